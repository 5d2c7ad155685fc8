// Mutation round on the last eight commits (mut-today-50): the passthrough's redirect rewrite, the refusals a client's
// retry is taken for (clientLimits.retriesRefusal), the completion identity a continuation is given, the logprobs of a
// splice that carries no text, and the streamRecovery start-up warning. Each test kills a hand mutant the suites let by.
import type { ChatCompletionChunk } from 'openai/resources/chat/completions';
import { describe, expect, it } from 'vitest';
import { ConfigSchema } from '../src/config/schema.ts';
import { configWarnings } from '../src/config/warnings.ts';
import { clientLimits } from '../src/http/client-limits.ts';
import { asSameCompletion, DeliveredText } from '../src/pipeline/delivered-text.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import { setTimeout as sleep } from 'node:timers/promises';
import { failsOnce, useFakeProviders } from './helpers/fake-provider.ts';
import { cc, delta, type Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';
import { rawGet } from './helpers/raw-http.ts';
import { configServedBy, defaultConfig, RETRY_LOOP_ONLY, TEST_KEY, useGateways, useStacks } from './helpers/stack.ts';
import { deliverData } from './helpers/live-stream.ts';

const startStack = useStacks();
const startProvider = useFakeProviders();
const startUpstreams = useScriptedUpstreams();
const startGateway = useGateways();


describe('a passthrough redirect elsewhere that names the provider in its query', () => {
  it('goes on as it is: only a Location that begins with the provider\'s baseUrl is made the gateway\'s path', async () => {
    let origin = '';
    const p = await startProvider((req, res) => {
      req.resume();
      res.writeHead(302, { location: `https://sso.example.com/login?return_to=${origin}/v1/files/file-r/content` }).end();
    });
    origin = p.origin;
    const s = await startStack({
      config: (mockUrl) => ({ ...configServedBy(mockUrl, 'files', `${p.origin}/v1`), passthrough: { provider: 'files', paths: ['/v1/files'], methods: ['GET'] } }),
    });
    const res = await rawGet(`${s.url}/v1/files/file-r/content`);
    expect(res.status).toBe(302);
    expect(res.headers.location).toBe(`https://sso.example.com/login?return_to=${p.origin}/v1/files/file-r/content`);
  });
});

describe('clientLimits.retriesRefusal: the time a refusal\'s retry is still its own', () => {
  it('takes a retry that comes a few seconds after the time told (a loaded event loop), not one a minute later', async () => {
    let nowMs = 0;
    const limit = clientLimits({ agents: { requestsPerMinute: 60, burst: 1 } }, { store: new MemoryStore(), now: () => nowMs, random: () => 0, onLimited: () => {} })!;
    expect(await limit.admit('agents')).toBeUndefined();
    const told = (await limit.admit('agents'))?.retryAfterMs;
    expect(told).toBeGreaterThan(0);
    expect(told).toBeLessThanOrEqual(60_000);
    // The SDK's retry, 5 s late: still the refusal's.
    nowMs = told! + 5_000;
    expect(limit.retriesRefusal('agents')).toBe(true);
    // Refused again and its retry never came: forgotten well past the time told.
    const again = (await limit.admit('agents'))?.retryAfterMs ?? 0;
    nowMs += again + 60_000;
    expect(limit.retriesRefusal('agents')).toBe(false);
  });
});

describe('the completion a client began to get', () => {
  const chunk = (id: string, created: number, content: string) => JSON.stringify({ id, object: 'chat.completion.chunk', created, model: 'm', choices: [{ index: 0, delta: { content }, finish_reason: null }] });

  it('is the first chunk\'s id and created, whatever later chunks carry', () => {
    const d = new DeliveredText();
    deliverData(d, chunk('chatcmpl-A', 100, 'He'));
    deliverData(d, chunk('chatcmpl-B', 200, 'llo'));
    expect(d.completion).toEqual({ id: 'chatcmpl-A', created: 100 });
    expect(d.text).toBe('Hello');
  });

  const collect = async (texts: string[], completion: { id: string; created: unknown }) => {
    async function* source() {
      yield* texts;
    }
    let out = '';
    for await (const t of asSameCompletion(source(), completion)) out += t;
    return out;
  };

  it('is given to a continuation chunk with the same id but another created time', async () => {
    const out = await collect([`data: ${chunk('chatcmpl-A', 999, ' world')}\n\n`], { id: 'chatcmpl-A', created: 100 });
    expect(JSON.parse(out.trim().slice('data: '.length))).toMatchObject({ id: 'chatcmpl-A', created: 100 });
  });

  it('leaves a named event (event: error) as it came, its event line kept', async () => {
    const ev = `event: error\ndata: {"id":"chatcmpl-Q","error":{"message":"boom"}}\n\n`;
    expect(await collect([ev], { id: 'chatcmpl-A', created: 100 })).toBe(ev);
  });

  it('is given to a last event the continuation sent without its closing blank line', async () => {
    const out = await collect([`data: ${chunk('chatcmpl-Q', 200, 'ld')}`], { id: 'chatcmpl-A', created: 100 });
    expect(out).not.toBe('');
    expect(JSON.parse(out.trim().slice('data: '.length))).toMatchObject({ id: 'chatcmpl-A', created: 100, choices: [{ delta: { content: 'ld' } }] });
  });
});

describe('a splice that falls at the end of the next target\'s chunk which carries the finish', () => {
  const lp = (...tokens: string[]) => ({ content: tokens.map((token) => ({ token, logprob: -0.1, bytes: [...Buffer.from(token)], top_logprobs: [] })), refusal: null });
  const p: Script = { steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hello' }, null, 0, { logprobs: lp('Hel', 'lo') })]), 30, { destroy: true }] };
  const q: Script = {
    steps: [
      cc([delta({ role: 'assistant', content: '' })], { id: 'chatcmpl-Q' }),
      cc([delta({ content: 'Hel' }, null, 0, { logprobs: lp('Hel') })], { id: 'chatcmpl-Q' }),
      cc([delta({ content: 'lo' }, 'stop', 0, { logprobs: lp('lo') })], { id: 'chatcmpl-Q' }),
      'data: [DONE]\n\n',
    ],
  };

  it('sends the finish with no text and null logprobs (no token of it is the client\'s to add)', async () => {
    const { client } = await startUpstreams({ p: () => p, q: () => q }, [{ provider: 'p' }, { provider: 'q' }], { route: { streamRecovery: 'continue' } });
    const chunks: ChatCompletionChunk[] = [];
    const stream = client.chat.completions.stream({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], logprobs: true });
    stream.on('chunk', (c) => chunks.push(c));
    const done = await stream.finalChatCompletion();
    expect(done.choices[0]!.message.content).toBe('Hello');
    expect(done.choices[0]!.finish_reason).toBe('stop');
    const finish = chunks.find((c) => c.choices[0]?.finish_reason === 'stop')!;
    expect(finish.choices[0]!.delta.content ?? '').toBe('');
    expect(finish.choices[0]!.logprobs).toBeNull();
    expect(done.choices[0]!.logprobs!.content!.map((t) => t.token)).toEqual(['Hel', 'lo']);
  });
});

describe('the streamRecovery warning', () => {
  it('is said only for a route that sets continue: a /v1/messages route without it is warned of nothing', () => {
    const config = ConfigSchema.parse({
      providers: { p: { family: 'anthropic', baseUrl: 'https://api.anthropic.com', apiKey: 'k' }, q: { family: 'anthropic', baseUrl: 'https://example.com', apiKey: 'k2' } },
      routes: [{ name: 'r', match: { path: '/v1/messages' }, targets: [{ provider: 'p' }, { provider: 'q' }] }],
    });
    expect(configWarnings(config)).toEqual([]);
  });
});

describe('a client\'s first try after a refusal of its rate', () => {
  it('does not take the refusal\'s place: the SDK\'s retry that follows is still a request to the retry budget', async () => {
    const flaky = failsOnce('flaky');
    const provider = await startProvider(flaky);
    const base = defaultConfig('http://127.0.0.1:9', RETRY_LOOP_ONLY);
    const config = ConfigSchema.parse({
      ...base,
      providers: { mock: { family: 'openai', baseUrl: `${provider.origin}/v1`, apiKey: TEST_KEY, breaker: false } },
      // One retry a window: a declared retry counted as one leaves none for the other client's 503.
      routes: base.routes.map((r) => ({ ...r, budget: { ratio: 0, windowS: 60, minRetriesPerSecond: 1 / 60 }, retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } })),
      auth: { keys: { agents: 'sg-mut50-agents-1', other: 'sg-mut50-other-2' }, limits: { agents: { requestsPerMinute: 120, burst: 1 } } },
    });
    const url = await startGateway(config);
    const post = (key: string, content: string, headers: Record<string, string> = {}) =>
      fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${key}`, ...headers }, body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content }] }) });
    expect((await post('sg-mut50-agents-1', 'a')).status).toBe(200);
    const refused = await post('sg-mut50-agents-1', 'b');
    expect(refused.status).toBe(429);
    await sleep(1_200);
    // A first try (no x-stainless-retry-count), then the refused request's retry.
    expect((await post('sg-mut50-agents-1', 'c')).status).toBe(200);
    await sleep(1_200);
    expect((await post('sg-mut50-agents-1', 'b', { 'x-stainless-retry-count': '1' })).status).toBe(200);
    // The budget's one retry is whole for the other client's provider failure.
    const other = await post('sg-mut50-other-2', 'flaky', { 'x-stainless-retry-count': '0' });
    expect(other.status).toBe(200);
    expect(flaky.sent()).toBe(2);
  });
});
