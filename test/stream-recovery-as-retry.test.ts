// streamRecovery: continue, recorded as the retry it is: the continuation is taken from the retry budget, so it counts
// in stormgate_retry_count_total (and carries x-retry-attempt, as every retry does), a refusal of the budget counts in
// stormgate_retry_budget_exhausted_total, and its target's adaptive limit hears its rate limit as any attempt's.
import { describe, expect, it } from 'vitest';
import type OpenAI from 'openai';
import { cc, delta, recoveringToNext, useScriptedGateway, type ConfigShape, type Script, type Seen } from './helpers/scripted-provider.ts';
import { metricSum, type Stack } from './helpers/stack.ts';
import { streamedText } from './helpers/chat-stream.ts';

const cut = { destroy: true } as const;
const role = cc([delta({ role: 'assistant', content: '' })]);
const cutAfterHel: Script = { steps: [role, cc([delta({ content: 'Hel' })]), 30, cut] };
const hello: Script = { steps: [role, cc([delta({ content: 'Hello' })]), cc([delta({}, 'stop')]), 'data: [DONE]\n\n'] };
const busy: Script = { status: 503, headers: { 'content-type': 'application/json' }, steps: ['{"error":{"message":"busy","type":"server_error"}}'] };
/** A 429 without a wait hint: no hold-off, only the adaptive limit can hear it. */
const tooMany: Script = { status: 429, headers: { 'content-type': 'application/json' }, steps: ['{"error":{"message":"slow down","type":"rate_limit_error","code":"rate_limit_exceeded"}}'] };

async function readStream(client: OpenAI, signal?: AbortSignal): Promise<string> {
  const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true }, { signal });
  return (await streamedText(stream)).text;
}

const toQ = (seen: Seen[]) => seen.filter((r) => r.headers.authorization === 'Bearer q-key');
const limitOf = async (s: Stack, target: string) => Number((await (await fetch(`${s.url}/metrics`)).text()).match(new RegExp(`^stormgate_pool_limit\\{target="${target}"\\} ([\\d.]+)$`, 'm'))?.[1]);

const start = useScriptedGateway(recoveringToNext());

const noBudget: ConfigShape = (c, origin) => {
  recoveringToNext()(c, origin);
  for (const r of c.routes) if (r.name === 'chat') r.budget = { ratio: 0, windowS: 10, minRetriesPerSecond: 0 };
};
const startWithoutBudget = useScriptedGateway(noBudget);

/** q takes two attempts at a time: one stream in flight makes its limit binding, so a 429 then cuts it. */
const smallQ: ConfigShape = (c, origin) => {
  recoveringToNext()(c, origin);
  (c.providers.q as Record<string, unknown>).pools = { maxConcurrent: 2 };
};
const startSmallQ = useScriptedGateway(smallQ);

describe('a stream recovery is recorded as a retry', () => {
  it('counts in stormgate_retry_count_total with the break as its reason, and carries x-retry-attempt', async () => {
    const { client, seen, s } = await start((_b, n) => (n === 1 ? cutAfterHel : hello));
    expect(await readStream(client)).toBe('Hello');
    expect(await metricSum(s, 'stormgate_retry_count_total{route="chat",target="q/gpt-4o",reason="stream_cut"}')).toBe(1);
    expect(await metricSum(s, 'stormgate_retry_count_total')).toBe(1);
    // The request needed a second upstream request and succeeded: a retried request's success.
    expect(await metricSum(s, 'stormgate_retried_requests_total{route="chat",result="success"}')).toBe(1);
    expect(toQ(seen)[0]!.headers['x-retry-attempt']).toBe('1');
    expect(toQ(seen)[0]!.headers['x-retry-reason']).toBe('stream_cut');
  });

  it('names a stall as its reason', async () => {
    const { client, seen, s } = await start((_b, n) => (n === 1 ? { steps: [role, cc([delta({ content: 'Hel' })])], hold: true } : hello), { idleMs: 300 });
    expect(await readStream(client)).toBe('Hello');
    expect(await metricSum(s, 'stormgate_retry_count_total{route="chat",target="q/gpt-4o",reason="stream_stalled"}')).toBe(1);
    expect(toQ(seen)[0]!.headers['x-retry-reason']).toBe('stream_stalled');
  });

  it('counts a continuation that failed too: it went upstream', async () => {
    const { client, s } = await start((_b, n) => (n === 1 ? cutAfterHel : busy));
    expect(await readStream(client)).toBe('Hel');
    expect(await metricSum(s, 'stormgate_retry_count_total{route="chat",target="q/gpt-4o",reason="stream_cut"}')).toBe(1);
    expect(await metricSum(s, 'stormgate_retried_requests_total{route="chat",result="failure"}')).toBe(1);
  });

  it('counts a recovery the budget refuses in stormgate_retry_budget_exhausted_total, and no retry', async () => {
    const { client, seen, s } = await startWithoutBudget((_b, n) => (n === 1 ? cutAfterHel : hello));
    expect(await readStream(client)).toBe('Hel');
    expect(toQ(seen)).toHaveLength(0);
    expect(await metricSum(s, 'stormgate_retry_budget_exhausted_total{route="chat",target="q/gpt-4o"}')).toBe(1);
    expect(await metricSum(s, 'stormgate_retry_count_total')).toBe(0);
  });

  it("tells the next target's adaptive limit of the continuation's 429, as any attempt's", async () => {
    // First request: p answers 503 and it fails over to q, whose stream stays open (one of q's two slots in use).
    // Second: p is cut after "Hel", and q answers the continuation 429.
    const held: Script = { steps: [role, cc([delta({ content: 'Hi' })])], hold: true };
    const { client, seen, s } = await startSmallQ((_b, n) => {
      const atQ = seen[n - 1]!.headers.authorization === 'Bearer q-key';
      if (n <= 2) return atQ ? held : busy;
      return atQ ? tooMany : cutAfterHel;
    });
    const holding = new AbortController();
    const first = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true }, { signal: holding.signal });
    const reading = streamedText(first);
    try {
      await expect.poll(() => toQ(seen).length).toBe(1);
      expect(await limitOf(s, 'q/gpt-4o')).toBe(2);
      expect(await readStream(client)).toBe('Hel');
      expect(toQ(seen)).toHaveLength(2);
      expect(await limitOf(s, 'q/gpt-4o')).toBe(1);
    } finally {
      holding.abort();
      await reading;
    }
  });
});
