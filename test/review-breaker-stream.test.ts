// Review of the breaker's count of streams broken after their first output (BreakerBoard.streamBroke): the failure it
// makes of a stream's success stays inside what the window can hold (never more failures than requests), names no
// reason the window never had, and an error event the provider's family reads as the request's fault or a rate limit
// (Anthropic's own, on /v1/messages or translated) counts no more after the first output than before it.
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { handedOverStream } from './helpers/live-stream.ts';
import { BreakerSchema } from '../src/config/schema.ts';
import { settingsForModel } from '../src/policy/breaker.ts';
import { BreakerBoard, type BreakerCause } from '../src/state/breaker-board.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import { useScriptedGateway } from './helpers/scripted-provider.ts';

const T = 1_700_000_000_000;
const settings = settingsForModel(BreakerSchema.parse({ minRequests: 4, failureRate: 0.5, consecutiveFailures: 100, windowS: 10 }), undefined);

function boards(store = new MemoryStore()) {
  let now = T;
  const lines: Array<{ by: string; to: string; cause: BreakerCause }> = [];
  const make = (by: string) => new BreakerBoard({ store, now: () => now, random: () => 0, onTransition: (_t, _from, to, cause) => lines.push({ by, to: to.state, cause }) });
  return { a: make('a'), b: make('b'), lines, advance: (ms: number) => (now += ms), now: () => now };
}

describe('the breaker board: streams broken after their first output', () => {
  it('a break counted after its success has left the window brings its request along: failures never outnumber requests', async () => {
    const { a, lines, advance, now } = boards();
    const generation = a.current('p/m').generation;
    const startedAt = now();
    // Four long streams begin (their first outputs count four successes), then the window moves on past them.
    for (let i = 0; i < 4; i++) await a.record('p/m', settings, 'success', 10, undefined);
    await a.flush();
    advance(20_000);
    // Four new streams begin well; three of the old ones, twenty seconds in, are cut.
    for (let i = 0; i < 4; i++) await a.record('p/m', settings, 'success', 10, undefined);
    for (let i = 0; i < 3; i++) a.streamBroke('p/m', settings, { generation, atMs: startedAt }, { reason: 'stream_cut' });
    await a.flush();
    // 3 failures of 7 requests judged in the window, not 3 of 4 (the old streams' successes were no longer in it).
    expect(lines).toEqual([]);
    expect(a.current('p/m').state).toBe('closed');
  });

  it('still turns a success of the same window into a failure', async () => {
    const { a, lines } = boards();
    const counted = { generation: a.current('p/m').generation, atMs: T };
    for (let i = 0; i < 4; i++) await a.record('p/m', settings, 'success', 10, undefined);
    for (let i = 0; i < 2; i++) a.streamBroke('p/m', settings, counted, { reason: 'stream_stalled' });
    await a.flush();
    expect(lines.map((l) => `${l.to} ${l.cause.cause} ${l.cause.reason} ${(l.cause as { failures: number }).failures}/${(l.cause as { requests: number }).requests}`)).toEqual(['open failure_rate stream_stalled 2/4']);
  });

  it("names no reason of a window long gone: another instance's failures, tipped by this one's successes", async () => {
    const { a, b, lines, advance } = boards();
    // Instance a saw a 503 a minute ago (its window long gone) ...
    await a.record('p/m', settings, 'failure', 10, undefined, { reason: 'status_503' });
    await a.flush();
    advance(60_000);
    // ... instance b sees two timeouts now, and a's two successes bring the shared window to minRequests at 50%.
    for (let i = 0; i < 2; i++) await b.record('p/m', settings, 'failure', 10, undefined, { reason: 'timeout_response' });
    await b.flush();
    for (let i = 0; i < 2; i++) await a.record('p/m', settings, 'success', 10, undefined, { reason: 'ok' });
    await a.flush();
    expect(lines.map((l) => [l.by, l.to, l.cause.cause])).toEqual([['a', 'open', 'failure_rate']]);
    expect(lines[0]!.cause.reason).not.toBe('status_503');
  });
});

const aev = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
const anthropicStream = (error: Record<string, unknown>) => [
  aev('message_start', { message: { id: 'msg_01', type: 'message', role: 'assistant', content: [], model: 'claude-sonnet-4-5', stop_reason: null, stop_sequence: null, usage: { input_tokens: 5, output_tokens: 1 } } }),
  aev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
  aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Hel' } }),
  aev('error', { error }),
];

describe("Anthropic's error events after the first output, as its family reads them", () => {
  const gw = useScriptedGateway((c, origin) => {
    c.providers.p = { family: 'anthropic', baseUrl: origin, apiKey: 'anthropic-key', breaker: { minRequests: 3, failureRate: 0.5, consecutiveFailures: 100 } };
    c.routes = [
      { name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'p', model: 'claude-sonnet-4-5' }], park: false },
      { name: 'messages', match: { path: '/v1/messages' }, targets: [{ provider: 'p' }], park: false },
    ];
  });
  const opened = (logs: string[]) => logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === 'breaker open');

  for (const [name, error, counts] of [
    ['an invalid_request_error (the request)', { type: 'invalid_request_error', message: 'messages.0: the request is invalid' }, false],
    ['a rate_limit_error', { type: 'rate_limit_error', message: 'Number of request tokens has exceeded your per-minute rate limit' }, false],
    ['an overloaded_error (the provider)', { type: 'overloaded_error', message: 'Overloaded' }, true],
  ] as const) {
    it(`${counts ? 'counts' : 'does not count'} on /v1/messages: ${name}`, async () => {
      const { s } = await gw(() => ({ steps: anthropicStream(error) }));
      for (let i = 0; i < 5; i++) {
        const res = await fetch(`${s.url}/v1/messages`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-api-key': 'client-key', 'anthropic-version': '2023-06-01' },
          body: JSON.stringify({ model: 'claude-sonnet-4-5', max_tokens: 100, stream: true, messages: [{ role: 'user', content: 'hi' }] }),
        });
        const text = await res.text();
        if (i < 3) expect(text).toContain('Hel');
        await new Promise((r) => setTimeout(r, 80));
      }
      expect(opened(s.logs).length).toBe(counts ? 1 : 0);
    });
  }

  for (const [name, error, counts] of [
    ['an invalid_request_error (the request)', { type: 'invalid_request_error', message: 'messages.0: the request is invalid' }, false],
    ['an api_error (the provider)', { type: 'api_error', message: 'Internal server error' }, true],
  ] as const) {
    it(`${counts ? 'counts' : 'does not count'} translated for a chat client: ${name}`, async () => {
      const { client, s } = await gw(() => ({ steps: anthropicStream(error) }));
      for (let i = 0; i < 5; i++) {
        let text = '';
        try {
          const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
          for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
        } catch {
          // the error event raised
        }
        if (i < 3) expect(text).toBe('Hel');
        await new Promise((r) => setTimeout(r, 80));
      }
      expect(opened(s.logs).length).toBe(counts ? 1 : 0);
    });
  }
});

describe('a passthrough stream the instance ends at its shutdown', () => {
  it('is no break of the provider: its breaker hears nothing of it', async () => {
    const controller = new AbortController();
    const iterator = (async function* () {
      yield Buffer.from('data: {"anything": 2}\n\n');
      await sleep(5_000, undefined, { signal: controller.signal });
    })();
    const { live, ended } = handedOverStream({ api: 'other', first: 'data: {"anything": 1}\n\n', iterator, controller, idleMs: 10_000 });
    const read = (async () => {
      for await (const _ of live.body()) if (_.includes('"anything": 2')) live.interrupt();
    })().catch(() => undefined);
    const end = await ended;
    await read;
    expect(end.upstreamBroke).toBeUndefined();
  });
});
