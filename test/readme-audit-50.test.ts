// README claims checked as a new user meets them (audit 50): the Quick start's examples in config/examples, each
// started as its own comments say against the bundled mock (a redis-server of the test's own for the fleet), driven
// with the official openai and Anthropic SDKs; config/docker.yaml's scrape against the Grafana dashboard and the
// Prometheus rules; the errors `npm start` gives for the commonest config mistakes. What config-examples.test.ts and
// audits 44-49 already hold is not repeated. Found: four examples read variables their header does not name (the
// README says each names them at its top), fixed in the examples; a loop through a translated Anthropic target (the
// failover example with ANTHROPIC_BASE_URL set to the gateway, which its comment warns of) reached the client as a
// 508 without its `loop_detected` code: the translation now keeps an error code the upstream named.
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { parse as parseYaml } from 'yaml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfigFile } from '../src/config/load.ts';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { freePort } from './helpers/free-port.ts';
import { useGatewayProcesses, waitReady } from './helpers/gateway-process.ts';
import { mockCli } from './helpers/mock-cli.ts';
import { startRedis, type RedisHandle } from './helpers/redis-server.ts';
import { eventually } from './helpers/redis-stores.ts';
import { TEST_KEY, parseMetrics, useExtraMocks, useGateways, useStacks } from './helpers/stack.ts';

const ROOT = join(import.meta.dirname, '..');
const EXAMPLES = join(ROOT, 'config/examples');
const read = (path: string): string => readFileSync(join(ROOT, path), 'utf8');
const example = (name: string) => join(EXAMPLES, name);
const hi = [{ role: 'user' as const, content: 'hi' }];
const openai = (baseURL: string, apiKey = 'unused') => new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const claude = (baseURL: string) => new Anthropic({ baseURL, apiKey: 'unused', maxRetries: 0, logLevel: 'off' });
const lines = (logs: string[]) => logs.flatMap((l) => l.split('\n')).filter(Boolean).map((l) => JSON.parse(l) as Record<string, any>);
const requestLines = (logs: string[]) => lines(logs).filter((l) => l.msg === 'request');

async function rejection(p: Promise<unknown>): Promise<any> {
  return p.then(() => undefined, (e: unknown) => e);
}

describe('config/examples: the header of each file', () => {
  it('names every environment variable the file reads, as the README says ("Each names, at its top, ...")', () => {
    const files = readdirSync(EXAMPLES).filter((f) => f.endsWith('.yaml'));
    expect(files.length).toBeGreaterThanOrEqual(5);
    for (const file of files) {
      const text = readFileSync(example(file), 'utf8');
      const header = text.slice(0, text.search(/^[^#\n]/m));
      const body = text.slice(header.length).split('\n').filter((l) => !l.trimStart().startsWith('#')).join('\n');
      const read = new Set([...body.matchAll(/\$\{([A-Z0-9_]+)/g)].map((m) => m[1]!));
      expect(read.size, file).toBeGreaterThan(0);
      for (const name of read) expect(header, `${file}: ${name}`).toMatch(new RegExp(`\\b${name}\\b`));
    }
  });
});

describe('openai-anthropic-failover.yaml, driven as its comments say', () => {
  const stack = useStacks();
  const gateways = useGateways();
  const mocks = useExtraMocks();
  const env = (mockUrl: string, extra: Record<string, string> = {}) => ({ OPENAI_BASE_URL: `${mockUrl}/v1`, OPENAI_API_KEY: TEST_KEY, ANTHROPIC_BASE_URL: mockUrl, ANTHROPIC_API_KEY: TEST_KEY, ...extra });

  it('sends gpt-4.1-mini to Claude Haiku when OpenAI fails, a prompt too long for gpt-4o to gpt-4.1, and embeddings to OpenAI alone', async () => {
    const s = await stack({ config: (url) => loadConfigFile(example('openai-anthropic-failover.yaml'), env(url)) as ConfigInput });
    s.mock.setFaults({
      models: {
        'gpt-4.1-mini': { errors: [{ status: 503 }] },
        'gpt-4o': { errors: [{ status: 400, code: 'context_length_exceeded', message: "This model's maximum context length is 128000 tokens." }] },
      },
    });
    const small = await openai(s.baseURL).chat.completions.create({ model: 'gpt-4.1-mini', messages: hi }).withResponse();
    expect(small.data.model).toBe('claude-haiku-4-5');
    expect(small.response.headers.get('x-stormgate-route')).toBe('chat-small');
    expect(small.response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(small.response.headers.get('x-stormgate-attempts')).toBe('4'); // retry's default maxAttempts 3, then Anthropic

    const long = await openai(s.baseURL).chat.completions.create({ model: 'gpt-4o', messages: hi }).withResponse();
    expect(long.data.model).toBe('gpt-4.1');
    expect(long.response.headers.get('x-stormgate-fallback')).toBe('context_length');
    expect(long.response.headers.get('x-stormgate-target')).toBe('openai/gpt-4.1');

    s.mock.setFaults({ errors: [{ status: 503 }] });
    const err = await rejection(openai(s.baseURL).embeddings.create({ model: 'text-embedding-3-small', input: 'hi' }));
    expect(err.status).toBe(503);
    expect(s.mock.requests().filter((r) => r.path === '/v1/embeddings')).toHaveLength(3);
    expect(s.mock.requests().some((r) => r.path === '/v1/messages' && r.model !== 'claude-haiku-4-5')).toBe(false);
  });

  it('with ANTHROPIC_BASE_URL set to the gateway itself (the comment\'s warning), a request failed over to Claude gets 508 loop_detected', async () => {
    const mock = await mocks({ apiKey: TEST_KEY });
    mock.setFaults({ errors: [{ status: 503 }] });
    const port = await freePort();
    const config = loadConfigFile(example('openai-anthropic-failover.yaml'), env(mock.url, { ANTHROPIC_BASE_URL: `http://127.0.0.1:${port}` }));
    const logs: string[] = [];
    const url = await gateways(config, { port, logs });
    const err = await rejection(openai(`${url}/v1`).chat.completions.create({ model: 'gpt-4o', messages: hi }));
    expect(err.status).toBe(508);
    expect(err.code).toBe('loop_detected');
    expect(err.headers.get('x-should-retry')).toBe('false');
    const outer = requestLines(logs).find((l) => l.path === '/v1/chat/completions')!;
    expect(outer).toMatchObject({ target: 'anthropic/claude-sonnet-4-6', errorCode: 'loop_detected' });
    // The copy that came back was answered at once: one hop, no storm.
    expect(requestLines(logs).filter((l) => l.path === '/v1/messages')).toHaveLength(1);
  });
});

describe('anthropic-agents.yaml, started as the README\'s Quick start says', () => {
  const startProcess = useGatewayProcesses();
  const mocks = useExtraMocks();

  it('says the backup without its key is skipped; serves the Anthropic SDK (whole, streamed, count_tokens), Claude Code\'s ?beta=true, and a body past 10 MiB', async () => {
    const mock = await mocks();
    const port = await freePort();
    const g = startProcess('anthropic-agents', read('config/examples/anthropic-agents.yaml').replace('port: 8080', `port: ${port}`), {
      ANTHROPIC_UPSTREAM_URL: mock.url,
      ANTHROPIC_API_KEY: 'any',
      ANTHROPIC_BACKUP_API_KEY: undefined,
      ANTHROPIC_BACKUP_UPSTREAM_URL: undefined,
    });
    await waitReady(g, port);
    const warning = g.output().split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as Record<string, any>).find((l) => l.provider === 'anthropic-backup');
    expect(warning).toMatchObject({ level: 40, msg: 'provider anthropic-backup is optional and has no key: disabled, its targets are skipped' });

    const url = `http://127.0.0.1:${port}`;
    const whole = await claude(url).messages.create({ model: 'claude-sonnet-4-6', max_tokens: 64, messages: hi }).withResponse();
    expect(whole.data.content[0]!.type).toBe('text');
    expect(whole.response.headers.get('x-stormgate-route')).toBe('claude-agents');
    expect(whole.response.headers.get('request-id')).toMatch(/^req_/);
    const streamed = await claude(url).messages.stream({ model: 'claude-sonnet-4-6', max_tokens: 64, messages: hi }).finalMessage();
    expect(streamed.stop_reason).toBe('end_turn');
    expect((await claude(url).messages.countTokens({ model: 'claude-sonnet-4-6', messages: hi })).input_tokens).toBeGreaterThan(0);

    // Claude Code sends ?beta=true on both paths; the routes match the path alone.
    for (const path of ['/v1/messages?beta=true', '/v1/messages/count_tokens?beta=true']) {
      const body = path.includes('count') ? { model: 'claude-sonnet-4-6', messages: hi } : { model: 'claude-sonnet-4-6', max_tokens: 16, messages: hi };
      const r = await fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01' }, body: JSON.stringify(body) });
      expect(r.status, path).toBe(200);
      await r.arrayBuffer();
    }
    // bodyLimitBytes 32 MiB: a screenshot-heavy context of 11 MiB gets Anthropic's answer, not the default's 413.
    const big = await fetch(`${url}/v1/messages`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01' },
      body: JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 16, messages: [{ role: 'user', content: 'x'.repeat(11 * 1024 * 1024) }] }),
    });
    expect(big.status).toBe(200);
    await big.arrayBuffer();
  }, 40_000);
});

describe('fleet-redis.yaml: two instances on one redis-server', () => {
  const gateways = useGateways();
  const mocks = useExtraMocks();
  let redis: RedisHandle;
  beforeAll(async () => {
    redis = await startRedis();
  });
  afterAll(async () => {
    await redis?.stop();
  });
  const KEY = 'fleet-client-key';
  const fleet = async (prefix: string) => {
    const mock = await mocks({ apiKey: TEST_KEY });
    const config = loadConfigFile(example('fleet-redis.yaml'), { STORMGATE_API_KEY: KEY, REDIS_URL: redis.url, OPENAI_BASE_URL: `${mock.url}/v1`, OPENAI_API_KEY: TEST_KEY, STORMGATE_FLEET: prefix });
    const logs: string[] = [];
    const a = await gateways(config, { logs });
    const b = await gateways(config, { logs });
    return { mock, a, b, logs };
  };

  it('a 429 with retry-after on one instance holds the other back: its request waits parked, then one attempt', async () => {
    const { mock, a, b, logs } = await fleet(`audit50-hold-${process.pid}`);
    mock.setFaults({ errors: [{ status: 429, times: 1, headers: { 'retry-after': '1' } }] });
    const first = openai(`${a}/v1`, KEY).chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'a' }] });
    await eventually(() => mock.requests().length === 1, 5_000);
    await new Promise((r) => setTimeout(r, 100)); // the hold-off's write to Redis
    const second = await openai(`${b}/v1`, KEY).chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'b' }] }).withResponse();
    expect(second.response.headers.get('x-stormgate-attempts')).toBe('1');
    await first;
    const onB = requestLines(logs).find((l) => l.attempts?.length === 1 && l.parkedMs !== undefined)!;
    expect(onB.parkedMs).toBeGreaterThan(300);
    expect(mock.requests().map((r) => r.status)).toEqual([429, 200, 200]);
    // No key, no answer: it listens on every interface.
    expect((await fetch(`${a}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages: hi }) })).status).toBe(401);
  });

  it('opens the breaker for every instance at once on 5 failures in a row seen by one of them: the other parks its request for a probe', async () => {
    const { mock, a, b, logs } = await fleet(`audit50-breaker-${process.pid}`);
    mock.setFaults({ errors: [{ status: 503 }] });
    await rejection(openai(`${a}/v1`, KEY).chat.completions.create({ model: 'gpt-4o', messages: hi }));
    await new Promise((r) => setTimeout(r, 300)); // "once that instance has had no success for 250 ms": none has come at all
    const secondOnA = openai(`${a}/v1`, KEY).chat.completions.create({ model: 'gpt-4o', messages: hi });
    await eventually(() => lines(logs).some((l) => l.msg === 'breaker open'), 5_000);
    expect(lines(logs).find((l) => l.msg === 'breaker open')).toMatchObject({ cause: 'consecutive_failures', failures: 5, target: 'openai/gpt-4o' });
    expect(mock.requests()).toHaveLength(5);
    // B has sent nothing to the target; its request waits parked (park: maxWaitMs 10 s), sends no attempt of its own,
    // and goes as the breaker's probe (probeWhileParkedMs, 1 s) once the provider answers again.
    const onB = openai(`${b}/v1`, KEY).chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'b' }] });
    await new Promise((r) => setTimeout(r, 200));
    expect(mock.requests()).toHaveLength(5);
    mock.setFaults({});
    await Promise.all([onB, secondOnA]);
    const bLine = requestLines(logs).find((l) => l.attempts.length === 1 && l.status === 200 && l.parkedMs > 0)!;
    expect(bLine.attempts[0]).toMatchObject({ probe: true, status: 200 });
    expect(lines(logs).filter((l) => l.msg === 'breaker open')).toHaveLength(1);
  });

  it('goes on with local state while Redis is gone (readyz degraded, requests served), and is back on Redis when it returns', async () => {
    const { a } = await fleet(`audit50-outage-${process.pid}`);
    const ready = async () => (await (await fetch(`${a}/readyz`)).json()) as { degraded: boolean; store: string };
    expect(await ready()).toMatchObject({ store: 'redis', degraded: false });
    await redis.stop();
    try {
      await eventually(async () => (await ready()).degraded, 10_000);
      const served = await openai(`${a}/v1`, KEY).chat.completions.create({ model: 'gpt-4o', messages: hi });
      expect(served.choices[0]!.message.content).toBeTruthy();
    } finally {
      await redis.restart();
    }
    await eventually(async () => !(await ready()).degraded, 15_000);
  }, 40_000);
});

describe('priority-pools.yaml against the mock its comment starts (npm run mock -- --rate-limit-rpm 5000 ...)', () => {
  const runMock = mockCli();
  const gateways = useGateways();

  it('paces a burst of 200 online calls under the mock\'s limits (no 429 upstream), and refuses the batch key past its burst with 429 client_rate_limited', async () => {
    const mock = await runMock(['--rate-limit-rpm', '5000', '--rate-limit-tpm', '800000', '--rate-limit-burst-seconds', '1', '--quiet']);
    const config = loadConfigFile(example('priority-pools.yaml'), { OPENAI_BASE_URL: `${mock.url}/v1`, OPENAI_API_KEY: 'any', STORMGATE_KEY_AGENTS: 'a', STORMGATE_KEY_BATCH: 'b' });
    const url = await gateways(config);
    const agents = await Promise.allSettled(Array.from({ length: 200 }, () => openai(`${url}/v1`, 'a').chat.completions.create({ model: 'gpt-4o', messages: hi })));
    expect(agents.filter((r) => r.status === 'fulfilled')).toHaveLength(200);
    const stats = (await (await fetch(`${mock.url}/_mock/stats`)).json()) as { byStatus: Record<string, number>; rateLimited: Record<string, number> };
    expect(stats.byStatus).toEqual({ 200: 200 });
    expect(stats.rateLimited).toEqual({ requests: 0, tokens: 0 });

    // batch-jobs: 600 requests per minute, a burst of ten seconds' worth (100), refilled at 10 a second meanwhile.
    const started = Date.now();
    const batch = await Promise.allSettled(Array.from({ length: 130 }, () => openai(`${url}/v1`, 'b').chat.completions.create({ model: 'gpt-4o-mini-batch', messages: hi })));
    const seconds = (Date.now() - started) / 1000;
    const refused = batch.flatMap((r) => (r.status === 'rejected' ? [r.reason as any] : []));
    expect(refused.length).toBeGreaterThan(0);
    expect(130 - refused.length).toBeGreaterThanOrEqual(100);
    expect(130 - refused.length).toBeLessThanOrEqual(100 + Math.ceil(seconds * 10) + 1);
    expect(refused[0]).toMatchObject({ status: 429, code: 'client_rate_limited' });
    expect(Number(refused[0].headers.get('retry-after-ms'))).toBeGreaterThan(0);
    expect(refused[0].message).toContain('client "batch-jobs" is over its rate of 600 requests per minute (burst 100)');
  }, 40_000);
});

describe('self-hosted-with-cloud-backup.yaml', () => {
  const stack = useStacks();
  const mocks = useExtraMocks();

  it('sends the local server the default model and key "none", opens its breaker after 3 failures, then goes straight to OpenAI; passthrough answers 405 with its methods', async () => {
    const vllm = await mocks();
    const s = await stack({ config: (url) => loadConfigFile(example('self-hosted-with-cloud-backup.yaml'), { OPENAI_BASE_URL: `${url}/v1`, OPENAI_API_KEY: TEST_KEY, VLLM_BASE_URL: `${vllm.url}/v1` }) as ConfigInput });
    const local = await openai(s.baseURL).chat.completions.create({ model: 'anything', messages: hi });
    expect(local.model).toBe('meta-llama/Llama-3.1-8B-Instruct');
    expect(vllm.requests()[0]!.headers.authorization).toBe('Bearer none');
    await new Promise((r) => setTimeout(r, 300)); // the breaker opens once no success has come for 250 ms

    vllm.setFaults({ errors: [{ status: 503 }] });
    const first = await openai(s.baseURL).chat.completions.create({ model: 'anything', messages: hi }).withResponse();
    expect(first.response.headers.get('x-stormgate-target')).toBe('openai/gpt-4o-mini');
    expect(first.response.headers.get('x-stormgate-attempts')).toBe('3'); // maxAttempts 2 on the local server
    await openai(s.baseURL).chat.completions.create({ model: 'anything', messages: hi });
    expect(lines(s.logs).find((l) => l.msg === 'breaker open')).toMatchObject({ target: 'vllm/meta-llama/Llama-3.1-8B-Instruct', failures: 3 });
    const before = vllm.requests().length;
    const skipped = await openai(s.baseURL).chat.completions.create({ model: 'anything', messages: hi }).withResponse();
    expect(skipped.response.headers.get('x-stormgate-fallback')).toBe('breaker_open');
    expect(skipped.response.headers.get('x-stormgate-attempts')).toBe('1');
    expect(vllm.requests()).toHaveLength(before);

    const put = await fetch(`${s.url}/v1/files/file-abc`, { method: 'PUT' });
    expect(put.status).toBe(405);
    expect(put.headers.get('allow')!.split(/,\s*/).sort()).toEqual(['DELETE', 'GET', 'HEAD', 'POST']);
  });
});

describe('config/docker.yaml scraped, against grafana/dashboards and the Prometheus rules', () => {
  const stack = useStacks();

  it('exports every stormgate_* metric a panel or rule reads, with series for the request and pool figures after one stream', async () => {
    const s = await stack({
      config: (url) => {
        const c = loadConfigFile(join(ROOT, 'config/docker.yaml'), { STORMGATE_API_KEY: 'demo', OPENAI_BASE_URL: `${url}/v1`, OPENAI_API_KEY: TEST_KEY }) as ConfigInput;
        return { ...c, server: { ...c.server, host: '127.0.0.1' } };
      },
    });
    const stream = await openai(s.baseURL, 'demo').chat.completions.create({ model: 'gpt-4o-mini', stream: true, stream_options: { include_usage: true }, messages: hi });
    for await (const _ of stream) void _;
    const text = await (await fetch(`${s.url}/metrics`)).text();
    const typed = new Set([...text.matchAll(/^# TYPE (\S+)/gm)].map((m) => m[1]!));
    const withSeries = new Set(parseMetrics(text).map((m) => m.name));

    const dashboard = JSON.parse(read('grafana/dashboards/stormgate.json')) as { panels: { targets?: { expr: string }[]; panels?: unknown[] }[] };
    const exprs: string[] = [];
    const walk = (p: { targets?: { expr: string }[]; panels?: unknown[] }) => {
      for (const t of p.targets ?? []) exprs.push(t.expr);
      for (const inner of p.panels ?? []) walk(inner as typeof p);
    };
    dashboard.panels.forEach(walk);
    for (const file of ['recording.yml', 'alerts.yml']) {
      for (const g of (parseYaml(read(`grafana/prometheus/rules/${file}`)) as { groups: { rules: { expr: unknown }[] }[] }).groups) exprs.push(...g.rules.map((r) => String(r.expr)));
    }
    const used = new Set(exprs.flatMap((e) => [...e.matchAll(/\bstormgate_\w+/g)].map((m) => m[0])));
    expect(used.size).toBeGreaterThan(20);
    for (const name of used) expect(typed.has(name.replace(/_(bucket|sum|count)$/, '')) || typed.has(name), name).toBe(true);
    for (const name of ['stormgate_requests_total', 'stormgate_upstream_attempts_total', 'stormgate_ttft_seconds_bucket', 'stormgate_request_duration_seconds_bucket', 'stormgate_tokens_total', 'stormgate_stream_ends_total', 'stormgate_pool_in_use', 'stormgate_pool_limit', 'stormgate_breaker_state', 'stormgate_state_degraded']) {
      expect(withSeries.has(name), name).toBe(true);
    }
  });
});

describe('the commonest config mistakes, as npm start reports them', () => {
  const startProcess = useGatewayProcesses();

  it('exits 2 under "stormgate: invalid config" with a line per mistake: file, line, YAML path, what was expected and what was found', async () => {
    const text = [
      'server:',
      '  port: "8080"',
      'providers:',
      '  openai: { family: openai, baseUrl: "${AUDIT50_UNSET_URL}", apiKey: "sk-x" }',
      '  claude: { family: antropic, baseUrl: "http://127.0.0.1:9", apiKey: "x" }',
      'routes:',
      '  - name: chat',
      '    match: { path: v1/chat/completions }',
      '    targets: { provider: openai }',
      '    timeoutMs: 30s',
      '    retry:',
      '      maxAttempt: 3',
      '      retryOn: [503, "5xx"]',
      '      backoff: { strategy: full_jitter }',
      '',
    ].join('\n');
    const g = startProcess('mistakes', text, { AUDIT50_UNSET_URL: undefined });
    expect(await g.exited).toBe(2);
    const out = g.output();
    expect(out).toMatch(/^stormgate: invalid config\n/);
    // A variable that is unset is said first, alone (the file cannot be checked further without its value).
    expect(out).toContain(`${g.file}:4: providers.openai.baseUrl: environment variable AUDIT50_UNSET_URL is not set`);
    const fixed = startProcess('mistakes-2', text.replace('${AUDIT50_UNSET_URL}', 'http://127.0.0.1:9/v1'));
    expect(await fixed.exited).toBe(2);
    const said = fixed.output();
    for (const line of [
      `:2: server.port: expected number, received string ("8080")`,
      `:5: providers.claude.family: expected one of: openai, anthropic, azure-openai, received "antropic"; did you mean "anthropic"?`,
      `:8: routes[0].match.path: must start with "/", received "v1/chat/completions"; write "/v1/chat/completions"`,
      `:9: routes[0].targets: expected list, received object`,
      `:10: routes[0].timeoutMs: expected number, received string ("30s"); timeoutMs is a plain number of milliseconds: write timeoutMs: 30000`,
      `:12: routes[0].retry: unknown key "maxAttempt"; did you mean "maxAttempts"?`,
      `:13: routes[0].retry.retryOn[1]: expected an HTTP status as a whole number from 400 to 599 (503, not 5xx) or one of: network, timeout, received "5xx"`,
      `:14: routes[0].retry.backoff.strategy: expected one of: full-jitter, equal-jitter, decorrelated-jitter, exponential, fixed, received "full_jitter"; did you mean "full-jitter"?`,
    ]) {
      expect(said, line).toContain(`${fixed.file}${line}`);
    }
    // The schema the README's reference is generated from accepts the corrected file.
    expect(ConfigSchema.safeParse(parseYaml(text.replace('${AUDIT50_UNSET_URL}', 'http://127.0.0.1:9/v1').replace('"8080"', '8080').replace('antropic', 'anthropic').replace('v1/chat', '/v1/chat').replace('{ provider: openai }', '[ { provider: openai } ]').replace('30s', '30000').replace('maxAttempt:', 'maxAttempts:').replace(', "5xx"', '').replace('full_jitter', 'full-jitter'))).success).toBe(true);
  }, 30_000);
});
