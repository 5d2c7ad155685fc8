// Behaviours of the streaming modules that a wrong change went unnoticed by (hand-rolled mutation testing): the SSE
// framing, what an event means, an answer's shape, upstream error events and token usage. Each test pins one rule.
import { EventEmitter } from 'node:events';
import type { ServerResponse } from 'node:http';
import { describe, expect, it } from 'vitest';
import { MAX_EVENT_BYTES, SseParser, type SseEvent } from '../src/streaming/sse-parser.ts';
import { errorEventForClient, eventMeaning, nextSequenceNumber, startsAnswer, streamShapeOf } from '../src/streaming/stream-events.ts';
import { laterUsage, usageOf, usageOfBody } from '../src/streaming/usage.ts';
import { readUntilFirstOutput } from '../src/pipeline/first-output.ts';
import { EarlyStart } from '../src/pipeline/early-start.ts';
import { backgroundRunsOn, endedBroken, endedWhole, STREAM_END_KINDS } from '../src/pipeline/stream-ends.ts';
import type { StreamTranslator } from '../src/providers/families.ts';
import { StreamBody } from '../src/streaming/stream-body.ts';

const ev = (data: unknown, event: string | null = null): SseEvent => {
  const text = typeof data === 'string' ? data : JSON.stringify(data);
  return { raw: `${event ? `event: ${event}\n` : ''}data: ${text}`, data: text, event };
};
const frame = (text: string): SseEvent[] => new SseParser().push(Buffer.from(text));

describe('SSE framing: blank lines', () => {
  it('makes no event of extra blank lines between events', () => {
    expect(frame('data: a\n\n\n\ndata: b\n\n\r\n\r\n').map((e) => e.data)).toEqual(['a', 'b']);
  });

  it('leaves nothing to flush after a stream that ends in an extra blank line', () => {
    const p = new SseParser();
    expect(p.push(Buffer.from('data: a\n\n\n')).map((e) => e.data)).toEqual(['a']);
    expect(p.flush()).toBeUndefined();
  });
});

describe('what an event means', () => {
  it('reads an Anthropic tool call\'s empty first argument delta as a keep-alive, a non-empty one as output', () => {
    const delta = (partial_json: string) => ev({ type: 'content_block_delta', index: 1, delta: { type: 'input_json_delta', partial_json } });
    expect(eventMeaning('messages', delta(''))).toBe('keepalive');
    expect(eventMeaning('messages', delta('{"city"'))).toBe('output');
  });

  it('reads a chat chunk with `"error": null` (every field serialised) by its choices, not as an error', () => {
    const chunk = { object: 'chat.completion.chunk', error: null, choices: [{ index: 0, delta: { content: 'Hi' }, finish_reason: null }] };
    expect(eventMeaning('chat', ev(chunk))).toBe('output');
  });

  it('reads an error field as the SDKs do (`data && data.error`): false, "" or 0 is no error, any object or text is', () => {
    const chunk = (error: unknown) => ev({ object: 'chat.completion.chunk', error, choices: [{ index: 0, delta: { content: 'Hi' }, finish_reason: null }] });
    for (const none of [false, '', 0]) expect(eventMeaning('chat', chunk(none))).toBe('output');
    for (const error of [{}, { message: 'boom' }, 'model crashed', true]) expect(eventMeaning('chat', chunk(error))).toBe('error');
  });
});

describe('the shape of a streamed answer', () => {
  it('expects n choices for an integer n > 1, and one otherwise', () => {
    expect(streamShapeOf('chat', { n: 2 })).toEqual({ choices: 2, usage: false });
    expect(streamShapeOf('completions', { n: 3, stream_options: { include_usage: true } })).toEqual({ choices: 3, usage: true });
    for (const n of [1, 0, 2.5, '2', undefined]) expect(streamShapeOf('chat', { n }).choices).toBe(1);
  });

  it('starts only a background or conversation response at its response.created', () => {
    const created = ev({ type: 'response.created', sequence_number: 0, response: { id: 'resp_1' } }, 'response.created');
    expect(startsAnswer('responses', { choices: 1, usage: false, startsAtCreated: 'background' }, created)).toBe(true);
    expect(startsAnswer('responses', { choices: 1, usage: false, startsAtCreated: 'conversation' }, created)).toBe(true);
    expect(startsAnswer('responses', { choices: 1, usage: false }, created)).toBe(false);
  });
});

describe('upstream error events for the client', () => {
  it('names an Anthropic error sent as data alone `event: error`, so the Anthropic SDKs raise it', () => {
    const out = errorEventForClient('messages', ev({ type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } }));
    const [event] = frame(out);
    expect(event!.event).toBe('error');
    expect(JSON.parse(event!.data!)).toEqual({ type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } });
  });

  it('gives a numeric `param` the OpenAI shape\'s type, as it does a numeric `code`', () => {
    const out = errorEventForClient('chat', ev({ error: { message: 'bad', type: 'invalid_request_error', code: 'x', param: 3 } }));
    expect(JSON.parse(frame(out)[0]!.data!)).toEqual({ error: { message: 'bad', type: 'invalid_request_error', code: 'x', param: '3' } });
  });

  it('numbers the event it writes after a Responses API event on from that event', () => {
    expect(nextSequenceNumber('{"type":"response.output_text.delta","sequence_number":4}')).toBe(5);
    expect(nextSequenceNumber({ sequence_number: 0 })).toBe(1);
    expect(nextSequenceNumber({ sequence_number: -1 })).toBeUndefined();
    expect(nextSequenceNumber('{"type":"x"}')).toBeUndefined();
  });
});

describe('token usage, counted once', () => {
  // LiteLLM's chat usage for a Claude model carries Anthropic's cache counts beside a prompt_tokens that includes them.
  const litellm = { prompt_tokens: 1_010, completion_tokens: 5, total_tokens: 1_015, cache_read_input_tokens: 1_000, cache_creation_input_tokens: 0 };

  it('does not add cache counts to a chat usage whose prompt_tokens holds them already', () => {
    expect(usageOf({ choices: [], usage: litellm })).toEqual({ prompt: 1_010, completion: 5 });
    expect(usageOfBody(Buffer.from(JSON.stringify({ id: 'c', choices: [], usage: litellm })))).toEqual({ prompt: 1_010, completion: 5 });
  });

  it('keeps a stream\'s highest counts, and what it had when the latest event has none', () => {
    expect(laterUsage({ prompt: 50, completion: 1 }, { prompt: 0, completion: 20 })).toEqual({ prompt: 50, completion: 20 });
    expect(laterUsage({ prompt: 50, completion: 1 }, undefined)).toEqual({ prompt: 50, completion: 1 });
    expect(laterUsage(undefined, { prompt: 3, completion: 4 })).toEqual({ prompt: 3, completion: 4 });
  });

  it('reads a Responses API body\'s usage past a tool schema with a property named "usage"', () => {
    const properties = { usage: { type: 'string' }, note: { type: 'string', description: 'x'.repeat(700) } };
    const tools = [{ type: 'function', name: 'log', parameters: { type: 'object', properties } }];
    const body = { id: 'resp_1', object: 'response', output: [], tools, usage: { input_tokens: 7, output_tokens: 9, total_tokens: 16 } };
    expect(usageOfBody(Buffer.from(JSON.stringify(body)))).toEqual({ prompt: 7, completion: 9 });
  });

  it('reads a Responses API body\'s usage when the metadata echoed after it has a key named "usage"', () => {
    // The API echoes the request's metadata (free key-value pairs) after `usage`.
    const body = { id: 'resp_1', object: 'response', output: [], usage: { input_tokens: 7, output_tokens: 9, total_tokens: 16 }, user: null, metadata: { usage: 'nightly-eval' } };
    expect(usageOfBody(Buffer.from(JSON.stringify(body)))).toEqual({ prompt: 7, completion: 9 });
  });
});

/** An upstream body whose reads the test settles by hand: `send` one, `fail` one, or leave it pending (a silent upstream). */
function manualUpstream() {
  const reads: Array<{ resolve: (r: IteratorResult<Buffer>) => void; reject: (e: Error) => void }> = [];
  const waiters: Array<() => void> = [];
  const iterator: AsyncIterator<Buffer> = {
    next: () =>
      new Promise((resolve, reject) => {
        reads.push({ resolve, reject });
        waiters.splice(0).forEach((w) => w());
      }),
  };
  /** The read the reader is waiting on, once it asks. */
  const pending = async () => {
    while (reads.length === 0) await new Promise<void>((r) => waiters.push(r));
    return reads.shift()!;
  };
  return {
    iterator,
    send: async (text: string) => (await pending()).resolve({ value: Buffer.from(text), done: false }),
    end: async () => (await pending()).resolve({ value: undefined, done: true }),
    pending,
  };
}
const ONE = { choices: 1, usage: false } as const;
const chatChunk = (content: string) => `data: ${JSON.stringify({ object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content }, finish_reason: null }] })}\n\n`;
/** Resolves with the promise's value, or 'pending' if it has not settled within a few turns of the event loop. */
const settledSoon = <T>(p: Promise<T>) => Promise.race([p, new Promise<'pending'>((r) => setTimeout(() => r('pending'), 50))]);

describe('a stream before its first output (readUntilFirstOutput)', () => {
  it('ends the attempt as the deadline\'s when the early start comes just as a read fails it', async () => {
    const malformed = manualUpstream();
    const early = new EarlyStart();
    const first = readUntilFirstOutput('chat', ONE, malformed.iterator, undefined, early, '');
    await malformed.send('data: {"choices":[\n\n');
    expect(early.take()).toBe(true);
    expect(await first).toEqual({ failure: 'the deadline passed', outcome: { kind: 'aborted', by: 'deadline' } });

    const reset = manualUpstream();
    const early2 = new EarlyStart();
    const second = readUntilFirstOutput('chat', ONE, reset.iterator, undefined, early2, '');
    (await reset.pending()).reject(new Error('socket hang up'));
    expect(early2.take()).toBe(true);
    expect(await second).toEqual({ failure: 'the deadline passed', outcome: { kind: 'aborted', by: 'deadline' } });
  });

  it('reads an error event the upstream left unterminated at its end as that error, with the upstream\'s data', async () => {
    const up = manualUpstream();
    const first = readUntilFirstOutput('chat', ONE, up.iterator, undefined, undefined, '');
    const data = '{"error":{"message":"This model\'s maximum context length is 8192 tokens","type":"invalid_request_error","code":"context_length_exceeded"}}';
    await up.send(`event: error\ndata: ${data}`);
    await up.end();
    const verdict = (await first) as { failure: string; outcome?: { kind: string; status?: number }; event?: Buffer };
    expect(verdict.failure).toMatch(/^error event before any output: context_length_exceeded/);
    expect(verdict.outcome).toMatchObject({ kind: 'http', status: 400 });
    expect(verdict.event?.toString()).toBe(data);
  });

  it('fails the attempt at a [DONE] before any output, without waiting for the upstream to close', async () => {
    const up = manualUpstream();
    const first = readUntilFirstOutput('chat', ONE, up.iterator, undefined, undefined, '');
    await up.send('data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\ndata: [DONE]\n\n');
    // The upstream keeps its connection open: the attempt must not wait for its first-token timer.
    expect(await settledSoon(first)).toEqual({ failure: 'stream ended before any output' });
  });

  it('starts a background response at its response.created, before any output', async () => {
    const up = manualUpstream();
    const created = `event: response.created\ndata: ${JSON.stringify({ type: 'response.created', sequence_number: 0, response: { id: 'resp_1', status: 'queued' } })}\n\n`;
    const first = readUntilFirstOutput('responses', { choices: 1, usage: false, startsAtCreated: 'background' }, up.iterator, undefined, undefined, '');
    await up.send(created);
    const started = await settledSoon(first);
    expect(started).not.toBe('pending');
    expect((started as { pending: SseEvent[] }).pending.map((e) => e.event)).toEqual(['response.created']);
  });

  it('judges the events of one read in their order: output first makes what follows it the LiveStream\'s', async () => {
    const role = 'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n';
    const error = 'data: {"error":{"message":"overloaded","type":"server_error","code":"server_error"}}\n\n';
    const datas = async (text: string) => {
      const up = manualUpstream();
      const first = readUntilFirstOutput('chat', ONE, up.iterator, undefined, undefined, '');
      await up.send(text);
      const out = await first;
      return 'failure' in out ? out.failure : out.pending.map((e) => e.data);
    };
    // After the output, a malformed event is dropped and an error event ends the answer, by the LiveStream.
    expect(await datas(role + chatChunk('Hi') + 'data: {not json\n\n')).toEqual([chatChunk('Hi').slice(6, -2), '{not json']);
    expect(await datas(role + chatChunk('Hi') + error)).toEqual([chatChunk('Hi').slice(6, -2), error.slice(6, -2)]);
    // An oversized event after it breaks the stream at the LiveStream's next read: the output is the client's.
    expect(await datas(role + chatChunk('Hi') + `data: ${'a'.repeat(MAX_EVENT_BYTES)}`)).toEqual([chatChunk('Hi').slice(6, -2)]);
    // Before it, each fails the attempt, to be retried.
    expect(await datas(role + 'data: {not json\n\n' + chatChunk('Hi'))).toBe('malformed event before any output');
    expect(await datas(role + error + chatChunk('Hi'))).toMatch(/^error event before any output/);
  });

  it('fails the attempt at an oversized event that came in one read after events without output, at the next read or the end', async () => {
    for (const then of ['more', 'end'] as const) {
      const up = manualUpstream();
      const first = readUntilFirstOutput('chat', ONE, up.iterator, undefined, undefined, '');
      await up.send(`: ping\n\ndata: ${'a'.repeat(MAX_EVENT_BYTES)}`);
      if (then === 'more') await up.send('aaaa');
      else await up.end();
      expect(await first).toEqual({ failure: 'an event larger than 16 MB' });
    }
  });

  it('keeps every event a translation makes of the first output, not only the first of them', async () => {
    const up = manualUpstream();
    // A translator that makes two chat chunks of one upstream event (as Anthropic's translation can).
    const twice: StreamTranslator = { push: (e) => [e, { ...e, raw: e.raw.replace('Hi', ' there'), data: e.data!.replace('Hi', ' there') }], end: () => [], usage: () => undefined };
    const first = readUntilFirstOutput('chat', ONE, up.iterator, twice, undefined, '');
    await up.send(chatChunk('Hi'));
    const out = (await first) as { pending: SseEvent[] };
    expect(out.pending.map((e) => JSON.parse(e.data!).choices[0].delta.content)).toEqual(['Hi', ' there']);
  });
});

describe('how a stream that reached its client ended (stream-ends.ts)', () => {
  // Read by the idempotency keys (a whole answer is kept for repeats; a background response that may run on keeps its
  // key), by the request's outcome (a broken stream is a stream_error) and by the log's "closed by the client".
  it('counts an answer as whole when the gateway added [DONE] or a recovery completed it, and only then', () => {
    const whole = STREAM_END_KINDS.filter((k) => endedWhole(k));
    expect(whole).toEqual(['complete', 'done-added', 'recovered']);
  });

  it('counts a stream as broken when its client got an error event, and never when the client left', () => {
    expect(STREAM_END_KINDS.filter((k) => endedBroken(k))).toEqual(['cut', 'stalled', 'upstream-error', 'shutdown']);
  });

  it('lets a background response run on after a cut, a stall, a stalled client or a shutdown, not after an error or a client that left', () => {
    expect(STREAM_END_KINDS.filter((k) => backgroundRunsOn(k))).toEqual(['cut', 'stalled', 'client-stalled', 'shutdown']);
  });
});

/** A response whose head is written, recording what the body writes into it. */
function fakeResponse() {
  const res = Object.assign(new EventEmitter(), {
    written: [] as string[],
    ended: false,
    writableNeedDrain: false,
    destroyed: false,
    socket: null,
    write(chunk: unknown) {
      res.written.push(String(chunk));
      return true;
    },
    end() {
      res.ended = true;
    },
    flushHeaders() {},
  });
  return res;
}
const asResponse = (res: ReturnType<typeof fakeResponse>) => res as unknown as ServerResponse;
const tick = () => new Promise((r) => setImmediate(r));

describe('a streamed answer\'s body (StreamBody)', () => {
  it('written into the response, is destroyed at its end, and reads nothing as a Readable meanwhile', async () => {
    const body = new StreamBody('first;', (async function* () {
      yield 'a;';
      yield 'b;';
      yield 'c;';
    })());
    const res = fakeResponse();
    expect(body.writeTo(asResponse(res))).toBe(true);
    // A stray read (a listener that peeks) must not take events from the response.
    body.read();
    const closed = new Promise((r) => body.once('close', r));
    await closed;
    expect(res.written.join('')).toBe('first;a;b;c;');
    expect(res.ended).toBe(true);
    expect(body.destroyed).toBe(true);
  });

  it('once read as a Readable, is not also written into the response', async () => {
    const body = new StreamBody('first;', (async function* () {
      yield 'a;';
    })());
    expect(String(body.read())).toBe('first;');
    const res = fakeResponse();
    expect(body.writeTo(asResponse(res))).toBe(false);
    await tick();
    expect(res.written).toEqual([]);
    body.destroy();
  });

  it('ends its generator when destroyed (the client left), so the stream\'s cleanup runs', async () => {
    let cleaned = false;
    const body = new StreamBody('first;', (async function* () {
      try {
        // More than the Readable buffers ahead: the generator is held at a yield when the client leaves.
        for (;;) yield 'x'.repeat(64 * 1024);
      } finally {
        cleaned = true;
      }
    })());
    body.read();
    await tick();
    body.destroy();
    await tick();
    expect(cleaned).toBe(true);
  });
});
