// An agent fleet on OpenAI's Responses API through the gateway, played with the official `openai` SDK against a
// provider of the test's own that sends any event sequence: what the SDK sees (an answer, or an error it raises), how
// many requests the provider gets (the SDK's retries must never multiply the gateway's), and what the gateway writes
// itself. Found here: an error event ending a stream the client's deadline had started carried no sequence_number; a
// rate limit reported as a response.failed was a 502 and opened the breaker; a backup with a model of its own that
// serves no /v1/responses hid the primary's outage behind its 404.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { baseResponse, fastRetries, msgItem, responsesHead, responsesTail, rev, scripted, textDelta, useScriptedGateway, type Script, type Seen } from './helpers/scripted-provider.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { configServedBy, useStacks } from './helpers/stack.ts';

type ApiError = InstanceType<typeof OpenAI.APIError>;

/** Three quick attempts per target, and a breaker that opens once half of four requests have failed. */
const gw = useScriptedGateway((c, origin) => {
  fastRetries(c, origin);
  (c.providers.p as Record<string, unknown>).breaker = { minRequests: 4, failureRate: 0.5 };
});
const startProvider = useFakeProviders();
const startStack = useStacks();

const usage = { input_tokens: 1, output_tokens: 1, total_tokens: 2 };
const json = (body: unknown, status = 200, headers: Record<string, string> = {}): Script => ({ status, headers: { 'content-type': 'application/json', ...headers }, steps: [JSON.stringify(body)] });
const full = (): string[] => [...responsesHead(), textDelta('Hel', 4), textDelta('lo', 5), ...responsesTail('Hello', 6)];
const textOf = (r: { output: unknown[] }) =>
  (r.output as Array<{ type: string; content?: Array<{ text?: string }> }>).flatMap((o) => (o.type === 'message' ? o.content ?? [] : [])).map((c) => c.text ?? '').join('');

const reasoningItem = { id: 'rs_1', type: 'reasoning', summary: [] };
/** A reasoning model's opening events before it has anything to show: created, in_progress, its reasoning item added (0 to 2). */
const thinkingHead = (): string[] => [
  rev('response.created', { response: baseResponse('in_progress') }, 0),
  rev('response.in_progress', { response: baseResponse('in_progress') }, 1),
  rev('response.output_item.added', { output_index: 0, item: reasoningItem }, 2),
];

/** A stream's events as they reach a client, with their `event:` names and parsed data. */
async function eventsOf(baseURL: string, headers: Record<string, string>): Promise<Array<{ event: string | null; data: Record<string, unknown> }>> {
  const res = await fetch(`${baseURL}/responses`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify({ model: 'o4-mini', input: 'hi', stream: true }) });
  expect(res.status).toBe(200);
  return (await res.text())
    .split('\n\n')
    .filter((block) => block.split('\n').some((l) => l.startsWith('data:')))
    .map((block) => {
      const lines = block.split('\n');
      const data = lines.filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trim()).join('\n');
      return { event: lines.find((l) => l.startsWith('event:'))?.slice(6).trim() ?? null, data: JSON.parse(data) as Record<string, unknown> };
    });
}

/** An `openai` client of the gateway that counts its own HTTP requests (its retries included). */
function sdk(baseURL: string, maxRetries: number, headers: Record<string, string> = {}): { client: OpenAI; requests: () => number } {
  let n = 0;
  const client = new OpenAI({
    baseURL,
    apiKey: 'client-key',
    maxRetries,
    defaultHeaders: headers,
    fetch: (input, init) => {
      n++;
      return fetch(input, init);
    },
  });
  return { client, requests: () => n };
}

describe('a reasoning model that thinks before its first output', () => {
  it('is not cut at idleMs while it thinks within firstTokenMs, and is timed out at firstTokenMs when its only events are keep-alives', async () => {
    // in_progress, an added reasoning item and an opened summary part carry no output (README: Timeouts): they neither
    // stop the first-token timer nor start the answer, so the gateway still retries a model that never gets going.
    const summaryOpen = rev('response.reasoning_summary_part.added', { item_id: 'rs_1', output_index: 0, summary_index: 0, part: { type: 'summary_text', text: '' } }, 3);
    const late = [...thinkingHead(), summaryOpen, 1_000, ...responsesHead().slice(2).map((e) => e.replace('"output_index":0', '"output_index":1')), textDelta('Hello', 6), ...responsesTail('Hello', 7)];
    const { client, seen } = await gw(() => ({ steps: late }), { firstTokenMs: 3_000, idleMs: 300 });
    expect(textOf(await client.responses.stream({ model: 'o4-mini', input: 'hi', reasoning: { summary: 'auto' } }).finalResponse())).toBe('Hello');
    expect(seen.length).toBe(1);

    const heartbeat = (seq: number) => [150, rev('response.in_progress', { response: baseResponse('in_progress') }, seq)];
    // 16 heartbeats (2.4 s): the retry at firstTokenMs (600 ms) answers well before them, with room both ways for a
    // loaded machine's lag (8 heartbeats, 1.2 s, left the bound 500 ms from each).
    const beats = Array.from({ length: 16 }, (_, i) => i + 3);
    const { client: c2, seen: seen2 } = await gw((_b, n) => ({ steps: n === 1 ? [...thinkingHead(), ...beats.flatMap(heartbeat)] : full() }), { firstTokenMs: 600, idleMs: 300 });
    const started = Date.now();
    expect(textOf(await c2.responses.stream({ model: 'o4-mini', input: 'hi' }).finalResponse())).toBe('Hello');
    expect(Date.now() - started).toBeLessThan(1_800);
    expect(seen2.length).toBe(2);
  });

  it('ends a stream its client\'s deadline started with an error event numbered on from the head it got (cut, or stalled)', async () => {
    // The deadline (x-stormgate-timeout-ms, an SDK's timeout) starts a stream whose provider has sent only its head:
    // no event had passed the LiveStream itself, and the error event it wrote had no sequence_number, which the Vercel
    // AI SDK refuses ("Type validation failed") in place of the stream_interrupted error it carries.
    const { s, seen } = await gw(() => ({ steps: [...thinkingHead(), 1_200, { destroy: true }] }));
    const cut = await eventsOf(s.baseURL, { 'x-stormgate-timeout-ms': '1000' });
    expect(cut.map((e) => e.data.type)).toEqual(['response.created', 'response.in_progress', 'response.output_item.added', 'error']);
    expect(cut.at(-1)!.data).toMatchObject({ type: 'error', sequence_number: 3, code: 'stream_interrupted' });
    expect(seen.length).toBe(1);

    // A model that then stays silent: what is left of firstTokenMs ends it (idleMs bounds gaps only after the first output).
    const { s: s2 } = await gw(() => ({ steps: thinkingHead(), hold: true }), { firstTokenMs: 1_500, idleMs: 400 });
    const stalled = await eventsOf(s2.baseURL, { 'x-stormgate-timeout-ms': '1000' });
    expect(stalled.at(-1)!.data).toMatchObject({ type: 'error', sequence_number: 3 });
    expect(String(stalled.at(-1)!.data.message)).toContain('stalled');
    // The SDK raises it, never a clean end.
    const { client } = sdk(s2.baseURL, 0, { 'x-stormgate-timeout-ms': '1000' });
    await expect(client.responses.stream({ model: 'o4-mini', input: 'hi' }).finalResponse()).rejects.toThrow(/stalled/);
  });

  it('passes on a response.incomplete that came before any text (max_output_tokens spent on reasoning) as the answer it is', async () => {
    const inc = { ...baseResponse('incomplete', [reasoningItem], usage), incomplete_details: { reason: 'max_output_tokens' } };
    const { client, seen } = await gw(() => ({ steps: [...thinkingHead(), rev('response.incomplete', { response: inc }, 3)] }));
    // (The SDK's responses.stream() takes its final snapshot from response.completed only: the raw iterator is read.)
    const events: Array<{ type: string; response?: { status?: string; incomplete_details?: { reason?: string } | null } }> = [];
    for await (const e of await client.responses.create({ model: 'o4-mini', input: 'hi', stream: true, max_output_tokens: 16 })) events.push(e);
    expect(events.map((e) => e.type)).toEqual(['response.created', 'response.in_progress', 'response.output_item.added', 'response.incomplete']);
    expect(events.at(-1)!.response).toMatchObject({ status: 'incomplete', incomplete_details: { reason: 'max_output_tokens' } });
    expect(seen.length).toBe(1);
  });
});

describe('a stream broken before its first delta', () => {
  it('is retried whether cut or ended cleanly after response.created, and the SDK gets the retry\'s answer', async () => {
    const created = rev('response.created', { response: baseResponse('in_progress') }, 0);
    for (const broken of [[created, 20, { destroy: true } as const], [created, rev('response.in_progress', { response: baseResponse('in_progress') }, 1)]]) {
      const { client, seen } = await gw((_b, n) => ({ steps: n === 1 ? broken : full() }));
      const final = await client.responses.stream({ model: 'gpt-4.1', input: 'hi' }).finalResponse();
      expect(textOf(final)).toBe('Hello');
      expect(seen.length).toBe(2);
    }
  });
});

describe('rate limits on responses.create', () => {
  it('waits out retry-after between the gateway\'s attempts, and the SDK is told not to add its own', async () => {
    const limited = json({ error: { message: 'Rate limit reached for requests', type: 'requests', param: null, code: 'rate_limit_exceeded' } }, 429, { 'retry-after': '1' });
    const { s, seen } = await gw(() => limited);
    const { client, requests } = sdk(s.baseURL, 2);
    const started = Date.now();
    const err = (await client.responses.create({ model: 'gpt-4.1', input: 'hi' }).catch((e: unknown) => e)) as ApiError;
    expect(err).toBeInstanceOf(OpenAI.RateLimitError);
    expect(err.code).toBe('rate_limit_exceeded');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(Date.now() - started).toBeGreaterThanOrEqual(2_000);
    expect(seen.length).toBe(3);
    expect(requests()).toBe(1);
  });

  it('reads a rate limit reported in a response.failed, streamed or whole, as the 429 it is: no breaker opened, no 502', async () => {
    // ResponseError.code `rate_limit_exceeded`, sent after response.created (or as a whole Response whose status is
    // failed). Read as a broken stream, each request was a 502 upstream_bad_response, and four of them opened the
    // breaker: circuit_open for every agent for 30 s, where the same limit answered as a 429 never opens it.
    const failed = { ...baseResponse('failed'), error: { code: 'rate_limit_exceeded', message: 'Rate limit reached for gpt-4.1 on tokens per min (TPM): Limit 30000, Used 30000, Requested 1200.' } };
    for (const stream of [true, false]) {
      const { s, seen } = await gw(() => (stream ? { steps: [rev('response.created', { response: baseResponse('in_progress') }, 0), rev('response.failed', { response: failed }, 1)] } : json(failed)));
      const { client } = sdk(s.baseURL, 0);
      for (let i = 0; i < 5; i++) {
        const err = (await (stream ? client.responses.stream({ model: 'gpt-4.1', input: 'hi' }).finalResponse() : client.responses.create({ model: 'gpt-4.1', input: 'hi' })).catch((e: unknown) => e)) as ApiError;
        expect(err, `stream: ${stream}, request ${i + 1}`).toBeInstanceOf(OpenAI.RateLimitError);
        expect(err.code).toBe('rate_limit_exceeded');
        expect(err.message).toContain('Rate limit reached for gpt-4.1');
      }
      expect(seen.length).toBe(15);
      expect(seen.filter((x) => x.headers['x-retry-reason'] !== undefined).every((x) => x.headers['x-retry-reason'] === 'status_429')).toBe(true);
    }
  });
});

describe('deadlines and idempotency keys on a long non-streaming response', () => {
  const slowAnswer = (ms: number): Script => ({ headers: { 'content-type': 'application/json' }, steps: [ms, JSON.stringify(baseResponse('completed', [msgItem('Hello')], usage))] });

  it('answers 504 before the SDK\'s per-request timeout (x-stainless-timeout), which the SDK does not retry', async () => {
    const { s, seen } = await gw(() => slowAnswer(2_500));
    const { client, requests } = sdk(s.baseURL, 2);
    const started = Date.now();
    const err = (await client.responses.create({ model: 'gpt-4.1', input: 'hi' }, { timeout: 1_500 }).catch((e: unknown) => e)) as ApiError;
    expect(err.status).toBe(504);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(Date.now() - started).toBeLessThan(1_500);
    expect(requests()).toBe(1);
    expect(seen.length).toBe(1);
  });

  it('with an Idempotency-Key, the SDK\'s retry after its own timeout waits for the run: one response at the provider', async () => {
    const { s, seen } = await gw(() => slowAnswer(1_500));
    const { client, requests } = sdk(s.baseURL, 3);
    const r = await client.responses.create({ model: 'gpt-4.1', input: 'hi', store: true }, { headers: { 'Idempotency-Key': 'turn-7' }, timeout: 1_000 });
    expect(r.output_text).toBe('Hello');
    expect(requests()).toBe(2);
    expect(seen.length).toBe(1);
  });
});

describe('failover of a responses request to a backup that cannot serve /v1/responses', () => {
  const down: Script = json({ error: { message: 'The server is overloaded', type: 'server_error', param: null, code: null } }, 503);
  const noSuchPath: Script = json({ detail: 'Not Found' }, 404);

  it("answers the primary's 503 with the backup's 404 as a note, whether the backup sends the client's model or one of its own", async () => {
    // A vLLM or Ollama backup without the Responses API answers 404 for the path. With a `model` of its own, that 404
    // was taken as the config's (a retired model) and became the request's last failure: the client got a 404
    // NotFoundError (x-should-retry: false) for a valid request, and never learnt of the primary's outage.
    for (const backupModel of [undefined, 'llama-3.3-70b']) {
      const seenA: Seen[] = [];
      const seenB: Seen[] = [];
      const a = await startProvider(scripted(() => down, seenA));
      const b = await startProvider(scripted(() => noSuchPath, seenB));
      const s = await startStack({
        config: (mockUrl) => {
          const c = configServedBy(mockUrl, 'a', `${a.origin}/v1`);
          c.providers.b = { family: 'openai', baseUrl: `${b.origin}/v1`, apiKey: 'b-key', breaker: false };
          c.routes = c.routes.filter((r) => r.name === 'responses').map((r) => ({ ...r, targets: [{ provider: 'a' }, { provider: 'b', ...(backupModel && { model: backupModel }) }], retry: { maxAttempts: 2, backoff: { strategy: 'fixed' as const, baseMs: 10 } } }));
          return c;
        },
      });
      const { client, requests } = sdk(s.baseURL, 2);
      for (const call of [() => client.responses.create({ model: 'gpt-4.1', input: 'hi' }), () => client.responses.stream({ model: 'gpt-4.1', input: 'hi' }).finalResponse()]) {
        const err = (await call().catch((e: unknown) => e)) as ApiError;
        expect(err.status, `backup model: ${backupModel}`).toBe(503);
        expect(err.error).toMatchObject({ type: 'server_error' });
        expect(err.message).toContain('The server is overloaded');
        expect(err.message).toMatch(/the fallback b\/\S+ rejected the request \(404: .*Not Found/);
        expect(err.headers?.get('x-should-retry')).toBe('false');
        expect(err.headers?.get('x-stormgate-target')).toBe('a/gpt-4.1');
      }
      expect(requests()).toBe(2);
      expect(seenA.length).toBe(4);
      expect(seenB.length).toBe(2);
    }
  });
});
