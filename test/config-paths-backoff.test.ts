// Config mistakes that used to pass validation: a target's own backoff with capMs below baseMs (only the route's was
// checked), and route or passthrough paths fastify cannot register (the gateway's own paths, a duplicate, a ":" or
// "*"), which made start-up fail with a FastifyError stack trace instead of the file, line and path.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import type { ConfigError } from '../src/config/load.ts';
import { configErrorOf } from './helpers/config-text.ts';

const env = { OPENAI_API_KEY: 'sk-test' };

const config = (route: string, extra = '') => `providers:
  openai:
    family: openai
    baseUrl: http://127.0.0.1:1/v1
    apiKey: \${OPENAI_API_KEY}
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: openai } ]
${route}${extra}`;

const configError = (text: string): ConfigError => configErrorOf(text, env);

describe('backoff capMs below baseMs', () => {
  it("is refused on a target's own retry, as on the route's", () => {
    const text = config(`  - name: other
    match: { path: /v1/embeddings }
    targets: [ { provider: openai, retry: { backoff: { baseMs: 5000, capMs: 100 } } } ]
`);
    expect(configError(text).message).toBe('gw.yaml:12: routes[1].targets[0].retry.backoff.baseMs: must not exceed capMs (100)');
  });

  it("is refused on a contextWindowFallback's retry", () => {
    const text = config(`    contextWindowFallback: { provider: openai, model: gpt-4.1, retry: { backoff: { baseMs: 900, capMs: 10 } } }
`);
    expect(configError(text).message).toBe('gw.yaml:10: routes[0].contextWindowFallback.retry.backoff.baseMs: must not exceed capMs (10)');
  });

  it("is still refused once on the route's own retry", () => {
    const text = config(`    retry: { backoff: { baseMs: 5000, capMs: 100 } }
`);
    expect(configError(text).issues).toEqual([{ path: 'routes[0].retry.backoff.baseMs', line: 10, message: 'must not exceed capMs (100)' }]);
  });
});

describe('paths fastify cannot register as written', () => {
  it.each([
    ['/v1/models', "is one of the gateway's own paths"],
    ['/healthz', "is one of the gateway's own paths"],
    ['/metrics', "is one of the gateway's own paths"],
    ['/v1/models/gpt-4o', "is one of the gateway's own paths"],
    ['/v1/:thing', 'must be a plain path'],
    ['"/v1/*"', 'must be a plain path'],
  ])('refuses a route on %s', (path, why) => {
    const text = config(`  - name: other
    match: { path: ${path} }
    targets: [ { provider: openai } ]
`);
    const e = configError(text);
    expect(e.issues).toHaveLength(1);
    expect(e.issues[0]).toMatchObject({ path: 'routes[1].match.path', line: 11 });
    expect(e.issues[0]!.message).toContain(why);
  });

  it.each([
    ['[/v1/files, /v1/files]', 'passthrough.paths[1]', 'is listed already (passthrough.paths[0])'],
    ['[/v1/files, /v1/files/]', 'passthrough.paths[1]', 'is listed already (passthrough.paths[0])'],
    ['["/v1/files/:id"]', 'passthrough.paths[0]', 'must be a plain path'],
  ])('refuses passthrough paths %s', (paths, at, why) => {
    const e = configError(config('', `passthrough: { provider: openai, paths: ${paths} }\n`));
    expect(e.issues).toHaveLength(1);
    expect(e.issues[0]).toMatchObject({ path: at, line: 10 });
    expect(e.issues[0]!.message).toContain(why);
  });

  it('makes the CLI exit 2 with one line naming the file, the line and the path, no stack trace', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'stormgate-cfg-'));
    try {
      const file = join(dir, 'gw.yaml');
      writeFileSync(file, config(`  - name: models
    match: { path: /v1/models }
    targets: [ { provider: openai } ]
`));
      const child = spawn(process.execPath, ['--import', 'tsx', 'src/main.ts', '--config', file], {
        cwd: resolve(import.meta.dirname, '..'),
        env: { PATH: process.env.PATH, OPENAI_API_KEY: 'sk-test' },
        stdio: ['ignore', 'ignore', 'pipe'],
      });
      let stderr = '';
      child.stderr.on('data', (d: Buffer) => (stderr += d));
      const code = await new Promise<number | null>((done) => child.on('exit', done));
      expect(stderr).not.toMatch(/\n\s+at /);
      expect(stderr).toContain(`${file}:11: routes[1].match.path: "/v1/models" is one of the gateway's own paths`);
      expect(code).toBe(2);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
