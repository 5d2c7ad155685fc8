// A Claude-agent fleet's failure scenarios on Anthropic's own API (/v1/messages, /v1/messages/count_tokens), played
// with the official @anthropic-ai/sdk against a provider of the test's own that speaks Anthropic's wire format: what
// the SDK sees, and how many requests the provider gets (the SDK's retries must never multiply the gateway's).
import type { IncomingMessage, RequestListener, ServerResponse } from 'node:http';
import Anthropic from '@anthropic-ai/sdk';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { TEST_KEY, useStacks, type Stack } from './helpers/stack.ts';

const startStack = useStacks();
const startProvider = useFakeProviders();

type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];
type ApiError = InstanceType<typeof Anthropic.APIError>;

/** An Anthropic event, framed as Anthropic sends it. */
const ev = (type: string, fields: object = {}) => `event: ${type}\ndata: ${JSON.stringify({ type, ...fields })}\n\n`;
const usage = { input_tokens: 5, output_tokens: 1 };
const message = { id: 'msg_1', type: 'message', role: 'assistant', model: 'claude-sonnet-4-6', content: [{ type: 'text', text: 'Shipped.' }], stop_reason: 'end_turn', stop_sequence: null, usage };
const start = ev('message_start', { message: { ...message, content: [], stop_reason: null } });
const textOpen = (index = 0) => ev('content_block_start', { index, content_block: { type: 'text', text: '' } });
const textDelta = (text: string, index = 0) => ev('content_block_delta', { index, delta: { type: 'text_delta', text } });
const blockStop = (index = 0) => ev('content_block_stop', { index });
const finish = (reason = 'end_turn') => ev('message_delta', { delta: { stop_reason: reason, stop_sequence: null }, usage: { output_tokens: 7 } });
const errorEvent = (type: string, text: string) => ev('error', { error: { type, message: text } });
const errorBody = (type: string, text: string) => JSON.stringify({ type: 'error', error: { type, message: text } });

/** A handler that reads the request's body first. */
const afterBody =
  (answer: (req: IncomingMessage, res: ServerResponse) => void): RequestListener =>
  (req, res) => {
    req.resume();
    req.on('end', () => answer(req, res));
  };
const sse = (res: ServerResponse) => res.writeHead(200, { 'content-type': 'text/event-stream', 'request-id': 'req_stream' });
const json = (res: ServerResponse, status: number, body: string, headers: Record<string, string> = {}) => res.writeHead(status, { 'content-type': 'application/json', ...headers }).end(body);

const countRoute: RouteInput = { name: 'count', match: { path: '/v1/messages/count_tokens' }, targets: [{ provider: 'claude' }], retry: { maxAttempts: 2, maxWaitHintMs: 5_000 }, park: false };

/** `primary` as the Anthropic account `claude`, and `backup` (when given) as a second account. */
async function stackOf(primary: string, opts: { backup?: string; route?: Partial<RouteInput>; provider?: Partial<ProviderInput>; routes?: RouteInput[] } = {}): Promise<Stack> {
  return startStack({
    config: () => ({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: {
        claude: { family: 'anthropic', baseUrl: primary, apiKey: TEST_KEY, breaker: false, ...opts.provider },
        ...(opts.backup && { backup: { family: 'anthropic' as const, baseUrl: opts.backup, apiKey: 'backup-key', breaker: false } }),
      },
      routes: [
        {
          name: 'messages',
          match: { path: '/v1/messages' },
          targets: [{ provider: 'claude' }, ...(opts.backup ? [{ provider: 'backup' }] : [])],
          budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 },
          park: false,
          retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } },
          ...opts.route,
        },
        ...(opts.routes ?? []),
      ],
    }),
  });
}

/** An Anthropic SDK client of the gateway that counts its HTTP requests (its own retries included). */
function sdk(s: Stack, opts: { maxRetries?: number; timeout?: number } = {}): { client: Anthropic; requests: () => number } {
  let n = 0;
  const client = new Anthropic({
    baseURL: s.url,
    apiKey: 'client-secret-key',
    maxRetries: opts.maxRetries ?? 2,
    ...(opts.timeout !== undefined && { timeout: opts.timeout }),
    fetch: (input, init) => {
      n++;
      return fetch(input, init);
    },
  });
  return { client, requests: () => n };
}

const ask = { model: 'claude-sonnet-4-6', max_tokens: 256, messages: [{ role: 'user' as const, content: 'Where is my order?' }] };
const tools = [{ name: 'lookup_order', input_schema: { type: 'object' as const, properties: { id: { type: 'string' } } } }];

describe('rate limits a Claude agent fleet hits', () => {
  // Anthropic: token counting and message creation have "separate and independent" rate limits. The target's
  // hold-off is keyed by provider and model, which both paths share: Claude Code's count_tokens calls, rate-limited
  // with a retry-after, turned every agent's /v1/messages away with 429 provider_held_off for that long.
  it("keeps count_tokens' own 429 from holding off message creation, and message creation's from holding off count_tokens", async () => {
    const paths: string[] = [];
    const p = await startProvider(
      afterBody((req, res) => {
        paths.push(req.url ?? '');
        const counting = req.url?.includes('count_tokens');
        if (counting && paths.filter((u) => u.includes('count_tokens')).length === 1) {
          json(res, 429, errorBody('rate_limit_error', 'Number of token counting requests has exceeded your rate limit'), { 'retry-after': '30' });
        } else if (!counting && paths.filter((u) => !u.includes('count_tokens')).length === 2) {
          json(res, 429, errorBody('rate_limit_error', 'Number of request tokens has exceeded your per-minute rate limit'), { 'retry-after': '30' });
        } else json(res, 200, counting ? JSON.stringify({ input_tokens: 12 }) : JSON.stringify(message));
      }),
    );
    const s = await stackOf(p.origin, { route: { retry: { maxAttempts: 1 } }, routes: [countRoute] });
    const { client } = sdk(s, { maxRetries: 0 });
    const limited = (await client.messages.countTokens({ model: ask.model, messages: ask.messages }).catch((e: unknown) => e)) as ApiError;
    expect(limited).toBeInstanceOf(Anthropic.RateLimitError);
    expect(Number(limited.headers?.get('retry-after'))).toBeGreaterThanOrEqual(30);
    // The next agent's message goes upstream and is answered.
    expect((await client.messages.create(ask)).content[0]).toMatchObject({ text: 'Shipped.' });
    // Message creation rate-limited in its turn: token counting still goes upstream.
    expect(await client.messages.create(ask).catch((e: unknown) => e)).toBeInstanceOf(Anthropic.RateLimitError);
    expect((await client.messages.countTokens({ model: ask.model, messages: ask.messages })).input_tokens).toBe(12);
    expect(paths).toEqual(['/v1/messages/count_tokens', '/v1/messages', '/v1/messages', '/v1/messages/count_tokens']);
    // Message creation's own hold-off still turns the next message away, without a request upstream.
    const held = (await client.messages.create(ask).catch((e: unknown) => e)) as ApiError;
    expect(held.error).toMatchObject({ type: 'error', error: { type: 'rate_limit_error', code: 'provider_held_off' } });
    expect(held.requestID).toBe(held.headers?.get('x-stormgate-request-id'));
    expect(p.hits()).toBe(4);
  });

  // The same separate limits: count_tokens' 429s cut the adaptive concurrency limit that /v1/messages lives under
  // (both keyed by provider and model), so a token-counting burst throttled every agent's message creation.
  it.each([['count_tokens', false], ['messages', true]])("gives count_tokens an adaptive concurrency limit of its own, which its 429s cut and message creation's do not (%s limited)", async (_, messagesLimited) => {
    let created = 0;
    const p = await startProvider(
      afterBody((req, res) => {
        const limited = req.url?.includes('count_tokens') ? !messagesLimited : messagesLimited && created++ > 0;
        if (limited) json(res, 429, errorBody('rate_limit_error', 'Number of requests has exceeded your rate limit'));
        else json(res, 200, req.url?.includes('count_tokens') ? JSON.stringify({ input_tokens: 12 }) : JSON.stringify(message));
      }),
    );
    const s = await stackOf(p.origin, { provider: { maxConnections: 4 }, route: { retry: { maxAttempts: 1 } }, routes: [{ ...countRoute, retry: { maxAttempts: 1 } }] });
    const { client } = sdk(s, { maxRetries: 0 });
    const limit = async (of = 'claude/claude-sonnet-4-6') => Number((await (await fetch(`${s.url}/metrics`)).text()).match(new RegExp(`^stormgate_pool_limit\\{target="${of}"\\} ([\\d.]+)$`, 'm'))?.[1]);
    expect((await client.messages.create(ask)).content[0]).toMatchObject({ text: 'Shipped.' });
    expect(await limit()).toBe(4);
    for (let i = 0; i < 12; i++) {
      await Promise.all(Array.from({ length: 4 }, () => (messagesLimited ? client.messages.create(ask) : client.messages.countTokens({ model: ask.model, messages: ask.messages })).catch((e: unknown) => e)));
    }
    if (messagesLimited) expect(await limit()).toBeLessThan(4);
    else expect(await limit()).toBe(4);
    // count_tokens' own 429s still damp count_tokens: its route has a limit of its own.
    if (!messagesLimited) expect(await limit('claude/claude-sonnet-4-6 count')).toBeLessThan(4);
  });

  it('waits for an anthropic-ratelimit-requests-reset when no retry-after came, and the SDK sends the call once', async () => {
    let n = 0;
    const p = await startProvider(
      afterBody((_req, res) => {
        if (n++ > 0) return json(res, 200, JSON.stringify(message));
        json(res, 429, errorBody('rate_limit_error', 'Number of requests has exceeded your per-minute rate limit'), {
          'anthropic-ratelimit-requests-limit': '50',
          'anthropic-ratelimit-requests-remaining': '0',
          'anthropic-ratelimit-requests-reset': new Date(Date.now() + 1_000).toISOString(),
          // A limit with room left: its later reset is no reason to wait.
          'anthropic-ratelimit-tokens-remaining': '5000',
          'anthropic-ratelimit-tokens-reset': new Date(Date.now() + 20_000).toISOString(),
        });
      }),
    );
    const s = await stackOf(p.origin);
    const { client, requests } = sdk(s);
    const t0 = Date.now();
    expect((await client.messages.create(ask)).content[0]).toMatchObject({ text: 'Shipped.' });
    expect(Date.now() - t0).toBeGreaterThanOrEqual(900);
    expect(Date.now() - t0).toBeLessThan(5_000);
    expect(p.hits()).toBe(2);
    expect(requests()).toBe(1);
  });

  it('fails over from a rate-limited account to a rate-limited backup once each, then turns agents away without a request upstream', async () => {
    const limited = afterBody((_req, res) => json(res, 429, errorBody('rate_limit_error', 'rate limited'), { 'retry-after': '40', 'request-id': 'req_429' }));
    const primary = await startProvider(limited);
    const backup = await startProvider(limited);
    const s = await stackOf(primary.origin, { backup: backup.origin, route: { retry: { maxAttempts: 3, maxWaitHintMs: 5_000 } } });
    const { client, requests } = sdk(s, { maxRetries: 0 });
    const err = (await client.messages.create(ask).catch((e: unknown) => e)) as ApiError;
    expect(err).toBeInstanceOf(Anthropic.RateLimitError);
    expect(err.requestID).toBe('req_429');
    expect(err.error).toMatchObject({ type: 'error', error: { type: 'rate_limit_error', message: 'rate limited' } });
    expect(Number(err.headers?.get('retry-after'))).toBeGreaterThanOrEqual(40);
    expect([primary.hits(), backup.hits()]).toEqual([1, 1]);
    const held = (await client.messages.stream(ask).finalMessage().catch((e: unknown) => e)) as ApiError;
    expect(held).toBeInstanceOf(Anthropic.RateLimitError);
    expect(held.error).toMatchObject({ type: 'error', error: { type: 'rate_limit_error', code: 'provider_held_off' } });
    expect(held.requestID).toBeTruthy();
    expect([primary.hits(), backup.hits(), requests()]).toEqual([1, 1, 2]);
  });

  it("answers a proxy's HTML 502 in Anthropic's error shape, which the SDK reads as an api_error", async () => {
    const p = await startProvider(afterBody((_req, res) => res.writeHead(502, { 'content-type': 'text/html' }).end('<html><h1>502 Bad Gateway</h1></html>')));
    const s = await stackOf(p.origin, { route: { retry: { maxAttempts: 2, retryOn: [502] } } });
    const { client, requests } = sdk(s);
    const err = (await client.messages.create(ask).catch((e: unknown) => e)) as ApiError;
    expect(err).toBeInstanceOf(Anthropic.InternalServerError);
    expect(err.type).toBe('api_error');
    expect(err.requestID).toBe(err.headers?.get('x-stormgate-request-id'));
    expect(p.hits()).toBe(2);
    expect(requests()).toBe(1);
  });
});

describe('streams a Claude agent reads', () => {
  // Anthropic always names its error events; an Anthropic-compatible server may send `{"type": "error", ...}` as data
  // alone. The gateway read it as an error and ended the stream there, but passed it on unnamed: the SDK skips events
  // without a name, and its stream ended cleanly with half an answer.
  it('raises an error event sent without its event name after the first output, never a clean end', async () => {
    const p = await startProvider(
      afterBody((_req, res) => {
        sse(res);
        res.write(start + textOpen() + textDelta('Your order '));
        setTimeout(() => res.end(`data: ${JSON.stringify({ type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } })}\n\n`), 30);
      }),
    );
    const s = await stackOf(p.origin);
    const { client } = sdk(s);
    const types: string[] = [];
    const iterate = async () => {
      for await (const e of await client.messages.create({ ...ask, stream: true })) types.push(e.type);
    };
    const err = (await iterate().then(() => 'ended cleanly', (e: unknown) => e)) as ApiError;
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(err.error).toMatchObject({ type: 'error', error: { type: 'overloaded_error' } });
    expect(types).toEqual(['message_start', 'content_block_start', 'content_block_delta']);
    expect(p.hits()).toBe(1);
  });

  it('raises an api_error event in the middle of a tool call, never a call with half its input', async () => {
    const p = await startProvider(
      afterBody((_req, res) => {
        sse(res);
        res.write(start + ev('content_block_start', { index: 0, content_block: { type: 'tool_use', id: 'toolu_1', name: 'lookup_order', input: {} } }));
        res.write(ev('content_block_delta', { index: 0, delta: { type: 'input_json_delta', partial_json: '{"id": "A' } }));
        setTimeout(() => res.end(errorEvent('api_error', 'Internal server error')), 30);
      }),
    );
    const s = await stackOf(p.origin);
    const err = (await sdk(s).client.messages.stream({ ...ask, tools }).finalMessage().catch((e: unknown) => e)) as ApiError;
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(err.error).toMatchObject({ error: { type: 'api_error' } });
    expect(p.hits()).toBe(1);
  });

  it('retries a tool_use stream whose overloaded_error came before its first output, and streams the call whole', async () => {
    let n = 0;
    const p = await startProvider(
      afterBody((_req, res) => {
        sse(res);
        if (n++ === 0) return res.end(start + ev('ping') + errorEvent('overloaded_error', 'Overloaded'));
        const json = (partial: string) => ev('content_block_delta', { index: 0, delta: { type: 'input_json_delta', partial_json: partial } });
        res.end(start + ev('content_block_start', { index: 0, content_block: { type: 'tool_use', id: 'toolu_1', name: 'lookup_order', input: {} } }) + json('') + json('{"id": "A') + json('1"}') + blockStop() + finish('tool_use') + ev('message_stop'));
      }),
    );
    const s = await stackOf(p.origin);
    const { client, requests } = sdk(s);
    const msg = await client.messages.stream({ ...ask, tools }).finalMessage();
    expect(msg.stop_reason).toBe('tool_use');
    expect(msg.content).toEqual([expect.objectContaining({ type: 'tool_use', name: 'lookup_order', input: { id: 'A1' } })]);
    expect(p.hits()).toBe(2);
    expect(requests()).toBe(1);
  });

  it('counts thinking deltas as output: a model thinking past firstTokenMs and idleMs in steps is never timed out', async () => {
    const p = await startProvider(
      afterBody((_req, res) => {
        sse(res);
        res.write(start + ev('content_block_start', { index: 0, content_block: { type: 'thinking', thinking: '' } }));
        let k = 0;
        const timer = setInterval(() => {
          res.write(ev('content_block_delta', { index: 0, delta: { type: 'thinking_delta', thinking: `step ${k} ` } }));
          if (++k < 8) return;
          clearInterval(timer);
          const signature = ev('content_block_delta', { index: 0, delta: { type: 'signature_delta', signature: 'sig' } });
          res.end(signature + blockStop() + textOpen(1) + textDelta('Shipped.', 1) + blockStop(1) + finish() + ev('message_stop'));
        }, 250);
        res.on('close', () => clearInterval(timer));
      }),
    );
    // 2 s of thinking in steps of 250 ms against timers of 1 s: the 750 ms between a step and a timer is for a loaded
    // CI machine, which can starve the gateway for a few hundred ms while the next step waits in its socket.
    const s = await stackOf(p.origin, { provider: { timeouts: { firstTokenMs: 1_000, idleMs: 1_000 } } });
    const msg = await sdk(s).client.messages.stream({ ...ask, thinking: { type: 'enabled', budget_tokens: 1024 } }).finalMessage();
    expect(msg.content).toEqual([{ type: 'thinking', thinking: expect.stringMatching(/^step 0 .*step 7 $/), signature: 'sig' }, expect.objectContaining({ type: 'text', text: 'Shipped.' })]);
    expect(p.hits()).toBe(1);
  });

  it('does not take pings for a first token: a stream of pings alone is retried, then a 504 timeout_error the SDK does not retry', async () => {
    const p = await startProvider(
      afterBody((_req, res) => {
        sse(res);
        res.write(start);
        const timer = setInterval(() => res.write(ev('ping')), 50);
        res.on('close', () => clearInterval(timer));
      }),
    );
    const s = await stackOf(p.origin, { provider: { timeouts: { firstTokenMs: 300 } } });
    const { client, requests } = sdk(s);
    const err = (await client.messages.stream(ask).finalMessage().catch((e: unknown) => e)) as ApiError;
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(err.status).toBe(504);
    expect(err.error).toMatchObject({ type: 'error', error: { type: 'timeout_error', code: 'upstream_timeout' } });
    expect(p.hits()).toBe(3);
    expect(requests()).toBe(1);
  });

  it("starts a stream at the SDK's own timeout when the model is still thinking, rather than a 504, and finishes it", async () => {
    const p = await startProvider(
      afterBody((_req, res) => {
        sse(res);
        res.write(start);
        const timer = setInterval(() => res.write(ev('ping')), 200);
        const late = setTimeout(() => {
          clearInterval(timer);
          res.end(textOpen() + textDelta('Shipped.') + blockStop() + finish() + ev('message_stop'));
        }, 2_300);
        res.on('close', () => {
          clearInterval(timer);
          clearTimeout(late);
        });
      }),
    );
    const s = await stackOf(p.origin, { provider: { timeouts: { firstTokenMs: 60_000, idleMs: 1_000 } } });
    // Sent as x-stainless-timeout: 2: the gateway's deadline is 1.75 s, the first token comes at 2.3 s.
    const { client, requests } = sdk(s, { timeout: 2_000 });
    const msg = await client.messages.stream(ask).finalMessage();
    expect(msg.content[0]).toMatchObject({ type: 'text', text: 'Shipped.' });
    expect(p.hits()).toBe(1);
    expect(requests()).toBe(1);
  });

  it('aborts the upstream request when the agent aborts mid-stream, and sends nothing again', async () => {
    let closedAt: number | undefined;
    const p = await startProvider(
      afterBody((_req, res) => {
        sse(res);
        res.write(start + textOpen() + textDelta('a'));
        const timer = setInterval(() => res.write(textDelta('b')), 30);
        res.on('close', () => {
          clearInterval(timer);
          closedAt = Date.now();
        });
      }),
    );
    const s = await stackOf(p.origin);
    const { client, requests } = sdk(s);
    const stream = client.messages.stream(ask);
    let n = 0;
    stream.on('text', () => {
      if (++n === 3) stream.abort();
    });
    expect(await stream.finalMessage().catch((e: unknown) => e)).toBeInstanceOf(Anthropic.APIUserAbortError);
    const abortedAt = Date.now();
    await new Promise((r) => setTimeout(r, 300));
    expect(closedAt).toBeDefined();
    expect(closedAt! - abortedAt).toBeLessThan(250);
    expect(p.hits()).toBe(1);
    expect(requests()).toBe(1);
  });
});

describe('what goes upstream', () => {
  it("forwards anthropic-beta and anthropic-version, and never the agent's x-api-key or bearer token", async () => {
    const seen: IncomingMessage['headers'][] = [];
    const p = await startProvider(
      afterBody((req, res) => {
        seen.push(req.headers);
        json(res, 200, req.url?.includes('count_tokens') ? JSON.stringify({ input_tokens: 3 }) : JSON.stringify(message));
      }),
    );
    const s = await stackOf(p.origin, { routes: [countRoute] });
    const { client } = sdk(s);
    await client.beta.messages.create({ ...ask, betas: ['interleaved-thinking-2025-05-14', 'context-1m-2025-08-07'] });
    await client.beta.messages.countTokens({ model: ask.model, messages: ask.messages, betas: ['context-1m-2025-08-07'] });
    await new Anthropic({ baseURL: s.url, apiKey: null, authToken: 'client-bearer-token', maxRetries: 0 }).messages.create(ask);
    expect(seen.map((h) => h['anthropic-beta'])).toEqual(['interleaved-thinking-2025-05-14,context-1m-2025-08-07', 'context-1m-2025-08-07,token-counting-2024-11-01', undefined]);
    for (const h of seen) {
      expect(h['x-api-key']).toBe(TEST_KEY);
      expect(h.authorization).toBeUndefined();
      expect(h['anthropic-version']).toMatch(/^\d{4}-\d{2}-\d{2}$/);
      expect(JSON.stringify(h)).not.toMatch(/client-secret-key|client-bearer-token/);
    }
  });
});
