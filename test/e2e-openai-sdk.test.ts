// End to end, as a user runs it: the official openai SDK, its base URL pointed at the gateway, a flaky upstream.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { countingClient, RETRY_LOOP_ONLY, useStacks, type Stack } from './helpers/stack.ts';

const startStack = useStacks(RETRY_LOOP_ONLY);
let stack: Stack;

const messages = [{ role: 'user' as const, content: 'Say something useful' }];

describe('the openai SDK through the gateway', () => {
  it('gets every chat (streamed and not) and embeddings call answered while 30% of first attempts fail with 503', async () => {
    stack = await startStack({
      faults: { errors: [{ status: 503, rate: 0.3, firstAttemptsOnly: true }] },
      route: { retry: { maxAttempts: 3, backoff: { strategy: 'full-jitter', baseMs: 20, capMs: 100 } } },
    });
    const { client, counter } = countingClient(stack);
    const calls: Array<Promise<unknown>> = [];
    for (let i = 0; i < 20; i++) calls.push(client.chat.completions.create({ model: 'gpt-4o', messages }));
    for (let i = 0; i < 10; i++) {
      calls.push(
        (async () => {
          const stream = await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true });
          let text = '';
          for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
          return text;
        })(),
      );
    }
    for (let i = 0; i < 10; i++) calls.push(client.embeddings.create({ model: 'text-embedding-3-small', input: `doc ${i}` }));
    const results = await Promise.all(calls);
    expect(results).toHaveLength(40);
    const chat = results[0] as OpenAI.ChatCompletion;
    expect(chat.choices[0]!.message.content).toBeTruthy();
    expect((results[20] as string).length).toBeGreaterThan(0);
    expect((results[39] as OpenAI.CreateEmbeddingResponse).data[0]!.embedding).toHaveLength(8);
    // The SDK never had to retry: the gateway absorbed every failure.
    expect(counter.requests).toBe(40);
    const stats = stack.mock.stats();
    expect(stats.byStatus['503']).toBe(12);
    expect(stats.total).toBe(52);
  });

  it('fails each call after the gateway\'s attempts when every attempt fails, and the SDK makes no retries of its own', async () => {
    stack = await startStack({
      faults: { errors: [{ status: 503, rate: 1 }] },
      route: { retry: { maxAttempts: 3, backoff: { strategy: 'full-jitter', baseMs: 10, capMs: 50 } } },
    });
    const { client, counter } = countingClient(stack);
    const outcomes = await Promise.allSettled([
      client.chat.completions.create({ model: 'gpt-4o', messages }),
      client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }),
      client.embeddings.create({ model: 'text-embedding-3-small', input: 'x' }),
    ]);
    for (const o of outcomes) {
      expect(o.status).toBe('rejected');
      const err = (o as PromiseRejectedResult).reason as InstanceType<typeof OpenAI.APIError>;
      expect(err).toBeInstanceOf(OpenAI.APIError);
      expect(err.status).toBe(503);
    }
    expect(counter.requests).toBe(3);
    expect(stack.mock.stats().total).toBe(9);
  });

  it('answers before the SDK\'s own timeout, so the SDK does not retry a hung upstream', async () => {
    stack = await startStack({ faults: { hangRate: 1 } });
    const { client, counter } = countingClient(stack);
    const started = Date.now();
    // The JS SDK sends x-stainless-timeout only for a per-request timeout.
    const err = (await client.chat.completions.create({ model: 'gpt-4o', messages }, { timeout: 2_000 }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err.status).toBe(504);
    expect(Date.now() - started).toBeLessThan(2_000);
    expect(counter.requests).toBe(1);
    expect(stack.mock.stats().total).toBe(1);
    // No provider answered: the SDK's request id is the gateway's, the one its log lines carry.
    expect(err.requestID).toBe(err.headers?.get('x-stormgate-request-id'));
    expect(stack.logs.join('')).toContain(err.requestID!);
  });

  it('starts a stream at the SDK\'s timeout when the provider is slow to its first token, as the provider would have', async () => {
    // The SDK's timeout runs until the headers; a provider sends them (and the role chunk) at once, then thinks.
    stack = await startStack({ faults: { stream: { firstTokenDelayMs: 2_500 } } });
    const { client, counter } = countingClient(stack);
    const started = Date.now();
    const { data: stream, response } = await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }, { timeout: 2_000 }).withResponse();
    // The head came at the deadline (1750 ms), before the SDK gave up and before any token.
    expect(Date.now() - started).toBeLessThan(2_000);
    expect(response.headers.get('x-stormgate-attempts')).toBe('1');
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text.length).toBeGreaterThan(0);
    expect(Date.now() - started).toBeGreaterThanOrEqual(2_400);
    expect(counter.requests).toBe(1);
    expect(stack.mock.stats().total).toBe(1);
    expect(stack.logs.join('')).toContain('"startedEarly":true');
  });

  it('still answers 504 at the route\'s own timeoutMs when the first token is late', async () => {
    stack = await startStack({ faults: { stream: { firstTokenDelayMs: 2_500 } }, route: { ...RETRY_LOOP_ONLY.route, timeoutMs: 1_500 } });
    const { client } = countingClient(stack);
    const err = (await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }, { maxRetries: 0 }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err.status).toBe(504);
    expect(stack.mock.stats().total).toBe(1);
  });

  it('takes a client-wide deadline from x-stormgate-timeout-ms in the SDK\'s default headers', async () => {
    stack = await startStack({ faults: { hangRate: 1 } });
    const client = new OpenAI({ baseURL: stack.baseURL, apiKey: 'k', timeout: 2_000, defaultHeaders: { 'x-stormgate-timeout-ms': '2000' } });
    const started = Date.now();
    const err = (await client.chat.completions.create({ model: 'gpt-4o', messages }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err.status).toBe(504);
    expect(Date.now() - started).toBeLessThan(2_000);
    expect(stack.mock.stats().total).toBe(1);
  });

  it('shows the gateway and upstream request ids to the SDK user', async () => {
    stack = await startStack({});
    const { client } = countingClient(stack);
    const { data, response, request_id } = await client.chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(data.object).toBe('chat.completion');
    expect(request_id).toMatch(/^req_/);
    expect(response.headers.get('x-stormgate-request-id')).toBeTruthy();
    expect(response.headers.get('x-stormgate-attempts')).toBe('1');
    const notFound = (await client.post('/no/such/path', { body: {} }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(notFound.status).toBe(404);
    expect(notFound.requestID).toBe(notFound.headers?.get('x-stormgate-request-id'));
  });

  it('runs the Responses API and legacy completions', async () => {
    stack = await startStack({});
    const { client } = countingClient(stack);
    const r = await client.responses.create({ model: 'gpt-4o', input: 'hello' });
    expect(r.output_text.length).toBeGreaterThan(0);
    const c = await client.completions.create({ model: 'gpt-3.5-turbo-instruct', prompt: 'hello' });
    expect(c.choices[0]!.text.length).toBeGreaterThan(0);
  });

  it('lists the models the routes serve', async () => {
    stack = await startStack({});
    const { client } = countingClient(stack);
    const ids: string[] = [];
    for await (const m of client.models.list()) ids.push(m.id);
    expect(ids).toContain('gpt-4o');
  });
});
