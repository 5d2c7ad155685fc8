// What the Docker image runs: the TypeScript compiled by `npm run build` (tsconfig.build.json), started with plain node
// and no tsx. The image has no dev dependencies and no demo, so a missing key says what to set, and nothing else.
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startMock, type MockServer } from '../src/mock/server.ts';
import { freePort } from './helpers/free-port.ts';
import { useGatewayProcesses, waitReady } from './helpers/gateway-process.ts';

// Inside the project, so the compiled modules find node_modules as the image's do under /app.
mkdirSync(join(process.cwd(), '.tmp'), { recursive: true });
const out = mkdtempSync(join(process.cwd(), '.tmp', 'build-'));
let mock: MockServer | undefined;
// Plain node on the compiled entry: no tsx.
const startProcess = useGatewayProcesses({ entry: [join(out, 'main.js')] });

beforeAll(() => {
  const tsc = spawnSync(process.execPath, ['node_modules/typescript/bin/tsc', '-p', 'tsconfig.build.json', '--outDir', out], { encoding: 'utf8' });
  expect(tsc.stdout + tsc.stderr).toBe('');
  expect(tsc.status).toBe(0);
}, 120_000);

afterAll(async () => {
  await mock?.close();
  rmSync(out, { recursive: true, force: true });
});

describe('the production build', () => {
  it('names the missing key and no demo the image does not have', () => {
    const { OPENAI_API_KEY: _drop, STORMGATE_CONFIG: _drop2, ...env } = process.env;
    const run = spawnSync(process.execPath, [join(out, 'main.js'), '--config', 'config/gateway.yaml'], { env, encoding: 'utf8' });
    expect(run.status).toBe(2);
    expect(run.stderr).toContain('Set OPENAI_API_KEY in the environment.');
    expect(run.stderr).not.toContain('npm run demo');
  });

  it('serves a chat completion with plain node', async () => {
    mock = await startMock({ quiet: true });
    const port = await freePort();
    const gateway = startProcess('gw', {
      server: { host: '127.0.0.1', port, logLevel: 'warn' },
      providers: { mock: { family: 'openai', baseUrl: `${mock.url}/v1`, apiKey: 'k' } },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }] }],
      drain: { preStopMs: 0 },
    });
    await waitReady(gateway, port);
    const r = await fetch(`http://127.0.0.1:${port}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(r.status).toBe(200);
    expect(((await r.json()) as { object: string }).object).toBe('chat.completion');
    gateway.proc.kill('SIGTERM');
    expect(await gateway.exited).toBe(0);
  });
});
