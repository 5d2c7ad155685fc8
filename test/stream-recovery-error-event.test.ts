// streamRecovery: continue past the provider's own error event after the first output (an overload mid-answer, the
// commonest break of all): the next target is asked for the rest, as after a cut or a stall; the client gets the
// provider's error event only if no target continues the answer, and an error that is not the provider's failure (the
// request's fault, the account's refusal) is never continued.
import { describe, expect, it } from 'vitest';
import { cc, delta, recoveringToNext, useScriptedGateway, type Script } from './helpers/scripted-provider.ts';
import { metricSum } from './helpers/stack.ts';
import { streamedText } from './helpers/chat-stream.ts';

const start = useScriptedGateway(recoveringToNext());

const errorAfterHel = (error: Record<string, unknown>): Script => ({
  steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hel' })]), `data: ${JSON.stringify({ error })}\n\n`],
});
const overloaded = { message: 'The server is overloaded, try again', type: 'server_error', code: 'server_error' };
const hello: Script = { steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hello' })]), cc([delta({}, 'stop')]), 'data: [DONE]\n\n'] };
const busy: Script = { status: 503, headers: { 'content-type': 'application/json' }, steps: ['{"error":{"message":"busy","type":"server_error"}}'] };

async function ask(client: Awaited<ReturnType<typeof start>>['client']) {
  const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
  return streamedText(stream);
}

function logLine(s: Awaited<ReturnType<typeof start>>['s']) {
  const line = s.logs.find((l) => l.includes('"reqId"'));
  return line === undefined ? undefined : (JSON.parse(line) as { outcome: string; streamEnd: string; attempts: Array<{ target: string }> });
}

describe('a provider error event after the first output, with streamRecovery: continue', () => {
  it('is continued by the next target: the client gets the whole answer and never the error', async () => {
    const { client, s, seen } = await start((_body, n) => (n === 1 ? errorAfterHel(overloaded) : hello));
    const { text, err } = await ask(client);
    expect(err).toBeUndefined();
    expect(text).toBe('Hello');
    expect(seen).toHaveLength(2);
    await expect.poll(() => logLine(s)).toBeDefined();
    expect([logLine(s)!.outcome, logLine(s)!.streamEnd]).toEqual(['success', 'recovered']);
    expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="recovered"}')).toBe(1);
  });

  it('reaches the client as the provider\'s own error event when the next target cannot continue', async () => {
    const { client, s } = await start((_body, n) => (n === 1 ? errorAfterHel(overloaded) : busy));
    const { text, err } = await ask(client);
    expect(text).toBe('Hel');
    expect(String(err)).toMatch(/overloaded/);
    await expect.poll(() => logLine(s)).toBeDefined();
    expect([logLine(s)!.outcome, logLine(s)!.streamEnd]).toEqual(['stream_error', 'upstream-error']);
  });

  it('is passed on at once, nothing asked of the next target, when it is the request\'s fault', async () => {
    const { client, seen } = await start((_body, n) => (n === 1 ? errorAfterHel({ message: 'Invalid prompt: flagged', type: 'invalid_request_error', code: 'invalid_prompt' }) : hello));
    const { text, err } = await ask(client);
    expect(text).toBe('Hel');
    expect(String(err)).toMatch(/flagged/);
    expect(seen).toHaveLength(1);
  });
});
