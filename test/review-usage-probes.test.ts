// Review of streamUsage (43e3427): the usage the gateway asked for, taken out of the client's stream, in the cases the
// per-batch grace check and the first-output read meet it. A usage chunk alone in its read (a batch of no client
// events) after the finish, with no [DONE] and the connection held open, must still end the wait: [DONE] added after
// the second past the finish, not after idleMs. A usage chunk ahead of any output is dropped without counting as
// output; a provider that reports usage on every chunk (vLLM's continuous_usage_stats) is billed once, its last
// counts, and the client sees none of it. Bounds are generous: the wrong behaviour waits idleMs (8 s).
// And of e79b180: a probe given back unjudged ('ignore-request') with halfOpenProbes 2 lets one more probe take its
// place, never a third at once, and the round is judged on answered probes alone.
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { BreakerSchema } from '../src/config/schema.ts';
import { settingsForModel } from '../src/policy/breaker.ts';
import { BreakerBoard, type Probe } from '../src/state/breaker-board.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';
import { cc, delta, DONE, type Script } from './helpers/scripted-provider.ts';
import type { Stack } from './helpers/stack.ts';

const start = useScriptedUpstreams();
const BILL = { prompt_tokens: 1234, completion_tokens: 56, total_tokens: 1290 };
const messages = [{ role: 'user', content: 'Payment terms?' }];
const NULL_USAGE = { usage: null };
const timeouts = { connectMs: 1_000, firstTokenMs: 5_000, idleMs: 8_000 };

async function rawStream(s: Stack, body: Record<string, unknown> = {}): Promise<{ text: string; ms: number }> {
  const t0 = performance.now();
  const res = await fetch(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages, stream: true, ...body }) });
  expect(res.status).toBe(200);
  const text = await res.text();
  return { text, ms: performance.now() - t0 };
}

async function requestLine(s: Stack): Promise<Record<string, unknown>> {
  const lines = () => s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => typeof l.reqId === 'string' && typeof l.durationMs === 'number');
  for (const end = Date.now() + 5_000; lines().length < 1; await sleep(20)) if (Date.now() > end) throw new Error('no request log line');
  return lines()[0]!;
}

const sse = (steps: Script['steps'], hold = false): Script => ({ headers: { 'content-type': 'text/event-stream' }, steps, hold });
const text = (raw: string) =>
  raw
    .split('\n\n')
    .filter((e) => e.startsWith('data: {'))
    .map((e) => (JSON.parse(e.slice(6)) as { choices: Array<{ delta?: { content?: string } }> }).choices.map((c) => c.delta?.content ?? '').join(''))
    .join('');

describe('streamUsage: the hidden usage and the end of the stream', () => {
  it('ends a finished stream a second after its hidden usage chunk comes alone, without [DONE], not idleMs later', async () => {
    const steps = [cc([delta({ role: 'assistant', content: '' })], NULL_USAGE), cc([delta({ content: 'Net 30.' })], NULL_USAGE), cc([delta({}, 'stop')], NULL_USAGE), 150, cc([], { usage: BILL })];
    const { s } = await start({ p: () => sse(steps, true) }, [{ provider: 'p' }], { provider: { streamUsage: true, timeouts } });
    const got = await rawStream(s);
    expect(got.text).not.toContain('usage');
    expect(got.text.endsWith('data: [DONE]\n\n')).toBe(true);
    expect(text(got.text)).toBe('Net 30.');
    expect(got.ms).toBeLessThan(5_000);
    const line = await requestLine(s);
    expect(line.streamEnd).toBe('done-added');
    expect(line.usage).toEqual({ prompt: 1234, completion: 56 });
  });

  it('drops a usage chunk that comes before any output without taking it for the first output', async () => {
    const steps = [cc([], { usage: BILL }), cc([delta({ role: 'assistant', content: '' })], NULL_USAGE), cc([delta({ content: 'Net 30.' })], NULL_USAGE), cc([delta({}, 'stop')], NULL_USAGE), DONE];
    const { s } = await start({ p: () => sse(steps) }, [{ provider: 'p' }], { provider: { streamUsage: true, timeouts } });
    const got = await rawStream(s);
    expect(got.text).not.toContain('usage');
    expect(text(got.text)).toBe('Net 30.');
    const line = await requestLine(s);
    expect(line.streamEnd).toBe('complete');
    expect(line.usage).toEqual({ prompt: 1234, completion: 56 });
  });

  it('bills a provider that reports usage on every chunk once, by its last counts, and shows the client none', async () => {
    const at = (completion: number) => ({ usage: { prompt_tokens: 10, completion_tokens: completion, total_tokens: 10 + completion } });
    const steps = [cc([delta({ role: 'assistant', content: '' })], at(0)), cc([delta({ content: 'Net 30.' })], at(3)), cc([delta({}, 'stop')], at(4)), cc([], at(4)), DONE];
    const { s, seen } = await start({ p: () => sse(steps) }, [{ provider: 'p' }], { provider: { streamUsage: true, timeouts } });
    const got = await rawStream(s, { stream_options: { continuous_usage_stats: true } });
    expect(seen.p![0]!.body.stream_options).toEqual({ continuous_usage_stats: true, include_usage: true });
    expect(got.text).not.toContain('usage');
    expect(text(got.text)).toBe('Net 30.');
    const line = await requestLine(s);
    expect(line.streamEnd).toBe('complete');
    expect(line.usage).toEqual({ prompt: 10, completion: 4 });
  });
});

describe("a half-open round of two probes, one of them given back unjudged ('ignore-request')", () => {
  it('lets one probe take its place, never three out at once, and closes on the answered probes alone', async () => {
    const s = settingsForModel(BreakerSchema.parse({ consecutiveFailures: 2, openS: 30, probeWhileParkedMs: 1_000, halfOpenProbes: 2, closeAfter: 2 }), undefined);
    let now = 10_000;
    const b = new BreakerBoard({ store: new MemoryStore(), now: () => now, random: () => 0 });
    const target = 'groq/llama';
    for (let i = 0; i < 2; i++) await b.record(target, s, 'failure', 10, undefined);
    now += 1_000;
    const take = async (): Promise<Probe | undefined> => {
      const a = await b.admit(target, s, true, 30_000);
      return a.admitted ? a.probe : undefined;
    };
    await b.record(target, s, 'success', 50, (await take())!);
    expect(b.current(target)).toMatchObject({ state: 'half-open', probeSuccesses: 1 });
    const first = (await take())!;
    const flex = (await take())!;
    expect(first && flex).toBeTruthy();
    expect(await take()).toBeUndefined();
    await b.record(target, s, 'ignore-request', 50, flex);
    expect(b.current(target)).toMatchObject({ state: 'half-open', probeSuccesses: 1 });
    const next = (await take())!;
    expect(next).toBeTruthy();
    expect(await take()).toBeUndefined();
    await b.record(target, s, 'success', 50, first);
    // closeAfter 2 answered in this round (the 498 is in none): the breaker closes on them.
    expect(b.current(target).state).toBe('closed');
    await b.record(target, s, 'success', 50, next);
    expect(b.current(target).state).toBe('closed');
  });
});
