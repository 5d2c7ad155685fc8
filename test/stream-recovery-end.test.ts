// streamRecovery: continue, when the continuation itself breaks: the client gets an error event (never a clean end),
// and the request is logged and counted as the broken stream it is, not as a recovered success.
import { describe, expect, it } from 'vitest';
import { cc, delta, recoveringToNext, useScriptedGateway } from './helpers/scripted-provider.ts';
import { metricSum } from './helpers/stack.ts';

const start = useScriptedGateway(recoveringToNext());
const cut = { destroy: true } as const;

describe('a stream recovery that breaks too', () => {
  it('is a stream_error with the continuation\'s end, not a recovered success', async () => {
    // The first target is cut after "Hel"; the next one starts with exactly that (so it is spliced on) and is cut too.
    const { client, s } = await start(() => ({ steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hel' })]), 30, cut] }));
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    let text = '';
    const err = await (async () => {
      for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    })().catch((e: unknown) => e as Error);
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
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
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
});
