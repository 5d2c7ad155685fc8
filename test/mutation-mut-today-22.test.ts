// Mutation tests over the stream after its first output (src/pipeline/live-stream.ts): mutants the LiveStream's own
// tests left alive. A client that reads slowly but steadily is not a stalled one, and a stalled one is given up on at
// ten idle periods exactly; timers are stopped and the attempt's listeners released when the stream ends; the
// Responses API error event is numbered on from the last event; the last event left unterminated, the text of vLLM's
// aborted chunk, the usage tally and the after-finish grace; and a bug in stream-recovery.ts's splice, which dropped
// the finish_reason of the continuation chunk that reached past the delivered text. Driven directly
// (test/helpers/live-stream.ts) as runAttempt hands a stream over, and over HTTP with the openai SDK as the client.
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { handedOverStream, readAll, upstream, type Step } from './helpers/live-stream.ts';
import { LiveStream } from '../src/pipeline/live-stream.ts';
import { cc, delta, recoveringToNext, useScriptedGateway } from './helpers/scripted-provider.ts';
import { SseParser } from '../src/streaming/sse-parser.ts';

const chunk = (content: string, finish: string | null = null): string =>
  `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content }, finish_reason: finish }] })}\n\n`;
const DONE = 'data: [DONE]\n\n';

/** Reads the whole stream, pausing `pauseMs` after every part: a client that reads slowly, but reads. */
async function readSlowly(live: LiveStream, pauseMs: number): Promise<string> {
  let text = '';
  for await (const part of live.body()) {
    text += part;
    await sleep(pauseMs);
  }
  return text;
}

afterEach(() => {
  vi.useRealTimers();
});

const gateway = useScriptedGateway();
const recovering = useScriptedGateway(recoveringToNext());

describe('LiveStream: a client that reads', () => {
  it('is not given up on when it takes every part a few idle periods late: its wait counts from its last read', async () => {
    // Each pause is 2.5 idle periods (less than the 10 that give a client up, with room for a loaded machine's lag);
    // counted across reads, the 9 pauses would add up to 20.
    const controller = new AbortController();
    const rest: Step[] = [...Array.from({ length: 7 }, (_, i) => chunk(` ${i}`)), chunk('.', 'stop'), DONE];
    const { live, ended } = handedOverStream({ first: chunk('a'), iterator: upstream(controller, rest), controller, idleMs: 100 });
    const text = await readSlowly(live, 250);
    expect(text.endsWith(DONE)).toBe(true);
    expect((await ended).kind).toBe('complete');
  });
});

describe('LiveStream: a client that reads nothing', () => {
  it('is given up on at ten idle periods, not later', async () => {
    vi.useFakeTimers();
    const controller = new AbortController();
    const { live, ended } = handedOverStream({ first: chunk('a'), iterator: upstream(controller, [chunk('b', 'stop'), DONE]), controller, idleMs: 100 });
    live.open(); // the first part is taken, then nothing more is read
    await vi.advanceTimersByTimeAsync(999);
    expect(live.ended).toBeUndefined();
    await vi.advanceTimersByTimeAsync(1);
    expect(live.ended?.kind).toBe('client-stalled');
    expect((await ended).kind).toBe('client-stalled');
    expect(controller.signal.aborted).toBe(true);
  });
});

describe('LiveStream: its timers and its upstream once it has ended', () => {
  it('leaves no timer running after an answer ends with its [DONE], the after-finish grace armed on the way', async () => {
    vi.useFakeTimers();
    const controller = new AbortController();
    // The finish arms the after-finish grace in place of the idle timer; the [DONE] comes in the next read.
    const { live, ended } = handedOverStream({ first: chunk('a'), iterator: upstream(controller, [chunk('b', 'stop'), DONE]), controller, idleMs: 2_000 });
    const text = await readAll(live);
    expect(text.endsWith(DONE)).toBe(true);
    expect((await ended).kind).toBe('complete');
    // The drain of the response's last bytes ends at once (the upstream is over); nothing is left to fire.
    await vi.advanceTimersByTimeAsync(0);
    expect(vi.getTimerCount()).toBe(0);
  });

  it('leaves no timer running after a cut answer ends with its error event', async () => {
    vi.useFakeTimers();
    const controller = new AbortController();
    const { live, ended } = handedOverStream({ first: chunk('a'), iterator: upstream(controller, [chunk('b'), new Error('other side closed')]), controller, idleMs: 2_000 });
    const text = await readAll(live);
    expect(text).toContain('stream_interrupted');
    expect((await ended).kind).toBe('cut');
    await vi.advanceTimersByTimeAsync(0);
    expect(vi.getTimerCount()).toBe(0);
  });

  it('stops the first-token timer of a stream handed over before its first output when its client stalls', async () => {
    vi.useFakeTimers();
    const controller = new AbortController();
    const created = `event: response.created\ndata: ${JSON.stringify({ type: 'response.created', sequence_number: 0, response: { id: 'resp_1', status: 'queued', background: true } })}\n\n`;
    const { live, ended } = handedOverStream({ first: created, iterator: upstream(controller, [60_000]), controller, api: 'responses', shape: { choices: 1, usage: false, startsAtCreated: 'background' }, idleMs: 100, firstTokenLeftMs: 60_000 });
    live.open(); // the head is taken, then nothing more is read
    await vi.advanceTimersByTimeAsync(1_000);
    expect((await ended).kind).toBe('client-stalled');
    expect(vi.getTimerCount()).toBe(0);
  });
});

describe('LiveStream: the attempt\'s listeners', () => {
  /** A stream as runAttempt builds it, counting how often it releases the attempt's listeners. */
  function counted(rest: Step[]) {
    const controller = new AbortController();
    const parser = new SseParser();
    const released = { n: 0 };
    const live = new LiveStream({
      api: 'chat',
      shape: { choices: 1, usage: false },
      head: '',
      pending: parser.push(Buffer.from(chunk('a'))),
      parser,
      iterator: upstream(controller, rest),
      translate: undefined,
      controller,
      requestSignal: new AbortController().signal,
      detach: () => released.n++,
      idleMs: 2_000,
      apiKey: 'sk-provider',
    });
    return { live, controller, released };
  }

  it('are released once when the answer ends, and once when its client leaves', async () => {
    const whole = counted([chunk('b', 'stop'), DONE]);
    expect((await readAll(whole.live)).endsWith(DONE)).toBe(true);
    expect(whole.released.n).toBe(1);
    const left = counted([chunk('b'), 60_000]);
    left.live.open();
    left.live.abandon();
    expect(left.live.ended?.kind).toBe('client-gone');
    expect(left.released.n).toBe(1);
    expect(left.controller.signal.aborted).toBe(true);
  });
});

describe('LiveStream: the Responses API error event that ends a broken stream', () => {
  const created = `event: response.created\ndata: ${JSON.stringify({ type: 'response.created', sequence_number: 0, response: { id: 'resp_1', status: 'in_progress' } })}\n\n`;
  const delta = (n: number, text: string) => `event: response.output_text.delta\ndata: ${JSON.stringify({ type: 'response.output_text.delta', sequence_number: n, delta: text })}\n\n`;
  /** A Responses API stream handed over with `head` framed and `first` parsed, reading `rest`. */
  function responses(head: string, first: string, rest: Step[]): LiveStream {
    const controller = new AbortController();
    const parser = new SseParser();
    return new LiveStream({
      api: 'responses',
      shape: { choices: 1, usage: false },
      head,
      pending: parser.push(Buffer.from(first)),
      parser,
      iterator: upstream(controller, rest),
      translate: undefined,
      controller,
      requestSignal: new AbortController().signal,
      detach: () => undefined,
      idleMs: 2_000,
      apiKey: 'sk-provider',
    });
  }
  /** The sequence_number of the error event that ends `text`. */
  const errorSequence = (text: string): unknown => {
    const events = new SseParser().push(Buffer.from(text)).filter((e) => e.event === 'error');
    expect(events).toHaveLength(1);
    return (JSON.parse(events[0]!.data!) as { sequence_number?: unknown }).sequence_number;
  };

  it('numbers on from the last event passed, not from the head', async () => {
    const live = responses(created, delta(1, 'Hi'), [delta(2, ' there'), new Error('other side closed')]);
    const text = await readAll(live);
    expect(text).toContain('stream_interrupted');
    expect(errorSequence(text)).toBe(3);
  });

  it('numbers on from the head\'s one event when none was passed after it', async () => {
    const live = responses(created, '', [new Error('other side closed')]);
    expect(errorSequence(await readAll(live))).toBe(1);
  });

  it('is 0 when no event at all came before the break', async () => {
    const live = responses('', '', [new Error('other side closed')]);
    expect(errorSequence(await readAll(live))).toBe(0);
  });
});

describe('LiveStream: handed over before its first output, an empty answer', () => {
  it('gets its [DONE] after the after-finish grace, not at the first-token limit: the finish stops that timer', async () => {
    const controller = new AbortController();
    const started = Date.now();
    // An answer started before its first output (at the client's deadline) that finishes with no text, then goes quiet.
    const { live, ended } = handedOverStream({ first: chunk(''), iterator: upstream(controller, [chunk('', 'stop'), 60_000]), controller, idleMs: 300, firstTokenLeftMs: 10_000 });
    const text = await readAll(live);
    expect(text.endsWith(DONE)).toBe(true);
    expect((await ended).kind).toBe('done-added');
    // The grace is 300 ms here (idleMs); the first-token timer had 10 s left.
    expect(Date.now() - started).toBeLessThan(5_000);
  }, 20_000);
});

describe('LiveStream: the after-finish grace', () => {
  it('is not put back by bytes of no whole event: a finished answer whose upstream trickles gets its [DONE] at the grace', async () => {
    const controller = new AbortController();
    // After the finish, a byte every 40 ms for 6 s that never completes an event.
    const trickle: Step[] = Array.from({ length: 150 }, () => [40, 'x'] as Step[]).flat();
    const started = Date.now();
    const { live, ended } = handedOverStream({ first: chunk('a'), iterator: upstream(controller, [chunk('b', 'stop'), ': partial', ...trickle]), controller, idleMs: 2_000 });
    const text = await readAll(live);
    expect(text.endsWith(DONE)).toBe(true);
    expect((await ended).kind).toBe('done-added');
    // The grace is a second; the trickle lasts six.
    expect(Date.now() - started).toBeLessThan(4_000);
  }, 20_000);
});

describe('LiveStream: the usage tally', () => {
  it('keeps the usage chunk\'s counts when an event after it carries `"usage": null`', async () => {
    const controller = new AbortController();
    const usageChunk = `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', choices: [], usage: { prompt_tokens: 3, completion_tokens: 5, total_tokens: 8 } })}\n\n`;
    // A late chunk (an annotation, as Azure's asynchronous filter sends after the finish) with every field serialised.
    const late = `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', choices: [{ index: 0, delta: {}, finish_reason: null, content_filter_results: {} }], usage: null })}\n\n`;
    const { live, ended } = handedOverStream({ first: chunk('a'), iterator: upstream(controller, [chunk('b', 'stop'), usageChunk, late, DONE]), controller, shape: { choices: 1, usage: true } });
    expect((await readAll(live)).endsWith(DONE)).toBe(true);
    expect((await ended).usage).toEqual({ prompt: 3, completion: 5 });
  });
});

describe('LiveStream: the recovery hand-off', () => {
  it('asks for no continuation of a stream started before its first output that broke before any: nothing was delivered', async () => {
    const controller = new AbortController();
    // Started at the client's deadline with its role chunk alone, then cut: no text, no reasoning went out.
    const { live, ended } = handedOverStream({ first: chunk(''), iterator: upstream(controller, [new Error('other side closed')]), controller, firstTokenLeftMs: 10_000 });
    let asked = 0;
    live.recoverWith(async () => {
      asked++;
      return undefined;
    });
    const text = await readAll(live);
    expect(asked).toBe(0);
    expect(text).toContain('the upstream stream was cut: other side closed');
    expect((await ended).kind).toBe('cut');
  });
});

describe('LiveStream: the upstream\'s last event', () => {
  it('is passed on when the upstream ends it without its closing blank line', async () => {
    const controller = new AbortController();
    const last = chunk('b', 'stop').trimEnd();
    const { live, ended } = handedOverStream({ first: chunk('a'), iterator: upstream(controller, [last]), controller });
    const text = await readAll(live);
    expect(text).toContain('"content":"b"');
    expect(text).not.toContain('stream_interrupted');
    expect(text.endsWith(DONE)).toBe(true);
    expect((await ended).kind).toBe('done-added');
  });
});

describe('over HTTP, the client\'s view', () => {
  it('an answer whose last chunk (text and finish) comes without its closing blank line reaches the SDK whole', async () => {
    const { client } = await gateway(() => ({
      steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hel' })]), 50, cc([delta({ content: 'lo' }, 'stop')]).trimEnd()],
    }));
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    let text = '';
    let finish: string | null = null;
    for await (const c of stream) {
      text += c.choices[0]?.delta.content ?? '';
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    expect(text).toBe('Hello');
    expect(finish).toBe('stop');
  });
});

describe('over HTTP: vLLM\'s finish_reason "abort"', () => {
  it('passes on the text the aborted chunk still carries before the error event that ends the answer', async () => {
    const { client } = await gateway(() => ({
      steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hel' })]), 30, cc([delta({ content: 'lo' }, 'abort')]), 'data: [DONE]\n\n'],
    }));
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    let text = '';
    let err: unknown;
    try {
      for await (const c of stream) text += c.choices[0]?.delta.content ?? '';
    } catch (e) {
      err = e;
    }
    expect(text).toBe('Hello');
    expect(String(err)).toContain('the provider aborted the answer');
  });
});

describe('stream recovery: a continuation spliced on after the delivered text', () => {
  it('keeps the finish_reason of the chunk that reaches past the delivered text (text and finish in one chunk)', async () => {
    // p cuts at "Hello wor"; q, asked afresh, answers "Hello world." with its last text and its finish in one chunk.
    const { client, seen } = await recovering((_body, n) =>
      n === 1
        ? { steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hello wor' })]), 30, { destroy: true }] }
        : { steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hello ' })]), cc([delta({ content: 'world.' }, 'stop')]), 'data: [DONE]\n\n'] },
    );
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    let text = '';
    let finish: string | null = null;
    for await (const c of stream) {
      text += c.choices[0]?.delta.content ?? '';
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    expect(seen.length).toBe(2);
    expect(text).toBe('Hello world.');
    // Without it the SDK's finalChatCompletion() throws (missing finish_reason), and an agent cannot tell a whole answer.
    expect(finish).toBe('stop');
  });

  it('sends the finish alone when the chunk with it ends exactly where the delivered text did', async () => {
    const { client } = await recovering((_body, n) =>
      n === 1
        ? { steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hello world' })]), 30, { destroy: true }] }
        : { steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hello ' })]), cc([delta({ content: 'world' }, 'stop')]), 'data: [DONE]\n\n'] },
    );
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    let text = '';
    let finish: string | null = null;
    for await (const c of stream) {
      text += c.choices[0]?.delta.content ?? '';
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    expect(text).toBe('Hello world');
    expect(finish).toBe('stop');
  });
});
