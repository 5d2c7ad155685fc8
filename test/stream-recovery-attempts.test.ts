// streamRecovery: continue sends a second upstream request: it is an attempt like any other, in the request's log line
// (`attempts`) and in stormgate_upstream_attempts_total, or the amplification those show misses every recovery.
import { describe, expect, it } from 'vitest';
import { cc, delta, useScriptedGateway, type ConfigShape } from './helpers/scripted-provider.ts';
import { metricSum } from './helpers/stack.ts';

const withNextTarget: ConfigShape = (c, origin) => {
  c.providers.q = { family: 'openai', baseUrl: `${origin}/v1`, apiKey: 'q-key', breaker: false };
  for (const r of c.routes) {
    if (r.name !== 'chat') continue;
    r.targets = [{ provider: 'p' }, { provider: 'q' }];
    r.streamRecovery = 'continue';
    r.retry = { maxAttempts: 1 };
  }
};
const start = useScriptedGateway(withNextTarget);
const cut = { destroy: true } as const;

describe('a stream recovery', () => {
  it('is logged and counted as an upstream attempt', async () => {
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
    const line = JSON.parse(s.logs.find((l) => l.includes('"reqId"'))!) as { streamEnd: string; attempts: Array<{ target: string; reason: string }> };
    expect(line.streamEnd).toBe('recovered');
    expect(line.attempts.map((a) => [a.target, a.reason])).toEqual([['p/gpt-4o', 'ok'], ['q/gpt-4o', 'ok']]);
    expect(await metricSum(s, 'stormgate_upstream_attempts_total{target="p/gpt-4o"')).toBe(1);
    expect(await metricSum(s, 'stormgate_upstream_attempts_total{target="q/gpt-4o"')).toBe(1);
  });
});
