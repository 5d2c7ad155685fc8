// pino with the credentials redacted wherever they could appear: headers, config objects, errors.
import pino, { type Logger } from 'pino';
import type { Config } from '../config/schema.ts';

const HEADER_PATHS = [
  'req.headers.authorization',
  'req.headers["api-key"]',
  'req.headers["x-api-key"]',
  'headers.authorization',
  'headers["api-key"]',
  'headers["x-api-key"]',
];

const REDACT_PATHS = [...HEADER_PATHS, 'apiKey', '*.apiKey', 'providers.*.apiKey'];

export function createLogger(config: Pick<Config, 'server'>, destination?: pino.DestinationStream): Logger {
  const options: pino.LoggerOptions = {
    level: config.server.logLevel,
    base: { service: 'stormgate' },
    redact: { paths: REDACT_PATHS, censor: '[redacted]' },
    serializers: { err: pino.stdSerializers.err },
  };
  // pino's default destination: stdout through an asynchronous SonicBoom, flushed when the process exits (a crash loses
  // what was not yet written). Synchronous writes measured no faster here, in throughput or in a stream's first token,
  // and would hold the event loop whenever the reader of stdout (a container runtime, a pipe) falls behind.
  return destination ? pino(options, destination) : pino(options);
}

/**
 * The logger of the one line per request, made once. Its fields are the gateway's own (route, target, attempts,
 * outcome, ids), none of which can hold a key, so it keeps only the header paths: the top-level wildcard `*.apiKey`
 * makes pino pass every field of every line through the redactor and clone the objects among them (the attempts),
 * which cost each request more than the rest of its log line.
 */
export function accessLogger(logger: Logger): Logger {
  return logger.child({}, { redact: { paths: HEADER_PATHS, censor: '[redacted]' } });
}
