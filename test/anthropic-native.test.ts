// Anthropic's own API through the gateway, end to end with the official @anthropic-ai/sdk as a Claude agent would use
// it (ANTHROPIC_BASE_URL pointed at the gateway): retries, wait hints, deadlines, streams and failover work on
// /v1/messages as on chat completions, and every error reaches the SDK in a shape it reads.
import Anthropic from '@anthropic-ai/sdk';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import { ConfigSchema } from '../src/config/schema.ts';
import type { FaultSpec } from '../src/mock/server.ts';
import { eventStream, useFakeProviders } from './helpers/fake-provider.ts';
import { metricSum, RETRY_LOOP_ONLY, TEST_KEY, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';

const startStack = useStacks();
const startBackup = useExtraMocks();
const startProvider = useFakeProviders();

type RouteInput = ConfigInput['routes'][number];

/** The stack's mock as the Anthropic provider `claude`; with `backup`, a second mock as another Anthropic account. */
async function anthropicStack(opts: { faults?: FaultSpec; route?: Partial<RouteInput>; backup?: FaultSpec; firstTokenMs?: number; routes?: RouteInput[] } = {}): Promise<Stack> {
  const backup = opts.backup ? await startBackup({ faults: opts.backup, quiet: true, apiKey: 'backup-key' }) : undefined;
  return startStack({
    faults: opts.faults,
    config: (url) => ({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: {
        claude: { family: 'anthropic', baseUrl: url, apiKey: TEST_KEY, breaker: false, ...(opts.firstTokenMs && { timeouts: { firstTokenMs: opts.firstTokenMs } }) },
        ...(backup && { backup: { family: 'anthropic' as const, baseUrl: `${backup.url}/v1`, apiKey: 'backup-key', breaker: false } }),
      },
      routes: [
        {
          name: 'messages',
          match: { path: '/v1/messages' },
          targets: [{ provider: 'claude' }, ...(backup ? [{ provider: 'backup', model: 'claude-haiku-4-5' }] : [])],
          ...RETRY_LOOP_ONLY.route,
          retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } },
          ...opts.route,
        },
        ...(opts.routes ?? []),
      ],
    }),
  });
}

/** An SDK client that counts the HTTP requests it makes (its own retries included). */
function sdk(s: Stack, opts: { maxRetries?: number; timeout?: number } = {}): { client: Anthropic; requests: () => number; sentVersion: () => string | null } {
  let n = 0;
  let version: string | null = null;
  const client = new Anthropic({
    baseURL: s.url,
    apiKey: 'client-key',
    maxRetries: opts.maxRetries ?? 2,
    ...(opts.timeout !== undefined && { timeout: opts.timeout }),
    fetch: (input, init) => {
      n++;
      version = new Headers(init?.headers).get('anthropic-version');
      return fetch(input, init);
    },
  });
  return { client, requests: () => n, sentVersion: () => version };
}

const ask = { model: 'claude-sonnet-4-6', max_tokens: 256, messages: [{ role: 'user' as const, content: 'Where is my order?' }] };

describe('Anthropic Messages API (/v1/messages) with the Anthropic SDK', () => {
  it('answers through deterministic 529s (30% of first attempts), the gateway retrying and the SDK never', async () => {
    const s = await anthropicStack({ faults: { errors: [{ status: 529, rate: 0.3, firstAttemptsOnly: true }] } });
    const { client, requests, sentVersion } = sdk(s);
    for (let i = 0; i < 10; i++) {
      const { data, response } = await client.messages.create(ask).withResponse();
      expect(data.type).toBe('message');
      expect(data.content[0]).toMatchObject({ type: 'text', text: expect.stringMatching(/Mock answer/) });
      expect(data.usage.input_tokens).toBeGreaterThan(0);
      // The provider's request id, where the SDK reads it.
      expect(response.headers.get('request-id')).toBeTruthy();
    }
    expect(requests()).toBe(10);
    expect(s.mock.stats().byStatus).toEqual({ 200: 10, 529: 3 });
    // Sent as the client wrote it, with the provider's key in place of the client's and the client's API version.
    const sent = s.mock.requests()[0]!;
    expect(sent.path).toBe('/v1/messages');
    expect(sent.headers['x-api-key']).toBe(TEST_KEY);
    expect(sent.headers['anthropic-version']).toBe(sentVersion());
    expect(sentVersion()).toMatch(/^\d{4}-\d{2}-\d{2}$/);
    expect(sent.headers.authorization).toBeUndefined();
    expect(s.mock.requests().filter((r) => r.headers['x-retry-attempt'] === '1')).toHaveLength(3);
  });

  it('fails after the gateway\'s attempts with the provider\'s error, in the Anthropic shape, and the SDK does not retry', async () => {
    const s = await anthropicStack({ faults: { errors: [{ status: 529, rate: 1 }] } });
    const { client, requests } = sdk(s);
    const err = await client.messages.create(ask).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Anthropic.APIError);
    const e = err as InstanceType<typeof Anthropic.APIError>;
    expect(e.status).toBe(529);
    expect(e.type).toBe('overloaded_error');
    expect(e.error).toMatchObject({ type: 'error', error: { type: 'overloaded_error', message: expect.any(String), param: null } });
    expect(e.headers?.get('x-should-retry')).toBe('false');
    expect(requests()).toBe(1);
    expect(s.mock.stats().total).toBe(3);
  });

  it('streams as the SDK expects: events pass as they come, and the final message is whole', async () => {
    const s = await anthropicStack({ faults: { errors: [{ status: 503, rate: 0.5, firstAttemptsOnly: true }], stream: { chunks: 4, chunkDelayMs: 20 } } });
    const { client } = sdk(s);
    for (let i = 0; i < 2; i++) {
      const stream = client.messages.stream(ask);
      const types: string[] = [];
      stream.on('streamEvent', (ev) => types.push(ev.type));
      const message = await stream.finalMessage();
      expect(message.content[0]).toMatchObject({ type: 'text', text: expect.stringMatching(/Mock answer/) });
      expect(message.stop_reason).toBe('end_turn');
      expect(types[0]).toBe('message_start');
      expect(types.at(-1)).toBe('message_stop');
      expect(types.filter((t) => t === 'content_block_delta')).toHaveLength(4);
    }
    expect(s.mock.stats().byStatus).toEqual({ 200: 2, 503: 1 });
  });

  it('retries a stream whose first token is late, then answers 504 in the Anthropic shape', async () => {
    const s = await anthropicStack({ firstTokenMs: 300, faults: { stream: { firstTokenDelayMs: 1_000 }, models: { fast: { stream: { firstTokenDelayMs: 0 } } } } });
    const { client } = sdk(s);
    const err = await client.messages.stream(ask).finalMessage().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect((err as InstanceType<typeof Anthropic.APIError>).status).toBe(504);
    expect((err as InstanceType<typeof Anthropic.APIError>).error).toMatchObject({ type: 'error', error: { type: 'timeout_error', code: 'upstream_timeout' } });
    expect(s.mock.stats().total).toBe(3);
    const ok = await client.messages.stream({ ...ask, model: 'fast' }).finalMessage();
    expect(ok.stop_reason).toBe('end_turn');
  });

  it('ends a stream cut after its first token with an error event the SDK raises, never a clean end', async () => {
    const s = await anthropicStack({ faults: { stream: { chunks: 5, cutAfterChunks: 2 } } });
    const { client } = sdk(s);
    const stream = client.messages.stream(ask);
    let text = '';
    stream.on('text', (t) => (text += t));
    const err = await stream.finalMessage().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(String((err as Error).message)).toMatch(/stream was cut|ended before the answer was complete/);
    expect(text.length).toBeGreaterThan(0);
    expect(s.mock.stats().total).toBe(1);
  });

  it('finishes a stream that ended after its stop_reason without message_stop', async () => {
    const s = await anthropicStack({ faults: { stream: { omitDone: true } } });
    const { client } = sdk(s);
    const types: string[] = [];
    const stream = client.messages.stream(ask);
    stream.on('streamEvent', (ev) => types.push(ev.type));
    const message = await stream.finalMessage();
    expect(message.stop_reason).toBe('end_turn');
    expect(types.at(-1)).toBe('message_stop');
    const line = s.logs.map((l) => JSON.parse(l) as { streamEnd?: string }).find((l) => l.streamEnd !== undefined);
    expect(line?.streamEnd).toBe('done-added');
  });

  it('honours a 429\'s retry-after before the retry', async () => {
    const s = await anthropicStack({ faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '1' } }] } });
    const started = Date.now();
    const message = await sdk(s).client.messages.create(ask);
    expect(message.type).toBe('message');
    expect(Date.now() - started).toBeGreaterThanOrEqual(1_000);
    expect(s.mock.stats().byStatus).toEqual({ 200: 1, 429: 1 });
  });

  it('fails over to another Anthropic account with the target\'s model while the first is down', async () => {
    const s = await anthropicStack({ faults: { errors: [{ status: 500, rate: 1 }] }, backup: {} });
    const { data, response } = await sdk(s).client.messages.create(ask).withResponse();
    expect(data.model).toBe('claude-haiku-4-5');
    expect(response.headers.get('x-stormgate-target')).toBe('backup/claude-haiku-4-5');
    expect(response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
  });

  it('passes the provider\'s 400 on at once, as Anthropic wrote it', async () => {
    const s = await anthropicStack({ faults: { errors: [{ status: 400, message: 'messages.0.content: Input should be a valid list' }] } });
    const { client, requests } = sdk(s);
    const err = (await client.messages.create(ask).catch((e: unknown) => e)) as InstanceType<typeof Anthropic.APIError>;
    expect(err).toBeInstanceOf(Anthropic.BadRequestError);
    expect(err.type).toBe('invalid_request_error');
    expect(err.message).toContain('Input should be a valid list');
    // Its own top-level request_id stays, beside the fields the OpenAI shape adds.
    expect(err.error).toMatchObject({ type: 'error', request_id: err.requestID, error: { type: 'invalid_request_error', param: null } });
    expect(s.mock.stats().total).toBe(1);
    expect(requests()).toBe(1);
  });

  it('answers the gateway\'s own errors in a shape the SDK reads: deadline, unknown model, bad JSON', async () => {
    const s = await anthropicStack({ faults: { latencyMs: 3_000 }, route: { match: { path: '/v1/messages', models: ['claude-sonnet-4-6'] } } });
    const { client } = sdk(s, { timeout: 1_000 });
    const started = Date.now();
    const late = (await client.messages.create(ask).catch((e: unknown) => e)) as InstanceType<typeof Anthropic.APIError>;
    // The SDK's own timeout (x-stainless-timeout) is the deadline: the gateway answers before the SDK gives up.
    expect(late.status).toBe(504);
    expect(Date.now() - started).toBeLessThan(2_500);
    expect(late.type).toBe('timeout_error');
    expect(late.error).toMatchObject({ type: 'error', error: { code: 'deadline_exceeded', message: expect.stringMatching(/deadline/) } });
    expect(late.requestID).toBeTruthy();
    const unknown = (await client.messages.create({ ...ask, model: 'claude-opus-9' }).catch((e: unknown) => e)) as InstanceType<typeof Anthropic.APIError>;
    expect(unknown).toBeInstanceOf(Anthropic.NotFoundError);
    expect(unknown.type).toBe('not_found_error');
    expect(unknown.error).toMatchObject({ error: { code: 'model_not_found', param: 'model' } });
    const bad = await fetch(`${s.url}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"model":' });
    expect(bad.status).toBe(400);
    expect(await bad.json()).toMatchObject({ type: 'error', error: { type: 'invalid_request_error', code: 'invalid_json', param: null, message: expect.any(String) } });
    expect(bad.headers.get('request-id')).toBe(bad.headers.get('x-stormgate-request-id'));
  });

  it('streams a tool call whole, counts the tokens, and serves count_tokens on a route of its own', async () => {
    const countRoute: RouteInput = { name: 'count', match: { path: '/v1/messages/count_tokens' }, targets: [{ provider: 'claude' }], retry: { maxAttempts: 2 } };
    const s = await anthropicStack({ faults: { stream: { chunks: 3 } }, routes: [countRoute] });
    const { client } = sdk(s);
    const tools = [{ name: 'lookup_order', description: 'Finds an order', input_schema: { type: 'object' as const, properties: { id: { type: 'string' } } } }];
    const message = await client.messages.stream({ ...ask, tools }).finalMessage();
    expect(message.stop_reason).toBe('tool_use');
    expect(message.content).toEqual([expect.objectContaining({ type: 'tool_use', name: 'lookup_order', input: expect.any(Object) })]);
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toMatch(/stormgate_tokens_total\{[^}]*route="messages"[^}]*kind="prompt"[^}]*\} [1-9]/);
    expect(metrics).toMatch(/stormgate_tokens_total\{[^}]*route="messages"[^}]*kind="completion"[^}]*\} [1-9]/);
    const counted = await client.messages.countTokens({ model: ask.model, messages: ask.messages });
    expect(counted.input_tokens).toBeGreaterThan(0);
    expect(s.mock.requests().at(-1)).toMatchObject({ path: '/v1/messages/count_tokens', headers: expect.objectContaining({ 'x-api-key': TEST_KEY }) });
    // The gateway's own error on that path is in the Anthropic shape too.
    const bad = await fetch(`${s.url}/v1/messages/count_tokens`, { method: 'PUT' });
    expect(bad.status).toBe(405);
    expect(await bad.json()).toMatchObject({ type: 'error', error: { type: 'invalid_request_error', code: 'method_not_allowed' } });
  });

  it('reads a prompt too long as context_length_exceeded: to the route\'s larger window, not retried', async () => {
    const tooLong = { errors: [{ status: 400, message: 'prompt is too long: 215000 tokens > 200000 maximum' }] };
    const s = await anthropicStack({ faults: { models: { 'claude-sonnet-4-6': tooLong } }, route: { contextWindowFallback: { provider: 'claude', model: 'claude-sonnet-4-6-1m' } } });
    const { data, response } = await sdk(s).client.messages.create(ask).withResponse();
    expect(data.model).toBe('claude-sonnet-4-6-1m');
    expect(response.headers.get('x-stormgate-fallback')).toBe('context_length');
    expect(s.mock.requests().map((r) => r.model)).toEqual(['claude-sonnet-4-6', 'claude-sonnet-4-6-1m']);
  });

  it('lists and retrieves models in Anthropic\'s shape for the Anthropic SDK, and in OpenAI\'s for anyone else', async () => {
    const s = await anthropicStack({ route: { match: { path: '/v1/messages', models: ['claude-sonnet-4-6', 'claude-opus-4-6'] } } });
    const { client } = sdk(s);
    const ids: string[] = [];
    for await (const m of client.models.list()) {
      expect(m).toMatchObject({ type: 'model', display_name: m.id, created_at: expect.stringMatching(/^\d{4}-\d{2}-\d{2}T/) });
      ids.push(m.id);
    }
    expect(ids).toEqual(['claude-sonnet-4-6', 'claude-opus-4-6']);
    expect(await client.models.retrieve('claude-opus-4-6')).toMatchObject({ id: 'claude-opus-4-6', type: 'model' });
    const plain = (await (await fetch(`${s.url}/v1/models`)).json()) as { object: string; data: Array<Record<string, unknown>> };
    expect(plain.object).toBe('list');
    expect(plain.data[0]).toEqual({ id: 'claude-sonnet-4-6', object: 'model', created: 0, owned_by: 'claude' });
  });

  it('lists for the Anthropic SDK only the models it can call: not a chat completions alias, which /v1/messages would refuse', async () => {
    const s = await anthropicStack({
      route: { match: { path: '/v1/messages', models: ['claude-sonnet-4-6'] } },
      routes: [{ name: 'smart', match: { path: '/v1/chat/completions', models: ['smart'] }, targets: [{ provider: 'claude', model: 'claude-opus-4-6' }] }],
    });
    const { client } = sdk(s);
    const ids: string[] = [];
    for await (const m of client.models.list()) ids.push(m.id);
    expect(ids).toEqual(['claude-sonnet-4-6']);
    const refused = await client.models.retrieve('smart').then(() => undefined, (e: unknown) => e as InstanceType<typeof Anthropic.APIError>);
    expect(refused?.status).toBe(404);
    // An OpenAI client (no anthropic-version) can call both, and is listed both.
    const plain = (await (await fetch(`${s.url}/v1/models`)).json()) as { data: Array<{ id: string }> };
    expect(plain.data.map((m) => m.id)).toEqual(['claude-sonnet-4-6', 'smart']);
  });

  it('refuses at start-up a /v1/messages route with a target of another family, naming it', () => {
    const config = {
      providers: { openai: { family: 'openai', baseUrl: 'http://127.0.0.1:9/v1', apiKey: 'k' }, claude: { family: 'anthropic', baseUrl: 'http://127.0.0.1:9', apiKey: 'k' } },
      routes: [{ name: 'messages', match: { path: '/v1/messages' }, targets: [{ provider: 'claude' }, { provider: 'openai' }] }],
    };
    const parsed = ConfigSchema.safeParse(config);
    expect(parsed.success).toBe(false);
    expect(parsed.error!.issues).toEqual([expect.objectContaining({ path: ['routes', 0, 'targets', 1], message: expect.stringMatching(/anthropic targets only; "openai" is openai/) })]);
    // And an Anthropic target on an OpenAI-only API is refused as before.
    const embeddings = ConfigSchema.safeParse({ ...config, routes: [{ name: 'e', match: { path: '/v1/responses' }, targets: [{ provider: 'claude' }] }] });
    expect(embeddings.error!.issues[0]!.message).toMatch(/anthropic targets serve \/v1\/chat\/completions and Anthropic's own API/);
  });

  describe('with a provider of the test\'s own (what the mock cannot send)', () => {
    /** An Anthropic event, framed as Anthropic sends it. */
    const ev = (type: string, fields: object = {}) => `event: ${type}\ndata: ${JSON.stringify({ type, ...fields })}\n\n`;
    const usage = { input_tokens: 5, cache_creation_input_tokens: 200, cache_read_input_tokens: 1_000, output_tokens: 7 };
    const message = { id: 'msg_1', type: 'message', role: 'assistant', model: 'claude-sonnet-4-6', content: [{ type: 'text', text: 'Shipped.' }], stop_reason: 'end_turn', stop_sequence: null, usage };

    /** The provider `claude` is `handler`, then (with `backup`) the mock as a second Anthropic account. */
    let hits = () => 0;
    async function ownStack(handler: Parameters<typeof startProvider>[0], backup = false, retry: Partial<NonNullable<RouteInput['retry']>> = {}): Promise<Stack> {
      const p = await startProvider(handler);
      hits = p.hits;
      return startStack({
        config: (url) => ({
          server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
          providers: {
            claude: { family: 'anthropic', baseUrl: p.origin, apiKey: 'claude-key' },
            ...(backup && { backup: { family: 'anthropic' as const, baseUrl: url, apiKey: TEST_KEY } }),
          },
          routes: [
            { name: 'messages', match: { path: '/v1/messages' }, targets: [{ provider: 'claude' }, ...(backup ? [{ provider: 'backup' }] : [])], retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 }, ...retry } },
            { name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'claude', model: 'claude-sonnet-4-6' }] },
          ],
        }),
      });
    }

    const noCredit = { type: 'error', error: { type: 'billing_error', message: 'Your credit balance is too low to access the Anthropic API.' } };

    it.each([
      ['a billing_error event before the first output of a stream', true],
      ['a billing_error object answered with a 200', false],
    ])('takes %s as the gateway\'s own billing: one attempt, the next account at once, the target held', async (_name, stream) => {
      const s = await ownStack(
        stream
          ? eventStream((res) => res.end(ev('message_start', { message: { ...message, content: [], stop_reason: null } }) + ev('error', { error: noCredit.error })))
          : (req, res) => {
              req.resume();
              req.on('end', () => {
                res.writeHead(200, { 'content-type': 'application/json' });
                res.end(JSON.stringify(noCredit));
              });
            },
        true,
      );
      const { client, requests } = sdk(s);
      for (let i = 0; i < 2; i++) {
        const { data, response } = stream ? await client.messages.stream(ask).withResponse() : await client.messages.create(ask).withResponse();
        const msg = stream ? await (data as ReturnType<typeof client.messages.stream>).finalMessage() : (data as Anthropic.Message);
        expect(msg.content[0]).toMatchObject({ type: 'text', text: expect.stringMatching(/Mock answer/) });
        expect(response.headers.get('x-stormgate-fallback')).toBe('credentials');
      }
      // Read as a broken answer, it was retried on the account that has no credit (three attempts), every request.
      expect(hits()).toBe(1);
      expect(requests()).toBe(2);
      expect(await metricSum(s, 'stormgate_credentials_held{target="claude/claude-sonnet-4-6"}')).toBe(1);
    });

    // Anthropic reports an overload that comes once a stream has begun as an `error` event in the 200 stream, before
    // any content: the same error its 529 carries. Read as a broken stream, it reached the SDK as a 502 api_error that
    // said only "error event before any output" (InternalServerError, not OverloadedError).
    it.each([
      ['overloaded_error', 529, 'Overloaded', Anthropic.OverloadedError],
      ['api_error', 500, 'Internal server error', Anthropic.InternalServerError],
      ['rate_limit_error', 429, 'Number of request tokens has exceeded your per-minute rate limit', Anthropic.RateLimitError],
    ] as const)('takes an %s event before the first output as the %s Anthropic answers it with: retried, then raised by the SDK as that', async (type, status, text, errorClass) => {
      const s = await ownStack((req, res) => {
        req.resume();
        res.writeHead(200, { 'content-type': 'text/event-stream', 'request-id': 'req_stream' });
        res.end(ev('message_start', { message: { ...message, content: [], stop_reason: null } }) + ev('ping') + ev('error', { error: { type, message: text } }));
      });
      const { client, requests } = sdk(s);
      const err = (await client.messages.stream(ask).finalMessage().catch((e: unknown) => e)) as InstanceType<typeof Anthropic.APIError>;
      expect(err).toBeInstanceOf(errorClass);
      expect(err.status).toBe(status);
      expect(err.type).toBe(type);
      expect(err.error).toMatchObject({ type: 'error', error: { type, message: text } });
      expect(err.requestID).toBe('req_stream');
      expect(err.headers?.get('x-should-retry')).toBe('false');
      // The gateway's three attempts, and none of the SDK's own.
      expect(hits()).toBe(3);
      expect(requests()).toBe(1);
    });

    it('fails an overloaded stream over to the next account under a retryOn without network: Anthropic did not run it', async () => {
      const s = await ownStack(eventStream((res) => res.end(ev('message_start', { message: { ...message, content: [], stop_reason: null } }) + ev('error', { error: { type: 'overloaded_error', message: 'Overloaded' } }))), true, { retryOn: [529] });
      const { data, response } = await sdk(s).client.messages.stream(ask).withResponse();
      expect((await data.finalMessage()).content[0]).toMatchObject({ type: 'text', text: expect.stringMatching(/Mock answer/) });
      expect(response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
      expect(hits()).toBe(3);
    });

    it('counts the prompt tokens read from and written to the prompt cache, as the chat translation does', async () => {
      const s = await ownStack((req, res) => {
        let raw = '';
        req.on('data', (d: Buffer) => (raw += d.toString()));
        req.on('end', () => {
          if ((JSON.parse(raw) as { stream?: boolean }).stream !== true) {
            res.writeHead(200, { 'content-type': 'application/json' });
            res.end(JSON.stringify(message));
            return;
          }
          res.writeHead(200, { 'content-type': 'text/event-stream' });
          res.end(
            ev('message_start', { message: { ...message, content: [], stop_reason: null, usage: { ...usage, output_tokens: 1 } } }) +
              ev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }) +
              ev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Shipped.' } }) +
              ev('content_block_stop', { index: 0 }) +
              ev('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 7 } }) +
              ev('message_stop'),
          );
        });
      });
      const prompt = (route: string) => metricSum(s, `stormgate_tokens_total{route="${route}",target="claude/claude-sonnet-4-6",kind="prompt"}`);
      const { client } = sdk(s);
      await client.messages.create(ask);
      expect(await prompt('messages')).toBe(1_205);
      await client.messages.stream(ask).finalMessage();
      expect(await prompt('messages')).toBe(2_410);
      // The same answer through the chat translation: its prompt_tokens hold the cached tokens too.
      const { OpenAI } = await import('openai');
      const chat = await new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 }).chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
      expect(chat.usage?.prompt_tokens).toBe(1_205);
      expect(await prompt('chat')).toBe(1_205);
    });
  });
});
