// Like fastify's Errors.md test: the README's error table and the code's error table must list the same codes.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { ERROR_CODES } from '../src/errors.ts';

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
