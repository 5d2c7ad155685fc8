// An adversarial review of the Responses API under faults (2026-12-07), as agents use it with the `openai` SDK:
// previous_response_id, conversation, background, streams and their resumes, tool calls, retries and their headers.
// The bug it found, pinned by tests that failed before the fix:
// - A request that commits at the provider as it is taken (background: true, a conversation) whose attempt the
//   drain's grace end cut in flight was answered 503 gateway_draining with x-should-retry: true, so the SDK sent it
//   again (to another instance, through the load balancer): a second background job beside the first, or the
//   conversation's turn twice, which every other failure after sending (a timeout, a lost connection) is kept from
//   (README, Retries: "it is not sent again, and the client gets that failure with x-should-retry: false").
//   src/pipeline/handle-request.ts, src/errors.ts drainingCutError.
// - A whole Response whose status is failed with rate_limit_exceeded (the whole-body form of response.failed) was
//   retried for a conversation turn or a background create: three created Responses in the conversation, where the
//   same failure streamed after its response.created is the turn begun and never sent again (third-party-suite-53).
//   The provider created that Response: it took the request. src/pipeline/attempt.ts, src/policy/outcome.ts maySendAgain.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { baseResponse, fastRetries, json, useScriptedGateway } from './helpers/scripted-provider.ts';
import { useStacks } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const stack = useStacks();
const scripted = useScriptedGateway(fastRetries);

/** One provider p behind a Responses route and a chat route, a drain whose grace period is `graceMs`. */
function config(origin: string, graceMs: number, route: Partial<ConfigInput['routes'][number]> = {}): () => ConfigInput {
  return () => ({
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    providers: { p: { family: 'openai', baseUrl: `${origin}/v1`, apiKey: 'p-key-0123456789', breaker: false } },
    routes: [
      { name: 'responses', match: { path: '/v1/responses' }, targets: [{ provider: 'p' }], park: false, ...route },
      { name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'p' }], park: false, ...route },
    ],
    drain: { preStopMs: 0, graceMs },
  });
}

/** A provider that reads each request and never answers it: a deep-research job taking its time to be queued. */
const neverAnswers = (req: IncomingMessage) => void req.resume();

interface Answer {
  status: number;
  retry: string | null;
  code: string | undefined;
}

const post = (url: string, path: string, body: unknown): Promise<Answer> =>
  fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) }).then(async (r) => ({
    status: r.status,
    retry: r.headers.get('x-should-retry'),
    code: ((await r.json()) as { error?: { code?: string } }).error?.code,
  }));

const BACKGROUND = { model: 'o3-deep-research', input: 'Research the coupon market', background: true };

describe('a request that commits at the provider, cut in flight by the drain\'s grace end', () => {
  it('is not invited back (x-should-retry: false) when background or in a conversation, streamed or not: the provider may have taken it', async () => {
    const p = await startProvider(neverAnswers);
    const s = await stack({ config: config(p.origin, 500) });
    const answers = Promise.all([
      post(s.url, '/v1/responses', BACKGROUND),
      post(s.url, '/v1/responses', { ...BACKGROUND, stream: true }),
      post(s.url, '/v1/responses', { model: 'gpt-4.1', input: 'Remember the coupon', conversation: 'conv_123' }),
      post(s.url, '/v1/responses', { model: 'gpt-4.1', input: 'Remember the coupon', conversation: { id: 'conv_123' }, stream: true }),
    ]);
    await sleep(300);
    expect(p.hits()).toBe(4);
    const drained = s.gateway.drain();
    for (const a of await answers) expect(a).toEqual({ status: 503, retry: 'false', code: 'gateway_draining' });
    await drained;
  });

  it('the SDK (maxRetries 2) sends a background create once, where a plain request is still invited back', async () => {
    const p = await startProvider(neverAnswers);
    const s = await stack({ config: config(p.origin, 500) });
    const sent: string[] = [];
    const client = new OpenAI({
      baseURL: s.baseURL,
      apiKey: 'client-key',
      maxRetries: 2,
      fetch: (url, init) => {
        sent.push(JSON.parse(String(init?.body)).input as string);
        return fetch(url, init);
      },
    });
    const background = client.responses.create({ ...BACKGROUND, background: true }).then(() => undefined, (e: unknown) => e);
    const plain = post(s.url, '/v1/responses', { model: 'gpt-4.1', input: 'hi' });
    const chat = post(s.url, '/v1/chat/completions', { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    await sleep(300);
    const drained = s.gateway.drain();
    const err = await background;
    // Invited back, the SDK sent it again (here to the closed instance; behind a load balancer, to another one).
    expect(sent).toEqual([BACKGROUND.input]);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(503);
    // Requests that only cost tokens to send again are invited back to another instance, as before.
    expect(await plain).toEqual({ status: 503, retry: 'true', code: 'gateway_draining' });
    expect(await chat).toEqual({ status: 503, retry: 'true', code: 'gateway_draining' });
    await drained;
  });

  it('is still invited back when only a backoff was cut: the 503 before it took nothing', async () => {
    // The first attempt gets a 503 (the provider took nothing); the drain's grace end cuts the retry's fixed 2 s wait,
    // and the background create is answered then, to be sent to another instance when the wait is over.
    let n = 0;
    const p = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      if (n++ === 0) res.writeHead(503, { 'content-type': 'application/json' }).end('{"error":{"message":"busy","type":"server_error","code":null}}');
    });
    const s = await stack({ config: config(p.origin, 500, { retry: { backoff: { strategy: 'fixed', baseMs: 2_000, capMs: 2_000 } } }) });
    const answer = post(s.url, '/v1/responses', BACKGROUND);
    await sleep(300);
    expect(p.hits()).toBe(1);
    const drained = s.gateway.drain();
    expect(await answer).toEqual({ status: 503, retry: 'true', code: 'gateway_draining' });
    expect(p.hits()).toBe(1);
    await drained;
  });
});

describe('a whole Response whose status is failed, for a request that commits at the provider', () => {
  // The whole-body form of response.failed: the provider created the Response (it has its id, and is stored), so it
  // took the request, as a stream's response.created says it did.
  const limited = json(200, { ...baseResponse('failed'), error: { code: 'rate_limit_exceeded', message: 'Rate limit reached for gpt-4.1' } });

  it('with a conversation is not sent again on its rate_limit_exceeded: the client gets the 429, the provider one request', async () => {
    const { client, seen } = await scripted(() => limited);
    const err = await client.responses.create({ model: 'gpt-4.1', input: 'Remember the coupon', conversation: 'conv_123' }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.RateLimitError);
    expect(seen).toHaveLength(1);
  });

  it('with background: true is not sent again either', async () => {
    const { client, seen } = await scripted(() => limited);
    const err = await client.responses.create(BACKGROUND).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.RateLimitError);
    expect(seen).toHaveLength(1);
  });

  it('without either is retried as the 429 it stands for, as before', async () => {
    const { client, seen } = await scripted(() => limited);
    const err = await client.responses.create({ model: 'gpt-4.1', input: 'hi' }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.RateLimitError);
    expect(seen).toHaveLength(3);
  });
});
