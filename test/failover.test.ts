// Failover, end to end with the openai SDK: to another OpenAI-compatible provider, to Anthropic through the format
// translation (streams and tool calls included), context-window fallback, weighted spreading, degraded answers.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import { ConfigSchema } from '../src/config/schema.ts';
import type { FaultSpec, MockServer } from '../src/mock/server.ts';
import { defaultConfig, RETRY_LOOP_ONLY, useExtraMocks, useStacks, type Stack, requestLine } from './helpers/stack.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';

const startStack = useStacks();
const startBackup = useExtraMocks();
const startProvider = useFakeProviders();
let backup: MockServer | undefined;

type RouteInput = ConfigInput['routes'][number];

/** The stack's mock as the OpenAI primary, a second mock as `backup` of the given family. */
async function withBackup(opts: {
  faults?: FaultSpec;
  backupFaults?: FaultSpec;
  family?: 'openai' | 'anthropic';
  route?: Partial<RouteInput>;
  backupModel?: string;
  primaryFirstTokenMs?: number;
  primaryBreaker?: ConfigInput['providers'][string]['breaker'];
}): Promise<Stack> {
  backup = await startBackup({ faults: opts.backupFaults, quiet: true, apiKey: 'backup-key' });
  const family = opts.family ?? 'anthropic';
  return startStack({
    faults: opts.faults,
    config: (url) => {
      const base = defaultConfig(url, {
        provider: {
          ...RETRY_LOOP_ONLY.provider,
          ...(opts.primaryFirstTokenMs && { timeouts: { firstTokenMs: opts.primaryFirstTokenMs } }),
          ...(opts.primaryBreaker && { breaker: opts.primaryBreaker }),
        },
        route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } },
      });
      return {
        ...base,
        providers: {
          ...base.providers,
          backup: { family, baseUrl: family === 'anthropic' ? backup!.url : `${backup!.url}/v1`, apiKey: 'backup-key', breaker: false },
        },
        routes: base.routes.map((r) =>
          r.name === 'chat' ? { ...r, targets: [{ provider: 'mock' }, { provider: 'backup', model: opts.backupModel ?? 'claude-sonnet-4-5' }], ...opts.route } : r,
        ),
      };
    },
  });
}

const sdk = (s: Stack) => new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
const messages = [{ role: 'user' as const, content: 'Where is my order?' }];

describe('failover to another provider', () => {
  it('answers from the Anthropic backup while the OpenAI primary is in a brownout, with the backup\'s model and usage', async () => {
    const s = await withBackup({ faults: { errors: [{ status: 503, rate: 1 }] } });
    const { data, response } = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(data.object).toBe('chat.completion');
    expect(data.model).toBe('claude-sonnet-4-5');
    expect(data.choices[0]!.message.content).toMatch(/Mock answer/);
    expect(data.usage!.total_tokens).toBeGreaterThan(0);
    expect(response.headers.get('x-stormgate-target')).toBe('backup/claude-sonnet-4-5');
    expect(response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    // Anthropic's request-id, where the SDK reads its request_id.
    expect(response.headers.get('x-request-id')).toBe(response.headers.get('request-id'));
    expect(response.headers.get('x-request-id')).toBeTruthy();
    expect(backup!.requests()[0]!.path).toBe('/v1/messages');
    expect(backup!.requests()[0]!.headers['x-api-key']).toBe('backup-key');
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toMatch(/stormgate_fallbacks_total\{route="chat",from="mock\/gpt-4o",to="backup\/claude-sonnet-4-5",reason="retries_exhausted"\} 1/);
  });

  it('goes to the backup at once while the primary\'s breaker is open, and names the primary in the log line', async () => {
    const s = await withBackup({ faults: { errors: [{ status: 503, rate: 1 }] }, primaryBreaker: { consecutiveFailures: 2, openS: 60 } });
    await sdk(s).chat.completions.create({ model: 'gpt-4o', messages });
    const primaryHits = s.mock.stats().total;
    const { response } = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(response.headers.get('x-stormgate-fallback')).toBe('breaker_open');
    expect(s.mock.stats().total).toBe(primaryHits);
    const line = s.logs.map((l) => JSON.parse(l) as { fallback?: string; skipped?: unknown }).find((l) => l.fallback === 'breaker_open');
    expect(line?.skipped).toEqual([{ target: 'mock/gpt-4o', reason: 'circuit breaker open' }]);
  });

  it('streams the Anthropic backup\'s answer as chat.completion.chunk events', async () => {
    const s = await withBackup({ faults: { errors: [{ status: 503, rate: 1 }] }, backupFaults: { stream: { chunks: 4 } } });
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true, stream_options: { include_usage: true } });
    let text = '';
    let finish: string | null | undefined;
    let usage: OpenAI.CompletionUsage | undefined | null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
      usage = chunk.usage ?? usage;
    }
    expect(text).toMatch(/Mock answer/);
    expect(finish).toBe('stop');
    expect(usage?.total_tokens).toBeGreaterThan(0);
  });

  it('drops a malformed Anthropic event that arrives in the same read as the first text, and streams on', async () => {
    // chunkDelayMs 0: the whole answer comes in one read, the broken event right after the first text.
    const s = await withBackup({ faults: { errors: [{ status: 503, rate: 1 }] }, backupFaults: { stream: { chunks: 6, chunkDelayMs: 0, malformedAtChunk: 1 } } });
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text.length).toBeGreaterThan(0);
    // One attempt at the backup: the answer it produced (and billed) was delivered, not retried.
    expect(backup!.stats().total).toBe(1);
    const line = s.logs.map((l) => JSON.parse(l) as { msg: string; streamEnd?: string; droppedMalformed?: number }).find((l) => l.streamEnd !== undefined);
    expect(line).toMatchObject({ msg: 'stream events dropped as malformed', streamEnd: 'complete', droppedMalformed: 1 });
  });

  it('carries a tool-call round trip through Anthropic, streamed and not', async () => {
    const s = await withBackup({ faults: { errors: [{ status: 503, rate: 1 }] } });
    const tools: OpenAI.ChatCompletionTool[] = [{ type: 'function', function: { name: 'lookup_order', description: 'Find an order', parameters: { type: 'object', properties: { x: { type: 'number' } } } } }];
    const first = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, tools });
    const call = first.choices[0]!.message.tool_calls![0]! as OpenAI.ChatCompletionMessageFunctionToolCall;
    expect(first.choices[0]!.finish_reason).toBe('tool_calls');
    expect(call.function.name).toBe('lookup_order');
    expect(JSON.parse(call.function.arguments)).toEqual({ x: 1 });
    const second = await sdk(s).chat.completions.create({
      model: 'gpt-4o',
      tools,
      messages: [...messages, first.choices[0]!.message, { role: 'tool', tool_call_id: call.id, content: '{"status":"shipped"}' }],
    });
    expect(second.choices[0]!.message.content).toMatch(/Mock answer/);
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, tools, stream: true });
    let args = '';
    let name = '';
    for await (const chunk of stream) {
      const tc = chunk.choices[0]?.delta?.tool_calls?.[0];
      if (tc?.function?.name) name = tc.function.name;
      args += tc?.function?.arguments ?? '';
    }
    expect(name).toBe('lookup_order');
    expect(JSON.parse(args)).toEqual({ x: 1 });
  });

  it('moves on after a first-token timeout instead of retrying the silent target', async () => {
    const s = await withBackup({ faults: { stream: { firstTokenDelayMs: 3_000 } }, family: 'openai', backupModel: 'gpt-4o', primaryFirstTokenMs: 300 });
    const started = Date.now();
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true }).withResponse();
    let text = '';
    for await (const chunk of stream.data) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text).toMatch(/Mock answer/);
    expect(stream.response.headers.get('x-stormgate-target')).toBe('backup/gpt-4o');
    expect(stream.response.headers.get('x-stormgate-fallback')).toBe('timeout');
    expect(s.mock.stats().total).toBe(1);
    expect(Date.now() - started).toBeLessThan(2_500);
  });

  it('sends a request the primary may have run to no other target when retryOn leaves timeout and network out', async () => {
    const route = { retry: { maxAttempts: 3, retryOn: [503], backoff: { strategy: 'fixed' as const, baseMs: 5, capMs: 5 } } };
    const s = await withBackup({ faults: { stream: { firstTokenDelayMs: 3_000 } }, family: 'openai', backupModel: 'gpt-4o', primaryFirstTokenMs: 300, route });
    const timedOut = await fetch(`${s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages, stream: true }),
    });
    expect(timedOut.status).toBe(504);
    expect(timedOut.headers.get('x-should-retry')).toBe('false');
    expect(((await timedOut.json()) as { error: { code: string } }).error.code).toBe('upstream_timeout');
    expect(s.mock.stats().total).toBe(1);
    expect(backup!.stats().total).toBe(0);
    // A connection lost after the request left is the same doubt.
    s.mock.setFaults({ resetRate: 1 });
    await expect(sdk(s).chat.completions.create({ model: 'gpt-4o', messages })).rejects.toMatchObject({ status: 502 });
    expect(backup!.stats().total).toBe(0);
    // So is a proxy's 502 (it lost its upstream mid-request) ...
    s.mock.setFaults({ errors: [{ status: 502, rate: 1 }] });
    await expect(sdk(s).chat.completions.create({ model: 'gpt-4o', messages })).rejects.toMatchObject({ status: 502 });
    expect(backup!.stats().total).toBe(0);
    // ... but an overloaded provider's 529 says it did not run: the backup takes it, retryOn or not.
    s.mock.setFaults({ errors: [{ status: 529, rate: 1 }] });
    const { response } = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(response.headers.get('x-stormgate-target')).toBe('backup/gpt-4o');
  });

  it('fails over on a provider\'s own 408 (it timed out), which is no verdict on the request', async () => {
    const s = await withBackup({ faults: { errors: [{ status: 408, rate: 1, code: 'Timeout', message: 'The operation was timeout.' }] }, family: 'openai', backupModel: 'gpt-4o' });
    const { response } = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(response.headers.get('x-stormgate-target')).toBe('backup/gpt-4o');
    expect(s.mock.stats().total).toBe(1);
  });

  it('skips a target whose family cannot express the request, with the reason in the log', async () => {
    const s = await withBackup({ faults: { errors: [{ status: 503, rate: 1 }] } });
    const err = (await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, n: 2 }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err.status).toBe(503);
    expect(backup!.stats().total).toBe(0);
    const line = await requestLine(s);
    expect(line.skipped[0].target).toBe('backup/claude-sonnet-4-5');
    expect(line.skipped[0].reason).toMatch(/n/);
  });

  it('never fails over a content-policy rejection, and passes the provider\'s reason on', async () => {
    const s = await withBackup({ faults: { errors: [{ status: 400, rate: 1, code: 'content_policy_violation', message: 'flagged by policy' }] } });
    const err = (await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err.status).toBe(400);
    expect(err.message).toMatch(/flagged by policy/);
    expect(backup!.stats().total).toBe(0);
  });

  it('fails over on the gateway\'s own credential problem and holds the primary off', async () => {
    const s = await withBackup({ faults: { errors: [{ status: 401, rate: 1 }] } });
    const first = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(first.response.headers.get('x-stormgate-fallback')).toBe('credentials');
    await sdk(s).chat.completions.create({ model: 'gpt-4o', messages });
    expect(s.mock.stats().total).toBe(1);
    expect(backup!.stats().total).toBe(2);
  });

  it('sends a context_length_exceeded request to contextWindowFallback', async () => {
    const s = await withBackup({
      faults: { errors: [{ status: 400, rate: 1, code: 'context_length_exceeded', message: 'too long' }] },
      family: 'openai',
      route: { contextWindowFallback: { provider: 'backup', model: 'gpt-4.1' } },
    });
    const { data, response } = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(data.model).toBe('gpt-4.1');
    expect(response.headers.get('x-stormgate-fallback')).toBe('context_length');
    expect(s.mock.stats().total).toBe(1);
  });

  it('answers the route\'s degraded message when every target fails, streamed and not', async () => {
    const s = await withBackup({
      faults: { errors: [{ status: 503, rate: 1 }] },
      backupFaults: { errors: [{ status: 529, rate: 1 }] },
      route: { degraded: { message: 'We are busy; your order status will be emailed.' } },
    });
    const { data, response } = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(data.choices[0]!.message.content).toBe('We are busy; your order status will be emailed.');
    expect(response.headers.get('x-stormgate-degraded')).toBe('true');
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text).toBe('We are busy; your order status will be emailed.');
  });

  it('logs what stopped the retries of a request answered with the degraded message, as for a failed one', async () => {
    const s = await withBackup({
      faults: { errors: [{ status: 503, rate: 1 }] },
      backupFaults: { errors: [{ status: 503, rate: 1 }] },
      family: 'openai',
      route: { degraded: { message: 'We are busy.' } },
    });
    const { response } = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(response.headers.get('x-stormgate-degraded')).toBe('true');
    const line = await requestLine(s);
    expect(line.outcome).toBe('degraded');
    expect(line.retriesStopped).toBe('retries_exhausted');
    expect(line.attempts.map((a: { target: string }) => a.target)).toEqual(['mock/gpt-4o', 'mock/gpt-4o', 'backup/claude-sonnet-4-5', 'backup/claude-sonnet-4-5']);
  });
});

describe('stream recovery (streamRecovery: continue)', () => {
  /** The mock cuts its streams after 2 chunks; `next` (an OpenAI-compatible server at `origin`) is asked to continue. */
  function cutThenNext(origin: string): Promise<Stack> {
    return startStack({
      faults: { stream: { chunks: 6, cutAfterChunks: 2 } },
      config: (url) => {
        const base = defaultConfig(url, RETRY_LOOP_ONLY);
        return {
          ...base,
          providers: { ...base.providers, next: { family: 'openai', baseUrl: `${origin}/v1`, apiKey: 'next-key', breaker: false } },
          routes: base.routes.map((r) => (r.name === 'chat' ? { ...r, targets: [{ provider: 'mock' }, { provider: 'next' }], streamRecovery: 'continue' as const } : r)),
        };
      },
    });
  }

  async function rawText(s: Stack): Promise<string> {
    const res = await fetch(`${s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages, stream: true }),
    });
    return res.text();
  }

  it('finishes a cut stream at an Anthropic target with the delivered text as a prefill', async () => {
    const s = await withBackup({ faults: { stream: { chunks: 6, cutAfterChunks: 2 } }, route: { streamRecovery: 'continue' } });
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(backup!.stats().total).toBe(1);
    expect(text.length).toBeGreaterThan(0);
    expect(await rawText(s)).toContain(': stormgate stream recovered');
  });

  it('sends an Anthropic prefill without the trailing whitespace it refuses, and keeps one space in the text', async () => {
    // Cut after "Mock answer to: Where " (6 chunks, cut after 4): Anthropic answers 400 to a prefill ending in a space.
    const s = await withBackup({ faults: { stream: { chunks: 6, cutAfterChunks: 4 } }, route: { streamRecovery: 'continue' } });
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text).toBe('Mock answer to: Where and so the mock continues after 21 characters.');
    // "21 characters": the prefill was "Mock answer to: Where", without its space.
  });

  it('asks the next target for text only: the request\'s tools stay (a history of calls needs them), not to be called', async () => {
    const bodies: Array<Record<string, unknown>> = [];
    const next = await startProvider((req, res) => {
      let raw = '';
      req.on('data', (c: Buffer) => (raw += c));
      req.on('end', () => {
        bodies.push(JSON.parse(raw) as Record<string, unknown>);
        res.writeHead(503, { 'content-type': 'application/json' }).end('{"error":{"message":"busy","type":"server_error"}}');
      });
    });
    const s = await cutThenNext(next.origin);
    const tools = [{ type: 'function' as const, function: { name: 'get_weather', parameters: { type: 'object', properties: {} } } }];
    // After a tool's result the answer is text (the mock's too), and the request still has its tools.
    const history = [
      ...messages,
      { role: 'assistant' as const, content: null, tool_calls: [{ id: 'call_1', type: 'function' as const, function: { name: 'get_weather', arguments: '{}' } }] },
      { role: 'tool' as const, tool_call_id: 'call_1', content: 'sunny' },
    ];
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages: history, stream: true, tools, tool_choice: 'auto', parallel_tool_calls: true });
    await expect((async () => { for await (const _ of stream); })()).rejects.toThrow(/cut/);
    expect(bodies).toHaveLength(1);
    expect(bodies[0]).toMatchObject({ tools, tool_choice: 'none' });
    expect(bodies[0]!.parallel_tool_calls).toBeUndefined();
  });

  it('splices an OpenAI-compatible target\'s answer on only when it starts with exactly the delivered text', async () => {
    const s = await withBackup({ faults: { stream: { chunks: 6, cutAfterChunks: 2 } }, family: 'openai', backupModel: 'gpt-4o', route: { streamRecovery: 'continue' } });
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    // The mock answers the same request with the same text: the splice gives the client the answer exactly once.
    expect(text).toMatch(/^Mock answer to: Where is my order\?/);
    expect(text.split('Mock answer').length).toBe(2);
  });

  it('does not splice on an OpenAI-compatible answer that says something else: the client gets the cut, not two answers glued', async () => {
    const chunk = (content: string, finish: string | null = null) =>
      `data: ${JSON.stringify({ id: 'chatcmpl-x', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta: { content }, logprobs: null, finish_reason: finish }] })}\n\n`;
    let asked = 0;
    const next = await startProvider((req, res) => {
      req.resume();
      req.on('end', () => {
        asked++;
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.end(`${chunk('A different model ')}${chunk('writes a different answer entirely.')}${chunk('', 'stop')}data: [DONE]\n\n`);
      });
    });
    const s = await cutThenNext(next.origin);
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    let text = '';
    const err = await (async () => {
      for await (const c of stream) text += c.choices[0]?.delta?.content ?? '';
    })().catch((e: unknown) => e as Error);
    expect(asked).toBe(1);
    expect(String(err)).toMatch(/cut|ended before the answer was complete/);
    expect(text).toMatch(/^Mock answer/);
    expect(text).not.toContain('different');
  });

  it('recovers only with a retry from the budget: none left, no request to the next target', async () => {
    const s = await withBackup({
      faults: { stream: { chunks: 6, cutAfterChunks: 2 } },
      route: { streamRecovery: 'continue', budget: { ratio: 0, windowS: 10, minRetriesPerSecond: 0 } },
    });
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    const err = await (async () => {
      for await (const _ of stream) void _;
    })().catch((e: unknown) => e as Error);
    expect(String(err)).toMatch(/cut|ended before the answer was complete/);
    expect(backup!.stats().total).toBe(0);
  });

  it('does not continue an answer of n > 1 choices, which has no one delivered text: no request to the next target', async () => {
    const s = await withBackup({ faults: { stream: { chunks: 6, cutAfterChunks: 2 } }, family: 'openai', backupModel: 'gpt-4o', route: { streamRecovery: 'continue' } });
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true, n: 2 });
    const err = await (async () => {
      for await (const _ of stream) void _;
    })().catch((e: unknown) => e as Error);
    expect(String(err)).toMatch(/cut|ended before the answer was complete/);
    expect(backup!.stats().total).toBe(0);
  });

  it('does not ask a Claude 4.6 or later model, which refuses a prefill with a 400, to continue: no request, no retry spent', async () => {
    const s = await withBackup({ faults: { stream: { chunks: 6, cutAfterChunks: 2 } }, route: { streamRecovery: 'continue' }, backupModel: 'claude-sonnet-4-6' });
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    const err = await (async () => {
      for await (const _ of stream) void _;
    })().catch((e: unknown) => e as Error);
    expect(String(err)).toMatch(/cut|ended before the answer was complete/);
    expect(backup!.stats().total).toBe(0);
  });

  it('leaves the client the original failure when the next target rejects the attempt', async () => {
    const s = await withBackup({
      faults: { stream: { chunks: 6, cutAfterChunks: 2 } },
      backupFaults: { errors: [{ status: 400, rate: 1, message: 'prefill rejected' }] },
      route: { streamRecovery: 'continue' },
    });
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    const err = await (async () => {
      for await (const _ of stream) void _;
    })().catch((e: unknown) => e as Error);
    expect(String(err)).toMatch(/cut|ended before the answer was complete/);
    expect(String(err)).not.toMatch(/prefill rejected/);
  });
});

describe('recovery', () => {
  it('serves from the backup at once while the primary\'s breaker is open, and returns to the primary once it recovers', async () => {
    backup = await startBackup({ quiet: true, apiKey: 'backup-key' });
    const s = await startStack({
      faults: { errors: [{ status: 503, rate: 1 }] },
      config: (url) => {
        const base = defaultConfig(url, { route: { retry: { maxAttempts: 1 }, park: false } });
        return {
          ...base,
          providers: {
            mock: { ...base.providers.mock!, breaker: { openS: 1, closeAfter: 2 } },
            backup: { family: 'openai', baseUrl: `${backup!.url}/v1`, apiKey: 'backup-key' },
          },
          routes: base.routes.map((r) => (r.name === 'chat' ? { ...r, targets: [{ provider: 'mock' }, { provider: 'backup', model: 'gpt-4o' }] } : r)),
        };
      },
    });
    const target = async () => (await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse()).response.headers.get('x-stormgate-target');
    for (let i = 0; i < 5; i++) expect(await target()).toBe('backup/gpt-4o');
    const primaryBefore = s.mock.stats().total;
    // Open: no request reaches the primary, not even a failed first attempt.
    expect(await target()).toBe('backup/gpt-4o');
    expect(s.mock.stats().total).toBe(primaryBefore);
    s.mock.setFaults({});
    const started = Date.now();
    let back = false;
    while (!back && Date.now() - started < 5_000) {
      back = (await target()) === 'mock/gpt-4o' && (await target()) === 'mock/gpt-4o' && (await target()) === 'mock/gpt-4o';
      await new Promise((r) => setTimeout(r, 50));
    }
    expect(back).toBe(true);
    // Within 1.1 x openS plus closeAfter probe round trips (and this test's own pace).
    expect(Date.now() - started).toBeLessThan(2_500);
  });
});

describe('weighted spreading', () => {
  it('spreads 1,000 requests within 5% of the weights', async () => {
    const s = await withBackup({ family: 'openai', backupModel: 'gpt-4o', route: { strategy: 'weighted', targets: [{ provider: 'mock', weight: 3 }, { provider: 'backup', model: 'gpt-4o', weight: 1 }] } });
    for (let i = 0; i < 1_000; i += 50) {
      await Promise.all(Array.from({ length: 50 }, () => s.gateway.inject({ method: 'POST', url: '/v1/chat/completions', payload: { model: 'gpt-4o', messages } })));
    }
    const primary = s.mock.stats().total;
    expect(primary + backup!.stats().total).toBe(1_000);
    expect(Math.abs(primary / 1_000 - 0.75)).toBeLessThan(0.05);
  });
});

describe('config rules for fallbacks', () => {
  const providers = {
    openai: { family: 'openai' as const, baseUrl: 'https://api.openai.com/v1', apiKey: 'k' },
    other: { family: 'openai' as const, baseUrl: 'https://other.example/v1', apiKey: 'k' },
    anthropic: { family: 'anthropic' as const, baseUrl: 'https://api.anthropic.com', apiKey: 'k' },
  };
  it('rejects an embeddings fallback to another model', () => {
    const r = ConfigSchema.safeParse({ providers, routes: [{ name: 'e', match: { path: '/v1/embeddings' }, targets: [{ provider: 'openai' }, { provider: 'other', model: 'text-embedding-3-large' }] }] });
    expect(r.success).toBe(false);
    expect(JSON.stringify(r.error?.issues)).toMatch(/same model/);
  });
  it('rejects a Responses API fallback to another family', () => {
    const r = ConfigSchema.safeParse({ providers, routes: [{ name: 'r', match: { path: '/v1/responses' }, targets: [{ provider: 'openai' }, { provider: 'anthropic', model: 'claude-sonnet-4-5' }] }] });
    expect(r.success).toBe(false);
  });
  it('accepts the issue\'s example with an optional Azure provider without a key, and disables it', async () => {
    const r = ConfigSchema.safeParse({
      providers: { ...providers, azure: { family: 'azure-openai', baseUrl: 'https://example.openai.azure.com', apiKey: '', apiVersion: '2024-10-21', optional: true } },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions', models: ['gpt-4o*'] }, targets: [{ provider: 'openai' }, { provider: 'anthropic', model: 'claude-sonnet-4-5' }], contextWindowFallback: { provider: 'openai', model: 'gpt-4.1' } }],
    });
    expect(r.success).toBe(true);
  });
});

