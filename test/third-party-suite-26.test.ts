// A twenty-sixth third-party suite, written from the README alone (Quick start, "Failover and API families", "Retry
// budget, circuit breaker, hold-offs, parking", "Priority pools", "Client keys", "Paths", the configuration reference)
// and the commented configs in config/examples/, as an outside platform team would test the gateway over the weeks they
// CONFIGURE it: each shipped example copied to a temp dir (only its ports and addresses rewritten, its ${VARS} pointed
// at mocks) and driven with the one fault its comments say it is for; then a config that grows (routes by model, an
// alias, weighted targets, a backup, per-route and per-target retry, passthrough paths opened one by one, client keys
// turned on later, --port on the command line); then the mistakes a team makes while editing YAML, each run as a real
// `node --import tsx src/main.ts --config FILE` process that must exit 2 with one line per problem, its file, line and
// YAML path, and no secret.
// Real HTTP on 127.0.0.1, the official openai and @anthropic-ai/sdk clients, the bundled mock provider, a real
// redis-server for the fleet example. Bounds are generous (a loaded 2-core machine).
// Found: an anchor misuse (`<<: *defualts`, an alias to an anchor never set, a merge of a scalar) failed with the YAML
// library's words and no line nor YAML path ("gw.yaml: Merge sources must be maps or map aliases"), against the README's
// "the file, the line, the YAML path and what was expected": fixed in src/config/load.ts (the alias's line, its path,
// the anchor names set before it and the closest one). A tab in the indentation gave one clear line and four more of
// the parser's cascade about lines that were fine: now the tab's line only. auth.keys written as a list was "expected
// map of name to object" (a key is a string): now "map of name to string".
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { afterAll, describe, expect, it } from 'vitest';
import { loadConfigFile } from '../src/config/load.ts';
import type { MockServer } from '../src/mock/server.ts';
import { freePort } from './helpers/free-port.ts';
import { useGatewayProcesses, waitReady } from './helpers/gateway-process.ts';
import { expectOpenAIError, sdkError } from './helpers/openai-error.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { parseMetrics, useExtraMocks, useGateways, type MetricSample } from './helpers/stack.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();
const startProcess = useGatewayProcesses();
const redis = useRedisServer();

const EXAMPLES = resolve(import.meta.dirname, '../config/examples');
const CHAT = '/v1/chat/completions';
const messages = [{ role: 'user' as const, content: 'Summarise the incident in one line.' }];

/** Provider keys: each mock accepts only its own, so every answer proves the gateway swapped the client's key. */
const OPENAI_KEY = 'sk-s26-openai-0123456789abcdef';
const ANTHROPIC_KEY = 'sk-ant-s26-primary-0123456789';
const BACKUP_KEY = 'sk-ant-s26-backup-9876543210';
const AGENTS_KEY = 'sg-s26-agents-key-0123456789';
const BATCH_KEY = 'sg-s26-batch-key-0123456789';

const dir = mkdtempSync(join(tmpdir(), 'stormgate-s26-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/**
 * An example copied as the team would: the same text, with only its listener moved to a free loopback port (the
 * in-process gateway listens on its own port; a process gets `port`), written to the suite's temp dir.
 */
function copyExample(name: string, port = 0): string {
  const text = readFileSync(join(EXAMPLES, name), 'utf8')
    .replace(/host: 0\.0\.0\.0/g, 'host: 127.0.0.1')
    .replace(/port: 8080/g, `port: ${port}`);
  const file = join(dir, name);
  writeFileSync(file, text);
  return file;
}

let fileSeq = 0;
/** A config the team writes by hand, as YAML text in a file. */
function yamlFile(text: string): string {
  const file = join(dir, `gw-${fileSeq++}.yaml`);
  writeFileSync(file, text);
  return file;
}

async function gatewayFrom(file: string, env: NodeJS.ProcessEnv, logs?: string[]): Promise<string> {
  return startGateway(loadConfigFile(file, env), { logs });
}

const openai = (url: string, apiKey = 'unused-by-the-gateway', counter?: { requests: number }) =>
  new OpenAI({
    baseURL: `${url}/v1`,
    apiKey,
    fetch: async (u, init) => {
      if (counter) counter.requests++;
      return fetch(u, init);
    },
  });

const sumOf = (samples: MetricSample[], name: string, labels: Record<string, string> = {}) =>
  samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v)).reduce((a, s) => a + s.value, 0);
const metrics = async (url: string) => parseMetrics(await (await fetch(`${url}/metrics`)).text());

async function eventually(what: string, check: () => boolean | Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`not in ${timeoutMs} ms: ${what}`);
    await sleep(20);
  }
}

/** A raw chat completion (curl's view): status, headers, body. */
async function rawChat(url: string, body: object, headers: Record<string, string> = {}) {
  const t0 = performance.now();
  const res = await fetch(`${url}${CHAT}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
  const json = (await res.json().catch(() => undefined)) as Record<string, any> | undefined; // eslint-disable-line @typescript-eslint/no-explicit-any -- JSON read by field
  return { status: res.status, headers: res.headers, body: json, ms: performance.now() - t0 };
}

const chatsAt = (mock: MockServer) => mock.requests().filter((r) => r.path === CHAT);

describe('each shipped example under the fault its comments say it is for', () => {
  it('openai-anthropic-failover: during an OpenAI brownout the OpenAI SDK is answered by Claude, in the OpenAI shape, per model size', async () => {
    const primary = await startMock({ apiKey: OPENAI_KEY });
    const claude = await startMock({ apiKey: ANTHROPIC_KEY });
    const url = await gatewayFrom(copyExample('openai-anthropic-failover.yaml'), {
      OPENAI_BASE_URL: `${primary.url}/v1`,
      OPENAI_API_KEY: OPENAI_KEY,
      ANTHROPIC_BASE_URL: claude.url,
      ANTHROPIC_API_KEY: ANTHROPIC_KEY,
    });
    const client = openai(url);
    // Healthy: OpenAI answers, nothing reaches Claude.
    const calm = await client.chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(calm.response.headers.get('x-stormgate-target')).toBe('openai/gpt-4o');
    expect(claude.requests()).toHaveLength(0);

    primary.brownout('503', 60_000);
    const big = await client.chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(big.data.object).toBe('chat.completion');
    expect(typeof big.data.choices[0]!.message.content).toBe('string');
    expect(big.data.choices[0]!.finish_reason).toBe('stop');
    // The answer's model and usage are the fallback's own, so cost dashboards bill Claude.
    expect(big.data.model).toBe('claude-sonnet-4-6');
    expect(big.data.usage?.total_tokens).toBeGreaterThan(0);
    expect(big.response.headers.get('x-stormgate-target')).toBe('anthropic/claude-sonnet-4-6');
    expect(big.response.headers.get('x-stormgate-fallback')).toBeTruthy();

    // The small-model route: gpt-4o-mini goes to Haiku, and a stream comes back as chat.completion.chunk events.
    const stream = await client.chat.completions.create({ model: 'gpt-4o-mini', messages, stream: true }).withResponse();
    expect(stream.response.headers.get('x-stormgate-target')).toBe('anthropic/claude-haiku-4-5');
    let text = '';
    for await (const chunk of stream.data) {
      expect(chunk.object).toBe('chat.completion.chunk');
      text += chunk.choices[0]?.delta?.content ?? '';
    }
    expect(text.length).toBeGreaterThan(0);
    // Claude got Messages API requests with its own key and the mapped models (the mock refused any other key).
    const sent = claude.requests().filter((r) => r.path === '/v1/messages');
    expect(sent.map((r) => r.model).sort()).toEqual(['claude-haiku-4-5', 'claude-sonnet-4-6']);
    expect(sent.every((r) => r.headers['x-api-key'] === ANTHROPIC_KEY && r.headers['authorization'] === undefined)).toBe(true);
  });

  it('priority-pools: under a batch flood past maxConcurrent, online requests go upstream ahead of the queued batch and stay fast', async () => {
    // Answers take 0.3 to 1.2 s, so the 100 slots free one by one while the flood's 30 extra batch requests queue.
    const mock = await startMock({ apiKey: OPENAI_KEY, faults: { latencyMs: 300, latencyJitterMs: 900 } });
    const url = await gatewayFrom(copyExample('priority-pools.yaml'), {
      OPENAI_BASE_URL: `${mock.url}/v1`,
      OPENAI_API_KEY: OPENAI_KEY,
      STORMGATE_KEY_AGENTS: AGENTS_KEY,
      STORMGATE_KEY_BATCH: BATCH_KEY,
    });
    const auth = { authorization: `Bearer ${AGENTS_KEY}` };
    // The batch job's own model name: the route sends gpt-4o-mini in the batch class.
    const flood = Array.from({ length: 130 }, () => rawChat(url, { model: 'gpt-4o-mini-batch', messages }, auth));
    await eventually('the batch flood holds all 100 slots', () => chatsAt(mock).length >= 100);
    const online = await Promise.all(Array.from({ length: 5 }, () => rawChat(url, { model: 'gpt-4o', messages }, auth)));
    const batch = await Promise.all(flood);
    expect(batch.map((a) => a.status)).toEqual(Array(130).fill(200));
    expect(online.map((a) => a.status)).toEqual(Array(5).fill(200));
    expect(batch.every((a) => a.body?.model === 'gpt-4o-mini')).toBe(true);
    // Upstream order: the 5 online requests went out right after the first 100 batch ones, before most of the 30 queued.
    const order = chatsAt(mock).map((r) => r.model);
    expect(order.filter((m) => m === 'gpt-4o-mini')).toHaveLength(130);
    const lastOnline = order.lastIndexOf('gpt-4o');
    console.info(`s26 priority-pools: online upstream positions ${order.flatMap((m, i) => (m === 'gpt-4o' ? [i + 1] : [])).join(',')} of 135; online ms ${online.map((a) => Math.round(a.ms)).join(',')}`);
    // First come first served would put them at 131 to 135; the bound leaves room for batch requests that got a slot
    // while the online ones were still on their way in (a loaded machine: slots free at about 130 a second).
    expect(lastOnline + 1).toBeLessThanOrEqual(120);
    expect(Math.max(...online.map((a) => a.ms))).toBeLessThan(5_000);

    // The batch team's key caps it at the batch class: its flood past its burst (600 a minute: 100 at once) is refused
    // before the pools, with retry-after-ms, and never reaches the provider.
    const sentBefore = chatsAt(mock).length;
    mock.setFaults({});
    const batchTeam = await Promise.all(Array.from({ length: 110 }, () => rawChat(url, { model: 'gpt-4o', messages }, { authorization: `Bearer ${BATCH_KEY}` })));
    const refused = batchTeam.filter((a) => a.status === 429);
    expect(batchTeam.filter((a) => a.status === 200).length).toBeLessThanOrEqual(101);
    expect(refused.length).toBeGreaterThanOrEqual(9);
    expectOpenAIError(refused[0]!.body, 'client_rate_limited', 'rate_limit_error');
    expect(Number(refused[0]!.headers.get('retry-after-ms'))).toBeGreaterThan(0);
    expect(chatsAt(mock).length - sentBefore).toBe(batchTeam.length - refused.length);
  });

  it('self-hosted-with-cloud-backup: with the local server down, OpenAI answers fast as gpt-4o-mini, the breaker stops trying it, files pass through', async () => {
    const local = await startMock();
    const localUrl = local.url;
    await local.close(); // the GPU box is down: connections are refused
    const cloud = await startMock({ apiKey: OPENAI_KEY });
    const url = await gatewayFrom(copyExample('self-hosted-with-cloud-backup.yaml'), {
      VLLM_BASE_URL: `${localUrl}/v1`,
      OPENAI_BASE_URL: `${cloud.url}/v1`,
      OPENAI_API_KEY: OPENAI_KEY,
    });
    const client = openai(url);
    const reasons: string[] = [];
    for (let i = 0; i < 6; i++) {
      const t0 = performance.now();
      const { data, response } = await client.chat.completions.create({ model: 'anything-the-app-sends', messages }).withResponse();
      expect(performance.now() - t0).toBeLessThan(5_000);
      expect(data.model).toBe('gpt-4o-mini');
      expect(response.headers.get('x-stormgate-target')).toBe('openai/gpt-4o-mini');
      reasons.push(response.headers.get('x-stormgate-fallback') ?? '');
    }
    console.info(`s26 self-hosted: fallback reasons ${reasons.join(',')}`);
    // The first request tried the local server twice (maxAttempts: 2); three failures in a row open its breaker,
    // after which requests go to OpenAI at once.
    expect(reasons[0]).toBe('retries_exhausted');
    expect(reasons.at(-1)).toBe('breaker_open');
    expect(reasons.slice(reasons.indexOf('breaker_open'))).toEqual(Array(reasons.length - reasons.indexOf('breaker_open')).fill('breaker_open'));
    expect(sumOf(await metrics(url), 'stormgate_breaker_state', { target: 'vllm/meta-llama/Llama-3.1-8B-Instruct' })).toBeGreaterThan(0);
    // The whole app saw every model as the route's first target's (the listing says so).
    const models = await client.models.list();
    expect(models.data.map((m) => m.id)).toContain('meta-llama/Llama-3.1-8B-Instruct');

    // Files and batches go straight to OpenAI with its key, once; an endpoint not listed stays 404 at the gateway.
    const files = await fetch(`${url}/v1/files?purpose=batch`, { headers: { authorization: 'Bearer sk-client-own' } });
    await files.arrayBuffer();
    expect(files.headers.get('x-should-retry')).toBe('false');
    const filesUp = cloud.requests().filter((r) => r.path === '/v1/files');
    expect(filesUp).toHaveLength(1);
    expect(filesUp[0]!.headers['authorization']).toBe(`Bearer ${OPENAI_KEY}`);
    const del = await fetch(`${url}/v1/batches/batch_abc`, { method: 'DELETE' });
    await del.arrayBuffer();
    expect(cloud.requests().filter((r) => r.path === '/v1/batches/batch_abc' && r.method === 'DELETE')).toHaveLength(1);
    const put = await fetch(`${url}/v1/files/file_1`, { method: 'PUT', body: '{}' });
    expect(put.status).toBe(405);
    await put.arrayBuffer();
    const other = await fetch(`${url}/v1/assistants`);
    expect(other.status).toBe(404);
    expectOpenAIError(await other.json(), 'unknown_url');
    expect(cloud.requests().some((r) => r.path === '/v1/assistants' || r.method === 'PUT')).toBe(false);
  });

  it('fleet-redis: two instances on one real redis-server share the breaker; the second sends nothing to the failing provider', async () => {
    const mock = await startMock({ apiKey: OPENAI_KEY, faults: { errors: [{ status: 503 }] } });
    const env = {
      STORMGATE_API_KEY: AGENTS_KEY,
      REDIS_URL: redis().url,
      OPENAI_BASE_URL: `${mock.url}/v1`,
      OPENAI_API_KEY: OPENAI_KEY,
      STORMGATE_FLEET: `s26-${process.pid}-${Date.now()}`,
    };
    const file = copyExample('fleet-redis.yaml');
    const a = await gatewayFrom(file, env);
    const b = await gatewayFrom(file, env);
    const auth = { authorization: `Bearer ${AGENTS_KEY}` };
    // It listens for a load balancer: a client without the key is refused, in the OpenAI shape.
    const anonymous = await rawChat(b, { model: 'gpt-4o', messages });
    expect(anonymous.status).toBe(401);
    expectOpenAIError(anonymous.body, 'invalid_api_key');

    // Instance A meets the outage: five failures in a row open the breaker for the fleet.
    await eventually('instance A answers circuit_open', async () => (await rawChat(a, { model: 'gpt-4o', messages }, { ...auth, 'x-stormgate-timeout-ms': '800' })).body?.error?.code === 'circuit_open', 15_000);
    const seen = chatsAt(mock).length;
    expect(seen).toBeGreaterThanOrEqual(5);
    // Instance B has never sent a request, and holds back at once: no parking in 800 ms, 503 circuit_open, retry-after.
    const fromB = await Promise.all(Array.from({ length: 4 }, () => rawChat(b, { model: 'gpt-4o', messages }, { ...auth, 'x-stormgate-timeout-ms': '800' })));
    for (const answer of fromB) {
      expect(answer.status).toBe(503);
      expectOpenAIError(answer.body, 'circuit_open', answer.body?.error?.type);
      expect(Number(answer.headers.get('retry-after'))).toBeGreaterThan(0);
    }
    expect(chatsAt(mock).length).toBe(seen);
    expect(sumOf(await metrics(b), 'stormgate_breaker_state', { target: 'openai/gpt-4o' })).toBeGreaterThan(0);
  });

  it('anthropic-agents: the Anthropic SDK rides an overload of the first account on the second; without the backup key it is skipped and said so', async () => {
    const first = await startMock({ apiKey: ANTHROPIC_KEY, faults: { errors: [{ status: 529, type: 'overloaded_error', message: 'Overloaded' }] } });
    const second = await startMock({ apiKey: BACKUP_KEY });
    const file = copyExample('anthropic-agents.yaml');
    const env = { ANTHROPIC_UPSTREAM_URL: first.url, ANTHROPIC_API_KEY: ANTHROPIC_KEY, ANTHROPIC_BACKUP_UPSTREAM_URL: second.url, ANTHROPIC_BACKUP_API_KEY: BACKUP_KEY };
    const url = await gatewayFrom(file, env);
    const claude = new Anthropic({ baseURL: url, apiKey: 'sk-ant-agent-own', maxRetries: 0 });
    const { data, response } = await claude.messages.create({ model: 'claude-sonnet-4-6', max_tokens: 256, messages: [{ role: 'user', content: 'hi' }] }).withResponse();
    expect(data.type).toBe('message');
    expect(data.content[0]!.type).toBe('text');
    expect(response.headers.get('x-stormgate-target')).toBe('anthropic-backup/claude-sonnet-4-6');
    expect(response.headers.get('x-stormgate-fallback')).toBeTruthy();
    // Each account got its own key, never the agent's.
    expect(first.requests().every((r) => r.headers['x-api-key'] === ANTHROPIC_KEY)).toBe(true);
    expect(second.requests().every((r) => r.headers['x-api-key'] === BACKUP_KEY)).toBe(true);
    // A stream too, and count_tokens (Claude Code counts before it sends).
    const stream = claude.messages.stream({ model: 'claude-sonnet-4-6', max_tokens: 256, messages: [{ role: 'user', content: 'hi' }] });
    const final = await stream.finalMessage();
    expect(final.stop_reason).toBe('end_turn');
    const counted = await claude.messages.countTokens({ model: 'claude-sonnet-4-6', messages: [{ role: 'user', content: 'hi' }] });
    expect(counted.input_tokens).toBeGreaterThan(0);

    // The same file without ANTHROPIC_BACKUP_API_KEY: starts, says the backup is off, and the overload reaches the SDK as one.
    const logs: string[] = [];
    const alone = await gatewayFrom(file, { ANTHROPIC_UPSTREAM_URL: first.url, ANTHROPIC_API_KEY: ANTHROPIC_KEY }, logs);
    expect(logs.some((l) => l.includes('anthropic-backup') && /disabled|skipped|optional/i.test(l))).toBe(true);
    const soloClient = new Anthropic({ baseURL: alone, apiKey: 'unused', maxRetries: 0, timeout: 4_000 });
    const err = await soloClient.messages.create({ model: 'claude-sonnet-4-6', max_tokens: 64, messages: [{ role: 'user', content: 'hi' }] }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(Anthropic.APIError);
    const apiErr = err as InstanceType<typeof Anthropic.APIError>;
    console.info(`s26 anthropic-agents alone: ${apiErr.status} ${JSON.stringify(apiErr.error)}`);
    expect([529, 503]).toContain(apiErr.status);
  });
});

describe('a config that grows over the weeks', () => {
  const provider = (name: string, mock: MockServer) =>
    `  ${name}:\n    family: openai\n    baseUrl: "${mock.url}/v1"\n    apiKey: "\${${name.toUpperCase()}_KEY}"\n    breaker: false\n`;
  const keys = { PRIMARY_KEY: OPENAI_KEY, BACKUP_KEY: OPENAI_KEY };

  it('routes by match.models, a model alias with a target model, and 404 model_not_found for a model no route serves', async () => {
    const primary = await startMock({ apiKey: OPENAI_KEY });
    const backup = await startMock({ apiKey: OPENAI_KEY });
    const file = yamlFile(`server: { host: 127.0.0.1, port: 0, logLevel: warn }
providers:
${provider('primary', primary)}${provider('backup', backup)}routes:
  - name: small
    match: { path: /v1/chat/completions, models: ["gpt-4o-mini"] }
    targets: [ { provider: backup } ]
  - name: smart
    match: { path: /v1/chat/completions, models: ["smart"] }
    targets: [ { provider: primary, model: gpt-4o } ]
  - name: chat
    match: { path: /v1/chat/completions, models: ["gpt-4o*"] }
    targets: [ { provider: primary } ]
`);
    const url = await gatewayFrom(file, keys);
    const client = openai(url);
    const small = await client.chat.completions.create({ model: 'gpt-4o-mini', messages }).withResponse();
    expect(small.response.headers.get('x-stormgate-route')).toBe('small');
    expect(chatsAt(backup).map((r) => r.model)).toEqual(['gpt-4o-mini']);
    const smart = await client.chat.completions.create({ model: 'smart', messages }).withResponse();
    expect(smart.data.model).toBe('gpt-4o');
    expect(smart.response.headers.get('x-stormgate-target')).toBe('primary/gpt-4o');
    const glob = await client.chat.completions.create({ model: 'gpt-4o-2024-08-06', messages }).withResponse();
    expect(glob.response.headers.get('x-stormgate-route')).toBe('chat');
    expect(chatsAt(primary).map((r) => r.model)).toEqual(['gpt-4o', 'gpt-4o-2024-08-06']);
    const err = await sdkError(client.chat.completions.create({ model: 'llama-3.1-70b', messages }));
    expect(err.status).toBe(404);
    expect(err.code).toBe('model_not_found');
    expect(chatsAt(primary).length + chatsAt(backup).length).toBe(3);
    const listed = (await client.models.list()).data.map((m) => m.id);
    expect(listed).toEqual(expect.arrayContaining(['gpt-4o-mini', 'smart']));
    expect(listed).not.toContain('llama-3.1-70b');
  });

  it('weighted targets spread 3:1 exactly and interleaved; adding a backup turns a brownout into answers', async () => {
    const primary = await startMock({ apiKey: OPENAI_KEY });
    const backup = await startMock({ apiKey: OPENAI_KEY });
    const head = `server: { host: 127.0.0.1, port: 0, logLevel: warn }\nproviders:\n${provider('primary', primary)}${provider('backup', backup)}routes:\n`;
    const weighted = await gatewayFrom(
      yamlFile(`${head}  - name: chat
    match: { path: /v1/chat/completions }
    strategy: weighted
    targets:
      - { provider: primary, weight: 3 }
      - { provider: backup, weight: 1 }
`),
      keys,
    );
    const order: string[] = [];
    for (let i = 0; i < 8; i++) order.push((await rawChat(weighted, { model: 'gpt-4o', messages })).headers.get('x-stormgate-target')!);
    expect(order.filter((t) => t === 'primary/gpt-4o')).toHaveLength(6);
    expect(order.filter((t) => t === 'backup/gpt-4o')).toHaveLength(2);
    expect(order.join(',')).not.toContain('backup/gpt-4o,backup/gpt-4o');

    // Week 1: one target; its brownout reaches the client as a 503 the gateway has already retried.
    primary.reset();
    primary.brownout('503', 60_000);
    const single = await gatewayFrom(yamlFile(`${head}  - name: chat\n    match: { path: /v1/chat/completions }\n    targets: [ { provider: primary } ]\n    retry: { maxAttempts: 2, backoff: { baseMs: 10, capMs: 20 } }\n`), keys);
    const down = await rawChat(single, { model: 'gpt-4o', messages }, { 'x-stormgate-timeout-ms': '3000' });
    // Already retried by the gateway: the SDK is told not to retry it again.
    expect(down.status).toBe(503);
    expect(down.headers.get('x-should-retry')).toBe('false');
    // Week 2: a backup added under the same route: the same brownout is answered by it.
    const withBackup = await gatewayFrom(
      yamlFile(`${head}  - name: chat\n    match: { path: /v1/chat/completions }\n    targets: [ { provider: primary }, { provider: backup } ]\n    retry: { maxAttempts: 2, backoff: { baseMs: 10, capMs: 20 } }\n`),
      keys,
    );
    const saved = await openai(withBackup).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(saved.response.headers.get('x-stormgate-target')).toBe('backup/gpt-4o');
    expect(saved.response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
  });

  it("per-route retry overrides, and a target's retry replacing the route's whole (what it leaves out is the default, not the route's)", async () => {
    const mock = await startMock({ apiKey: OPENAI_KEY, faults: { errors: [{ status: 503, firstAttemptsOnly: true }] } });
    const url = await gatewayFrom(
      yamlFile(`server: { host: 127.0.0.1, port: 0, logLevel: warn }
providers:
${provider('primary', mock)}routes:
  - name: no-retries
    match: { path: /v1/chat/completions, models: ["gpt-4o-mini"] }
    targets: [ { provider: primary } ]
    retry: { maxAttempts: 1 }
    park: false
  - name: target-retry
    match: { path: /v1/chat/completions, models: ["gpt-4.1"] }
    retry: { maxAttempts: 1 }
    targets:
      - provider: primary
        retry: { backoff: { baseMs: 10, capMs: 20 } }
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: primary } ]
    retry: { maxAttempts: 3, backoff: { strategy: fixed, baseMs: 10, capMs: 10 } }
`),
      { PRIMARY_KEY: OPENAI_KEY },
    );
    const counter = { requests: 0 };
    const client = openai(url, 'x', counter);
    const retried = await client.chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(retried.response.headers.get('x-stormgate-attempts')).toBe('2');
    const byTarget = await client.chat.completions.create({ model: 'gpt-4.1', messages }).withResponse();
    expect(byTarget.response.headers.get('x-stormgate-attempts')).toBe('2');
    mock.reset();
    const noRetry = await sdkError(openai(url, 'x').chat.completions.create({ model: 'gpt-4o-mini', messages }, { maxRetries: 0 }));
    expect(noRetry.status).toBe(503);
    expect(chatsAt(mock)).toHaveLength(1);
  });

  it('passthrough paths opened one by one: a path not opened stays 404 unknown_url and never reaches the provider', async () => {
    const mock = await startMock({ apiKey: OPENAI_KEY });
    const base = `server: { host: 127.0.0.1, port: 0, logLevel: warn }\nproviders:\n${provider('primary', mock)}routes:\n  - name: chat\n    match: { path: /v1/chat/completions }\n    targets: [ { provider: primary } ]\n`;
    const get = async (url: string, path: string, init: RequestInit = {}) => {
      const res = await fetch(`${url}${path}`, { headers: { authorization: 'Bearer sk-client-own' }, ...init });
      const text = await res.text();
      return { status: res.status, headers: res.headers, text };
    };
    const closed = await gatewayFrom(yamlFile(base), { PRIMARY_KEY: OPENAI_KEY });
    const nothing = await get(closed, '/v1/files');
    expect(nothing.status).toBe(404);
    expectOpenAIError(JSON.parse(nothing.text), 'unknown_url');

    const filesOnly = await gatewayFrom(yamlFile(`${base}passthrough:\n  provider: primary\n  paths: [/v1/files]\n`), { PRIMARY_KEY: OPENAI_KEY });
    await get(filesOnly, '/v1/files/file_123/content');
    const batches = await get(filesOnly, '/v1/batches');
    expect(batches.status).toBe(404);
    expectOpenAIError(JSON.parse(batches.text), 'unknown_url');
    const post = await get(filesOnly, '/v1/files', { method: 'POST', body: 'x' });
    expect(post.status).toBe(405);
    expect(post.headers.get('allow')).toMatch(/GET/);
    expect(post.headers.get('allow')).not.toMatch(/POST/);

    const both = await gatewayFrom(yamlFile(`${base}passthrough:\n  provider: primary\n  paths: [/v1/files, /v1/batches]\n  methods: [GET, POST]\n`), { PRIMARY_KEY: OPENAI_KEY });
    await get(both, '/v1/batches');
    await get(both, '/v1/files', { method: 'POST', body: 'x', headers: { 'content-type': 'text/plain', authorization: 'Bearer sk-client-own' } });
    const seen = mock.requests().map((r) => `${r.method} ${r.path} ${r.headers['authorization'] === `Bearer ${OPENAI_KEY}` ? 'provider-key' : 'OTHER'}`);
    expect(seen).toEqual(['GET /v1/files/file_123/content provider-key', 'GET /v1/batches provider-key', 'POST /v1/files provider-key']);
  });

  it('--port on the command line, and auth.keys turned on later: old clients get 401 invalid_api_key, not retried by the SDK', async () => {
    const mock = await startMock({ apiKey: OPENAI_KEY });
    const filePort = await freePort();
    const port = await freePort();
    const withAuth = `server: { host: 127.0.0.1, port: ${filePort}, logLevel: info }
auth:
  keys:
    agents: "\${S26_AGENTS_KEY}"
providers:
  primary: { family: openai, baseUrl: "${mock.url}/v1", apiKey: "\${PRIMARY_KEY}" }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: primary } ]
`;
    // Before: no auth, any apiKey works (in-process, the same file without its auth block).
    const before = await gatewayFrom(yamlFile(withAuth.replace(/auth:\n {2}keys:\n.*\n/, '')), { PRIMARY_KEY: OPENAI_KEY });
    await openai(before, 'old-client-anything').chat.completions.create({ model: 'gpt-4o', messages });

    const file = yamlFile(withAuth);
    const child = spawn(process.execPath, ['--import', 'tsx', 'src/main.ts', '--config', file, '--port', String(port)], {
      env: { ...process.env, PRIMARY_KEY: OPENAI_KEY, S26_AGENTS_KEY: AGENTS_KEY },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout.on('data', (d: Buffer) => (output += d.toString()));
    child.stderr.on('data', (d: Buffer) => (output += d.toString()));
    try {
      await waitReady({ proc: child, file, exited: once(child, 'exit').then(([c]) => c as number | null), output: () => output }, port, 30_000);
      const url = `http://127.0.0.1:${port}`;
      expect(await fetch(`http://127.0.0.1:${filePort}/healthz`).then(() => 'open', () => 'closed')).toBe('closed');
      expect((await fetch(`${url}/healthz`)).status).toBe(200);
      const counter = { requests: 0 };
      const old = await sdkError(openai(url, 'old-client-anything', counter).chat.completions.create({ model: 'gpt-4o', messages }));
      expect(old).toBeInstanceOf(OpenAI.AuthenticationError);
      expect(old.status).toBe(401);
      expect(old.code).toBe('invalid_api_key');
      expectOpenAIError(old.error === undefined ? undefined : { error: old.error }, 'invalid_api_key', (old.error as { type?: string }).type);
      expect(counter.requests).toBe(1);
      const upstreamBefore = chatsAt(mock).length;
      const ok = await openai(url, AGENTS_KEY).chat.completions.create({ model: 'gpt-4o', messages });
      expect(ok.object).toBe('chat.completion');
      expect(chatsAt(mock).length).toBe(upstreamBefore + 1);
      expect(chatsAt(mock).at(-1)!.headers['authorization']).toBe(`Bearer ${OPENAI_KEY}`);
      await sleep(200);
      expect(output).not.toContain(AGENTS_KEY);
      expect(output).not.toContain(OPENAI_KEY);
    } finally {
      child.kill('SIGKILL');
      if (child.exitCode === null && child.signalCode === null) await once(child, 'exit');
    }
  });
});

describe('the mistakes a team makes while editing YAML: exit 2, one line per problem, file, line, YAML path, no secret', () => {
  const SECRET = 'sk-s26-do-not-print-me-4242';
  const CLIENT_SECRET = 'sg-s26-client-secret-777';
  const good = `server: { host: 127.0.0.1, port: 0, logLevel: info }
providers:
  openai:
    family: openai
    baseUrl: "https://api.openai.com/v1"
    apiKey: "\${OPENAI_API_KEY}"
    timeouts: { connectMs: 5000 }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: openai } ]
    timeoutMs: 60000
    retry: { maxAttempts: 3 }
`;
  const edit = (from: string, to: string, text = good) => {
    expect(text).toContain(from);
    return text.replace(from, to);
  };

  it('fails every broken edit at start-up with a message that says where and what to fix', async () => {
    // [name, yaml, env, expected problem lines: each [line, pattern of what follows "file:line"]]
    const cases: Array<[string, string, Record<string, string | undefined>, Array<[number, RegExp]>]> = [
      ['typo', edit('timeouts:', 'timeoutz:'), {}, [[7, /^: providers\.openai: unknown key "timeoutz"; did you mean "timeouts"\?$/]]],
      ['wrong-type', edit('maxAttempts: 3', 'maxAttempts: three'), {}, [[13, /^: routes\[0\]\.retry\.maxAttempts: expected .*number.*"three"/]]],
      ['unknown-provider', edit('{ provider: openai }', '{ provider: opneai }'), {}, [[11, /^: routes\[0\]\.targets\[0\]\.provider: unknown provider "opneai".*openai/]]],
      ['missing-var', good, { OPENAI_API_KEY: undefined }, [[6, /^: providers\.openai\.apiKey: environment variable OPENAI_API_KEY is not set$/]]],
      [
        'duplicate-route',
        `${good}  - name: chat\n    match: { path: /v1/embeddings }\n    targets: [ { provider: openai } ]\n`,
        {},
        [[14, /^: routes\[1\]\.name: .*"chat".*twice/]],
      ],
      ['bad-duration', edit('timeoutMs: 60000', 'timeoutMs: 30s'), {}, [[12, /^: routes\[0\]\.timeoutMs: .*"30s".*milliseconds/]]],
      ['too-long', edit('timeoutMs: 60000', 'timeoutMs: 3000000000'), {}, [[12, /^: routes\[0\]\.timeoutMs: .*2147483647/]]],
      ['tab', edit('    family: openai', '\tfamily: openai'), {}, [[4, /^(:\d+)?: .*[Tt]ab/]]],
      [
        'anchor-typo',
        `x-timeouts: &timeouts { connectMs: 5000 }\n${edit('timeouts: { connectMs: 5000 }', 'timeouts: { <<: *timeoutz }')}`,
        {},
        [[8, /^(:\d+)?: providers\.openai\.timeouts: .*\*timeoutz.*timeouts/]],
      ],
      [
        'anchor-after-use',
        `${edit('timeouts: { connectMs: 5000 }', 'timeouts: *later')}x-later: &later { connectMs: 5000 }\n`,
        {},
        [[7, /^(:\d+)?: providers\.openai\.timeouts: .*\*later/]],
      ],
      [
        'keys-as-list',
        edit('routes:', `auth:\n  keys: [ "\${S26_CLIENT_KEY}" ]\nroutes:`),
        { S26_CLIENT_KEY: CLIENT_SECRET },
        [[9, /^: auth\.keys: expected map of name to string, received list$/]],
      ],
      [
        'two-problems',
        edit('maxAttempts: 3', 'maxAttempts: three', edit('timeouts:', 'timeoutz:')),
        {},
        [
          [7, /unknown key "timeoutz"/],
          [13, /maxAttempts/],
        ],
      ],
    ];
    const runs = cases.map(([name, yaml, env]) => startProcess(`mistake-${name}`, yaml, { OPENAI_API_KEY: SECRET, ...env }));
    const codes = await Promise.all(runs.map((r) => r.exited));
    const report: string[] = [];
    cases.forEach(([name, , , expected], i) => {
      const out = runs[i]!.output();
      report.push(`${name} (exit ${codes[i]}):\n${out}`);
      expect.soft(codes[i], `${name}: ${out}`).toBe(2);
      expect.soft(out, name).not.toContain(SECRET);
      expect.soft(out, name).not.toContain(CLIENT_SECRET);
      expect.soft(out, name).not.toMatch(/\n\s+at /); // no stack trace
      const lines = out.split('\n').filter((l) => l !== '');
      expect.soft(lines[0], name).toBe('stormgate: invalid config');
      const problems = lines.slice(1).filter((l) => l.startsWith(runs[i]!.file));
      expect.soft(problems.length, `${name}: one line per problem\n${out}`).toBe(expected.length);
      expected.forEach(([line, pattern], j) => {
        const p = problems[j]!;
        expect.soft(p.startsWith(`${runs[i]!.file}:${line}`), `${name}: line ${line} in\n${p}`).toBe(true);
        expect.soft(p.slice(`${runs[i]!.file}:${line}`.length), `${name}: ${p}`).toMatch(pattern);
      });
    });
    console.info(`s26 config mistakes:\n${report.join('\n')}`);
  }, 60_000);
});
