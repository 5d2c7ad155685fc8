// The LiveStream's end-of-answer rules, driven by a scripted upstream: an answer is whole only when every choice has
// finished (n > 1), the usage chunk asked for is waited for, and a client that reads slowly is not an upstream stall.
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { handedOverStream, readAll, upstream, type Step } from './helpers/live-stream.ts';
import { LiveStream, type StreamEnd } from '../src/pipeline/live-stream.ts';
import type { StreamShape } from '../src/streaming/stream-events.ts';
import { MAX_EVENT_BYTES } from '../src/streaming/sse-parser.ts';

const chunk = (index: number, content: string, finish: string | null = null): string =>
  `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', choices: [{ index, delta: { content }, finish_reason: finish }] })}\n\n`;
const usageChunk = `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', choices: [], usage: { prompt_tokens: 3, completion_tokens: 5, total_tokens: 8 } })}\n\n`;
const DONE = 'data: [DONE]\n\n';
const KEY = 'sk-live-stream-provider-key';

/** A stream whose first output (`first`) has arrived, as runAttempt hands it over, reading `rest` from the upstream. */
function liveStream(first: string, rest: Step[], shape: StreamShape, idleMs = 2_000): { live: LiveStream; ended: Promise<StreamEnd> } {
  const controller = new AbortController();
  return handedOverStream({ first, iterator: upstream(controller, rest), controller, shape, idleMs, apiKey: KEY });
}

describe('LiveStream: when an answer is whole', () => {
  it('with n = 2, one choice finished and the upstream gone is a cut, not a finished answer', async () => {
    const { live, ended } = liveStream(chunk(0, 'Hel') + chunk(1, 'Hel'), [chunk(0, 'lo', 'stop'), chunk(1, 'l')], { choices: 2, usage: false });
    const text = await readAll(live);
    expect(text).not.toContain('[DONE]');
    expect(text).toContain('stream_interrupted');
    expect((await ended).kind).toBe('cut');
  });

  it('with n = 2, both choices finished and no [DONE] gets [DONE] added', async () => {
    const { live, ended } = liveStream(chunk(0, 'Hel') + chunk(1, 'Hel'), [chunk(0, 'lo', 'stop'), chunk(1, 'lo', 'stop')], { choices: 2, usage: false });
    const text = await readAll(live);
    expect(text.endsWith(DONE)).toBe(true);
    expect((await ended).kind).toBe('done-added');
  });

  it('a finished answer whose connection is reset before [DONE] gets [DONE], not an error', async () => {
    const { live, ended } = liveStream(chunk(0, 'Hel'), [chunk(0, 'lo', 'stop'), 50, new Error('other side closed')], { choices: 1, usage: false });
    const text = await readAll(live);
    expect(text).not.toContain('stream_interrupted');
    expect(text.endsWith(DONE)).toBe(true);
    expect((await ended).kind).toBe('done-added');
  });

  it('with n = 2, one choice finished and the connection reset is a cut', async () => {
    const { live, ended } = liveStream(chunk(0, 'Hel') + chunk(1, 'Hel'), [chunk(0, 'lo', 'stop'), new Error('other side closed')], { choices: 2, usage: false });
    const text = await readAll(live);
    expect(text).not.toContain('[DONE]');
    expect(text).toContain('the upstream stream was cut: other side closed');
    expect((await ended).kind).toBe('cut');
  });

  it('with n = 3 from a provider that ignores n, one finished choice is a whole answer', async () => {
    const { live, ended } = liveStream(chunk(0, 'Hel'), [chunk(0, 'lo', 'stop')], { choices: 3, usage: false });
    const text = await readAll(live);
    expect(text.endsWith(DONE)).toBe(true);
    expect((await ended).kind).toBe('done-added');
  });

  it('with n = 2 sent one choice after another, a reset between the choices is a cut, not one whole answer', async () => {
    const { live, ended } = liveStream(chunk(0, 'Hel'), [chunk(0, 'lo', 'stop'), 50, new Error('other side closed')], { choices: 2, usage: false });
    const text = await readAll(live);
    expect(text).not.toContain('[DONE]');
    expect(text).toContain('the upstream stream was cut: other side closed');
    expect((await ended).kind).toBe('cut');
  });

  it('with n = 2 sent one choice after another, a stall before the second is a stall, not one whole answer', async () => {
    const { live, ended } = liveStream(chunk(0, 'Hel'), [chunk(0, 'lo', 'stop'), 60_000], { choices: 2, usage: false }, 300);
    const text = await readAll(live);
    expect(text).not.toContain('[DONE]');
    expect(text).toContain('stalled');
    expect((await ended).kind).toBe('stalled');
  });

  it('with n = 2, waits past the after-finish grace for the choice still running', async () => {
    const { live, ended } = liveStream(chunk(0, 'Hel') + chunk(1, 'Hel'), [chunk(0, 'lo', 'stop'), 1_200, chunk(1, 'lo', 'stop'), DONE], { choices: 2, usage: false });
    const text = await readAll(live);
    expect(text).toContain(chunk(1, 'lo', 'stop'));
    expect((await ended).kind).toBe('complete');
  });

  it('with include_usage, waits past the after-finish grace for the usage chunk', async () => {
    const { live, ended } = liveStream(chunk(0, 'Hel'), [chunk(0, 'lo', 'stop'), 1_200, usageChunk, DONE], { choices: 1, usage: true });
    const text = await readAll(live);
    expect(text).toContain('"prompt_tokens":3');
    const end = await ended;
    expect(end.kind).toBe('complete');
    expect(end.usage).toEqual({ prompt: 3, completion: 5 });
  });

  it('without include_usage, a finished answer whose upstream goes quiet gets [DONE] after the grace, not a stall', async () => {
    const started = Date.now();
    const { live, ended } = liveStream(chunk(0, 'Hel'), [chunk(0, 'lo', 'stop'), 60_000], { choices: 1, usage: false }, 30_000);
    const text = await readAll(live);
    expect(text.endsWith(DONE)).toBe(true);
    expect((await ended).kind).toBe('done-added');
    expect(Date.now() - started).toBeLessThan(5_000);
  });
});

describe('LiveStream: idle timer', () => {
  it('does not count a slow client as upstream silence', async () => {
    const { live, ended } = liveStream(chunk(0, 'a'), [chunk(0, 'b'), chunk(0, 'c', 'stop'), DONE], { choices: 1, usage: false }, 150);
    const text = await readAll(live, 600);
    expect(text.endsWith(DONE)).toBe(true);
    expect((await ended).kind).toBe('complete');
  });

  it('ends an upstream that trickles bytes of no whole event, as one that is silent', async () => {
    const trickle: Step[] = Array.from({ length: 30 }, () => [40, 'x'] as Step[]).flat();
    const { live, ended } = liveStream(chunk(0, 'a'), [chunk(0, 'b'), 'data: {"x', ...trickle, '":1}\n\n', chunk(0, 'c', 'stop'), DONE], { choices: 1, usage: false }, 150);
    const text = await readAll(live);
    expect(text).toContain('stalled');
    expect((await ended).kind).toBe('stalled');
  });

  it('keeps a stream whose next event is waiting when a starved process runs its expired idle timer (the stall is decided after that turn\'s reads)', async () => {
    const IDLE_MS = 100;
    const controller = new AbortController();
    let reads = 0;
    // Like undici's body: a read fails once its request is aborted.
    const iterator: AsyncIterator<Buffer> = {
      next: () => {
        if (++reads > 1) return Promise.resolve({ value: undefined, done: true });
        return new Promise((resolve, reject) => {
          controller.signal.addEventListener('abort', () => reject(controller.signal.reason as Error), { once: true });
          // The event comes just after the idle timer expires, while the process is starved (the busy wait): when the
          // loop next runs its timers both have expired, and the idle one, sooner, runs first in that same turn.
          setTimeout(() => resolve({ value: Buffer.from(chunk(0, 'lo', 'stop') + DONE), done: false }), IDLE_MS + 5);
          setImmediate(() => {
            for (const until = performance.now() + 3 * IDLE_MS; performance.now() < until; );
          });
        });
      },
    };
    const { live, ended } = handedOverStream({ first: chunk(0, 'Hel'), iterator, controller, idleMs: IDLE_MS, apiKey: KEY });
    const text = await readAll(live);
    expect(text).not.toContain('stalled');
    expect(text.endsWith(DONE)).toBe(true);
    expect((await ended).kind).toBe('complete');
  });

  it('still ends an upstream that goes silent while the client waits', async () => {
    const { live, ended } = liveStream(chunk(0, 'a'), [chunk(0, 'b'), 60_000], { choices: 1, usage: false }, 150);
    const text = await readAll(live);
    expect(text).toContain('stalled');
    expect((await ended).kind).toBe('stalled');
  });

  it('gives up on a client that reads nothing for ten idle periods, freeing the upstream and the slot', async () => {
    const { live, ended } = liveStream(chunk(0, 'a'), [chunk(0, 'b'), chunk(0, 'c', 'stop'), DONE], { choices: 1, usage: false }, 50);
    let slotFreed = false;
    live.whenUpstreamDone(() => (slotFreed = true));
    const started = Date.now();
    live.open(); // the first chunk is taken, then nothing more is read
    const end = await ended;
    expect(end.kind).toBe('client-stalled');
    expect(slotFreed).toBe(true);
    expect(Date.now() - started).toBeGreaterThanOrEqual(450);
  });

  it('does not count a recovery\'s continuation as a client stall', async () => {
    const { live, ended } = liveStream(chunk(0, 'Hel'), [], { choices: 1, usage: false }, 50);
    live.recoverWith(async () => ({
      text: (async function* () {
        for (let i = 0; i < 15; i++) {
          await sleep(60);
          yield chunk(0, ` ${i}`);
        }
        yield chunk(0, '.', 'stop') + DONE;
      })(),
      ended: (): StreamEnd => ({ kind: 'complete', events: 16, droppedMalformed: 0 }),
      target: 'next/gpt-4o',
    }));
    const text = await readAll(live);
    expect(text.endsWith(DONE)).toBe(true);
    expect((await ended).kind).toBe('recovered');
  });

  it('lets go of a broken upstream before its continuation starts: the response cut off, the slot given back once, the break known', async () => {
    // "Hel", then silence: the stall the idle timer cuts while the upstream's response is still open.
    const controller = new AbortController();
    const { live, ended } = handedOverStream({ first: chunk(0, 'Hel'), iterator: upstream(controller, [60_000]), controller, idleMs: 100, apiKey: KEY });
    let released = 0;
    live.whenUpstreamDone(() => released++);
    const atContinuation: Array<{ released: number; aborted: boolean; broke: string | undefined }> = [];
    live.recoverWith(async () => {
      atContinuation.push({ released, aborted: controller.signal.aborted, broke: live.upstreamBroke?.reason });
      return {
        text: (async function* () {
          await sleep(50);
          yield chunk(0, 'lo', 'stop') + DONE;
        })(),
        ended: (): StreamEnd => ({ kind: 'complete', events: 2, droppedMalformed: 0 }),
        target: 'next/gpt-4o',
      };
    });
    const text = await readAll(live);
    expect(text.endsWith(DONE)).toBe(true);
    expect(atContinuation).toEqual([{ released: 1, aborted: true, broke: 'stream_stalled' }]);
    expect((await ended).kind).toBe('recovered');
    expect(released).toBe(1);
    // One registered once the upstream is let go of runs at once, as on any ended stream.
    live.whenUpstreamDone(() => released++);
    expect(released).toBe(2);
  });

  it('lets go of a cut upstream still open (a cut-short answer) before its continuation, and only once when that is refused', async () => {
    const controller = new AbortController();
    const abortChunk = `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', choices: [{ index: 0, delta: {}, finish_reason: 'abort', stop_reason: null }] })}\n\n`;
    const { live, ended } = handedOverStream({ first: chunk(0, 'Hel'), iterator: upstream(controller, [abortChunk, 60_000]), controller, apiKey: KEY });
    let released = 0;
    live.whenUpstreamDone(() => released++);
    let seen: { released: number; aborted: boolean } | undefined;
    live.recoverWith(async () => {
      seen = { released, aborted: controller.signal.aborted };
      return undefined;
    });
    const text = await readAll(live);
    expect(text).toContain('stream_interrupted');
    expect(seen).toEqual({ released: 1, aborted: true });
    expect((await ended).kind).toBe('cut');
    expect(released).toBe(1);
  });

  it('asks for no continuation once interrupted: a break read after the shutdown ends with the shutdown\'s error event', async () => {
    const controller = new AbortController();
    const abortChunk = `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', choices: [{ index: 0, delta: {}, finish_reason: 'abort', stop_reason: null }] })}\n\n`;
    // "lo" and the cut come in one read: the stream waits at "lo" for its client, which is where the shutdown finds it.
    const { live, ended } = handedOverStream({ first: chunk(0, 'Hel'), iterator: upstream(controller, [chunk(0, 'lo') + abortChunk, 60_000]), controller, apiKey: KEY });
    const asked: boolean[] = [];
    live.recoverWith(async (_delivered, _brokeBy, shutdown) => {
      asked.push(shutdown.aborted);
      return undefined;
    });
    const body = live.body();
    await body.next();
    expect((await body.next()).value).toContain('"lo"');
    live.interrupt();
    let rest = '';
    for await (const part of body) rest += part;
    // The continuation is told of the shutdown before anything goes upstream (stream-recovery.ts sends nothing then).
    expect(asked).toEqual([true]);
    expect(rest).toContain('the gateway instance is shutting down before the answer was complete');
    expect(rest).toContain('stream_interrupted');
    expect((await ended).kind).toBe('shutdown');
  });

  it('abandons a continuation its client left before reading any of it (at the recovery\'s marker): its upstream and slot go back', async () => {
    const controller = new AbortController();
    const { live, ended } = handedOverStream({ first: chunk(0, 'Hel'), iterator: upstream(controller, [new Error('other side closed')]), controller, apiKey: KEY });
    let abandoned = 0;
    let started = false;
    live.recoverWith(async () => ({
      text: (async function* () {
        started = true;
        yield chunk(0, 'lo', 'stop') + DONE;
      })(),
      ended: () => undefined,
      target: 'next/gpt-4o',
      abandon: () => abandoned++,
    }));
    const body = live.body();
    await body.next();
    // The marker: the continuation is in hand, and the client goes (its response destroyed) before reading on.
    expect((await body.next()).value).toContain('stream recovered');
    await body.return(undefined);
    expect(started).toBe(false);
    expect(abandoned).toBe(1);
    expect((await ended).kind).toBe('client-gone');
  });

  it('ends as its continuation did when a recovery breaks too: the client got that error event, not an answer', async () => {
    const { live, ended } = liveStream(chunk(0, 'Hel'), [], { choices: 1, usage: false }, 50);
    live.recoverWith(async () => ({
      text: (async function* () {
        yield chunk(0, 'lo');
        yield 'data: {"error":{"message":"the upstream stream was cut","type":"server_error","param":null,"code":"stream_interrupted"}}\n\n';
      })(),
      ended: (): StreamEnd => ({ kind: 'stalled', events: 1, droppedMalformed: 0 }),
      target: 'next/gpt-4o',
    }));
    const text = await readAll(live);
    expect(text).toContain('stream_interrupted');
    expect((await ended).kind).toBe('stalled');
  });

  it('turns an `event: error` without an error object into one the SDKs raise, and ends the stream', async () => {
    const { live, ended } = liveStream(chunk(0, 'a'), ['event: error\ndata: {"message":"model overloaded","type":"server_error"}\n\n', chunk(0, 'b')], { choices: 1, usage: false });
    const text = await readAll(live);
    expect(text).toContain('"error":{"message":"the upstream stream failed: model overloaded"');
    expect(text).not.toContain('chunk(0');
    expect((await ended).kind).toBe('upstream-error');
  });

  it('drops a malformed event in text, but ends a tool call it would corrupt with an error event', async () => {
    // Some servers send an empty tool_calls list with every text delta: that is no tool call.
    const emptyTools = `data: ${JSON.stringify({ id: 'c1', choices: [{ index: 0, delta: { content: 'Hel', tool_calls: [] }, finish_reason: null }] })}\n\n`;
    const text = liveStream(emptyTools, ['data: {not json\n\n', chunk(0, 'lo', 'stop'), DONE], { choices: 1, usage: false });
    expect(await readAll(text.live)).toContain('[DONE]');
    expect(await text.ended).toMatchObject({ kind: 'complete', droppedMalformed: 1 });
    const args = (a: string) => `data: ${JSON.stringify({ id: 'c1', choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: a } }] }, finish_reason: null }] })}\n\n`;
    const tool = liveStream(args('{"x"'), ['data: {not json\n\n', args(':1}'), chunk(0, '', 'tool_calls'), DONE], { choices: 1, usage: false });
    const out = await readAll(tool.live);
    expect(out).toContain('malformed event inside a tool call');
    expect(out).not.toContain(':1}');
    expect(out).not.toContain('[DONE]');
    expect(await tool.ended).toMatchObject({ kind: 'cut', droppedMalformed: 1 });
  });

  it('passes the events that came in one read with the start of an oversized event, then ends with the cut', async () => {
    const oversized = `data: {"x":"${'a'.repeat(MAX_EVENT_BYTES)}`;
    // After the first output: the read holds the next delta and the event over the limit.
    const after = liveStream(chunk(0, 'a'), [chunk(0, 'b') + oversized], { choices: 1, usage: false });
    const text = await readAll(after.live);
    expect(text).toContain('"content":"b"');
    expect(text).toContain('the upstream stream was cut: an event larger than 16 MB');
    expect(await after.ended).toMatchObject({ kind: 'cut', events: 2 });
    // Handed over with it: the first output came in the read that began the oversized event.
    const controller = new AbortController();
    const withFirst = handedOverStream({ first: chunk(0, 'a') + oversized, iterator: upstream(controller, []), controller, apiKey: KEY });
    const out = await readAll(withFirst.live);
    expect(out).toContain('"content":"a"');
    expect(out).toContain('an event larger than 16 MB');
    expect(await withFirst.ended).toMatchObject({ kind: 'cut', events: 1 });
  });

  it('takes the provider\'s key out of an error event that quotes it', async () => {
    const { live } = liveStream(chunk(0, 'a'), [`data: {"error":{"message":"bad key ${KEY} for model","type":"server_error"}}\n\n`], { choices: 1, usage: false });
    const text = await readAll(live);
    expect(text).toContain('"message":"bad key [redacted] for model"');
    expect(text).not.toContain(KEY);
  });
});

describe('LiveStream: handed over before its first output (started early, a background response)', () => {
  const created = `event: response.created\ndata: ${JSON.stringify({ type: 'response.created', sequence_number: 0, response: { id: 'resp_1', status: 'queued', background: true } })}\n\n`;
  const delta = (n: number, text: string) => `event: response.output_text.delta\ndata: ${JSON.stringify({ type: 'response.output_text.delta', sequence_number: n, delta: text })}\n\n`;
  const completed = (n: number) => `event: response.completed\ndata: ${JSON.stringify({ type: 'response.completed', sequence_number: n, response: { id: 'resp_1', status: 'completed' } })}\n\n`;
  const BACKGROUND: StreamShape = { choices: 1, usage: false, startsAtCreated: 'background' };
  /** A ping every 100 ms, `n` of them. */
  const pings = (n: number): Step[] => Array.from({ length: n }, () => [100, ': ping\n\n'] as Step[]).flat();

  it('lets the model think silently for longer than idleMs, within what is left of firstTokenMs', async () => {
    const controller = new AbortController();
    const { live, ended } = handedOverStream({ first: created, iterator: upstream(controller, [900, delta(1, 'Hi'), completed(2)]), controller, api: 'responses', shape: BACKGROUND, idleMs: 300, firstTokenLeftMs: 2_000 });
    const text = await readAll(live);
    expect(text).toContain('"delta":"Hi"');
    expect((await ended).kind).toBe('complete');
  });

  it('ends with a stall at the first-token limit, however many pings come before any output', async () => {
    const controller = new AbortController();
    const started = Date.now();
    const { live, ended } = handedOverStream({ first: created, iterator: upstream(controller, [...pings(30), delta(1, 'Hi'), completed(2)]), controller, api: 'responses', shape: BACKGROUND, idleMs: 300, firstTokenLeftMs: 700 });
    const text = await readAll(live);
    expect(text).toContain('the upstream stream stalled: no first token within 700 ms');
    expect(text).not.toContain('"delta":"Hi"');
    expect(await ended).toMatchObject({ kind: 'stalled', upstreamBroke: { reason: 'stream_stalled' } });
    // At the first-token limit (700 ms), not after the 3 s of pings; a loaded machine's lag allowed.
    expect(Date.now() - started).toBeLessThan(2_000);
  });

  it('still gives up on a client that reads nothing, while the model thinks', async () => {
    const controller = new AbortController();
    const { live, ended } = handedOverStream({ first: created, iterator: upstream(controller, [60_000]), controller, api: 'responses', shape: BACKGROUND, idleMs: 50, firstTokenLeftMs: 10_000 });
    const started = Date.now();
    live.open(); // the head is taken, then nothing more is read
    expect((await ended).kind).toBe('client-stalled');
    expect(Date.now() - started).toBeLessThan(5_000);
  });

  it('after its first output, is bounded by idleMs between events: the first-token timer is stopped', async () => {
    const controller = new AbortController();
    const { live, ended } = handedOverStream({ first: chunk(0, ''), iterator: upstream(controller, [100, chunk(0, 'a'), ...pings(12), chunk(0, 'b', 'stop'), DONE]), controller, idleMs: 300, firstTokenLeftMs: 600 });
    const text = await readAll(live);
    expect(text.endsWith(DONE)).toBe(true);
    expect((await ended).kind).toBe('complete');
    const silent = new AbortController();
    const late = handedOverStream({ first: chunk(0, ''), iterator: upstream(silent, [100, chunk(0, 'a'), 60_000]), controller: silent, idleMs: 300, firstTokenLeftMs: 5_000 });
    const started = Date.now();
    expect(await readAll(late.live)).toContain('the upstream stream stalled: no event for 300 ms');
    expect((await late.ended).kind).toBe('stalled');
    expect(Date.now() - started).toBeLessThan(2_000);
  });
});
