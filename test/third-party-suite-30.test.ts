// A thirtieth third-party suite, written from the README alone ("What the client sees", "Retries", "Deadlines and
// timeouts", "Streaming", "Failover and API families" with "Anthropic clients (/v1/messages)", "Errors"), as a
// company whose agent fleet is PINNED TO OLDER OFFICIAL SDKs would test the gateway: the last `openai` 4.x (4.104.0,
// node-fetch and agentkeepalive underneath), the last `openai` 5.x (5.23.2, the built-in fetch), and an older
// `@anthropic-ai/sdk` (0.39.0, the last 0.3x, node-fetch underneath), installed beside the current ones through npm
// aliases (`openai-v4`, `openai-v5`, `anthropic-sdk-v0`). Every client runs at its DEFAULT settings (2 retries of its
// own, 10-minute timeout, its own transport: no `fetch` of the test's), against upstreams of the test's own that
// fail: 429s with `retry-after` / `retry-after-ms`, 503 brownouts, hangs past the deadline, streams cut mid-way, and
// Anthropic's 529 `overloaded_error`. For each version the suite records what the SDK sees (its result or its error's
// status, code, request id and headers) and how many requests the provider got; the client's own requests are
// counted from the gateway's request log lines, one per request. The rule under test: the SDK's retries never
// multiply the gateway's (`x-should-retry: false` on every error but a "come back after this wait").
//
// What each version does, read from its source and checked here:
// - All three honour `x-should-retry` (true: retry after `retry-after-ms` / `retry-after` when under 60 s; false:
//   no retry) and raise an error event inside a stream (`data: {"error":...}` for openai, `event: error` for
//   Anthropic), so a stream the gateway ends with `stream_interrupted` is never returned as a truncated answer.
// - Request ids: openai 4.x `err.request_id`, openai 5.x `err.requestID` (both from `x-request-id`), Anthropic 0.39
//   `err.request_id` (from `request-id`). openai 4.x and Anthropic 0.39 give `err.headers` as a plain object, openai
//   5.x as `Headers`.
// - `x-stainless-timeout`: openai 4.104 sends it for the client-wide timeout too (600 by default), in seconds;
//   openai 5.x only for a per-request timeout (as 6.x); Anthropic 0.39 for every `messages.create`, but in
//   MILLISECONDS (`"600000"` by default): the Anthropic JS SDK 0.37.0 to 0.39.x and the openai JS SDK 4.83.0 to
//   4.91.x sent it so before both switched to seconds (their changelogs: "send X-Stainless-Timeout in seconds").
// Found and fixed: the gateway read Anthropic 0.39's `x-stainless-timeout: 2000` (a 2 s timeout) as 2000 s, so its
// deadline fell back to the route's; the SDK gave up at 2 s on its own and sent the call twice more, each one a new
// upstream request: 3 upstream requests and an APIConnectionTimeoutError where the README promises one request and a
// `504 deadline_exceeded` with `x-should-retry: false` (src/policy/deadline.ts: the SDKs and versions that send
// milliseconds, told by their `user-agent`, are read in ms).
// Asserted as the SDK's own behaviour, which no gateway can change: openai 5.x sends no timeout header for a
// client-wide `timeout`, so at that timeout it gives up and retries by itself (3 upstream requests); the README's
// `defaultHeaders: { 'x-stormgate-timeout-ms' }` fixes it, and that is checked too.
import { setTimeout as sleep } from 'node:timers/promises';
import AnthropicV0 from 'anthropic-sdk-v0';
import OpenAIv4 from 'openai-v4';
import OpenAIv5 from 'openai-v5';
import { describe, expect, it } from 'vitest';
import { cc, completion, delta, DONE, json, type Answer, type Script, type Seen } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams, type UpstreamsOptions } from './helpers/scripted-upstreams.ts';
import { requestLine, type Stack } from './helpers/stack.ts';

const start = useScriptedUpstreams();
const CLIENT_KEY = 'sk-client-not-a-provider-key';

// ---------------------------------------------------------------------------------------------------------------
// The two older openai SDKs behind one face: what a call returns or raises, as each version exposes it.

type OpenAIVersion = 'openai 4.104.0' | 'openai 5.23.2';
interface Raised {
  status: number | undefined;
  code: string | null | undefined;
  requestId: string | null | undefined;
  shouldRetry: string | null | undefined;
  /** The error's class name (APIConnectionTimeoutError, InternalServerError, ...). */
  name: string;
  message: string;
}

interface OldOpenAI {
  version: OpenAIVersion;
  /** A client of the gateway at the SDK's defaults, but for the options given. */
  client(s: Stack, opts?: { timeout?: number; defaultHeaders?: Record<string, string> }): OldClient;
}
interface OldClient {
  chat(opts?: { timeout?: number }): Promise<string>;
  /** Streams a chat, collecting the text; rejects with what the SDK raised and the text it had. */
  stream(): Promise<string>;
}

const body = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'Summarise the incident report.' }] };

/** What an error from any of the three SDKs says, each version's way. */
function raised(err: unknown, partial = ''): Raised & { partial: string } {
  const e = err as Record<string, unknown> & { headers?: unknown };
  const h = e.headers;
  const header = (name: string): string | null | undefined =>
    h instanceof Headers ? h.get(name) : h && typeof h === 'object' ? ((h as Record<string, string | undefined>)[name] ?? null) : undefined;
  return {
    status: e.status as number | undefined,
    code: (e.code as string | null | undefined) ?? ((e.error as { error?: { code?: string } } | undefined)?.error?.code ?? null),
    requestId: (e.requestID ?? e.request_id) as string | null | undefined,
    shouldRetry: header('x-should-retry'),
    name: (err as Error).constructor.name,
    message: (err as Error).message,
    partial,
  };
}

/** What of either older SDK's client the suite calls: the two versions' types differ, their calls do not. */
interface ChatCreate {
  chat: { completions: { create(body: object, opts?: object): Promise<any> } };
}

/** One face for an older openai SDK, given how to make its client. */
function oldOpenAI(version: OpenAIVersion, make: (opts: { baseURL: string; apiKey: string; timeout?: number; defaultHeaders?: Record<string, string> }) => ChatCreate): OldOpenAI {
  return {
    version,
    client(s, opts = {}) {
      const c = make({ baseURL: s.baseURL, apiKey: CLIENT_KEY, ...opts });
      return {
        async chat(o = {}) {
          const r = await c.chat.completions.create(body, o);
          return (r.choices[0]?.message.content as string | null) ?? '';
        },
        async stream() {
          let text = '';
          try {
            const chunks = (await c.chat.completions.create({ ...body, stream: true })) as AsyncIterable<{ choices: Array<{ delta: { content?: string | null } }> }>;
            for await (const chunk of chunks) text += chunk.choices[0]?.delta.content ?? '';
          } catch (err) {
            throw Object.assign(err as Error, { partial: text });
          }
          return text;
        },
      };
    },
  };
}

const V4 = oldOpenAI('openai 4.104.0', (opts) => new OpenAIv4(opts));
const V5 = oldOpenAI('openai 5.23.2', (opts) => new OpenAIv5(opts));

const settle = <T>(p: Promise<T>) =>
  p.then(
    (value) => ({ ok: true as const, value }),
    (error: unknown) => ({ ok: false as const, error: raised(error, (error as { partial?: string }).partial ?? '') }),
  );

/** The client's requests to the gateway: one request log line each, once written (a line follows its answer by a tick). */
async function clientRequests(s: Stack, atLeast = 1): Promise<number> {
  const count = () =>
    s.logs.filter((l) => {
      const line = JSON.parse(l) as { route?: string; outcome?: string };
      return line.route !== undefined && line.outcome !== undefined;
    }).length;
  const until = Date.now() + 2_000;
  while (count() < atLeast && Date.now() < until) await sleep(20);
  await sleep(50);
  return count();
}

/** What the suite measured, printed at the end: per version and scenario, the SDK's view and the upstream requests. */
const record: string[] = [];
const note = (version: string, scenario: string, sdkSaw: string, upstream: number, client: number) =>
  record.push(`${version.padEnd(16)} ${scenario.padEnd(34)} client ${client}  upstream ${upstream}  sdk: ${sdkSaw}`);
const total = (seen: Record<string, Seen[]>) => Object.values(seen).reduce((n, s) => n + s.length, 0);

// Upstream answers.
const rateLimited = (headers: Record<string, string>): Script =>
  json(429, { error: { message: 'Rate limit reached for gpt-4o on requests per min (RPM): Limit 500, Used 500, Requested 1.', type: 'requests', param: null, code: 'rate_limit_exceeded' } }, headers);
const busy = (n: number): Script => json(503, { error: { message: 'The server is overloaded or not ready yet.', type: 'server_error', param: null, code: null } }, { 'x-request-id': `req_up_${n}` });
const answer =
  (text: string): Answer =>
  (b) =>
    b.stream === true ? { steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: text })]), cc([delta({}, 'stop')]), DONE] } : completion(text, 'gpt-4o');
const thenAnswer =
  (first: Answer, times = 1, text = 'Two services degraded.'): Answer =>
  (b, n) =>
    n <= times ? first(b, n) : answer(text)(b, n);
/** Headers at once, then nothing for 20 s: a provider that hangs. */
const hang: Answer = () => ({ status: 200, headers: { 'content-type': 'application/json' }, steps: [20_000, '{}'] });
/** A stream cut after two words of its text. */
const cutStream: Answer = () => ({ steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Two services' })]), 30, cc([delta({ content: ' degr' })]), 30, { destroy: true }] });

const chatRoute = (opts: UpstreamsOptions = {}) => opts;

describe.each([V4, V5])('$version against failing providers, at its default settings', (sdk) => {
  it('gets the answer of a 429 whose retry-after: 1 the gateway waits out itself: one client request, two upstream', async () => {
    const { s, seen } = await start({ p: thenAnswer(() => rateLimited({ 'retry-after': '1' })) }, [{ provider: 'p' }]);
    const t0 = Date.now();
    const text = await sdk.client(s).chat();
    expect(text).toBe('Two services degraded.');
    expect(Date.now() - t0).toBeGreaterThanOrEqual(950);
    expect(seen.p!).toHaveLength(2);
    const client = await clientRequests(s);
    expect(client).toBe(1);
    note(sdk.version, '429 retry-after: 1 (gateway waits)', 'answer', seen.p!.length, client);
  });

  it('comes back after the retry-after-ms of a hold-off the gateway would not wait out, and gets the answer', async () => {
    const { s, seen } = await start({ p: thenAnswer(() => rateLimited({ 'retry-after-ms': '1500' })) }, [{ provider: 'p' }], chatRoute({ route: { retry: { maxAttempts: 2, maxWaitHintMs: 500 } } }));
    const t0 = Date.now();
    const text = await sdk.client(s).chat();
    expect(text).toBe('Two services degraded.');
    // The SDK slept what it was told (the hint plus the gateway's spread), so the upstream saw the retry after the hold-off.
    expect(Date.now() - t0).toBeGreaterThanOrEqual(1_450);
    expect(seen.p!).toHaveLength(2);
    expect(seen.p!.map((r) => r.headers['x-stainless-retry-count'])).toEqual(['0', '1']);
    const client = await clientRequests(s, 2);
    expect(client).toBe(2);
    note(sdk.version, '429 retry-after-ms: 1500 (hold-off)', 'answer after x-should-retry: true', seen.p!.length, client);
  });

  it("raises the brownout's 503 once, with x-should-retry: false and the provider's request id: its retries do not multiply the gateway's", async () => {
    const { s, seen } = await start({ p: (_b, n) => busy(n) }, [{ provider: 'p' }]);
    const r = await settle(sdk.client(s).chat());
    expect(r.ok).toBe(false);
    if (r.ok) return;
    expect(r.error).toMatchObject({ status: 503, shouldRetry: 'false', requestId: 'req_up_2', name: 'InternalServerError' });
    expect(seen.p!).toHaveLength(2); // the route's maxAttempts, and no more
    const client = await clientRequests(s);
    expect(client).toBe(1);
    note(sdk.version, '503 brownout', `${r.error.name} ${r.error.status} id=${r.error.requestId}`, seen.p!.length, client);
  });

  it("gets 504 deadline_exceeded before a per-request timeout (x-stainless-timeout), with the gateway's request id, and sends it once", async () => {
    const { s, seen } = await start({ p: hang }, [{ provider: 'p' }], chatRoute({ route: { timeoutMs: 10_000 } }));
    const t0 = Date.now();
    const r = await settle(sdk.client(s).chat({ timeout: 2_000 }));
    const took = Date.now() - t0;
    expect(r.ok).toBe(false);
    if (r.ok) return;
    expect(r.error).toMatchObject({ status: 504, code: 'deadline_exceeded', shouldRetry: 'false' });
    expect(took).toBeLessThan(2_000);
    const line = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.status === 504);
    expect(r.error.requestId).toBe(line?.reqId ?? line?.requestId);
    expect(seen.p!).toHaveLength(1);
    const client = await clientRequests(s);
    expect(client).toBe(1);
    note(sdk.version, 'hang, per-request timeout 2 s', `${r.error.status} ${r.error.code} after ${took} ms`, seen.p!.length, client);
  });

  it('at a client-wide timeout: openai 4.x sends x-stainless-timeout and gets the 504; 5.x sends none and retries by itself', async () => {
    const { s, seen } = await start({ p: hang }, [{ provider: 'p' }], chatRoute({ route: { timeoutMs: 10_000 } }));
    const r = await settle(sdk.client(s, { timeout: 1_000 }).chat());
    expect(r.ok).toBe(false);
    if (r.ok) return;
    if (sdk === V4) {
      // 4.x: Math.trunc(1000 / 1000) = 1 s sent; the gateway answers before the SDK gives up.
      expect(r.error).toMatchObject({ status: 504, code: 'deadline_exceeded', shouldRetry: 'false' });
      expect(seen.p!).toHaveLength(1);
    } else {
      // 5.x (as 6.x, README "Deadlines and timeouts"): no header, so the route's 10 s is the gateway's deadline; the SDK
      // times out at 1 s and sends the call twice more, each a new upstream request. The SDK's own, not the gateway's.
      expect(r.error.name).toBe('APIConnectionTimeoutError');
      expect(seen.p!).toHaveLength(3);
    }
    const client = await clientRequests(s, seen.p!.length);
    expect(client).toBe(seen.p!.length);
    note(sdk.version, 'hang, client-wide timeout 1 s', `${r.error.name} ${r.error.status ?? ''} ${r.error.code ?? ''}`, seen.p!.length, client);
  });

  it("gets the 504 at a client-wide timeout when x-stormgate-timeout-ms is in its defaultHeaders (the README's advice)", async () => {
    const { s, seen } = await start({ p: hang }, [{ provider: 'p' }], chatRoute({ route: { timeoutMs: 10_000 } }));
    const r = await settle(sdk.client(s, { timeout: 1_500, defaultHeaders: { 'x-stormgate-timeout-ms': '1500' } }).chat());
    expect(r.ok).toBe(false);
    if (r.ok) return;
    expect(r.error).toMatchObject({ status: 504, code: 'deadline_exceeded', shouldRetry: 'false' });
    expect(seen.p!).toHaveLength(1);
    note(sdk.version, 'hang, timeout + x-stormgate-timeout-ms', `${r.error.status} ${r.error.code}`, seen.p!.length, await clientRequests(s));
  });

  it('raises a stream cut mid-way (stream_interrupted), never returning the truncated text as a whole answer', async () => {
    const { s, seen } = await start({ p: cutStream }, [{ provider: 'p' }]);
    const r = await settle(sdk.client(s).stream());
    expect(r.ok).toBe(false);
    if (r.ok) return;
    expect(r.error.code).toBe('stream_interrupted');
    expect(r.error.partial).toBe('Two services degr');
    expect(seen.p!).toHaveLength(1);
    const client = await clientRequests(s);
    expect(client).toBe(1);
    note(sdk.version, 'stream cut mid-way', `${r.error.name} ${r.error.code} after "${r.error.partial}"`, seen.p!.length, client);
  });

  it('gets a chat completion from the Anthropic backup when the OpenAI primary browns out, whole and streamed', async () => {
    const { s, seen } = await start(
      { p: (_b, n) => busy(n), claude: { family: 'anthropic', answer: (b) => (b.stream === true ? anthropicStream('Failed over.') : anthropicMessage('Failed over.')) } },
      [{ provider: 'p' }, { provider: 'claude', model: 'claude-sonnet-4-6' }],
    );
    const c = sdk.client(s);
    expect(await c.chat()).toBe('Failed over.');
    expect(await c.stream()).toBe('Failed over.');
    expect(seen.p!).toHaveLength(4); // two attempts per call on the primary
    expect(seen.claude).toHaveLength(2);
    expect(seen.claude!.every((r) => r.url === '/v1/messages')).toBe(true);
    const client = await clientRequests(s, 2);
    expect(client).toBe(2);
    note(sdk.version, 'failover to Anthropic (2 calls)', 'answers, whole and streamed', total(seen), client);
  });
});

// ---------------------------------------------------------------------------------------------------------------
// @anthropic-ai/sdk 0.39.0 on /v1/messages.

const ANTHROPIC = 'anthropic 0.39.0';
const ev = (type: string, fields: object = {}) => `event: ${type}\ndata: ${JSON.stringify({ type, ...fields })}\n\n`;
const messageOf = (text: string) => ({ id: 'msg_01', type: 'message', role: 'assistant', model: 'claude-sonnet-4-6', content: [{ type: 'text', text }], stop_reason: 'end_turn', stop_sequence: null, usage: { input_tokens: 9, output_tokens: 3 } });
function anthropicMessage(text: string): Script {
  return json(200, messageOf(text), { 'request-id': 'req_anthropic_ok' });
}
function anthropicStream(text: string, cut = false): Script {
  const head = [ev('message_start', { message: { ...messageOf(text), content: [], stop_reason: null } }), ev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } })];
  const words = text.split(' ');
  if (cut) return { headers: { 'content-type': 'text/event-stream', 'request-id': 'req_anthropic_stream' }, steps: [...head, ev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: words[0] } }), 30, { destroy: true }] };
  return {
    headers: { 'content-type': 'text/event-stream', 'request-id': 'req_anthropic_stream' },
    steps: [...head, ev('content_block_delta', { index: 0, delta: { type: 'text_delta', text } }), ev('content_block_stop', { index: 0 }), ev('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 3 } }), ev('message_stop')],
  };
}
const overloaded = (n: number): Script => json(529, { type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } }, { 'request-id': `req_overloaded_${n}` });
const ask = { model: 'claude-sonnet-4-6', max_tokens: 256, messages: [{ role: 'user' as const, content: 'Where is my order?' }] };

async function claudeGateway(up: Answer, opts: UpstreamsOptions = {}) {
  return start({ claude: { family: 'anthropic', answer: up } }, [{ provider: 'claude' }], { path: '/v1/messages', ...opts });
}
const claude = (s: Stack, opts: { timeout?: number } = {}) => new AnthropicV0({ baseURL: s.url, apiKey: CLIENT_KEY, ...opts });
const textOf = (m: { content: Array<{ type: string; text?: string }> }) => m.content.map((b) => b.text ?? '').join('');

describe(`${ANTHROPIC} on /v1/messages, at its default settings`, () => {
  it("gets the message after a 529 overloaded_error the gateway retried: one client request, two upstream", async () => {
    const { s, seen } = await claudeGateway((b, n) => (n === 1 ? overloaded(n) : b.stream === true ? anthropicStream('On its way.') : anthropicMessage('On its way.')));
    const m = await claude(s).messages.create(ask);
    expect(textOf(m)).toBe('On its way.');
    expect(seen.claude).toHaveLength(2);
    const client = await clientRequests(s);
    expect(client).toBe(1);
    note(ANTHROPIC, '529 once, then the message', 'message', seen.claude!.length, client);
  });

  it("raises a lasting 529 once (status 529, overloaded_error, the provider's request id, x-should-retry: false)", async () => {
    const { s, seen } = await claudeGateway((_b, n) => overloaded(n));
    const r = await settle(claude(s).messages.create(ask));
    expect(r.ok).toBe(false);
    if (r.ok) return;
    expect(r.error).toMatchObject({ status: 529, requestId: 'req_overloaded_2', shouldRetry: 'false' });
    expect(r.error.message).toContain('overloaded_error');
    expect(seen.claude).toHaveLength(2);
    const client = await clientRequests(s);
    expect(client).toBe(1);
    note(ANTHROPIC, '529 overloaded, lasting', `${r.error.name} ${r.error.status} id=${r.error.requestId}`, seen.claude!.length, client);
  });

  it('comes back after the retry-after-ms of a hold-off the gateway would not wait out, and gets the message', async () => {
    const rateLimit = json(429, { type: 'error', error: { type: 'rate_limit_error', message: 'Number of request tokens has exceeded your per-minute rate limit' } }, { 'retry-after-ms': '1500', 'request-id': 'req_429' });
    const { s, seen } = await claudeGateway((_b, n) => (n === 1 ? rateLimit : anthropicMessage('On its way.')), { route: { retry: { maxAttempts: 2, maxWaitHintMs: 500 } } });
    const t0 = Date.now();
    const m = await claude(s).messages.create(ask);
    expect(textOf(m)).toBe('On its way.');
    expect(Date.now() - t0).toBeGreaterThanOrEqual(1_450);
    expect(seen.claude!.map((r) => r.headers['x-stainless-retry-count'])).toEqual(['0', '1']);
    const client = await clientRequests(s, 2);
    expect(client).toBe(2);
    note(ANTHROPIC, '429 retry-after-ms: 1500 (hold-off)', 'message after x-should-retry: true', seen.claude!.length, client);
  });

  it('raises a message stream cut mid-way (event: error), with the text so far', async () => {
    const { s, seen } = await claudeGateway(() => anthropicStream('On its way.', true));
    let text = '';
    const r = await settle(
      (async () => {
        try {
          for await (const e of await claude(s).messages.create({ ...ask, stream: true })) if (e.type === 'content_block_delta' && e.delta.type === 'text_delta') text += e.delta.text;
        } catch (err) {
          throw Object.assign(err as Error, { partial: text });
        }
        return text;
      })(),
    );
    expect(r.ok).toBe(false);
    if (r.ok) return;
    expect(r.error.partial).toBe('On');
    // 0.39 raises an SSE error event through APIError.generate() with no status, which makes it an APIConnectionError
    // whose message is the event's data: the SDK's own, and still raised, never a truncated message.
    expect(r.error).toMatchObject({ name: 'APIConnectionError', status: undefined });
    expect(r.error.message).toContain('stream_interrupted');
    expect(seen.claude).toHaveLength(1);
    const client = await clientRequests(s);
    expect(client).toBe(1);
    note(ANTHROPIC, 'stream cut mid-way', `${r.error.name} after "${r.error.partial}"`, seen.claude!.length, client);
  });

  it("keeps the route's deadline at its default timeout (x-stainless-timeout: 600000, 10 minutes in ms)", async () => {
    const { s, seen } = await claudeGateway(() => anthropicMessage('On its way.'));
    expect(textOf(await claude(s).messages.create(ask))).toBe('On its way.');
    expect(seen.claude).toHaveLength(1);
    expect(await requestLine(s)).toMatchObject({ deadlineSource: 'route', budgetMs: 114_000 });
  });

  // The bug: x-stainless-timeout "2000" (ms) read as 2000 s left the route's 10 s deadline; the SDK timed out at 2 s
  // three times, and the provider got three requests.
  it('gets 504 deadline_exceeded before its 2 s timeout, sent in ms, and the provider one request', async () => {
    const { s, seen } = await claudeGateway(hang, { route: { timeoutMs: 10_000 } });
    const t0 = Date.now();
    const r = await settle(claude(s, { timeout: 2_000 }).messages.create(ask));
    const took = Date.now() - t0;
    expect(r.ok).toBe(false);
    if (r.ok) return;
    expect(r.error).toMatchObject({ status: 504, code: 'deadline_exceeded', shouldRetry: 'false' });
    expect(took).toBeLessThan(2_000);
    expect(await requestLine(s)).toMatchObject({ deadlineSource: 'x-stainless-timeout', budgetMs: 1_750 });
    expect(seen.claude).toHaveLength(1);
    const client = await clientRequests(s);
    expect(client).toBe(1);
    note(ANTHROPIC, 'hang, timeout 2 s (sent as 2000)', `${r.error.status} ${r.error.code} after ${took} ms`, seen.claude!.length, client);
  });
});

describe('the record', () => {
  it('prints what each version saw and what the providers got', () => {
    console.log(`\nSDK versions against failing providers (route maxAttempts 2):\n${record.join('\n')}\n`);
    expect(record.length).toBeGreaterThan(0);
  });
});
