// vLLM's `finish_reason: "abort"` after the first output (its engine stopped the request: a replica shutting down or
// paused) is a cut answer, however cleanly its [DONE] follows: the provider stopped producing it and the client holds
// part of it. So it ends as a cut does: finished by streamRecovery where the route has it (a retry, reason
// stream_cut), else with the error event the SDKs raise, logged and counted as a cut, not as an upstream error event.
import { describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { cc, delta, recoveringToNext, useScriptedGateway, type Script, type Seen } from './helpers/scripted-provider.ts';
import { metricSum, type Stack } from './helpers/stack.ts';
import { streamedText } from './helpers/chat-stream.ts';

const role = cc([delta({ role: 'assistant', content: '' })]);
const DONE = 'data: [DONE]\n\n';
/** vLLM's last chunk for a request its engine stopped, with the text it had left (or none), then its [DONE]. */
const abortedAfter = (text: string, last = ''): Script => ({ steps: [role, cc([delta({ content: text })]), cc([delta(last === '' ? {} : { content: last }, 'abort', 0, { stop_reason: null })]), DONE] });
const hello: Script = { steps: [role, cc([delta({ content: 'Hello' })]), cc([delta({ content: ' there.' })]), cc([delta({}, 'stop')]), DONE] };

async function read(client: OpenAI) {
  const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
  return streamedText(stream);
}

async function logLine(s: Stack): Promise<{ outcome: string; streamEnd: string; msg: string; level: number; attempts: Array<{ target: string }> }> {
  await expect.poll(() => s.logs.find((l) => l.includes('"reqId"'))).toBeDefined();
  return JSON.parse(s.logs.find((l) => l.includes('"reqId"'))!) as { outcome: string; streamEnd: string; msg: string; level: number; attempts: Array<{ target: string }> };
}

const toQ = (seen: Seen[]) => seen.filter((r) => r.headers.authorization === 'Bearer q-key');

describe('vLLM\'s finish_reason "abort" after the first output, with streamRecovery: continue', () => {
  const start = useScriptedGateway(recoveringToNext());

  it('is finished by the next target as a cut is: one whole answer, a retry with reason stream_cut', async () => {
    const { client, seen, s } = await start((_b, n) => (n === 1 ? abortedAfter('Hel') : hello));
    expect(await read(client)).toMatchObject({ text: 'Hello there.', err: undefined });
    expect(toQ(seen)).toHaveLength(1);
    expect(toQ(seen)[0]!.headers['x-retry-reason']).toBe('stream_cut');
    expect(await metricSum(s, 'stormgate_retry_count_total{route="chat",target="q/gpt-4o",reason="stream_cut"}')).toBe(1);
    expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="recovered"}')).toBe(1);
    expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="upstream-error"}')).toBe(0);
    const line = await logLine(s);
    expect(line.outcome).toBe('success');
    expect(line.streamEnd).toBe('recovered');
    // A provider broke, the client never saw it: a warning that says so, not an abnormal end.
    expect(line).toMatchObject({ msg: 'stream recovered from the next target', level: 40 });
  });

  it("keeps the text the abort chunk itself carried, once: the continuation carries on after it", async () => {
    const { client, seen } = await start((_b, n) => (n === 1 ? abortedAfter('Hel', 'lo') : hello));
    expect(await read(client)).toMatchObject({ text: 'Hello there.', err: undefined });
    expect(toQ(seen)).toHaveLength(1);
  });

  it('is finished as well when the abort comes in the same read as the first output', async () => {
    const { client, seen } = await start((_b, n) => (n === 1 ? { steps: [abortedAfter('Hel', 'l').steps.join('')] } : hello));
    expect(await read(client)).toMatchObject({ text: 'Hello there.', err: undefined });
    expect(toQ(seen)).toHaveLength(1);
  });
});

describe('vLLM\'s finish_reason "abort" after the first output, without streamRecovery', () => {
  const start = useScriptedGateway();

  it('ends with the error event the SDK raises, logged and counted as a cut, the partial text of its last chunk kept', async () => {
    const { client, seen, s } = await start(() => abortedAfter('Hel', 'lo'));
    const { text, err } = await read(client);
    expect(text).toBe('Hello');
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err!.message).toContain('finish_reason "abort"');
    expect(seen).toHaveLength(1);
    expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="cut"}')).toBe(1);
    expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="upstream-error"}')).toBe(0);
    const line = await logLine(s);
    expect(line.outcome).toBe('stream_error');
    expect(line.streamEnd).toBe('cut');
  });

  it('writes neither the abort nor a [DONE] to the client, and the error is a stream_interrupted one', async () => {
    const { s } = await start(() => abortedAfter('Hel', 'lo'));
    const r = await fetch(`${s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: 'Bearer client-key' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true }),
    });
    const body = await r.text();
    expect(body).not.toContain('"finish_reason":"abort"');
    expect(body).not.toContain('[DONE]');
    expect(body).toContain('"code":"stream_interrupted"');
    // The chunk's own text goes on once, as any chunk's, before the error.
    expect(body.split('"content":"lo"')).toHaveLength(2);
  });
});
