// pino with the credentials redacted wherever they could appear: headers, config objects, errors.
import pino, { type Logger } from 'pino';
import type { Config } from '../config/schema.ts';

export const REDACT_PATHS = [
  'req.headers.authorization',
  'req.headers["api-key"]',
  'req.headers["x-api-key"]',
  'headers.authorization',
  'headers["api-key"]',
  'headers["x-api-key"]',
  'apiKey',
  '*.apiKey',
  'providers.*.apiKey',
];

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
