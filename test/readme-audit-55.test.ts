// README claims checked as a new user meets them (audit 55): the Quick start's `npm start` flags run through npm itself
// (--help, STORMGATE_CONFIG, --config and --port over both, a server.host that is no address here); the start-up
// refusals of "Configuration reference" and of "Priority pools" (shares, sizes, defaults); on a real process at
// logLevel trace, the warnings a config that loads but cannot work gets, "Logs and metrics"' instance name, redaction,
// the ops paths' quiet lines, /readyz's body and the metric names, "Health, readiness, shutdown"'s SIGHUP and a second
// SIGTERM; a request line's size; "Priority pools"' shedding on a full queue and slot waits over real HTTP; and
// "Deployment": the Dockerfile's HEALTHCHECK and the compose loadgen's script run as the containers run them, and the
// clock-skew log line of a fleet on one Redis. Every claim checked held: no README sentence or code was changed. What
// earlier audits and tests hold (the mock's CLI, the compose file read against the repository, the missing-key
// refusals, --port and an unknown flag on plain node, the priority header's lowering) is not repeated.
import OpenAI from 'openai';
import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { ConfigError, loadConfigFile, parseConfig } from '../src/config/load.ts';
import { startMock, type MockServer } from '../src/mock/server.ts';
import { freePort } from './helpers/free-port.ts';
import { useGatewayProcesses, waitReady, type GatewayProcess } from './helpers/gateway-process.ts';
import { TEST_KEY, scrapeMetrics, testLogSink, useStacks, type Stack } from './helpers/stack.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { RedisStore } from '../src/state/redis-store.ts';
import { createLogger } from '../src/observability/logger.ts';

const README = readFileSync('README.md', 'utf8');
const dir = mkdtempSync(join(tmpdir(), 'stormgate-audit55-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A config file of the test's own. */
function file(name: string, text: string): string {
  const path = join(dir, name);
  writeFileSync(path, text);
  return path;
}

/** One chat route to an OpenAI-family provider at `baseUrl`, named `route`. */
const oneRoute = (route: string, baseUrl: string, port = 0) =>
  `server: { host: 127.0.0.1, port: ${port}, logLevel: info }\nproviders:\n  mock: { family: openai, baseUrl: "${baseUrl}", apiKey: "k" }\nroutes:\n  - { name: ${route}, match: { path: /v1/chat/completions }, targets: [ { provider: mock } ] }\ndrain: { preStopMs: 0, graceMs: 2000 }\n`;

/** The message a config is refused with (fails the test if it loads). */
function refusal(yaml: string, env: Record<string, string> = { K: 'sk-a55-provider-secret' }): string {
  try {
    parseConfig(yaml, 'a55.yaml', env);
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return (e as Error).message;
  }
  throw new Error(`config loaded: ${yaml}`);
}

/** A one-provider config with `prov` added to the provider's flow mapping. */
const withProvider = (prov: string, apiKey = '"${K}"') =>
  `providers:\n  openai: { family: openai, baseUrl: "https://api.openai.com/v1", apiKey: ${apiKey}${prov} }\nroutes:\n  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: openai } ] }\n`;

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- a log line is JSON: tests read whatever field they check
type Line = Record<string, any>;
const jsonLines = (text: string): Line[] => text.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as Line);

/** `npm <args>` in the repository as a process group of its own (npm, and the node it execs), killed by its id after the test. */
const npmRuns: ChildProcess[] = [];
afterAll(() => {
  for (const c of npmRuns) if (c.exitCode === null && c.signalCode === null) process.kill(-c.pid!, 'SIGKILL');
});
function npm(args: string[], env: Record<string, string> = {}): { child: ChildProcess; out: () => string; exited: Promise<number | null> } {
  const child = spawn('npm', args, { env: { ...process.env, ...env }, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  npmRuns.push(child);
  let out = '';
  child.stdout!.on('data', (d: Buffer) => (out += String(d)));
  child.stderr!.on('data', (d: Buffer) => (out += String(d)));
  const exited = once(child, 'exit').then(([code]) => code as number | null);
  return { child, out: () => out, exited };
}

async function readyOn(port: number, out: () => string, child: ChildProcess): Promise<void> {
  const until = Date.now() + 30_000;
  while (Date.now() < until && child.exitCode === null) {
    if (await fetch(`http://127.0.0.1:${port}/readyz`).then((r) => r.ok, () => false)) return;
    await sleep(50);
  }
  throw new Error(`not ready on ${port}:\n${out()}`);
}

const chat = (url: string, headers: Record<string, string> = {}, body: object = { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }) =>
  fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });

describe('README "Quick start": npm start and its flags, run through npm', () => {
  let mock: MockServer;
  beforeAll(async () => {
    mock = await startMock({ quiet: true });
  });
  afterAll(async () => mock.close());

  it('`npm start -- --help` prints the usage: -c/--config (default $STORMGATE_CONFIG or config/gateway.yaml), -p/--port in place of server.port; exit 0', async () => {
    const run = npm(['start', '--silent', '--', '--help']);
    expect(await run.exited).toBe(0);
    const usage = run.out().trim();
    expect(usage).toMatch(/^usage: stormgate \[-c, --config <file>\] \[-p, --port <n>\]/);
    expect(usage).toContain('$STORMGATE_CONFIG or config/gateway.yaml');
    expect(usage).toContain('--port: in place of server.port');
    // The README's three lines use exactly these flags and the variable.
    expect(README).toContain('npm start -- --config my-gateway.yaml                            # or STORMGATE_CONFIG=my-gateway.yaml npm start');
    expect(README).toContain('npm start -- --config my-gateway.yaml --port 8081                # --port in place of the file\'s server.port');
  }, 40_000);

  it('`STORMGATE_CONFIG=a.yaml npm start` serves a.yaml; `--config b.yaml --port N` wins over the variable and over b.yaml\'s own port; the listening line names the file and its routes', async () => {
    const [portA, portB, portFlag] = await Promise.all([freePort(), freePort(), freePort()]);
    const a = file('a.yaml', oneRoute('from-env', `${mock.url}/v1`, portA));
    const b = file('b.yaml', oneRoute('from-flag', `${mock.url}/v1`, portB));
    const byEnv = npm(['start', '--silent'], { STORMGATE_CONFIG: a });
    const byFlag = npm(['start', '--silent', '--', '--config', b, '--port', String(portFlag)], { STORMGATE_CONFIG: a });
    await Promise.all([readyOn(portA, byEnv.out, byEnv.child), readyOn(portFlag, byFlag.out, byFlag.child)]);
    expect((await chat(`http://127.0.0.1:${portA}`)).headers.get('x-stormgate-route')).toBe('from-env');
    expect((await chat(`http://127.0.0.1:${portFlag}`)).headers.get('x-stormgate-route')).toBe('from-flag');
    // b.yaml's own port is not opened.
    expect(await fetch(`http://127.0.0.1:${portB}/healthz`).then(() => 'open', () => 'closed')).toBe('closed');
    const listening = (out: string) => jsonLines(out).find((l) => l.msg === 'stormgate listening')!;
    expect(listening(byEnv.out())).toMatchObject({ config: a, routes: ['from-env'], address: `http://127.0.0.1:${portA}` });
    expect(listening(byFlag.out())).toMatchObject({ config: b, routes: ['from-flag'], address: `http://127.0.0.1:${portFlag}` });
    // npm passes SIGTERM on to the gateway (the script execs node), which drains and exits 0.
    for (const r of [byEnv, byFlag]) r.child.kill('SIGTERM');
    expect(await Promise.all([byEnv.exited, byFlag.exited])).toEqual([0, 0]);
  }, 60_000);
});

describe('README "Quick start": a server.host that is no address of this machine, on a real process', () => {
  const startProcess = useGatewayProcesses();

  it('ends the start-up in one line naming server.host and the file, exit 2, no stack trace', async () => {
    const g = startProcess('elsewhere', oneRoute('chat', 'http://127.0.0.1:9/v1').replace('host: 127.0.0.1', 'host: 192.0.2.1'));
    expect(await g.exited).toBe(2);
    expect(g.output().trim().split('\n').at(-1)).toBe(`stormgate: cannot listen: 192.0.2.1 is not an address of this machine (server.host in ${g.file})`);
    expect(g.output()).not.toMatch(/\n\s+at /);
  }, 30_000);
});

describe('README "Configuration reference": what start-up refuses, and how it says so', () => {
  it('refuses a duration above 2147483647 ms, with the path and the value found', () => {
    expect(refusal(withProvider(', timeouts: { connectMs: 2147483648 }'))).toBe('a55.yaml:2: providers.openai.timeouts.connectMs: must be <= 2147483647, got 2147483648');
  });

  it('shows the value found for a quantity (tokensPerMinute), never a credential\'s: a `Bearer ` key, from the file or the environment, and a URL\'s password', () => {
    expect(refusal(withProvider(', pools: { tokensPerMinute: -5 }'))).toContain('providers.openai.pools.tokensPerMinute: must be >= 1, got -5');
    for (const msg of [refusal(withProvider('', '"Bearer sk-a55-inline-secret"')), refusal(withProvider(''), { K: 'Bearer sk-a55-env-secret' })]) {
      expect(msg).toContain('providers.openai.apiKey: starts with "Bearer ", which the gateway writes itself');
      expect(msg).toContain('e.g. "${OPENAI_API_KEY}"');
      expect(msg).not.toMatch(/sk-a55/);
    }
    const proxy = refusal(withProvider(', proxy: "ftp://user:hunter2@proxy.example:3128"'));
    expect(proxy).toContain('providers.openai.proxy:');
    expect(proxy).toContain('ftp://user:[redacted]@proxy.example:3128');
    expect(proxy).not.toContain('hunter2');
    // `$VAR` without braces, the fix named.
    expect(refusal(withProvider('', '$OPENAI_API_KEY'))).toContain('write ${OPENAI_API_KEY}');
  });

  it('names a tls.caFile a variable gave as "the file ${VLLM_CA} names", never the variable\'s value', () => {
    const path = file('ca.yaml', withProvider(', tls: { caFile: "${VLLM_CA}" }'));
    const env = { K: process.env.K, VLLM_CA: process.env.VLLM_CA };
    process.env.K = 'k';
    process.env.VLLM_CA = '/nonexistent/a55-private-ca.pem';
    try {
      expect(() => loadConfigFile(path)).toThrow(/providers\.openai\.tls\.caFile: cannot read the file \$\{VLLM_CA\} names \(ENOENT\)/);
      expect(() => loadConfigFile(path)).not.toThrow(/a55-private-ca/);
    } finally {
      for (const [k, v] of Object.entries(env)) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    }
  });

  it('`$${` is a literal `${`, and a default may hold a reference itself', () => {
    const config = parseConfig(withProvider('', '"$${K}-${A:-${B}}"'), 'a55.yaml', { B: 'bee' });
    expect(config.providers.openai!.apiKey).toBe('${K}-bee');
  });

  it('an `x-` top-level key holds anchors and is otherwise ignored; a merge key\'s explicit keys win', () => {
    const yaml = 'x-provider: &defaults { family: openai, baseUrl: "https://a.example/v1", apiKey: "${K}" }\nproviders:\n  openai: { <<: *defaults, baseUrl: "https://b.example/v1" }\nroutes:\n  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: openai } ] }\n';
    const config = parseConfig(yaml, 'a55.yaml', { K: 'k' });
    expect(config.providers.openai).toMatchObject({ family: 'openai', baseUrl: 'https://b.example/v1', apiKey: 'k' });
    expect(Object.keys(config)).not.toContain('x-provider');
  });

  it('refuses a second YAML document at its --- line, and `__proto__` as a name', () => {
    expect(refusal(`${withProvider('')}---\nfoo: 1\n`)).toMatch(/^a55\.yaml:5:1: the file holds more than one YAML document/);
    expect(refusal(withProvider('').replace('openai:', '__proto__:'))).toContain('providers.__proto__: cannot be a name here');
  });
});

describe('README "Priority pools": the pool settings start-up refuses, and its defaults', () => {
  it('refuses minShare values adding up past 1 ("start-up refuses it"), maxConcurrent above maxConnections ("which it may not exceed") and maxShare below minShare ("at least its minShare")', () => {
    expect(refusal(withProvider(', pools: { classes: { online: { minShare: 0.7 }, batch: { minShare: 0.4 } } }'))).toContain('providers.openai.pools.classes: the minShare values add up to 1.1 (online 0.7, batch 0.4), more than the whole pool');
    expect(refusal(withProvider(', maxConnections: 4, pools: { maxConcurrent: 5 }'))).toContain('providers.openai.pools.maxConcurrent: maxConcurrent (5) must not exceed maxConnections (4)');
    expect(refusal(withProvider(', pools: { classes: { online: { minShare: 0.5, maxShare: 0.3 } } }'))).toContain('providers.openai.pools.classes.online.maxShare: maxShare (0.3) is below the class\'s minShare (0.5)');
  });

  it('default classes: online (minShare 0.5, maxQueue 1000) then batch (minShare 0.1, maxQueue 10000), maxShare 1; maxConnections 128; a class written takes minShare 0 and maxQueue 1000', () => {
    const p = parseConfig(withProvider(''), 'a55.yaml', { K: 'k' }).providers.openai!;
    expect(p.maxConnections).toBe(128);
    expect(Object.keys(p.pools.classes)).toEqual(['online', 'batch']);
    expect(p.pools.classes).toEqual({ online: { minShare: 0.5, maxShare: 1, maxQueue: 1000 }, batch: { minShare: 0.1, maxShare: 1, maxQueue: 10000 } });
    const written = parseConfig(withProvider(', pools: { classes: { critical: {}, online: {} } }'), 'a55.yaml', { K: 'k' }).providers.openai!;
    expect(written.pools.classes).toEqual({ critical: { minShare: 0, maxShare: 1, maxQueue: 1000 }, online: { minShare: 0, maxShare: 1, maxQueue: 1000 } });
  });
});

describe('README "Logs and metrics": the size of a request line', () => {
  const startStack = useStacks();

  it('a plain success writes about 550 bytes (a whole answer and a stream alike); a trace id makes it longer', async () => {
    const s = await startStack();
    const ids: Array<string | null> = [];
    for (const [stream, headers] of [[false, {}], [true, {}], [false, { traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01' }]] as const) {
      const res = await chat(s.url, headers, { model: 'gpt-4o', stream, messages: [{ role: 'user', content: 'hi' }] });
      await res.text();
      ids.push(res.headers.get('x-stormgate-request-id'));
    }
    let raw: string[] = [];
    for (let i = 0; i < 100 && raw.length < 3; i++, await sleep(20)) raw = s.logs.join('').split('\n').filter((l) => ids.some((id) => l.includes(`"reqId":"${id}"`)));
    const bytes = raw.map((l) => Buffer.byteLength(l) + 1);
    for (const b of bytes.slice(0, 2)) {
      expect(b).toBeGreaterThan(450);
      expect(b).toBeLessThan(650);
    }
    expect(bytes[2]).toBeGreaterThan(bytes[0]!);
    // 1,000 such lines a second for a day: "about 48 GB".
    expect(Math.round((550 * 1000 * 86_400) / 1e9)).toBe(48);
  });
});

describe('README "Priority pools" over real HTTP', () => {
  const startStack = useStacks();
  const pooled = (pools: object, latencyMs: number) =>
    startStack({ faults: { latencyMs }, provider: { maxConnections: 1, pools }, route: { park: false } });
  const series = async (s: Stack, name: string, labels: Record<string, string> = {}) =>
    (await scrapeMetrics(s.url)).filter((m) => m.name === name && Object.entries(labels).every(([k, v]) => m.labels[k] === v));

  it('a full queue sheds: 503 load_shed for online, 429 for batch (the lowest class), each with x-should-retry: true and a retry-after, counted in stormgate_shed_total{priority,reason="queue_full"}', async () => {
    const s = await pooled({ classes: { online: { maxQueue: 0 }, batch: { maxQueue: 0 } } }, 600);
    const first = chat(s.url);
    await sleep(150); // the first holds the only slot
    const online = await chat(s.url);
    const batch = await chat(s.url, { 'x-stormgate-priority': 'batch' });
    expect((await first).status).toBe(200);
    for (const [res, status] of [[online, 503], [batch, 429]] as const) {
      expect(res.status).toBe(status);
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe('load_shed');
      expect(res.headers.get('x-should-retry')).toBe('true');
      expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
      expect(Number(res.headers.get('retry-after-ms'))).toBeGreaterThan(0);
    }
    for (const priority of ['online', 'batch']) expect((await series(s, 'stormgate_shed_total', { priority, reason: 'queue_full' }))[0]?.value, priority).toBe(1);
  });

  it('maxConcurrent defaults to maxConnections: a second request waits for the one slot, its attempt says `slotWaitMs`, stormgate_pool_wait_seconds counts both attempts; the pool\'s gauges carry the README\'s labels', async () => {
    const s = await pooled({}, 400);
    const [a, b] = await Promise.all([chat(s.url), (async () => (await sleep(100), chat(s.url)))()]);
    expect([a.status, b.status]).toEqual([200, 200]);
    const id = b.headers.get('x-stormgate-request-id');
    let line: Line | undefined;
    for (let i = 0; i < 100 && !line; i++, await sleep(20)) line = jsonLines(s.logs.join('')).find((l) => l.reqId === id);
    expect(line!.attempts[0].slotWaitMs).toBeGreaterThan(150);
    expect((await series(s, 'stormgate_pool_wait_seconds_count', { provider: 'mock', priority: 'online' }))[0]?.value).toBe(2);
    const metrics = await scrapeMetrics(s.url);
    for (const name of ['stormgate_pool_in_use', 'stormgate_pool_queue_depth']) {
      expect(Object.keys(metrics.find((m) => m.name === name && m.labels.provider === 'mock')!.labels).sort(), name).toEqual(['priority', 'provider']);
    }
    expect(metrics.find((m) => m.name === 'stormgate_pool_limit')!.labels).toEqual({ target: 'mock/gpt-4o' });
    expect(metrics.find((m) => m.name === 'stormgate_pool_limit')!.value).toBe(1);
    expect(metrics.find((m) => m.name === 'stormgate_waiting_body_bytes')).toMatchObject({ labels: {}, value: 0 });
  });
});

describe('a gateway process at logLevel trace: start-up warnings, the instance name, redaction, SIGHUP, a second SIGTERM, the image\'s HEALTHCHECK', () => {
  const startProcess = useGatewayProcesses();
  const PROVIDER_KEY = 'sk-a55-provider-key-0123456789';
  const CLIENT_SECRETS = ['sk-a55-client-authorization', 'sk-a55-client-x-api-key', 'sk-a55-client-api-key'];
  let mock: MockServer;
  let gateway: GatewayProcess;
  let port: number;
  let url: string;
  const lines = () => jsonLines(gateway.output());

  beforeAll(async () => {
    mock = await startMock({ quiet: true });
    port = await freePort();
    url = `http://127.0.0.1:${port}`;
    gateway = startProcess('trace', {
      server: { host: '127.0.0.1', port, logLevel: 'trace' },
      providers: {
        mock: { family: 'openai', baseUrl: `${mock.url}/v1`, apiKey: '${A55_PROVIDER_KEY}', pools: { requestsPerMinute: 60, burst: 100 } },
        bare: { family: 'openai', baseUrl: 'http://127.0.0.1:9', apiKey: 'none' },
        spare: { family: 'openai', baseUrl: 'http://127.0.0.1:9/v1', apiKey: '${A55_UNSET_KEY:-}', optional: true },
        selfsigned: { family: 'openai', baseUrl: 'https://127.0.0.1:9/v1', apiKey: 'none', tls: { rejectUnauthorized: false } },
      },
      routes: [
        { name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }], retry: { retryOn: [400, 503] } },
        { name: 'tight', match: { path: '/v1/embeddings' }, targets: [{ provider: 'bare' }], timeoutMs: 1000 },
        { name: 'others', match: { path: '/v1/completions' }, targets: [{ provider: 'spare' }, { provider: 'selfsigned' }] },
      ],
      drain: { preStopMs: 300, graceMs: 1000 },
    }, { A55_PROVIDER_KEY: PROVIDER_KEY, A55_UNSET_KEY: undefined });
    await waitReady(gateway, port);
  }, 40_000);
  afterAll(async () => mock.close());

  it('logs at warn, once the gateway starts, each setting that loads but cannot work, naming its provider or route (a baseUrl without a path, a retryOn status never retried, a timeoutMs that leaves no more than minAttemptMs, a burst past a minute\'s worth)', () => {
    const warns = lines().filter((l) => l.level === 40).map((l) => l.msg as string);
    expect(warns.find((m) => m.startsWith('provider bare: baseUrl http://127.0.0.1:9 has no path'))).toBeDefined();
    expect(warns.find((m) => m.startsWith('route chat: retry.retryOn lists 400 (the request itself is wrong)'))).toBeDefined();
    expect(warns.find((m) => m.startsWith('route tight: timeoutMs 1000 leaves 750 ms after its deadline margin, no more than minAttemptMs 1000'))).toBeDefined();
    expect(warns.find((m) => m.startsWith('provider mock: pools.burst 100 is more than a minute\'s worth of pools.requestsPerMinute (60)'))).toBeDefined();
    // "Configuration reference": an optional provider without its key is disabled, "said once at start-up"; and
    // tls.rejectUnauthorized: false, "the gateway warns at start-up".
    expect(warns.filter((m) => m.includes('provider spare'))).toEqual(['provider spare is optional and has no key: disabled, its targets are skipped']);
    expect(warns.find((m) => m.startsWith('provider selfsigned has tls.rejectUnauthorized: false'))).toBeDefined();
  });

  it('every line names the instance (`stormgate-` and 8 hex digits), one name, the one its via entry carries upstream', async () => {
    expect((await chat(url)).status).toBe(200);
    const all = lines();
    const names = new Set(all.map((l) => l.instance));
    expect(names.size).toBe(1);
    const [instance] = [...names];
    expect(instance).toMatch(/^stormgate-[0-9a-f]{8}$/);
    const upstream = (await (await fetch(`${mock.url}/_mock/requests`)).json()) as Array<{ headers: Record<string, string> }>;
    expect(upstream.at(-1)!.headers.via).toBe(`1.1 ${instance}`);
  });

  it('never logs the client\'s authorization, api-key and x-api-key, nor the configured apiKey, even at trace, even for a request the provider refuses', async () => {
    const headers = { authorization: `Bearer ${CLIENT_SECRETS[0]}`, 'x-api-key': CLIENT_SECRETS[1]!, 'api-key': CLIENT_SECRETS[2]! };
    expect((await chat(url, headers)).status).toBe(200);
    await fetch(`${mock.url}/_mock/faults`, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ errors: [{ status: 400, rate: 1 }] }) });
    expect((await chat(url, headers)).status).toBe(400);
    await fetch(`${mock.url}/_mock/faults`, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: '{}' });
    await sleep(200);
    const out = gateway.output();
    expect(lines().filter((l) => l.reqId !== undefined && l.route === 'chat')).toHaveLength(3); // the request lines were written
    for (const secret of [...CLIENT_SECRETS, PROVIDER_KEY]) expect(out, secret).not.toContain(secret);
  });

  it('the Dockerfile\'s HEALTHCHECK command, run as written (its port set to this gateway\'s), exits 0 on a live gateway and 1 with none listening', async () => {
    const dockerfile = readFileSync('Dockerfile', 'utf8');
    const cmd = JSON.parse(/^\s*CMD (\[.*\])$/m.exec(dockerfile.slice(dockerfile.indexOf('HEALTHCHECK')))![1]!) as string[];
    expect(cmd.slice(0, 2)).toEqual(['node', '-e']);
    expect(cmd[2]).toContain('http://127.0.0.1:8080/healthz');
    const run = (script: string) => new Promise<number>((resolve) => execFile(process.execPath, ['-e', script], { timeout: 10_000 }, (err) => resolve(err ? ((err as { code?: number }).code ?? -1) : 0)));
    const free = await freePort();
    expect(await run(cmd[2]!.replace('127.0.0.1:8080', `127.0.0.1:${port}`))).toBe(0);
    expect(await run(cmd[2]!.replace('127.0.0.1:8080', `127.0.0.1:${free}`))).toBe(1);
  });

  it('/readyz names the state store and whether it is degraded; /metrics has every name prefixed stormgate_, plus Node\'s default process metrics', async () => {
    const ready = await fetch(`${url}/readyz`);
    expect(ready.status).toBe(200);
    expect(await ready.json()).toEqual({ status: 'ready', store: 'memory', degraded: false });
    const text = await (await fetch(`${url}/metrics`)).text();
    const names = new Set([...text.matchAll(/^# TYPE (\S+) /gm)].map((m) => m[1]!));
    expect(names).toContain('process_cpu_user_seconds_total');
    expect(names).toContain('nodejs_heap_size_total_bytes');
    const ours = [...names].filter((n) => !/^(process|nodejs)_/.test(n));
    expect(ours.length).toBeGreaterThan(30);
    for (const n of ours) expect(n).toMatch(/^stormgate_/);
  });

  it('`/metrics`, `/healthz` and `/readyz` log a line only when they fail: none for the probes and scrapes so far, one for a 405', async () => {
    await Promise.all([fetch(`${url}/metrics`).then((r) => r.text()), fetch(`${url}/healthz`).then((r) => r.text()), fetch(`${url}/readyz`).then((r) => r.text())]);
    const wrong = await fetch(`${url}/healthz`, { method: 'POST' });
    expect(wrong.status).toBe(405);
    expect(wrong.headers.get('allow')).toBe('GET, HEAD');
    await sleep(100);
    const ops = lines().filter((l) => ['/metrics', '/healthz', '/readyz'].includes(l.path));
    expect(ops.map((l) => [l.method, l.path, l.status])).toEqual([['POST', '/healthz', 405]]);
  });

  it('SIGHUP is logged as a warning and ignored: the gateway keeps serving', async () => {
    gateway.proc.kill('SIGHUP');
    let warned: Line | undefined;
    for (let i = 0; i < 100 && !warned; i++, await sleep(20)) warned = lines().find((l) => l.level === 40 && String(l.msg).startsWith('SIGHUP ignored'));
    expect(warned!.msg).toContain('the config is read at start only');
    expect((await chat(url)).status).toBe(200);
    expect(gateway.proc.exitCode).toBeNull();
  });

  it('a SIGTERM that comes again while the gateway drains changes nothing (logged, ignored): /readyz fails at once, the drain ends with exit 0', async () => {
    gateway.proc.kill('SIGTERM');
    await sleep(50);
    gateway.proc.kill('SIGTERM');
    expect((await fetch(`${url}/readyz`)).status).toBe(503);
    expect(await gateway.exited).toBe(0);
    // The failed readiness probe has its line.
    expect(lines().filter((l) => l.path === '/readyz').map((l) => l.status)).toEqual([503]);
    const ignored = lines().find((l) => l.msg === 'signal ignored: already shutting down');
    expect(ignored).toMatchObject({ signal: 'SIGTERM', closing: 'SIGTERM' });
  }, 20_000);
});

describe('README "Deployment": the compose loadgen\'s script, run as its container runs it, through config/docker.yaml', () => {
  const startStack = useStacks();

  it('sends ~20 calls a second with STORMGATE_API_KEY: half streamed, a fifth in the batch class, all answered', async () => {
    const compose = parseYaml(readFileSync('docker-compose.yml', 'utf8')) as { services: { loadgen: { command: string[] } } };
    const [node, flag, script] = compose.services.loadgen.command;
    expect([node, flag]).toEqual(['node', '-e']);
    const s = await startStack({
      config: (mockUrl) => parseConfig(readFileSync('config/docker.yaml', 'utf8'), 'config/docker.yaml', { STORMGATE_API_KEY: 'demo', OPENAI_BASE_URL: `${mockUrl}/v1`, OPENAI_API_KEY: TEST_KEY }),
    });
    const loadgen = spawn(process.execPath, ['-e', script!], { env: { ...process.env, GATEWAY_URL: s.url, MOCK_URL: s.mock.url, STORMGATE_API_KEY: 'demo', RPS: '20', BROWNOUT_EVERY_S: '300' }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    loadgen.stdout.on('data', (d: Buffer) => (out += String(d)));
    const gone = once(loadgen, 'exit');
    await sleep(1_600);
    loadgen.kill('SIGKILL');
    await gone;
    await sleep(300); // the last calls' answers
    expect(out).toContain(`loadgen: 20 requests/s to ${s.url}`);
    const metrics = await scrapeMetrics(s.url);
    const count = (labels: Record<string, string>) => metrics.filter((m) => m.name === 'stormgate_requests_total' && Object.entries(labels).every(([k, v]) => m.labels[k] === v)).reduce((n, m) => n + m.value, 0);
    const all = count({ route: 'chat' });
    expect(all).toBeGreaterThanOrEqual(10);
    expect(count({ route: 'chat', outcome: 'success' })).toBe(all);
    expect(count({ outcome: 'rejected' })).toBe(0);
    const batch = count({ route: 'chat', priority: 'batch' });
    expect(batch).toBeGreaterThanOrEqual(Math.floor(all / 5));
    expect(batch).toBeLessThanOrEqual(Math.ceil(all / 5));
    const upstream = (await (await fetch(`${s.mock.url}/_mock/requests`)).json()) as Array<{ stream: boolean }>;
    const streamed = upstream.filter((r) => r.stream).length;
    expect(Math.abs(streamed * 2 - upstream.length)).toBeLessThanOrEqual(1);
    // The README's sample client uses the same key as its API key.
    const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'demo', maxRetries: 0 });
    expect((await client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] })).choices[0]!.message.content).toBeTruthy();
  });
});

describe('README "Deployment": instances that share a Redis need not agree on the time', () => {
  const redis = useRedisServer();
  const stores: RedisStore[] = [];
  afterAll(async () => {
    await Promise.all(stores.map((s) => s.close()));
  });

  /** A store whose clock is `offsetMs` off the machine's; resolves its log lines once it has read Redis's clock. */
  async function instanceOff(offsetMs: number): Promise<Line[]> {
    const logs: string[] = [];
    const logger = createLogger({ server: { logLevel: 'info' } } as Parameters<typeof createLogger>[0], testLogSink(logs));
    const store = new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 500, keyPrefix: `a55-${offsetMs}` }, logger, now: () => Date.now() + offsetMs });
    stores.push(store);
    expect(await store.ready()).toBe(true);
    await sleep(100);
    return jsonLines(logs.join(''));
  }

  it('logs `this instance\'s clock is off Redis\'s` with skewMs at half a second or more off; under half a second the clocks are taken to agree, and nothing is said', async () => {
    const [far, near] = await Promise.all([instanceOff(30_000), instanceOff(200)]);
    const off = (lines: Line[]) => lines.filter((l) => String(l.msg).startsWith("this instance's clock is off Redis's"));
    expect(off(far)).toHaveLength(1);
    expect(off(far)[0]!.level).toBe(40);
    expect(Math.abs(off(far)[0]!.skewMs - 30_000)).toBeLessThan(1_000);
    expect(off(near)).toEqual([]);
    expect(README).toContain("it logs `this instance's clock is off Redis's` with\n`skewMs` otherwise");
  });
});
