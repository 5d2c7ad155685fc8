// What streamRecovery reads of a stream's delivered events (pipeline/delivered-text.ts): the README promises that a
// refusal, audio or a tool call already delivered is never followed by another answer, and that reasoning alone is an
// answer begun with no text. The integration tests cover a refusal and reasoning; these cover every kind, and the
// fields some servers send as null in every delta.
import { describe, expect, it } from 'vitest';
import { DeliveredText } from '../src/pipeline/delivered-text.ts';
import { deliverData } from './helpers/live-stream.ts';

const chunk = (delta: Record<string, unknown>) => JSON.stringify({ object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: null }] });

function deliver(...deltas: Array<Record<string, unknown>>): DeliveredText {
  const d = new DeliveredText();
  for (const delta of deltas) deliverData(d, chunk(delta));
  return d;
}

describe('what a stream delivered, for its recovery', () => {
  it('keeps the text and takes a delta with every field null (as some servers send them) as plain text', () => {
    const d = deliver({ role: 'assistant', content: '' }, { content: 'Hel', refusal: null, function_call: null, audio: null, tool_calls: null, reasoning_content: null }, { content: 'lo' });
    expect(d.text).toBe('Hello');
    expect(d.notPlainText).toBe(false);
    expect(d.reasoning).toBe(false);
  });

  it('notes reasoning (reasoning_content or reasoning), not an empty one', () => {
    expect(deliver({ reasoning_content: '' }, { reasoning: '' }).reasoning).toBe(false);
    expect(deliver({ reasoning_content: 'Let me think.' }).reasoning).toBe(true);
    expect(deliver({ reasoning: 'Let me think.' }).reasoning).toBe(true);
  });

  it.each([
    ['a tool call', { tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'f', arguments: '' } }] }],
    ['a legacy function_call', { function_call: { name: 'f', arguments: '' } }],
    ['a refusal', { refusal: 'I cannot help with that.' }],
    ['audio', { audio: { id: 'audio_1', data: 'UklGR' } }],
    ['content as a list of parts', { content: [{ type: 'text', text: 'Hi' }] }],
  ])('marks %s as output no other answer may follow', (_what, delta) => {
    expect(deliver({ content: 'Hi' }, delta).notPlainText).toBe(true);
  });

  it('leaves an empty tool call list and a malformed event out of it', () => {
    const d = deliver({ content: 'Hi', tool_calls: [] });
    deliverData(d, '{"choices": [');
    deliverData(d, JSON.stringify({ choices: [{ index: 0, delta: null }] }));
    expect(d.notPlainText).toBe(false);
    expect(d.text).toBe('Hi');
  });
});
