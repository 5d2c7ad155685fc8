// streamUsage: an OpenAI-family provider that reports a stream's usage only when asked (stream_options.include_usage)
// is asked by the gateway, so every streamed chat completion is billed; a client that did not ask gets its stream as
// it would have without the setting: no usage chunk, no `usage` fields. Unit tests of the event filter and of the
// request, then real gateways over HTTP with scripted upstreams, the mock provider, the openai SDK and raw SSE.
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import { prepareUpstream } from '../src/providers/families.ts';
import type { ApiKind } from '../src/routing/router.ts';
import { SseParser, type SseEvent } from '../src/streaming/sse-parser.ts';
import { takeUsageOut } from '../src/streaming/hidden-usage.ts';
import { useScriptedUpstreams, type Upstream } from './helpers/scripted-upstreams.ts';
import { cc, delta, DONE, json, responsesHead, responsesTail, textDelta, type Script } from './helpers/scripted-provider.ts';
import { useStacks, type Stack } from './helpers/stack.ts';

const event = (text: string): SseEvent => new SseParser().push(Buffer.from(`${text}\n\n`))[0]!;

describe('takeUsageOut: the usage a client did not ask for, out of one chat chunk', () => {
  it("drops a usage chunk carrying a vendor's extension (x_groq) with it, and keeps one carrying anything else, without its usage", () => {
    const groq = takeUsageOut(event('data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5},"x_groq":{"id":"req_1","usage":{"queue_time":0.01}}}'));
    expect(groq.left).toBeUndefined();
    expect(groq.usage).toEqual({ prompt: 3, completion: 2 });
    const filtered = takeUsageOut(event('data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2},"prompt_filter_results":[{"prompt_index":0}]}'));
    expect(JSON.parse(filtered.left!.data!)).toEqual({ choices: [], prompt_filter_results: [{ prompt_index: 0 }] });
  });

  it('takes `"usage":null` out of an ordinary chunk and leaves every other byte as the provider sent it', () => {
    const sent = 'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"caf\\u00e9"},"logprobs":{"content":[{"token":"x","logprob":-1.0e-5}]},"finish_reason":null}],"usage":null,"obfuscation":"Qx"}';
    const { left, usage } = takeUsageOut(event(sent));
    expect(left?.raw).toBe('data: {"id":"c1","choices":[{"index":0,"delta":{"content":"caf\\u00e9"},"logprobs":{"content":[{"token":"x","logprob":-1.0e-5}]},"finish_reason":null}],"obfuscation":"Qx"}');
    expect(JSON.parse(left!.data!)).not.toHaveProperty('usage');
    expect(usage).toBeUndefined();
    // First key, last key, spaces around the colon.
    expect(takeUsageOut(event('data: {"usage": null, "choices":[{"index":0,"delta":{"content":"a"}}]}')).left?.data).toBe('{"choices":[{"index":0,"delta":{"content":"a"}}]}');
    expect(takeUsageOut(event('data: {"choices":[{"index":0,"delta":{"content":"a"}}] , "usage" : null}')).left?.data).toBe('{"choices":[{"index":0,"delta":{"content":"a"}}]}');
  });

  it('drops the usage chunk (choices: [] with usage), keeping its usage for the bill', () => {
    const { left, usage } = takeUsageOut(event('data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","system_fingerprint":"fp","service_tier":"default","choices":[],"usage":{"prompt_tokens":17,"completion_tokens":5,"total_tokens":22},"obfuscation":"a"}'));
    expect(left).toBeUndefined();
    expect(usage).toEqual({ prompt: 17, completion: 5 });
  });

  it('takes only the usage out of a chunk that carries choices too (a compatible server\'s finish with usage)', () => {
    const { left, usage } = takeUsageOut(event('data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":4}}'));
    expect(JSON.parse(left!.data!)).toEqual({ id: 'c1', choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] });
    expect(left!.raw).toBe(`data: ${left!.data}`);
    expect(usage).toEqual({ prompt: 3, completion: 4 });
    // A `usage` key nested elsewhere is the chunk's own, and stays.
    const nested = takeUsageOut(event('data: {"choices":[{"index":0,"delta":{"content":"a"}}],"x_meta":{"usage":null},"usage":null}'));
    expect(JSON.parse(nested.left!.data!)).toEqual({ choices: [{ index: 0, delta: { content: 'a' } }], x_meta: { usage: null } });
  });

  it('leaves any other event as it is: [DONE], comments, errors, malformed data, Azure\'s prompt filter chunk, text that says "usage"', () => {
    for (const raw of [
      'data: [DONE]',
      ': ping',
      'data: {"error":{"message":"overloaded","type":"server_error","param":null,"code":null}}',
      'data: {"usage":nul',
      'data: {"id":"","object":"","created":0,"model":"","prompt_filter_results":[{"prompt_index":0,"content_filter_results":{}}],"choices":[]}',
      'data: {"choices":[{"index":0,"delta":{"content":"the \\"usage\\": null field"}}]}',
    ]) {
      const ev = event(raw);
      expect(takeUsageOut(ev)).toEqual({ left: ev, usage: undefined });
    }
  });
});

const providers = parseConfig(
  `providers:
  oai: { family: openai, baseUrl: "https://api.openai.com/v1", apiKey: k, streamUsage: true }
  off: { family: openai, baseUrl: "https://api.openai.com/v1", apiKey: k }
  az: { family: azure-openai, baseUrl: "https://res.openai.azure.com", apiKey: k, apiVersion: "2024-10-21", streamUsage: true }
  ant: { family: anthropic, baseUrl: "https://api.anthropic.com", apiKey: k, streamUsage: true }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: oai } ]
`,
  'test.yaml',
).providers;

function prepared(provider: string, json: Record<string, unknown>, api: ApiKind = 'chat', clientPath = '/v1/chat/completions') {
  const rawBody = Buffer.from(JSON.stringify(json));
  const p = prepareUpstream(providers[provider]!, { api, clientPath, query: '', json, rawBody, model: provider === 'ant' ? 'claude-haiku-4-5' : 'gpt-4o' });
  if (!p.ok) throw new Error(p.reason);
  return { request: p.request, body: JSON.parse(p.request.body.toString()) as Record<string, unknown>, rawBody };
}

describe('prepareUpstream with streamUsage', () => {
  const chat = { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true };

  it('asks an openai or azure-openai provider for a chat stream\'s usage, keeping the client\'s other stream_options', () => {
    for (const provider of ['oai', 'az']) {
      const plain = prepared(provider, chat);
      expect(plain.body.stream_options).toEqual({ include_usage: true });
      expect(plain.request.hideUsage).toBeTypeOf('function');
      expect(prepared(provider, { ...chat, stream_options: { include_obfuscation: false } }).body.stream_options).toEqual({ include_obfuscation: false, include_usage: true });
      const refused = prepared(provider, { ...chat, stream_options: { include_usage: false } });
      expect(refused.body.stream_options).toEqual({ include_usage: true });
      expect(refused.request.hideUsage).toBeTypeOf('function');
    }
  });

  it('asks for a legacy completions stream\'s usage too', () => {
    const p = prepared('oai', { model: 'gpt-4o', prompt: 'hi', stream: true }, 'completions', '/v1/completions');
    expect(p.body.stream_options).toEqual({ include_usage: true });
    expect(p.request.hideUsage).toBeTypeOf('function');
  });

  it('changes nothing when the client asked for the usage itself, for whole answers, other APIs, other families, or with the setting off', () => {
    const asked = prepared('oai', { ...chat, stream_options: { include_usage: true } });
    expect(asked.request.body).toBe(asked.rawBody);
    expect(asked.request.hideUsage).toBeUndefined();
    for (const p of [
      prepared('oai', { ...chat, stream: false }),
      prepared('off', chat),
      prepared('oai', { model: 'gpt-4o', input: 'hi', stream: true }, 'responses', '/v1/responses'),
    ]) {
      expect(p.request.body).toBe(p.rawBody);
      expect(p.request.hideUsage).toBeUndefined();
    }
    const anthropic = prepared('ant', chat);
    expect(anthropic.body).not.toHaveProperty('stream_options');
    expect(anthropic.request.hideUsage).toBeUndefined();
  });
});

// ---------------------------------------------------------------------------------------------------------------
// Real gateways.

const start = useScriptedUpstreams();
const startStack = useStacks();
const BILL = { prompt_tokens: 1234, completion_tokens: 56, total_tokens: 1290 };
const messages = [{ role: 'user' as const, content: 'Payment terms?' }];

const includeUsage = (body: Record<string, unknown>) => (body.stream_options as { include_usage?: unknown } | null | undefined)?.include_usage === true;

/**
 * A chat stream as OpenAI sends it: with include_usage, `"usage": null` on every chunk and a usage chunk after the
 * finish; `withFinish`: the usage on the finish chunk instead (some compatible servers); `usageAfterMs`: a pause
 * before the usage chunk.
 */
function openaiStream(body: Record<string, unknown>, opts: { withFinish?: boolean; usageAfterMs?: number; head?: string[] } = {}): Script {
  const asked = includeUsage(body);
  const u = asked ? { usage: null } : {};
  const steps: Script['steps'] = [...(opts.head ?? []), cc([delta({ role: 'assistant', content: '' })], u), cc([delta({ content: 'Net ' })], u), cc([delta({ content: '30.' })], u)];
  if (asked && opts.withFinish) steps.push(cc([delta({}, 'stop')], { usage: BILL }));
  else {
    steps.push(cc([delta({}, 'stop')], u));
    if (asked) steps.push(...(opts.usageAfterMs ? [opts.usageAfterMs] : []), cc([], { usage: BILL }));
  }
  steps.push(DONE);
  return { headers: { 'content-type': 'text/event-stream' }, steps };
}

/** Reads an SDK chat stream: its text, and every chunk as the SDK handed it over. */
async function sdkStream(client: OpenAI, extra: Record<string, unknown> = {}): Promise<{ text: string; chunks: OpenAI.ChatCompletionChunk[] }> {
  const chunks: OpenAI.ChatCompletionChunk[] = [];
  let text = '';
  const stream = await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true, ...extra } as OpenAI.ChatCompletionCreateParamsStreaming);
  for await (const chunk of stream) {
    chunks.push(chunk);
    text += chunk.choices[0]?.delta?.content ?? '';
  }
  return { text, chunks };
}

/** The raw SSE text a client gets for a streamed chat completion. */
async function rawStream(s: Stack, body: Record<string, unknown>, path = '/v1/chat/completions'): Promise<string> {
  const res = await fetch(`${s.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages, stream: true, ...body }) });
  expect(res.status).toBe(200);
  return res.text();
}

/** stormgate_tokens_total's non-zero series, as `target kind` -> tokens. */
async function tokens(s: Stack): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const line of (await (await fetch(`${s.url}/metrics`)).text()).split('\n')) {
    if (!line.startsWith('stormgate_tokens_total{')) continue;
    const target = /target="([^"]*)"/.exec(line)![1]!;
    const kind = /kind="([^"]*)"/.exec(line)![1]!;
    const value = Number(line.split(' ').at(-1));
    if (value !== 0) out[`${target} ${kind}`] = value;
  }
  return out;
}

/** The request log lines, once `n` are written. */
async function requestLines(s: Stack, n: number): Promise<Array<Record<string, unknown>>> {
  const lines = () => s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => typeof l.reqId === 'string' && typeof l.durationMs === 'number');
  for (const end = Date.now() + 5_000; lines().length < n; await sleep(20)) if (Date.now() > end) throw new Error(`fewer than ${n} request log lines`);
  return lines();
}

const usageChunks = (chunks: OpenAI.ChatCompletionChunk[]) => chunks.filter((c) => c.usage);
const withUsageField = (chunks: OpenAI.ChatCompletionChunk[]) => chunks.filter((c) => 'usage' in c);

describe('streamUsage: true on an OpenAI-family provider', () => {
  it('asks for the usage, bills it (metric and log line), and gives a client that did not ask no usage chunk and no usage field', async () => {
    const { s, seen, client } = await start({ p: (body) => openaiStream(body) }, [{ provider: 'p' }], { provider: { streamUsage: true } });
    const got = await sdkStream(client);
    expect(got.text).toBe('Net 30.');
    expect(got.chunks.at(-1)?.choices[0]?.finish_reason).toBe('stop');
    expect(withUsageField(got.chunks)).toEqual([]);
    expect(seen.p![0]!.body.stream_options).toEqual({ include_usage: true });
    const [line] = await requestLines(s, 1);
    expect(line!.usage).toEqual({ prompt: 1234, completion: 56 });
    expect(line!.streamEnd).toBe('complete');
    expect(await tokens(s)).toEqual({ 'p/gpt-4o prompt': 1234, 'p/gpt-4o completion': 56 });

    // The raw stream is the one the client got before the setting: the same chunks, without their `usage` fields.
    const raw = await rawStream(s, {});
    expect(raw).not.toContain('usage');
    expect(raw).toBe([cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Net ' })]), cc([delta({ content: '30.' })]), cc([delta({}, 'stop')]), DONE].join(''));
    await requestLines(s, 2);
    expect(await tokens(s)).toEqual({ 'p/gpt-4o prompt': 2 * 1234, 'p/gpt-4o completion': 2 * 56 });
  });

  it('keeps the client\'s other stream_options, and gives a client that asked its usage chunk exactly once', async () => {
    const { s, seen, client } = await start({ p: (body) => openaiStream(body) }, [{ provider: 'p' }], { provider: { streamUsage: true } });
    const raw = await rawStream(s, { stream_options: { include_obfuscation: false } });
    expect(raw).not.toContain('usage');
    expect(seen.p![0]!.body.stream_options).toEqual({ include_obfuscation: false, include_usage: true });

    const asked = await sdkStream(client, { stream_options: { include_usage: true } });
    expect(asked.text).toBe('Net 30.');
    expect(usageChunks(asked.chunks).map((c) => c.usage)).toEqual([BILL]);
    // As OpenAI sends it to a client that asked: `usage: null` on the other chunks.
    expect(withUsageField(asked.chunks)).toHaveLength(asked.chunks.length);
    expect(seen.p![1]!.body.stream_options).toEqual({ include_usage: true });
    await requestLines(s, 2);
    expect(await tokens(s)).toEqual({ 'p/gpt-4o prompt': 2 * 1234, 'p/gpt-4o completion': 2 * 56 });
  });

  it('takes only the usage off a finish chunk that carries it (a compatible server), and still bills it', async () => {
    const { s, client } = await start({ p: (body) => openaiStream(body, { withFinish: true }) }, [{ provider: 'p' }], { provider: { streamUsage: true } });
    const got = await sdkStream(client);
    expect(got.text).toBe('Net 30.');
    expect(got.chunks.at(-1)?.choices[0]?.finish_reason).toBe('stop');
    expect(withUsageField(got.chunks)).toEqual([]);
    await requestLines(s, 1);
    expect(await tokens(s)).toEqual({ 'p/gpt-4o prompt': 1234, 'p/gpt-4o completion': 56 });
  });

  it('waits for the usage it asked for after the finish, as it waits for a client\'s own (not cut off by the second after the finish)', async () => {
    const { s, client } = await start({ p: (body) => openaiStream(body, { usageAfterMs: 1_600 }) }, [{ provider: 'p' }], { provider: { streamUsage: true } });
    const got = await sdkStream(client);
    expect(got.text).toBe('Net 30.');
    expect(withUsageField(got.chunks)).toEqual([]);
    const [line] = await requestLines(s, 1);
    expect(line!.streamEnd).toBe('complete');
    expect(line!.usage).toEqual({ prompt: 1234, completion: 56 });
  });

  it('passes an Azure deployment\'s prompt filter chunk on as it came, and hides only the usage', async () => {
    const filter = `data: ${JSON.stringify({ choices: [], created: 0, id: '', model: '', object: '', prompt_filter_results: [{ prompt_index: 0, content_filter_results: { hate: { filtered: false, severity: 'safe' } } }] })}\n\n`;
    const { s, seen } = await start({ az: { family: 'azure-openai', answer: (body) => openaiStream(body, { head: [filter] }) } }, [{ provider: 'az', model: 'gpt-4o-deployment' }], { provider: { streamUsage: true } });
    const raw = await rawStream(s, {});
    expect(raw.startsWith(filter)).toBe(true);
    expect(raw).not.toContain('usage');
    expect(seen.az![0]!.url).toContain('/openai/deployments/gpt-4o-deployment/chat/completions?api-version=2024-10-21');
    expect(seen.az![0]!.body.stream_options).toEqual({ include_usage: true });
    await requestLines(s, 1);
    expect(await tokens(s)).toEqual({ 'az/gpt-4o-deployment prompt': 1234, 'az/gpt-4o-deployment completion': 56 });
  });

  it('with the mock provider (usage: null on every chunk when asked): the client\'s stream carries no usage, the metric does', async () => {
    const s = await startStack({ provider: { streamUsage: true } });
    const raw = await rawStream(s, {});
    expect(raw).toContain('data: [DONE]');
    expect(raw).not.toContain('usage');
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client', maxRetries: 0 });
    const got = await sdkStream(client, { n: 2 });
    expect(got.text.length).toBeGreaterThan(0);
    expect(withUsageField(got.chunks)).toEqual([]);
    await requestLines(s, 2);
    const t = await tokens(s);
    expect(t['mock/gpt-4o prompt']).toBeGreaterThan(0);
    expect(t['mock/gpt-4o completion']).toBeGreaterThan(0);
  });
});

describe('streamUsage on /v1/completions', () => {
  it('with the mock provider: the SDK\'s completions stream carries no usage chunk, the metric and the log line have it', async () => {
    const s = await startStack({ provider: { streamUsage: true } });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client', maxRetries: 0 });
    const chunks: OpenAI.Completion[] = [];
    for await (const c of await client.completions.create({ model: 'gpt-4o', prompt: 'Say hi', stream: true })) chunks.push(c);
    expect(chunks.map((c) => c.choices[0]?.text ?? '').join('').length).toBeGreaterThan(0);
    expect(chunks.filter((c) => c.usage || c.choices.length === 0)).toEqual([]);
    const [line] = await requestLines(s, 1);
    expect(line!.usage).toMatchObject({ prompt: expect.any(Number), completion: expect.any(Number) });
    const t = await tokens(s);
    expect(t['mock/gpt-4o completion']).toBeGreaterThan(0);
    // A client that asks gets its usage chunk, once.
    const asked: OpenAI.Completion[] = [];
    for await (const c of await client.completions.create({ model: 'gpt-4o', prompt: 'Say hi', stream: true, stream_options: { include_usage: true } })) asked.push(c);
    expect(asked.filter((c) => c.usage)).toHaveLength(1);
  });
});

describe('streamUsage leaves alone what it should', () => {
  it('off (the default): the request and the stream are as before, and the stream bills nothing', async () => {
    const { s, seen, client } = await start({ p: (body) => openaiStream(body) }, [{ provider: 'p' }]);
    const got = await sdkStream(client);
    expect(got.text).toBe('Net 30.');
    expect(withUsageField(got.chunks)).toEqual([]);
    expect(seen.p![0]!.body).not.toHaveProperty('stream_options');
    const [line] = await requestLines(s, 1);
    expect(line!.usage).toBeUndefined();
    expect(await tokens(s)).toEqual({});
  });

  it('a failover to an Anthropic target bills its usage, gives the client none, and sends Anthropic no stream_options', async () => {
    const aev = (type: string, data: Record<string, unknown> = {}) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
    const message = { id: 'msg_1', type: 'message', role: 'assistant', model: 'claude-haiku-4-5', content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 700, output_tokens: 1 } };
    const anthropic: Script = {
      headers: { 'content-type': 'text/event-stream' },
      steps: [
        aev('message_start', { message }),
        aev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
        aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Net 30.' } }),
        aev('content_block_stop', { index: 0 }),
        aev('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 9 } }),
        aev('message_stop'),
      ],
    };
    const down: Upstream = () => json(503, { error: { message: 'overloaded', type: 'server_error', param: null, code: null } });
    const { s, seen, client } = await start(
      { p: down, a: { family: 'anthropic', answer: () => anthropic } },
      [{ provider: 'p' }, { provider: 'a', model: 'claude-haiku-4-5' }],
      { provider: { streamUsage: true }, route: { retry: { maxAttempts: 1 } } },
    );
    const got = await sdkStream(client);
    expect(got.text).toBe('Net 30.');
    expect(withUsageField(got.chunks)).toEqual([]);
    expect(seen.p![0]!.body.stream_options).toEqual({ include_usage: true });
    expect(seen.a![0]!.body).not.toHaveProperty('stream_options');
    await requestLines(s, 1);
    expect(await tokens(s)).toEqual({ 'a/claude-haiku-4-5 prompt': 700, 'a/claude-haiku-4-5 completion': 9 });
  });

  it('the Responses API: no stream_options sent, its completed event (and usage) reaches the client as before', async () => {
    const { s, seen, client } = await start(
      { p: () => ({ headers: { 'content-type': 'text/event-stream' }, steps: [...responsesHead(), textDelta('Net 30.', 4), ...responsesTail('Net 30.', 5)] }) },
      [{ provider: 'p' }],
      { provider: { streamUsage: true }, path: '/v1/responses' },
    );
    let usage: unknown;
    for await (const ev of await client.responses.create({ model: 'gpt-4.1', input: 'Payment terms?', stream: true })) if (ev.type === 'response.completed') usage = ev.response.usage;
    expect(usage).toMatchObject({ input_tokens: 12, output_tokens: 2 });
    expect(seen.p![0]!.body).not.toHaveProperty('stream_options');
    await requestLines(s, 1);
    expect(await tokens(s)).toEqual({ 'p/gpt-4.1 prompt': 12, 'p/gpt-4.1 completion': 2 });
  });

  it('a streamRecovery continuation at a streamUsage target is asked for its usage, billed to it, and hidden from the client', async () => {
    const cut = (): Script => ({ headers: { 'content-type': 'text/event-stream' }, steps: [cc([delta({ role: 'assistant', content: '' })], { usage: null }), cc([delta({ content: 'Net ' })], { usage: null }), 50, { destroy: true }] });
    const { s, seen, client } = await start(
      { p: cut, q: (body) => openaiStream(body) },
      [{ provider: 'p' }, { provider: 'q' }],
      { provider: { streamUsage: true }, route: { streamRecovery: 'continue', retry: { maxAttempts: 1 } } },
    );
    const got = await sdkStream(client);
    expect(got.text).toBe('Net 30.');
    expect(withUsageField(got.chunks)).toEqual([]);
    expect(seen.q![0]!.body.stream_options).toEqual({ include_usage: true });
    const [line] = await requestLines(s, 1);
    expect(line!.streamEnd).toBe('recovered');
    expect(line!.continuationUsage).toEqual({ target: 'q/gpt-4o', usage: { prompt: 1234, completion: 56 } });
    expect(await tokens(s)).toEqual({ 'q/gpt-4o prompt': 1234, 'q/gpt-4o completion': 56 });
  });
});
