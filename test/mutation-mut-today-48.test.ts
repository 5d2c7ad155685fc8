// Mutation round 48 on five modules no earlier round had mutated on their own: policy/backoff.ts (the jitter
// strategies and the wait-hint jitter), policy/retry-wait.ts (the one wait rule for retries), streaming/answer-progress.ts
// (which choices have come and finished, whether a tool call is open), config/interpolate.ts (`${VAR}` and
// `${VAR:-default}` in YAML values) and pipeline/plan-targets.ts (the request's targets and each one's keys, class and
// retry). 93 hand mutants: 68 killed by the existing files, 16 killed here, 9 equivalent, 0 open (backoff 21: 17/1/3;
// retry wait 12: 12/0/0; answer progress 19: 12/5/2; interpolate 20: 15/2/3; plan targets 21: 12/8/1).
// Killed here, backoff: a random() of exactly 1 taken as a draw (the top of the range) rather than as a faulty value.
// Killed here, answer progress: with n > 1, a tool call opening in the event that finishes another choice not marked
// open, a choice's finish not closing its own call, the getter ignoring the per-choice calls; a legacy function_call
// delta not opening a call; whole() not taking a finished answer (one choice asked, a stray second sent) as whole.
// Killed here, interpolate: `$${` written as `$${` rather than `${`; a name starting with a digit accepted.
// Killed here, plan targets: a model label of exactly 128 characters given an ellipsis; any service_tier (not only
// flex) reading the flex tier's hold-off; the client's auth.priority raising rather than lowering the class (and
// ignored); a route on an unknown path (api other) reading the target's hold-offs; a target's retry ignored for the
// route's; a fallback tried for a name still counted as only planned there (a later 404 at the primary gave its place
// back and dropped its series); x-client-request-id not sent upstream.
// Killed by other existing files than the module's importers: limitKey (anthropic-agents-suite), ownModel
// (fallback-keys), lowestClass (waiting-body-bytes), the Responses pinning and the context fallback's provider check
// (responses-failures), the disabled count (failover-2).
// Equivalent, backoff: MAX_DOUBLINGS 2000 (2^2000 is Infinity, base x Infinity capped at cap as base x 2^64 was: the
// schema keeps baseMs positive); unit's `u >= 0` as `u > 0` (0 and a faulty value both give 0); toWholeMs without
// Math.max(0, ...) (every wait it gets is at least 0: unit is in [0, 1), bases positive).
// Equivalent, answer progress: announced() with one choice (seen indexes weigh only while no choice finished, and a
// lone choice's finish finishes the answer); announced()'s messages check (streamShapeOf gives messages one choice).
// Equivalent, interpolate: closingBrace without skipping the `{` of a nested `${` (a `{` is neither `$` nor `}`);
// resolvePlain without the collection check (collection tags have no test) or without the default check (no tag of
// the 1.2 or 1.1 schema has a test and no default).
// Equivalent, plan targets: the family's headers spread before the forwarded ones (the allowlist never forwards
// authorization, api-key, x-api-key or anthropic-version, the only headers a family sets).
// No bugs found.
import OpenAI from 'openai';
import { parseDocument } from 'yaml';
import { interpolateDocument } from '../src/config/interpolate.ts';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type BackoffConfig, type ConfigInput } from '../src/config/schema.ts';
import { backoffDelayMs } from '../src/policy/backoff.ts';
import { shortModel } from '../src/pipeline/plan-targets.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { sdkError } from './helpers/openai-error.ts';
import { completion, json, scripted, type Seen } from './helpers/scripted-provider.ts';
import { defaultConfig, requestLine, useExtraMocks, useGateways, useStacks } from './helpers/stack.ts';
import { attempts, primaryAndBackupConfig, status } from './helpers/model-places.ts';
import { AnswerProgress } from '../src/streaming/answer-progress.ts';
import { eventMeaning } from '../src/streaming/stream-events.ts';
import type { SseEvent } from '../src/streaming/sse-parser.ts';

const startGateway = useGateways();
const startProvider = useFakeProviders();
const startStack = useStacks();
const extraMock = useExtraMocks();
const messages = [{ role: 'user' as const, content: 'Summarise the incident report.' }];

describe('backoff: a random() of exactly 1 is outside [0, 1) and counts as faulty', () => {
  const cfg = (strategy: BackoffConfig['strategy']): BackoffConfig => ({ strategy, baseMs: 100, capMs: 10_000 });

  it('draws the bottom of the range, as for any faulty value, not its top', () => {
    expect(backoffDelayMs(cfg('full-jitter'), 2, undefined, () => 1)).toBe(0);
    expect(backoffDelayMs(cfg('equal-jitter'), 2, undefined, () => 1)).toBe(200);
    expect(backoffDelayMs(cfg('decorrelated-jitter'), 0, 1_000, () => 1)).toBe(100);
  });
});

describe('plan-targets: a client model name as labels show it', () => {
  it('keeps a name of exactly 128 characters whole, and cuts one of 129 to 128 and an ellipsis', () => {
    expect(shortModel('m'.repeat(128))).toBe('m'.repeat(128));
    expect(shortModel('m'.repeat(129))).toBe(`${'m'.repeat(128)}…`);
  });
});

describe("plan-targets: only service_tier 'flex' reads the flex tier's hold-off", () => {
  it("sends a request asking for another tier ('auto') while the flex tier is held off", async () => {
    const seen: Seen[] = [];
    const p = await startProvider(scripted((body) => (body.service_tier === 'flex' ? json(498, { error: { message: 'Flex tier capacity exceeded.', type: 'invalid_request_error', code: 'capacity_exceeded' } }, { 'retry-after': '5' }) : completion('from groq', 'llama-3.3-70b-versatile')), seen));
    const input: ConfigInput = {
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: { groq: { family: 'openai', baseUrl: `${p.origin}/v1`, apiKey: 'groq-key-0123456789', breaker: false } },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'groq', model: 'llama-3.3-70b-versatile' }], park: false }],
    };
    const client = new OpenAI({ baseURL: `${await startGateway(ConfigSchema.parse(input))}/v1`, apiKey: 'sk-client', maxRetries: 0 });
    expect((await sdkError(client.chat.completions.create({ model: 'llama', messages, service_tier: 'flex' }))).status).toBe(498);
    const held = await sdkError(client.chat.completions.create({ model: 'llama', messages, service_tier: 'flex' }));
    expect(held.status).toBe(429);
    const auto = await client.chat.completions.create({ model: 'llama', messages, service_tier: 'auto' });
    expect(auto.choices[0]!.message.content).toBe('from groq');
    expect(seen.map((s) => s.body.service_tier)).toEqual(['flex', 'auto']);
  });
});

describe("plan-targets: a client's auth.priority and its x-stormgate-priority each only lower the route's class", () => {
  it("serves a batch-capped client's request in batch, though it asks for online and the route is online", async () => {
    const s = await startStack({ config: (url) => ({ ...defaultConfig(url), auth: { keys: { nightly: 'sk-nightly-0123456789' }, priority: { nightly: 'batch' } } }) });
    const res = await fetch(`${s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: 'Bearer sk-nightly-0123456789', 'x-stormgate-priority': 'online' },
      body: JSON.stringify({ model: 'gpt-4o', messages }),
    });
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    expect((await requestLine(s)).priority).toBe('batch');
  });
});

describe('answer progress: with n > 1, a tool call that opens in the event finishing another choice', () => {
  const ev = (data: unknown): SseEvent => {
    const text = JSON.stringify(data);
    return { raw: `data: ${text}`, data: text, event: null };
  };
  it("stays open until its own choice finishes", () => {
    const progress = new AnswerProgress('chat', { choices: 2, usage: false });
    const both = ev({ object: 'chat.completion.chunk', choices: [
      { index: 0, delta: { tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'lookup', arguments: '' } }] }, finish_reason: null },
      { index: 1, delta: {}, finish_reason: 'stop' },
    ] });
    expect(eventMeaning('chat', both)).toBe('finish');
    expect(progress.passed(eventMeaning('chat', both), both)).toBeUndefined();
    expect(progress.toolCallOpen).toBe(true);
    const done = ev({ object: 'chat.completion.chunk', choices: [{ index: 0, delta: {}, finish_reason: 'tool_calls' }] });
    progress.passed(eventMeaning('chat', done), done);
    expect(progress.toolCallOpen).toBe(false);
    expect(progress.finished).toBe(true);
  });
});

describe("plan-targets: a target's own retry replaces the route's", () => {
  it('retries a target whose retry allows 3 attempts on a route that allows 1', async () => {
    const seen: Seen[] = [];
    const p = await startProvider(scripted((_body, n) => (n <= 2 ? json(503, { error: { message: 'overloaded', type: 'server_error' } }) : completion('third time', 'gpt-4o')), seen));
    const input: ConfigInput = {
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: { up: { family: 'openai', baseUrl: `${p.origin}/v1`, apiKey: 'up-key-0123456789', breaker: false } },
      routes: [{
        name: 'chat', match: { path: '/v1/chat/completions' }, park: false,
        retry: { maxAttempts: 1 },
        targets: [{ provider: 'up', model: 'gpt-4o', retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 1, capMs: 1 } } }],
      }],
    };
    const client = new OpenAI({ baseURL: `${await startGateway(ConfigSchema.parse(input))}/v1`, apiKey: 'sk-client', maxRetries: 0 });
    const answer = await client.chat.completions.create({ model: 'gpt-4o', messages });
    expect(answer.choices[0]!.message.content).toBe('third time');
    expect(seen).toHaveLength(3);
  });
});

describe('answer progress: the tool calls a single choice can carry', () => {
  const ev = (data: unknown): SseEvent => {
    const text = JSON.stringify(data);
    return { raw: `data: ${text}`, data: text, event: null };
  };
  const delta = (d: Record<string, unknown>, finish: string | null = null) => ev({ object: 'chat.completion.chunk', choices: [{ index: 0, delta: d, finish_reason: finish }] });
  it('opens at a legacy function_call delta (the `functions` parameter), not at a null one', () => {
    const nulled = new AnswerProgress('chat', { choices: 1, usage: false });
    const text = delta({ content: 'hi', function_call: null });
    nulled.passed(eventMeaning('chat', text), text);
    expect(nulled.toolCallOpen).toBe(false);
    const progress = new AnswerProgress('chat', { choices: 1, usage: false });
    const call = delta({ function_call: { name: 'lookup', arguments: '' } });
    expect(eventMeaning('chat', call)).toBe('output');
    progress.passed('output', call);
    expect(progress.toolCallOpen).toBe(true);
    const more = delta({ function_call: { arguments: '{"q":' } });
    progress.passed('output', more);
    expect(progress.toolCallOpen).toBe(true);
    const fin = delta({}, 'function_call');
    progress.passed(eventMeaning('chat', fin), fin);
    expect(progress.toolCallOpen).toBe(false);
  });

  it('is whole once the one choice asked for finished, though a provider sent a second it was not asked for', () => {
    const progress = new AnswerProgress('chat', { choices: 1, usage: false });
    const both = ev({ object: 'chat.completion.chunk', choices: [{ index: 0, delta: {}, finish_reason: 'stop' }, { index: 1, delta: { content: 'extra' }, finish_reason: null }] });
    progress.passed(eventMeaning('chat', both), both);
    expect(progress.finished).toBe(true);
    expect(progress.whole()).toBe(true);
  });
});

describe("plan-targets: a route on a path the gateway has no API for reads no target's hold-off", () => {
  it("sends an audio request to a target the chat route's 429 held off", async () => {
    const seen: Seen[] = [];
    const p = await startProvider(scripted((body) => (body.input === undefined ? json(429, { error: { message: 'Rate limit reached', type: 'requests', code: 'rate_limit_exceeded' } }, { 'retry-after': '30' }) : json(200, { ok: true })), seen));
    const input: ConfigInput = {
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: { up: { family: 'openai', baseUrl: `${p.origin}/v1`, apiKey: 'up-key-0123456789', breaker: false } },
      routes: [
        { name: 'chat', match: { path: '/v1/chat/completions' }, park: false, targets: [{ provider: 'up', model: 'gpt-4o' }] },
        { name: 'speech', match: { path: '/v1/audio/speech' }, park: false, targets: [{ provider: 'up', model: 'gpt-4o' }] },
      ],
    };
    const url = await startGateway(ConfigSchema.parse(input));
    const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sk-client', maxRetries: 0 });
    expect((await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages }))).status).toBe(429);
    const held = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages }));
    expect((held.error as { code?: string }).code).toBe('provider_held_off');
    expect(seen).toHaveLength(1);
    const res = await fetch(`${url}/v1/audio/speech`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', input: 'hello', voice: 'alloy' }) });
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ ok: true });
    expect(seen).toHaveLength(2);
  });
});

describe('interpolate: `$${` is a literal `${`, and a name starts with a letter or _', () => {
  const read = (yaml: string, env: Record<string, string> = {}) => {
    const doc = parseDocument(yaml);
    const issues = interpolateDocument(doc, env);
    return { value: doc.toJS() as Record<string, unknown>, issues };
  };
  it('writes `${` once, in a value of literals only and beside a reference', () => {
    expect(read('a: "cost $${HOME}"\n')).toEqual({ value: { a: 'cost ${HOME}' }, issues: [] });
    expect(read('b: "$${X} and ${Y}"\n', { Y: 'why' })).toEqual({ value: { b: '${X} and why' }, issues: [] });
  });
  it('reports a reference whose name starts with a digit as invalid, and leaves the value as written', () => {
    const { value, issues } = read('port: "${1PORT}"\n', { '1PORT': '8080' });
    expect(value).toEqual({ port: '${1PORT}' });
    expect(issues.map((i) => i.message)).toEqual(['invalid reference "${1PORT}"; expected ${NAME} or ${NAME:-default}']);
  });
});

describe("plan-targets: a fallback's place for a name is no longer only planned once a request tried it there", () => {
  it("keeps the backup's series of a name that failed over there when the primary later answers 404 for it", async () => {
    const backup = await extraMock({});
    const s = await startStack({ faults: { models: { 'real-x': { errors: [{ status: 503 }] } } }, config: (url) => primaryAndBackupConfig(url, backup.url) });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 });
    expect(await status(client, 'real-x')).toBe(200);
    expect(await attempts(s, 'backup/real-x', '2xx')).toBe(1);
    // The primary now says it has no such model: its 404 ends the request; the backup, tried for the name, keeps its place.
    s.mock.setFaults({ models: { 'real-x': { errors: [{ status: 404, code: 'model_not_found' }] } } });
    expect(await status(client, 'real-x')).toBe(404);
    s.mock.setFaults({ models: { 'real-x': { errors: [{ status: 503 }] } } });
    expect(await status(client, 'real-x')).toBe(200);
    expect(await attempts(s, 'backup/real-x', '2xx')).toBe(2);
  });
});

describe('plan-targets: the headers every upstream request carries', () => {
  it("sends the client's request id upstream as x-client-request-id", async () => {
    const seen: Seen[] = [];
    const p = await startProvider(scripted(() => completion('hello', 'gpt-4o'), seen));
    const input: ConfigInput = {
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: { up: { family: 'openai', baseUrl: `${p.origin}/v1`, apiKey: 'up-key-0123456789', breaker: false } },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, park: false, targets: [{ provider: 'up', model: 'gpt-4o' }] }],
    };
    const url = await startGateway(ConfigSchema.parse(input));
    const res = await fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-request-id': 'call-48' }, body: JSON.stringify({ model: 'gpt-4o', messages }) });
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    expect(seen).toHaveLength(1);
    expect(seen[0]!.headers['x-client-request-id']).toBe('call-48');
  });
});
