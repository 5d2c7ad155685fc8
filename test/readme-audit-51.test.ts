// README claims checked as a new user meets them in the first hour (audit 51): `npm run demo` run as the Quick start
// says and its printed table against the README's sample; the default config's refusal without a key, word for word;
// the "By hand, without keys" walk (`npm run mock`, `npm start`, the curl call, a brownout, the call again, the request's
// log line); the Node version notes; every link and anchor of the README; every metric name the docs mention; every
// x-stormgate-* header; the config reference's stated defaults against what ConfigSchema.parse gives, for every key
// (audit 47 held a hand-picked list). What earlier audits and tests hold is not repeated.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { parse as parseYaml } from 'yaml';
import { afterEach, describe, expect, it } from 'vitest';
import { configFields } from '../scripts/config-reference.ts';
import { ConfigSchema } from '../src/config/schema.ts';
import { createMetrics } from '../src/observability/metrics.ts';
import { freePort } from './helpers/free-port.ts';
import { RETRY_LOOP_ONLY, TEST_KEY, defaultConfig, useStacks } from './helpers/stack.ts';

const ROOT = join(import.meta.dirname, '..');
const read = (path: string): string => readFileSync(join(ROOT, path), 'utf8');
const README = read('README.md');
const DOCS = ['README.md', 'grafana/README.md', 'docs/config-reference.md'];

/** Markdown without its fenced code blocks (a link or heading inside one is code, not a link or a heading). */
function prose(text: string): string {
  let fenced = false;
  return text
    .split('\n')
    .filter((line) => {
      if (line.trimStart().startsWith('```')) fenced = !fenced;
      return !fenced && !line.trimStart().startsWith('```');
    })
    .join('\n');
}

interface NpmRun {
  proc: ChildProcess;
  output: () => string;
  exited: Promise<number | null>;
}

/** `npm run <script> --silent -- args` as a user types it, in its own process group (killed whole afterwards). */
function useNpm(): (script: string, args?: string[], env?: Record<string, string | undefined>) => NpmRun {
  const groups: ChildProcess[] = [];
  afterEach(async () => {
    for (const proc of groups.splice(0)) {
      if (proc.exitCode !== null || proc.signalCode !== null) continue;
      const gone = once(proc, 'exit');
      try {
        process.kill(-proc.pid!, 'SIGKILL');
      } catch {
        // The group is gone already.
      }
      await gone;
    }
  });
  return (script, args = [], env = {}) => {
    const childEnv: NodeJS.ProcessEnv = { ...process.env };
    for (const [k, v] of Object.entries(env)) {
      if (v === undefined) delete childEnv[k];
      else childEnv[k] = v;
    }
    const proc = spawn('npm', ['run', script, '--silent', ...(args.length ? ['--', ...args] : [])], { cwd: ROOT, env: childEnv, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    groups.push(proc);
    let output = '';
    proc.stdout!.on('data', (d: Buffer) => (output += d.toString()));
    proc.stderr!.on('data', (d: Buffer) => (output += d.toString()));
    const exited = once(proc, 'exit').then(([code]) => code as number | null);
    return { proc, output: () => output, exited };
  };
}

async function until<T>(what: string, run: NpmRun, probe: () => Promise<T | undefined>, withinMs = 30_000): Promise<T> {
  const deadline = Date.now() + withinMs;
  for (;;) {
    const got = await probe();
    if (got !== undefined) return got;
    if (Date.now() > deadline || run.proc.exitCode !== null) throw new Error(`${what}:\n${run.output()}`);
    await sleep(100);
  }
}

/** The demo's table, as `name -> [direct, through]` cells. */
function demoTable(text: string): Map<string, [string, string]> {
  const rows = new Map<string, [string, string]>();
  for (const line of text.split('\n')) {
    const m = /^([a-z][a-z0-9 ]+?)\s{2,}(\S.*?)\s{2,}(\S.*?)\s*$/.exec(line);
    if (m && !line.includes('direct, SDK retries')) rows.set(m[1]!, [m[2]!, m[3]!]);
  }
  return rows;
}

describe('Quick start: npm run demo', () => {
  const npm = useNpm();

  it('runs with no keys, Redis or Docker and prints the README\'s table: same rows, 300 requests each way, 100% through stormgate with fewer attempts and retries, the breaker of primary/gpt-4o-mini opened', async () => {
    // The README's sample, and the arithmetic under it, are one run's own figures.
    const quickStart = README.slice(README.indexOf('## Quick start'), README.indexOf('## What happens to a request'));
    const sample = /It prints a table like this one[\s\S]*?```\n([\s\S]*?)```/.exec(quickStart)![1]!;
    const readmeRows = demoTable(sample);
    const sentence = /so the attempts are (\d+) requests' first attempts\s+on the primary, (\d+) on the backup \((\d+) requests tried both\) and (\d+) retries: (\d+)\./.exec(quickStart);
    expect(sentence, 'the sentence that adds up the sample\'s attempts').not.toBeNull();
    const [primaryFirst, backup, both, retries, total] = sentence!.slice(1).map(Number) as [number, number, number, number, number];
    expect(primaryFirst + backup + retries).toBe(total);
    expect(String(total)).toBe(readmeRows.get('upstream attempts')![1]);
    expect(String(backup)).toBe(readmeRows.get('fallbacks to backup')![1]);
    expect(String(retries)).toBe(readmeRows.get('retries')![1]);
    expect(String(primaryFirst + backup - both)).toBe(readmeRows.get('client requests')![1]);

    // DEMO_* and the keys cleared: the demo needs nothing from the environment.
    const run = npm('demo', [], { OPENAI_API_KEY: undefined, OPENAI_BASE_URL: undefined, DEMO_REQUESTS: undefined, DEMO_CONCURRENCY: undefined });
    expect(await run.exited, run.output()).toBe(0);
    const out = run.output();
    expect(out).toMatch(/^\s+direct, SDK retries\s+through stormgate\s*$/m);
    const rows = demoTable(out);
    expect([...rows.keys()]).toEqual([...readmeRows.keys()]);
    const n = (cell: string) => Number(/^\d+/.exec(cell)![0]);
    const [directAttempts, gatewayAttempts] = rows.get('upstream attempts')!.map(n) as [number, number];
    const [directRetries, gatewayRetries] = rows.get('retries')!.map(n) as [number, number];
    expect(rows.get('client requests')).toEqual(['300', '300']);
    expect(rows.get('successes')![1]).toBe('300 (100.0%)');
    expect(n(rows.get('successes')![0])).toBeLessThan(300); // gpt-4o-mini always fails straight at the primary
    expect(gatewayAttempts).toBeLessThan(directAttempts);
    expect(gatewayRetries).toBeLessThan(directRetries);
    expect(rows.get('fallbacks to backup')![0]).toBe('0');
    expect(n(rows.get('fallbacks to backup')![1])).toBeGreaterThan(0);
    expect(out).toMatch(/^The primary's circuit breaker opened \([^)]*primary\/gpt-4o-mini/m);
    expect(out).toMatch(/^Why requests went to the backup \(stormgate_fallbacks_total by reason\): [a-z_]+ \d+/m);
  }, 90_000);
});

describe('Quick start: the default config', () => {
  const npm = useNpm();

  it('without OPENAI_API_KEY, npm start refuses in the README\'s words (config/gateway.yaml:7) and points to npm run demo', async () => {
    const quoted = /says so \(`([^`]+)`\), pointing to `npm run demo`/.exec(README.replace(/\n/g, ' ').replace(/ {2,}/g, ' '))![1]!;
    expect(quoted).toBe('config/gateway.yaml:7: providers.openai.apiKey: environment variable OPENAI_API_KEY is not set');
    const run = npm('start', [], { OPENAI_API_KEY: undefined, STORMGATE_CONFIG: undefined });
    expect(await run.exited).toBe(2);
    expect(run.output()).toContain(quoted);
    expect(run.output()).toMatch(/npm run demo/);
  }, 60_000);

  it('"By hand, without keys": npm run mock, npm start on config/gateway.yaml, the curl call, a brownout, and the call again as the SDK sees it and the log line says it', async () => {
    // The commands' own defaults: the mock on 9000, the gateway on 127.0.0.1:8080 (ports picked here, as --port allows).
    expect(read('src/mock/main.ts')).toMatch(/--port N\s+port \(default 9000/);
    const gatewayYaml = read('config/gateway.yaml');
    expect(gatewayYaml).toMatch(/^server: \{ host: 127\.0\.0\.1, port: 8080\b/m);
    const mock = npm('mock', ['--port', '0']);
    const mockUrl = await until('npm run mock did not listen', mock, async () => /listening on (http:\S+)/.exec(mock.output())?.[1]);
    const port = await freePort();
    const gateway = npm('start', ['--port', String(port)], { OPENAI_BASE_URL: `${mockUrl}/v1`, OPENAI_API_KEY: 'any', STORMGATE_CONFIG: undefined });
    const url = `http://127.0.0.1:${port}`;
    await until('npm start was not ready', gateway, async () => ((await fetch(`${url}/readyz`).then((r) => r.ok, () => false)) ? true : undefined));

    // curl -s http://127.0.0.1:8080/v1/chat/completions -H 'content-type: application/json' -d '{...}'
    const body = '{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}';
    const first = await fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
    expect(first.status).toBe(200);
    expect((await first.json()) as { object: string }).toMatchObject({ object: 'chat.completion' });
    expect(first.headers.get('x-stormgate-route')).toBe('chat');
    expect(first.headers.get('x-stormgate-target')).toBe('openai/gpt-4o');

    // curl -s -X POST http://127.0.0.1:9000/_mock/brownout -d '{"mode": "503", "durationMs": 15000}'
    const brownout = await fetch(`${mockUrl}/_mock/brownout`, { method: 'POST', body: '{"mode": "503", "durationMs": 15000}' });
    expect(brownout.status).toBe(200);
    await brownout.arrayBuffer();
    const sent = (await (await fetch(`${mockUrl}/_mock/requests`)).json()) as unknown[];

    // Then call again, with the README's client: the route's 3 attempts, a 503 the SDK does not send again.
    const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused-by-the-gateway' });
    const err = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }).then(
      () => undefined,
      (e: unknown) => e as InstanceType<typeof OpenAI.APIError>,
    );
    expect(err?.status).toBe(503);
    expect(err!.headers!.get('x-should-retry')).toBe('false');
    const requestId = err!.headers!.get('x-stormgate-request-id')!;
    expect(requestId).toBeTruthy();
    const after = (await (await fetch(`${mockUrl}/_mock/requests`)).json()) as unknown[];
    expect(after.length - sent.length).toBe(3);

    // "Why did a request fail?": one JSON line on stdout under that id, each attempt with its status, what stopped the
    // retries and the error code the client got.
    const line = await until('no log line for the failed request', gateway, async () =>
      gateway
        .output()
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l) as Record<string, any>)
        .find((l) => l.reqId === requestId && l.msg === 'request'),
    );
    expect(line.status).toBe(503);
    expect(line.attempts.map((a: { status?: number }) => a.status)).toEqual([503, 503, 503]);
    expect(line.retriesStopped).toBe('retries_exhausted');
    if (err!.code) expect(line.errorCode).toBe(err!.code);
    expect(line.route).toBe('chat');
  }, 90_000);
});

describe('Quick start: "to try one without keys", each example on 127.0.0.1 started with npm start', () => {
  const npm = useNpm();

  it('its base URL variables pointed at npm run mock (openai at /v1, anthropic without) and "any" for each key: every example serves the openai SDK from the mock', async () => {
    const mock = npm('mock', ['--port', '0']);
    const mockUrl = await until('npm run mock did not listen', mock, async () => /listening on (http:\S+)/.exec(mock.output())?.[1]);
    const files = readdirSync(join(ROOT, 'config/examples')).filter((f) => f.endsWith('.yaml'));
    // fleet-redis.yaml listens on every interface (and wants Redis): audit 50 runs it; anthropic-agents.yaml too.
    const local = files.filter((f) => /^server: \{ host: 127\.0\.0\.1,/m.test(read(`config/examples/${f}`)) && f !== 'anthropic-agents.yaml');
    expect(local.length).toBeGreaterThanOrEqual(3);
    const runs = await Promise.all(
      local.map(async (file) => {
        const raw = parseYaml(read(`config/examples/${file}`)) as { providers: Record<string, { family: string; baseUrl: string; apiKey: string }>; auth?: { keys: Record<string, string> } };
        const env: Record<string, string> = {};
        const variable = (text: string) => /^\$\{(\w+)/.exec(text)?.[1];
        for (const p of Object.values(raw.providers)) {
          const url = variable(p.baseUrl);
          expect(url, `${file}: a provider's baseUrl is a variable`).toBeDefined();
          env[url!] = p.family === 'anthropic' ? mockUrl : `${mockUrl}/v1`;
          const key = variable(p.apiKey);
          if (key) env[key] = 'any';
        }
        const clientKeys: string[] = [];
        for (const [name, value] of Object.entries(raw.auth?.keys ?? {})) {
          env[variable(value)!] = `client-key-${name}`;
          clientKeys.push(`client-key-${name}`);
        }
        const port = await freePort();
        const run = npm('start', ['--config', `config/examples/${file}`, '--port', String(port)], env);
        const url = `http://127.0.0.1:${port}`;
        await until(`${file} was not ready`, run, async () => ((await fetch(`${url}/readyz`).then((r) => r.ok, () => false)) ? true : undefined));
        const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: clientKeys[0] ?? 'unused-by-the-gateway', maxRetries: 0 });
        const answer = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: `hi from ${file}` }] }).withResponse();
        return { file, status: answer.response.status, route: answer.response.headers.get('x-stormgate-route'), content: answer.data.choices[0]!.message.content };
      }),
    );
    for (const r of runs) {
      expect(r.status, r.file).toBe(200);
      expect(r.route, r.file).toBeTruthy();
      expect(r.content, r.file).toBeTruthy();
    }
    const seen = (await (await fetch(`${mockUrl}/_mock/requests`)).json()) as Array<{ path: string }>;
    expect(seen.filter((r) => r.path === '/v1/chat/completions').length).toBe(local.length);
  }, 90_000);
});

describe('Quick start: Node.js versions', () => {
  it('asks for Node 20.10 or later, runs Node 20 in the image, and cookie@2.0.2 (Node 22) comes only through light-my-request, which fastify loads for inject() alone', () => {
    const pkg = JSON.parse(read('package.json')) as { engines: { node: string } };
    expect(README).toContain('Node.js 20.10 or later (`engines` in package.json; the Docker image runs Node 20)');
    expect(pkg.engines.node).toBe('>=20.10');
    const froms = [...read('Dockerfile').matchAll(/^FROM (\S+)/gm)].map((m) => m[1]!);
    expect(froms.length).toBeGreaterThan(0);
    for (const from of froms) expect(from).toMatch(/^node:20\b/);
    const lock = JSON.parse(read('package-lock.json')) as { packages: Record<string, { version?: string; engines?: Record<string, string>; dev?: boolean; dependencies?: Record<string, string> }> };
    expect(lock.packages['node_modules/cookie']).toMatchObject({ version: '2.0.2', engines: { node: '>=22' } });
    const dependents = Object.entries(lock.packages).filter(([path, p]) => !p.dev && p.dependencies?.cookie && path !== '').map(([path]) => path);
    expect(dependents).toEqual(['node_modules/light-my-request']);
    const lmrDependents = Object.entries(lock.packages).filter(([, p]) => p.dependencies?.['light-my-request']).map(([path]) => path);
    expect(lmrDependents).toEqual(['node_modules/fastify']);
    // fastify requires it lazily, in inject(): the gateway never loads it while it serves.
    const fastify = read('node_modules/fastify/fastify.js');
    expect(fastify).toMatch(/if \(lightMyRequest === undefined\) \{\s*lightMyRequest = require\('light-my-request'\)/);
    expect(fastify.match(/require\('light-my-request'\)/g)).toHaveLength(1);
  });
});

describe('the README\'s links', () => {
  it('every in-page anchor names a heading, and every relative link a file that exists (README.md, grafana/README.md)', () => {
    let checked = 0;
    for (const file of ['README.md', 'grafana/README.md']) {
      const text = prose(read(file));
      const slugs = new Set<string>();
      const seen = new Map<string, number>();
      for (const h of text.matchAll(/^#{1,6} (.+)$/gm)) {
        // GitHub's slug: lower case, punctuation out, spaces to hyphens, -1, -2 for repeats.
        const base = h[1]!.trim().toLowerCase().replace(/[^\p{L}\p{N} _-]/gu, '').replace(/ /g, '-');
        const n = seen.get(base) ?? 0;
        seen.set(base, n + 1);
        slugs.add(n === 0 ? base : `${base}-${n}`);
      }
      for (const m of text.matchAll(/\]\(([^)\s]+)\)/g)) {
        const target = m[1]!;
        if (/^[a-z]+:/.test(target)) continue;
        const [path, anchor] = target.split('#') as [string, string | undefined];
        if (path) expect(existsSync(join(ROOT, dirname(file), path)), `${file}: ${target}`).toBe(true);
        else expect(slugs.has(anchor!), `${file}: ${target}`).toBe(true);
        checked++;
      }
    }
    expect(checked).toBeGreaterThan(30);
  });
});

describe('metric names in the docs', () => {
  it('every stormgate_* and stormgate:* name the README, grafana/README.md and the config reference mention is a metric the gateway exports or a shipped recording rule', () => {
    const names = new Set<string>();
    for (const m of createMetrics({ defaultMetrics: false }).registry.getMetricsAsArray() as unknown as { name: string; type: string }[]) {
      names.add(m.name);
      if (m.type === 'histogram') for (const suffix of ['_bucket', '_sum', '_count']) names.add(m.name + suffix);
    }
    const rules = read('grafana/prometheus/rules/recording.yml');
    for (const r of rules.matchAll(/record: (\S+)/g)) names.add(r[1]!);
    let mentioned = 0;
    for (const file of DOCS) {
      for (const name of new Set([...read(file).matchAll(/\bstormgate(?:_[a-z0-9_]+|:[a-z0-9_]+:[a-z0-9_]+)/g)].map((m) => m[0]))) {
        expect(names.has(name), `${file} mentions ${name}`).toBe(true);
        mentioned++;
      }
    }
    expect(mentioned).toBeGreaterThan(40);
  });
});

describe('x-stormgate-* headers', () => {
  it('the README names every one the gateway reads or writes, and none it does not (the passthrough\'s internal call id aside, taken off before sending)', () => {
    const files = readdirSync(join(ROOT, 'src'), { recursive: true, encoding: 'utf8' }).filter((f) => f.endsWith('.ts'));
    const inCode = new Set(files.flatMap((f) => [...read(join('src', f)).matchAll(/x-stormgate-[a-z-]*[a-z]/g)].map((m) => m[0])));
    expect(read('src/providers/passthrough.ts')).toMatch(/const CALL_HEADER = 'x-stormgate-passthrough-call';/);
    expect(read('src/providers/passthrough.ts')).toMatch(/taken off before the request is sent/);
    inCode.delete('x-stormgate-passthrough-call');
    const inReadme = new Set([...README.matchAll(/x-stormgate-[a-z-]*[a-z]/g)].map((m) => m[0]));
    expect([...inCode].sort()).toEqual([...inReadme].sort());
    expect(inCode.size).toBeGreaterThanOrEqual(9);
  });
});

describe('the configuration reference\'s defaults', () => {
  /** Every value at a reference path (`providers.<name>.timeouts.connectMs`, `routes[].targets[].weight`) of a parsed config. */
  function valuesAt(config: unknown, path: string): unknown[] {
    let here: unknown[] = [config];
    for (const segment of path.split('.')) {
      const list = segment.endsWith('[]');
      const key = list ? segment.slice(0, -2) : segment;
      here = here.flatMap((o) => {
        if (o === null || typeof o !== 'object') return [];
        if (key === '<name>') return Object.values(o);
        return key in o ? [(o as Record<string, unknown>)[key]] : [];
      });
      if (list) here = here.flatMap((o) => (Array.isArray(o) ? o : []));
    }
    return here;
  }

  it('every plain "Default: X" is what ConfigSchema.parse gives wherever the key can be left out, each key reached', () => {
    // Every optional object written (empty where it may be), so every key with a default is left out somewhere.
    const parsed = ConfigSchema.parse({
      providers: {
        openai: { family: 'openai', baseUrl: 'https://api.openai.com/v1', apiKey: 'sk-x', tls: {}, pools: { classes: { online: {}, batch: {} } }, breaker: { models: { 'gpt-4o': {} } } },
        claude: { family: 'anthropic', baseUrl: 'https://api.anthropic.com', apiKey: 'k', pools: { classes: { online: {}, batch: {} } } },
      },
      routes: [
        {
          name: 'chat',
          match: { path: '/v1/chat/completions' },
          targets: [{ provider: 'openai', retry: {} }, { provider: 'claude', model: 'claude-sonnet-4-6', retry: { backoff: {} } }],
          contextWindowFallback: { provider: 'openai', model: 'gpt-4.1', retry: {} },
          park: {},
          budget: { repeats: {} },
          retry: { backoff: {} },
        },
      ],
      passthrough: { provider: 'openai', paths: ['/v1/files'] },
      auth: { keys: { a: 'key-aaaa' }, limits: { a: { requestsPerMinute: 6 } } },
      state: {},
      drain: {},
      idempotency: {},
      server: {},
    });
    const plain = configFields().filter((f) => f.default !== undefined && (typeof f.default !== 'object' || Array.isArray(f.default)));
    expect(plain.length).toBeGreaterThan(60);
    for (const field of plain) {
      const values = valuesAt(parsed, field.path);
      expect(values.length, `${field.path} is not reached`).toBeGreaterThan(0);
      for (const value of values) expect(value, field.path).toEqual(field.default);
      expect(field.description, field.path).toContain(`Default: ${Array.isArray(field.default) ? '[' : String(field.default)}`);
    }
  });

  it('pools.classes, written, replaces the default classes whole, as its description says: a class left out is gone, one written takes minShare 0 and maxQueue 1000', () => {
    const parse = (pools: object) =>
      ConfigSchema.safeParse({
        providers: { openai: { family: 'openai', baseUrl: 'https://api.openai.com/v1', apiKey: 'sk-x', pools } },
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'openai' }] }],
      });
    const untouched = parse({});
    expect(untouched.success && untouched.data.providers.openai!.pools.classes).toEqual({ online: { minShare: 0.5, maxShare: 1, maxQueue: 1000 }, batch: { minShare: 0.1, maxShare: 1, maxQueue: 10_000 } });
    const written = parse({ classes: { online: { maxQueue: 2000 } } });
    expect(written.success && written.data.providers.openai!.pools.classes).toEqual({ online: { minShare: 0, maxShare: 1, maxQueue: 2000 } });
    const doc = configFields().find((f) => f.path === 'providers.<name>.pools.classes')!.description!;
    expect(doc).toMatch(/replaces (these|the default classes) whole/);
    expect(doc).toMatch(/minShare 0, maxQueue 1000\)/);
  });
});

describe('the error table: park_queue_full', () => {
  const startStack = useStacks();

  it('invites the client back (x-should-retry: true) only when the target is back within 60 s, as its row says; past that, retry-after alone', async () => {
    const row = README.split('\n').find((l) => l.startsWith('| `park_queue_full` |'))!;
    expect(row).toMatch(/`x-should-retry: true` when (that is )?(with)?in 60 s/);
    // A provider that refuses connections, its breaker opened by one failure for `openS`; one request parked (the
    // queue's only place), the next turned away. Parked requests probe after probeWhileParkedMs: set past openS here.
    const turnedAway = async (openS: number) => {
      const s = await startStack({
        config: (mockUrl) => {
          const base = defaultConfig(mockUrl, RETRY_LOOP_ONLY);
          const down = { family: 'openai' as const, baseUrl: 'http://127.0.0.1:9/v1', apiKey: TEST_KEY, breaker: { consecutiveFailures: 1, openS, probeWhileParkedMs: openS * 1000, probeWhileParkedMaxMs: openS * 1000 } };
          return { ...base, providers: { ...base.providers, down }, routes: [{ name: 'parked', match: { path: '/v1/completions' }, targets: [{ provider: 'down' }], retry: { maxAttempts: 1 }, park: { maxQueue: 1 }, timeoutMs: 2 * openS * 1000 }] };
        },
      });
      const completion = (signal?: AbortSignal): Promise<Response> => fetch(`${s.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', prompt: 'hi' }), signal });
      await (await completion()).arrayBuffer(); // 502, the breaker opens
      // Parked: the route's deadline (twice openS) leaves time for the probe; the client leaves at the end.
      const leave = new AbortController();
      const waiting = completion(leave.signal).catch(() => undefined);
      await sleep(300);
      const full = await completion();
      const body = (await full.json()) as { error: { code: string } };
      leave.abort();
      await waiting;
      await s.close();
      return { status: full.status, code: body.error.code, shouldRetry: full.headers.get('x-should-retry'), retryAfter: Number(full.headers.get('retry-after')) };
    };
    const soon = await turnedAway(30);
    expect(soon).toMatchObject({ status: 503, code: 'park_queue_full', shouldRetry: 'true' });
    expect(soon.retryAfter).toBeGreaterThan(20);
    expect(soon.retryAfter).toBeLessThanOrEqual(31);
    const late = await turnedAway(300);
    expect(late).toMatchObject({ status: 503, code: 'park_queue_full', shouldRetry: 'false' });
    expect(late.retryAfter).toBeGreaterThan(60);
  });
});
