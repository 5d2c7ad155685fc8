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
  return destination ? pino(options, destination) : pino(options);
}
