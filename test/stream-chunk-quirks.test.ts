// Chat chunks from OpenAI-compatible servers that say things differently from OpenAI: `"function_call": null` in every
// delta (servers that serialise every field of the SDK's own models), `"finish_reason": ""` on every chunk until the
// last (Ollama before 0.1.39, SGLang before 0.4.4), and content as a list of parts (Mistral's reasoning models stream
// their thinking so). A null is no output and "" no finish: read as such, the role chunk was the first output (no
// first-token timeout, no retry of a cut before the text), and the answer was "finished" from its first chunk, so a
// pause of a second mid-answer ended it with [DONE], truncated. A list of parts is output: held back as silence, a
// model thinking longer than firstTokenMs was timed out and run again on every attempt.
import { describe, expect, it } from 'vitest';
import { choiceIndexes, eventMeaning, parsedData } from '../src/streaming/stream-events.ts';
import type { SseEvent } from '../src/streaming/sse-parser.ts';
import { cc, delta, useScriptedGateway } from './helpers/scripted-provider.ts';

const gw = useScriptedGateway((c) => {
  for (const r of c.routes as Array<Record<string, unknown>>) r.retry = { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 10, capMs: 10 } };
});
const messages = [{ role: 'user' as const, content: 'hi' }];
const DONE = 'data: [DONE]\n\n';
const ev = (text: string): SseEvent => ({ raw: text.trimEnd(), data: text.trimEnd().slice('data: '.length), event: null });
/** A role chunk as a server that dumps every field of the SDK's model sends it. */
const nullRole = cc([delta({ role: 'assistant', content: null, function_call: null, tool_calls: null, refusal: null, audio: null })]);
/** A delta whose finish_reason is "" (not finished), as older Ollama and SGLang send every chunk but the last. */
const unfinished = (d: Record<string, unknown>) => cc([delta(d, '' as never)]);

describe('chat chunks of compatible servers', () => {
  it('are read for what they say: null is no output, "" no finish, a list of parts is output', () => {
    expect(eventMeaning('chat', ev(nullRole))).toBe('keepalive');
    expect(eventMeaning('chat', ev(unfinished({ role: 'assistant', content: '' })))).toBe('keepalive');
    expect(eventMeaning('chat', ev(unfinished({ content: 'Hel' })))).toBe('output');
    expect(choiceIndexes(parsedData(ev(unfinished({ content: 'Hel' }))))).toEqual({ seen: [0], finished: [] });
    // What they stand beside still counts: a legacy function call, a real finish.
    expect(eventMeaning('chat', ev(cc([delta({ function_call: { name: 'f', arguments: '' } })])))).toBe('output');
    expect(eventMeaning('chat', ev(cc([delta({}, 'stop')])))).toBe('finish');
    expect(eventMeaning('chat', ev(cc([delta({ content: [{ type: 'thinking', thinking: [{ type: 'text', text: 'hm' }] }] })])))).toBe('output');
    expect(eventMeaning('chat', ev(cc([delta({ content: [] })])))).toBe('keepalive');
  });

  it('a role chunk with function_call: null is not the first output: a cut after it is retried', async () => {
    const { client, seen } = await gw((_, n) => ({
      steps: n === 1 ? [nullRole, 20, { destroy: true }] : [nullRole, cc([delta({ content: 'ok', function_call: null, tool_calls: null })]), cc([delta({}, 'stop')]), DONE],
    }));
    const final = await client.chat.completions.stream({ model: 'gpt-4o', messages }).finalChatCompletion();
    expect(final.choices[0]!.message.content).toBe('ok');
    expect(seen).toHaveLength(2);
  });

  it('a role chunk with function_call: null leaves the first-token timeout running', async () => {
    const { client, seen } = await gw(
      (_, n) => ({ steps: n === 1 ? [nullRole] : [nullRole, cc([delta({ content: 'ok' })]), cc([delta({}, 'stop')]), DONE], hold: n === 1 }),
      { firstTokenMs: 400, idleMs: 3_000 },
    );
    const started = Date.now();
    const final = await client.chat.completions.stream({ model: 'gpt-4o', messages }).finalChatCompletion();
    expect(final.choices[0]!.message.content).toBe('ok');
    expect(seen).toHaveLength(2);
    expect(Date.now() - started).toBeLessThan(2_000);
  });

  it('content as a list of parts (Mistral\'s thinking) is output: a model thinking past firstTokenMs is not timed out', async () => {
    const thinking = (text: string) => cc([delta({ content: [{ type: 'thinking', thinking: [{ type: 'text', text }] }] })]);
    const steps: Array<string | number> = [cc([delta({ role: 'assistant', content: '' })])];
    for (let i = 0; i < 10; i++) steps.push(thinking(`step ${i} `), 100);
    steps.push(cc([delta({ content: 'Answer' })]), cc([delta({}, 'stop')]), DONE);
    const { client, seen } = await gw(() => ({ steps }), { firstTokenMs: 400 });
    const stream = await client.chat.completions.create({ model: 'magistral-medium-2509', messages, stream: true });
    let parts = 0;
    let text = '';
    for await (const chunk of stream) {
      const content = chunk.choices[0]?.delta?.content as unknown;
      if (Array.isArray(content)) parts++;
      else text += (content as string | undefined) ?? '';
    }
    expect(parts).toBe(10);
    expect(text).toBe('Answer');
    expect(seen).toHaveLength(1);
  });

  it('finish_reason "" on every chunk: a pause mid-answer does not end it, and a cut is a cut', async () => {
    const { client, seen } = await gw((_, n) => ({
      steps:
        n === 1
          ? [unfinished({ role: 'assistant', content: 'Hel' }), unfinished({ content: 'lo' }), 1_500, unfinished({ content: ' world' }), cc([delta({}, 'stop')]), DONE]
          : [unfinished({ role: 'assistant', content: 'Hel' }), unfinished({ content: 'lo' }), 20, { destroy: true }],
    }));
    const final = await client.chat.completions.stream({ model: 'gpt-4o', messages }).finalChatCompletion();
    expect(final.choices[0]!.message.content).toBe('Hello world');
    expect(final.choices[0]!.finish_reason).toBe('stop');

    const cut = await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    let text = '';
    const err = await (async () => {
      for await (const chunk of cut) text += chunk.choices[0]?.delta?.content ?? '';
    })().then(() => undefined, (e: { code?: string }) => e);
    expect(text).toBe('Hello');
    expect(err?.code).toBe('stream_interrupted');
    expect(seen).toHaveLength(2);
  });
});
