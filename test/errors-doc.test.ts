// Like fastify's Errors.md test: the README's error table and the code's error table must list the same codes.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { ERROR_CODES, normaliseUpstreamErrorBody } from '../src/errors.ts';

describe('the README error table', () => {
  const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
  const block = readme.slice(readme.indexOf('<!-- error-codes:start -->'), readme.indexOf('<!-- error-codes:end -->'));
  const documented = new Map([...block.matchAll(/^\| `([a-z_]+)` \| (\d+|\(in-stream\)) \|/gm)].map((m) => [m[1]!, m[2]!]));

  it('documents every error code the gateway answers with, with its status', () => {
    for (const [code, def] of Object.entries(ERROR_CODES)) {
      expect(documented.get(code), `README lacks ${code}`).toBe(code === 'stream_interrupted' ? '(in-stream)' : String(def.status));
    }
  });

  it('documents no code that no longer exists', () => {
    for (const code of documented.keys()) expect(Object.keys(ERROR_CODES)).toContain(code);
  });
});

describe('an upstream error passed on', () => {
  it('keeps a well-formed OpenAI error as it is, its own fields included, filling only what the shape lacks', () => {
    const azure = {
      error: {
        message: 'The response was filtered',
        type: null,
        param: 'prompt',
        code: 'content_filter',
        status: 400,
        innererror: { code: 'ResponsibleAIPolicyViolation', content_filter_result: { hate: { filtered: true, severity: 'high' } } },
      },
    };
    const out = normaliseUpstreamErrorBody(400, Buffer.from(JSON.stringify(azure)));
    expect(out).toEqual({ error: { ...azure.error, type: 'invalid_request_error' } });
    expect(normaliseUpstreamErrorBody(503, Buffer.from('{"error":{"message":"busy"}}'))).toEqual({ error: { message: 'busy', type: 'server_error', param: null, code: null } });
  });
});
