// streamRecovery: continue, when the continuation itself breaks: the client gets an error event (never a clean end),
// and the request is logged and counted as the broken stream it is, not as a recovered success.
import { describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { cc, delta, recoveringToNext, useScriptedGateway, type Script } from './helpers/scripted-provider.ts';
import { metricSum } from './helpers/stack.ts';
import { streamedText } from './helpers/chat-stream.ts';

const start = useScriptedGateway(recoveringToNext());
const cut = { destroy: true } as const;

/** The first target's answer: "Hel", then a cut. */
const cutAfterHel: Script = { steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hel' })]), 30, cut] };
const busy: Script = { status: 503, headers: { 'content-type': 'application/json' }, steps: ['{"error":{"message":"busy","type":"server_error"}}'] };
const hello: Script = { steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hello' })]), cc([delta({}, 'stop')]), 'data: [DONE]\n\n'] };

/** One streamed request read to its end; its error (the cut the client was told of), if any, swallowed. */
async function readStream(client: OpenAI): Promise<string> {
  const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
  return (await streamedText(stream)).text;
}

describe('a stream recovery that breaks too', () => {
  it('is a stream_error with the continuation\'s end, not a recovered success', async () => {
    // The first target is cut after "Hel"; the next one starts with exactly that (so it is spliced on) and is cut too.
    const { client, s } = await start(() => ({ steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hel' })]), 30, cut] }));
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    const { text, err } = await streamedText(stream);
    expect(String(err)).toMatch(/cut/);
    expect(text).toBe('Hel');
    await expect.poll(() => s.logs.find((l) => l.includes('"reqId"'))).toBeDefined();
    const line = JSON.parse(s.logs.find((l) => l.includes('"reqId"'))!) as { outcome: string; streamEnd: string };
    expect(line.outcome).toBe('stream_error');
    expect(line.streamEnd).toBe('cut');
    expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="recovered"}')).toBe(0);
    expect(await metricSum(s, 'stormgate_requests_total{route="chat",target="p/gpt-4o",priority="online",outcome="success"}')).toBe(0);
  });

  it('is still recovered when the continuation completes, its own upstream request counted as an attempt', async () => {
    const { client, s } = await start((_body, n) =>
      n === 1
        ? { steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hel' })]), 30, cut] }
        : { steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hello' })]), cc([delta({}, 'stop')]), 'data: [DONE]\n\n'] },
    );
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    const { text } = await streamedText(stream);
    expect(text).toBe('Hello');
    await expect.poll(() => s.logs.find((l) => l.includes('"reqId"'))).toBeDefined();
    const line = JSON.parse(s.logs.find((l) => l.includes('"reqId"'))!) as { outcome: string; streamEnd: string; attempts: Array<{ target: string; reason: string }> };
    expect(line.outcome).toBe('success');
    expect(line.streamEnd).toBe('recovered');
    // The recovery is a second upstream request: in the log line and stormgate_upstream_attempts_total like any other,
    // or the amplification those show misses every recovery.
    expect(line.attempts.map((a) => [a.target, a.reason])).toEqual([['p/gpt-4o', 'ok'], ['q/gpt-4o', 'ok']]);
    expect(await metricSum(s, 'stormgate_upstream_attempts_total{target="p/gpt-4o"')).toBe(1);
    expect(await metricSum(s, 'stormgate_upstream_attempts_total{target="q/gpt-4o"')).toBe(1);
  });

  describe("the continuation's target's breaker", () => {
    // q opens on 2 failures in a row (with no success from it for 250 ms), or when every one of at least 2 requests failed.
    const guarded = useScriptedGateway(recoveringToNext({ consecutiveFailures: 2, minRequests: 2, failureRate: 1 }));

    it('counts a failed continuation as a failure and a successful one as a success, as any attempt on it', async () => {
      // Every request is cut at p after "Hel"; q answers its continuations 503, then "Hello", then 503, 503.
      const fromQ = [busy, hello, busy, busy];
      const { client, seen } = await guarded((_body, n) => (seen[n - 1]!.headers.authorization === 'Bearer q-key' ? (fromQ.shift() ?? busy) : cutAfterHel));
      const asked = () => seen.filter((r) => r.headers.authorization === 'Bearer q-key').length;
      await readStream(client);
      // q's success resets the run: its breaker does not open on the failures either side of it.
      expect(await readStream(client)).toBe('Hello');
      await readStream(client);
      expect(asked()).toBe(3);
      await new Promise((r) => setTimeout(r, 300));
      // The second failure in a row opens q's breaker, and the next cut is not sent to it.
      await readStream(client);
      expect(asked()).toBe(4);
      await readStream(client);
      expect(asked()).toBe(4);
    });

    it('counts a continuation the provider breaks after its first output as a failure in the failure-rate window', async () => {
      const { client, seen, s } = await guarded(() => cutAfterHel);
      const asked = () => seen.filter((r) => r.headers.authorization === 'Bearer q-key').length;
      await readStream(client);
      await readStream(client);
      expect(asked()).toBe(2);
      // Two continuations begun (successes at their first output) and both cut: two of two, once the window is written.
      await expect.poll(() => metricSum(s, 'stormgate_breaker_state{target="q/gpt-4o"}')).toBe(1);
      await readStream(client);
      expect(asked()).toBe(2);
    });
  });
});
