// A stream is counted a success for its breaker at its first output. A provider that then breaks every answer (a cut,
// a stall, Anthropic's `overloaded_error` mid-stream) kept every request, and every user got a broken answer, because
// the breaker never heard of the break. The break now turns that success into a failure in the failure-rate window;
// an error event that blames the request, a rate limit or the gateway's own account still says nothing against the
// provider's health.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { BreakerSchema, type ConfigInput } from '../src/config/schema.ts';
import { settingsForModel } from '../src/policy/breaker.ts';
import { BreakerBoard } from '../src/state/breaker-board.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import type { FaultSpec } from '../src/mock/server.ts';
import { cc, delta, useScriptedGateway } from './helpers/scripted-provider.ts';
import { useExtraMocks, useStacks } from './helpers/stack.ts';

const settings = settingsForModel(BreakerSchema.parse({ minRequests: 4, failureRate: 0.5, consecutiveFailures: 100 }), undefined);

function board(now: () => number) {
  const store = new MemoryStore();
  const transitions: string[] = [];
  const b = new BreakerBoard({ store, now, random: () => 0, onTransition: (_t, from, to, cause) => transitions.push(`${from.state}->${to.state} ${cause.cause} ${cause.reason}`) });
  return { b, transitions };
}

describe('the breaker board and streams broken after their first output', () => {
  it('turns each such success into a failure of the window it was counted in', async () => {
    let now = 10_000;
    const { b, transitions } = board(() => now);
    const generation = b.current('p/m').generation;
    for (let i = 0; i < 4; i++) await b.record('p/m', settings, 'success', 10, undefined);
    await b.flush();
    expect(transitions).toEqual([]);
    for (let i = 0; i < 3; i++) b.streamBroke('p/m', settings, { generation, atMs: 10_000 }, { reason: 'stream_cut' });
    now += 100;
    await b.flush();
    // 3 of 4: past failureRate 0.5.
    expect(transitions).toEqual(['closed->open failure_rate stream_cut']);
  });

  it('leaves a window of another generation alone (the breaker opened and closed since)', async () => {
    let now = 10_000;
    const { b, transitions } = board(() => now);
    const generation = b.current('p/m').generation;
    for (let i = 0; i < 4; i++) await b.record('p/m', settings, 'success', 10, undefined);
    await b.flush();
    // Probes closed a breaker that opened meanwhile: a fresh window, none of these streams' business.
    for (let i = 0; i < 100; i++) await b.record('p/m', settingsForModel(BreakerSchema.parse({ consecutiveFailures: 1 }), undefined), 'failure', 10, undefined);
    now += 31_000;
    const probe = await b.admit('p/m', { ...settings, closeAfter: 1 }, false, 5_000);
    expect(probe.admitted).toBe(true);
    await b.record('p/m', { ...settings, closeAfter: 1 }, 'success', 10, probe.admitted ? probe.probe : undefined);
    expect(b.current('p/m').state).toBe('closed');
    for (let i = 0; i < 4; i++) b.streamBroke('p/m', settings, { generation, atMs: 10_000 }, { reason: 'stream_cut' });
    await b.flush();
    expect(transitions.filter((t) => t.startsWith('closed->open failure_rate'))).toEqual([]);
  });
});

const startStack = useStacks();
const startMock = useExtraMocks();

/** A chat route on `primary` then `backup`, the primary's breaker tripping on half of 4 requests in its window. */
async function twoTargets(primaryFaults: FaultSpec, timeouts: Record<string, number> = {}) {
  const primary = await startMock({ faults: primaryFaults, quiet: true, apiKey: 'primary-key' });
  const backup = await startMock({ faults: {}, quiet: true, apiKey: 'backup-key' });
  const provider = (url: string, key: string) => ({ family: 'openai' as const, baseUrl: `${url}/v1`, apiKey: key, timeouts: { connectMs: 1_000, firstTokenMs: 3_000, idleMs: 3_000, ...timeouts } });
  const config = (): ConfigInput => ({
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    providers: {
      primary: { ...provider(primary.url, 'primary-key'), breaker: { minRequests: 4, failureRate: 0.5, consecutiveFailures: 100, openS: 30 } },
      backup: { ...provider(backup.url, 'backup-key'), breaker: false },
    },
    routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'primary' }, { provider: 'backup' }], park: false }],
  });
  const s = await startStack({ config });
  const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client', maxRetries: 0 });
  return { s, client, primary, backup };
}

/** One streamed chat completion read to its end: the text, or the error the SDK raised. */
async function stream(client: OpenAI): Promise<{ text: string; error?: string }> {
  let text = '';
  try {
    const s = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    for await (const chunk of s) text += chunk.choices[0]?.delta.content ?? '';
    return { text };
  } catch (err) {
    return { text, error: (err as Error).message };
  }
}

describe('a provider that breaks every stream after its first output', () => {
  for (const [name, faults, timeouts, reason] of [
    ['cut', { stream: { chunks: 6, cutAfterChunks: 2 } }, {}, 'stream_cut'],
    ['stalled', { stream: { chunks: 6, stallAfterChunks: 2 } }, { idleMs: 200 }, 'stream_stalled'],
  ] as const) {
    it(`opens its breaker by the failure rate, and the next streams go to the backup (${name})`, async () => {
      const { s, client, primary, backup } = await twoTargets(faults, timeouts);
      const results: Array<{ text: string; error?: string }> = [];
      for (let i = 0; i < 10; i++) {
        results.push(await stream(client));
        // The window's counts are written in batches at most 50 ms apart.
        await new Promise((r) => setTimeout(r, 80));
      }
      const broken = results.filter((r) => r.error !== undefined).length;
      // The first four break (the window needs minRequests); once open, the backup answers whole.
      expect(broken).toBeGreaterThanOrEqual(4);
      expect(broken).toBeLessThan(10);
      expect(results.at(-1)).toEqual({ text: expect.any(String) });
      expect(primary.requests().length).toBe(broken);
      expect(backup.requests().length).toBe(10 - broken);
      const opened = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.msg === 'breaker open');
      expect(opened).toMatchObject({ target: expect.stringContaining('primary'), cause: 'failure_rate', reason });
    });
  }
});

describe('error events that end a stream after its first output', () => {
  const gw = useScriptedGateway((c) => {
    (c.providers.p as Record<string, unknown>).breaker = { minRequests: 3, failureRate: 0.5, consecutiveFailures: 100 };
  });
  const errorEvent = (error: Record<string, unknown>) => `data: ${JSON.stringify({ error })}\n\n`;
  const opened = (logs: string[]) => logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === 'breaker open');

  for (const [name, error, counts] of [
    ['a server error', { message: 'The server had an error while processing your request.', type: 'server_error', code: 'server_error', param: null }, true],
    ['an overload', { message: 'Overloaded', type: 'overloaded_error' }, true],
    ['a content filter (the request)', { message: 'The response was filtered.', type: 'invalid_request_error', code: 'content_filter', param: 'prompt' }, false],
    ['a rate limit', { message: 'Rate limit reached.', type: 'requests', code: 'rate_limit_exceeded', param: null }, false],
  ] as const) {
    it(`${counts ? 'count' : 'do not count'} against the provider: ${name}`, async () => {
      const { client, s } = await gw(() => ({ steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hel' })]), errorEvent(error)] }));
      for (let i = 0; i < 5; i++) {
        const r = await stream(client);
        // Once the breaker is open, the lone target turns the request away before any text.
        if (i < 3) expect(r).toEqual({ text: 'Hel', error: expect.any(String) });
        await new Promise((res) => setTimeout(res, 80));
      }
      expect(opened(s.logs).length).toBe(counts ? 1 : 0);
    });
  }
});
