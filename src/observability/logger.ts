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

export const REDACT_PATHS = [...HEADER_PATHS, 'apiKey', '*.apiKey', 'providers.*.apiKey'];

export function createLogger(config: Pick<Config, 'server'>, destination?: pino.DestinationStream): Logger {
  const options: pino.LoggerOptions = {
    level: config.server.logLevel,
    base: { service: 'stormgate' },
    redact: { paths: REDACT_PATHS, censor: '[redacted]' },
    serializers: { err: pino.stdSerializers.err },
  };
  // Asynchronous writes: under load the lines written while one write is in flight go out together, in one system
  // call, rather than one each on the request's thread. pino flushes what is left when the process exits.
  return pino(options, destination ?? pino.destination({ dest: 1, sync: false }));
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
