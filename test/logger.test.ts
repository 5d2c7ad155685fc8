import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { accessLogger, createLogger } from '../src/observability/logger.ts';

function sink(lines: Array<Record<string, unknown>>): Writable {
  return new Writable({
    write(chunk, _enc, cb) {
      lines.push(JSON.parse(String(chunk)) as Record<string, unknown>);
      cb();
    },
  });
}

const config = { server: { logLevel: 'info' } } as Parameters<typeof createLogger>[0];

describe('logger redaction', () => {
  it('redacts credentials in headers and any config object, wherever they are logged', () => {
    const lines: Array<Record<string, unknown>> = [];
    const log = createLogger(config, sink(lines));
    log.info(
      {
        req: { headers: { authorization: 'Bearer secret-1', 'x-api-key': 'secret-2' } },
        headers: { 'api-key': 'secret-3' },
        apiKey: 'secret-4',
        openai: { baseUrl: 'https://example.invalid', apiKey: 'secret-5' },
        providers: { anthropic: { apiKey: 'secret-6' } },
      },
      'x',
    );
    const text = JSON.stringify(lines);
    for (let i = 1; i <= 6; i++) expect(text).not.toContain(`secret-${i}`);
    expect(lines[0]).toMatchObject({ apiKey: '[redacted]', openai: { apiKey: '[redacted]', baseUrl: 'https://example.invalid' } });
  });

  it('writes the request line with the service and the request id, headers still redacted', () => {
    const lines: Array<Record<string, unknown>> = [];
    const access = accessLogger(createLogger(config, sink(lines)));
    access.info({ reqId: 'req-1', route: 'chat', attempts: [{ target: 'openai/gpt-4o', reason: 'ok' }], req: { headers: { authorization: 'Bearer secret-7' } } }, 'request');
    expect(lines[0]).toMatchObject({ level: 30, service: 'stormgate', reqId: 'req-1', route: 'chat', attempts: [{ target: 'openai/gpt-4o', reason: 'ok' }], msg: 'request' });
    expect(JSON.stringify(lines)).not.toContain('secret-7');
  });
});
