// Every Responses API stream event carries a `sequence_number`, the error event included, and clients validate it:
// the Vercel AI SDK's parser (@ai-sdk/openai, the default model of `openai('gpt-4o')`) requires it on `type: "error"`,
// so an error event the gateway wrote without one (a cut, a stall, the event it adds after a `response.failed`)
// surfaced as "Type validation failed" instead of the stream_interrupted error it carries. Read on the wire.
import { describe, expect, it } from 'vitest';
import { baseResponse, fastRetries, responsesHead, rev, textDelta, useScriptedGateway, type Script } from './helpers/scripted-provider.ts';

const gw = useScriptedGateway(fastRetries);

/** The stream's events as a client reads them: each event's data, parsed, with its `event:` name. */
async function eventsOf(baseURL: string): Promise<Array<{ event: string | null; data: Record<string, unknown> }>> {
  const res = await fetch(`${baseURL}/responses`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4.1', input: 'hi', stream: true }),
  });
  expect(res.status).toBe(200);
  const text = await res.text();
  return text
    .split('\n\n')
    .filter((block) => block.split('\n').some((l) => l.startsWith('data:')))
    .map((block) => {
      const lines = block.split('\n');
      const event = lines.find((l) => l.startsWith('event:'))?.slice(6).trim() ?? null;
      const data = lines.filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trim()).join('\n');
      return { event, data: JSON.parse(data) as Record<string, unknown> };
    });
}

/** The error event that ends the stream numbers on from the event before it, as OpenAI's own do. */
function expectNumberedErrorAfter(events: Array<{ event: string | null; data: Record<string, unknown> }>, previous: number): void {
  const last = events.at(-1)!;
  expect(last.event).toBe('error');
  expect(last.data.type).toBe('error');
  expect(last.data.sequence_number).toBe(previous + 1);
}

describe('Responses API error events carry a sequence_number', () => {
  it('the error event of a stream cut after its first output numbers on from the last event passed', async () => {
    const script = (): Script => ({ steps: [...responsesHead(), textDelta('Hel', 4), 20, { destroy: true }] });
    const { s } = await gw(script);
    const events = await eventsOf(s.baseURL);
    expect(events.at(-1)!.data.code).toBe('stream_interrupted');
    expectNumberedErrorAfter(events, 4);
  });

  it('the error event of a stream that stalled after its first output does too', async () => {
    const { s } = await gw(() => ({ steps: [...responsesHead(), textDelta('Hel', 4), textDelta('lo', 5)], hold: true }), { idleMs: 300 });
    const events = await eventsOf(s.baseURL);
    expect(String(events.at(-1)!.data.message)).toContain('stalled');
    expectNumberedErrorAfter(events, 5);
  });

  it('the error event added after a response.failed numbers on from it; an upstream error event keeps its own', async () => {
    const failed = rev('response.failed', { response: { ...baseResponse('failed'), error: { code: 'server_error', message: 'The model failed' } } }, 5);
    const { s } = await gw(() => ({ steps: [...responsesHead(), textDelta('Hel', 4), failed] }));
    const events = await eventsOf(s.baseURL);
    expect(events.at(-2)!.data.type).toBe('response.failed');
    expectNumberedErrorAfter(events, 5);

    const { s: s2 } = await gw(() => ({ steps: [...responsesHead(), textDelta('Hel', 4), rev('error', { code: 'server_error', message: 'An error occurred', param: null }, 5)] }));
    expectNumberedErrorAfter(await eventsOf(s2.baseURL), 4);
  });
});
