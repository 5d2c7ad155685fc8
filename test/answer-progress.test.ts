// Where a streamed answer stands, event by event: when it is over, when every choice has finished (so [DONE] may be
// written for it), and when a tool call's arguments are on their way (so a malformed event breaks it). Read wrong,
// a finished answer ends as a cut, or a truncated one with [DONE] the client takes as whole.
import { describe, expect, it } from 'vitest';
import { AnswerProgress } from '../src/streaming/answer-progress.ts';
import { eventMeaning, type StreamShape } from '../src/streaming/stream-events.ts';
import type { SseEvent } from '../src/streaming/sse-parser.ts';
import type { ApiKind } from '../src/routing/router.ts';

const ev = (data: unknown, event: string | null = null): SseEvent => {
  const text = typeof data === 'string' ? data : JSON.stringify(data);
  return { raw: `${event ? `event: ${event}\n` : ''}data: ${text}`, data: text, event };
};
const choice = (index: number, delta: Record<string, unknown>, finish: string | null = null) => ({ index, delta, finish_reason: finish });
const chunk = (...choices: ReturnType<typeof choice>[]) => ev({ object: 'chat.completion.chunk', choices });
const DONE = ev('[DONE]');
const ONE: StreamShape = { choices: 1, usage: false };

/** An answer's progress fed `events` as the LiveStream passes them on; the last event's end, if any. */
function feed(api: ApiKind, shape: StreamShape, events: SseEvent[]) {
  const progress = new AnswerProgress(api, shape);
  let end: string | undefined;
  for (const e of events) end = pass(progress, api, e);
  return { progress, end };
}
const pass = (progress: AnswerProgress, api: ApiKind, e: SseEvent) => progress.passed(eventMeaning(api, e), e);

describe('one choice', () => {
  it('is finished at its finish_reason and over at [DONE]', () => {
    const going = feed('chat', ONE, [chunk(choice(0, { content: 'Hel' })), chunk(choice(0, { content: 'lo' }))]);
    expect(going.end).toBeUndefined();
    expect(going.progress.finished).toBe(false);
    expect(going.progress.whole()).toBe(false);
    const finished = feed('chat', ONE, [chunk(choice(0, { content: 'Hello' })), chunk(choice(0, {}, 'stop'))]);
    expect(finished.end).toBeUndefined();
    expect(finished.progress.finished).toBe(true);
    expect(finished.progress.whole()).toBe(true);
    expect(feed('chat', ONE, [chunk(choice(0, { content: 'Hello' })), chunk(choice(0, {}, 'stop')), DONE]).end).toBe('complete');
  });

  it('ends at an error event, in the data or as `event: error`', () => {
    expect(feed('chat', ONE, [chunk(choice(0, { content: 'a' })), ev({ error: { message: 'overloaded' } })]).end).toBe('upstream-error');
    expect(feed('chat', ONE, [chunk(choice(0, { content: 'a' })), ev({ message: 'overloaded' }, 'error')]).end).toBe('upstream-error');
  });

  it('ends a Responses API answer at its terminal event, which has no [DONE] after it', () => {
    const delta = ev({ type: 'response.output_text.delta', delta: 'Hi' }, 'response.output_text.delta');
    expect(feed('responses', ONE, [delta]).end).toBeUndefined();
    expect(feed('responses', ONE, [delta, ev({ type: 'response.completed' }, 'response.completed')]).end).toBe('complete');
    expect(feed('responses', ONE, [delta, ev({ type: 'response.incomplete' }, 'response.incomplete')]).end).toBe('complete');
    expect(feed('responses', ONE, [delta, ev({ type: 'response.failed' }, 'response.failed')]).end).toBe('upstream-error');
  });

  it('finishes an Anthropic answer at its stop_reason and ends it at message_stop', () => {
    const text = ev({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'Hi' } });
    const stop = feed('messages', ONE, [text, ev({ type: 'message_delta', delta: { stop_reason: 'end_turn' } })]);
    expect(stop.end).toBeUndefined();
    expect(stop.progress.finished).toBe(true);
    expect(stop.progress.whole()).toBe(true);
    expect(feed('messages', ONE, [text, ev({ type: 'message_delta', delta: { stop_reason: 'end_turn' } }), ev({ type: 'message_stop' })]).end).toBe('complete');
  });

  it('has nothing whole before any finish', () => {
    expect(feed('chat', ONE, []).progress.whole()).toBe(false);
  });
});

describe('n choices', () => {
  const THREE: StreamShape = { choices: 3, usage: false };

  it('is finished only when every choice asked for has finished', () => {
    const { progress } = feed('chat', THREE, [chunk(choice(0, { content: 'a' }), choice(1, { content: 'b' }), choice(2, { content: 'c' })), chunk(choice(0, {}, 'stop')), chunk(choice(2, {}, 'stop'))]);
    expect(progress.finished).toBe(false);
    expect(progress.whole()).toBe(false);
    expect(pass(progress, 'chat', chunk(choice(1, {}, 'length')))).toBeUndefined();
    expect(progress.finished).toBe(true);
    expect(progress.whole()).toBe(true);
  });

  it('is whole, not finished, when a provider that ignores `n` sent one choice and finished it', () => {
    const { progress, end } = feed('chat', THREE, [chunk(choice(0, { content: 'a' })), chunk(choice(0, {}, 'stop'))]);
    expect(end).toBeUndefined();
    // Finished is what a broken stream is judged by: fewer choices may be a provider cut between two of them.
    expect(progress.finished).toBe(false);
    expect(progress.whole()).toBe(true);
  });

  it('is not whole when a choice whose role chunk came before the first output never finished', () => {
    // OpenAI opens every choice with its role chunk before any text: those chunks are the stream's head, not passed.
    const progress = new AnswerProgress('chat', THREE);
    progress.announced(chunk(choice(0, { role: 'assistant', content: '' })));
    progress.announced(chunk(choice(1, { role: 'assistant', content: '' })));
    for (const e of [chunk(choice(0, { content: 'a' })), chunk(choice(0, {}, 'stop'))]) pass(progress, 'chat', e);
    expect(progress.whole()).toBe(false);
  });

  it('reads a choice without an index by its place in the list', () => {
    const noIndex = (finish: string | null) => ({ delta: {}, finish_reason: finish });
    const { progress } = feed('chat', { choices: 2, usage: false }, [ev({ choices: [noIndex(null), noIndex(null)] }), ev({ choices: [noIndex('stop'), noIndex('stop')] })]);
    expect(progress.finished).toBe(true);
  });

  it('does not end the answer at the first choice\'s finish', () => {
    const { end } = feed('chat', { choices: 2, usage: false }, [chunk(choice(0, { content: 'a' }), choice(1, { content: 'b' })), chunk(choice(0, {}, 'stop'))]);
    expect(end).toBeUndefined();
  });
});

describe('tool calls', () => {
  const args = (a: string) => chunk(choice(0, { tool_calls: [{ index: 0, function: { arguments: a } }] }));

  it('is open from a tool call\'s first delta until a finish', () => {
    const { progress } = feed('chat', ONE, [chunk(choice(0, { content: 'Let me look.' })), args('{"q"')]);
    expect(progress.toolCallOpen).toBe(true);
    pass(progress, 'chat', chunk(choice(0, { content: 'more text' })));
    expect(progress.toolCallOpen).toBe(true);
    pass(progress, 'chat', chunk(choice(0, {}, 'tool_calls')));
    expect(progress.toolCallOpen).toBe(false);
  });

  it('is not open for an empty tool_calls list sent with every text delta', () => {
    expect(feed('chat', ONE, [chunk(choice(0, { content: 'Hel', tool_calls: [] }))]).progress.toolCallOpen).toBe(false);
  });

  it('is open for Responses API argument deltas and Anthropic tool_use blocks', () => {
    const fn = ev({ type: 'response.function_call_arguments.delta', delta: '{"q"' }, 'response.function_call_arguments.delta');
    const custom = ev({ type: 'response.custom_tool_call_input.delta', delta: 'x' }, 'response.custom_tool_call_input.delta');
    expect(feed('responses', ONE, [fn]).progress.toolCallOpen).toBe(true);
    expect(feed('responses', ONE, [custom]).progress.toolCallOpen).toBe(true);
    expect(feed('messages', ONE, [ev({ type: 'content_block_start', index: 1, content_block: { type: 'tool_use', id: 't1', name: 'search', input: {} } })]).progress.toolCallOpen).toBe(true);
    expect(feed('messages', ONE, [ev({ type: 'content_block_delta', index: 1, delta: { type: 'input_json_delta', partial_json: '{"q"' } })]).progress.toolCallOpen).toBe(true);
    expect(feed('messages', ONE, [ev({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'Hi' } })]).progress.toolCallOpen).toBe(false);
  });

  it('is not opened by an event that carries no output, whatever its text holds', () => {
    const roleOnly = ev({ choices: [choice(0, { role: 'assistant' })], tool_calls: [{ id: 'not a delta' }] });
    expect(eventMeaning('chat', roleOnly)).toBe('keepalive');
    expect(feed('chat', ONE, [roleOnly]).progress.toolCallOpen).toBe(false);
  });
});

describe('a [DONE] before the answer is whole', () => {
  const call = (index: number, a: string, id?: string) => chunk(choice(0, { tool_calls: [{ index, ...(id ? { id, type: 'function', function: { name: 'get_weather', arguments: a } } : { function: { arguments: a } }) }] }));
  const cutBy = (shape: StreamShape, events: SseEvent[]) => feed('chat', shape, events).progress.cutByDone();

  it('cuts a tool call whose arguments so far are not JSON, whichever call of several it is', () => {
    expect(cutBy(ONE, [call(0, '', 'call_1'), call(0, '{"city": "Kra')])).toMatch(/tool call's arguments/);
    expect(cutBy(ONE, [call(0, '{"city": "Zürich"}', 'call_1'), call(1, '', 'call_2'), call(1, '{"ci')])).toMatch(/tool call's arguments/);
    const legacy = chunk(choice(0, { function_call: { name: 'get_weather', arguments: '{"city": ' } }));
    expect(cutBy(ONE, [legacy])).toMatch(/tool call's arguments/);
  });

  it('is not shown by text, by whole arguments or by a call whose arguments have not begun: a server may send no finish_reason', () => {
    expect(cutBy(ONE, [chunk(choice(0, { content: 'Hello' }))])).toBeUndefined();
    expect(cutBy(ONE, [call(0, '', 'call_1'), call(0, '{"city": '), call(0, '"Zürich"}')])).toBeUndefined();
    expect(cutBy(ONE, [call(0, '', 'call_1')])).toBeUndefined();
    // Arguments as an object (some servers send one) are nothing to judge.
    expect(cutBy(ONE, [chunk(choice(0, { tool_calls: [{ index: 0, function: { arguments: { city: 'Kra' } } }] }))])).toBeUndefined();
  });

  it('judges each call alone where a server numbers parallel calls under one index, a new id after whole arguments', () => {
    expect(cutBy(ONE, [call(0, '{"city": "Zürich"}', 'call_1'), call(0, '{"city": "Kraków"}', 'call_2')])).toBeUndefined();
    expect(cutBy(ONE, [call(0, '{"city": "Zürich"}', 'call_1'), call(0, '{"city": "Kra', 'call_2')])).toMatch(/tool call's arguments/);
    // A proxy that gives every chunk of one call an id of its own: the pieces are still one call's.
    expect(cutBy(ONE, [call(0, '{"ci', 'call_a'), call(0, 'ty": "Kra', 'call_b')])).toMatch(/tool call's arguments/);
    expect(cutBy(ONE, [call(0, '{"ci', 'call_a'), call(0, 'ty": "Kraków"}', 'call_b')])).toBeUndefined();
  });

  it('is none once the answer is whole', () => {
    expect(cutBy(ONE, [call(0, '{"city": "Kra', 'call_1'), chunk(choice(0, {}, 'tool_calls'))])).toBeUndefined();
  });

  it('cuts a choice still running when another has had its finish_reason', () => {
    const TWO: StreamShape = { choices: 2, usage: false };
    expect(cutBy(TWO, [chunk(choice(0, { content: 'a' }), choice(1, { content: 'b' })), chunk(choice(0, {}, 'stop'))])).toMatch(/every choice's finish/);
    // A provider that ignores `n` sends one choice: whole at its finish.
    expect(cutBy(TWO, [chunk(choice(0, { content: 'a' })), chunk(choice(0, {}, 'stop'))])).toBeUndefined();
  });

  it('stops judging arguments past 1 MiB in all', () => {
    const big = 'x'.repeat(600 * 1024);
    expect(cutBy(ONE, [call(0, `{"a": "${big}`, 'call_1')])).toMatch(/tool call's arguments/);
    expect(cutBy(ONE, [call(0, `{"a": "${big}`, 'call_1'), call(0, big)])).toBeUndefined();
  });
});
