// A provider's request rate (pools.requestsPerMinute) end to end: the official `openai` SDK against the gateway in
// front of the bundled mock over real HTTP, alone and as a fleet of two on a real redis-server. What the provider sees
// is its arrival times: never more than the rate and its burst in any second, however many agents ask at once, with
// online traffic served before a batch backlog and a request that cannot expect its turn told so at once.
import { randomUUID } from 'node:crypto';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { ConfigSchema } from '../src/config/schema.ts';
import type { MockRequestLog } from '../src/mock/stats.ts';
import { startMock } from '../src/mock/server.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { defaultConfig, RETRY_LOOP_ONLY, TEST_KEY, useGateways, useStacks, type Stack } from './helpers/stack.ts';

const start = useStacks(RETRY_LOOP_ONLY);
const ask = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'hi' }] };

/** The most arrivals in any window of `ms` (a window opening at each arrival). */
function mostIn(requests: readonly MockRequestLog[], ms: number): number {
  const at = requests.map((r) => r.receivedAt).sort((a, b) => a - b);
  let most = 0;
  for (let i = 0, j = 0; i < at.length; i++) {
    while (at[i]! - at[j]! >= ms) j++;
    most = Math.max(most, i - j + 1);
  }
  return most;
}

/** `n` chat calls sent at once with fetch, each with `timeoutMs` to live: their statuses, times, headers and bodies. */
function callsAtOnce(s: Stack, n: number, json: object, timeoutMs: number) {
  return Promise.all(
    Array.from({ length: n }, async () => {
      const t0 = Date.now();
      const res = await fetch(`${s.baseURL}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-stormgate-timeout-ms': String(timeoutMs) },
        body: JSON.stringify(json),
      });
      return { status: res.status, ms: Date.now() - t0, headers: res.headers, body: (await res.json()) as { error?: { code: string; message: string } } };
    }),
  );
}

/** Each call not answered was shed at once (within `withinMs`), told to come back when its turn would be. */
function expectToldToComeBack(calls: Awaited<ReturnType<typeof callsAtOnce>>, atLeastMs: number, withinMs: number): void {
  for (const c of calls.filter((c) => c.status !== 200)) {
    expect(c.status).toBe(503);
    expect(c.body.error?.code).toBe('load_shed');
    expect(c.ms).toBeLessThan(withinMs);
    expect(c.headers.get('x-should-retry')).toBe('true');
    expect(Number(c.headers.get('retry-after-ms'))).toBeGreaterThanOrEqual(atLeastMs);
  }
}

describe('a provider paced at its request rate', () => {
  it('sends a crowd of SDK calls on at the rate and its burst, and answers every one', async () => {
    // 10 a second, 2 at once: 24 calls at once take about 2.2 s to send.
    const s = await start({ provider: { pools: { requestsPerMinute: 600, burst: 2 } } });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client' });
    const started = Date.now();
    const answers = await Promise.all(Array.from({ length: 24 }, () => client.chat.completions.create(ask)));
    expect(answers.every((a) => a.choices[0]?.message.content)).toBe(true);
    const seen = s.mock.requests();
    expect(seen).toHaveLength(24);
    // The rate and the burst in any second (arrivals can bunch a little on the wire, never run ahead of the pacing) ...
    expect(mostIn(seen, 1_000)).toBeLessThanOrEqual(13);
    // ... so the crowd takes its time to go out: the last was sent at least ~2 s after the first.
    const at = seen.map((r) => r.receivedAt);
    expect(Math.max(...at) - Math.min(...at)).toBeGreaterThanOrEqual(1_800);
    expect(Date.now() - started).toBeGreaterThanOrEqual(1_800);
  });

  it('gives the turns to online calls before a batch backlog', async () => {
    const s = await start({ provider: { pools: { requestsPerMinute: 600, burst: 1 } } });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client' });
    const timed = async (priority: string) => {
      const t0 = Date.now();
      await client.chat.completions.create(ask, { headers: { 'x-stormgate-priority': priority } });
      return { ms: Date.now() - t0, doneAt: Date.now() };
    };
    const batch = Array.from({ length: 20 }, () => timed('batch'));
    // The backlog is queued (20 at 10 a second: 2 s) when the online calls come.
    await new Promise((r) => setTimeout(r, 300));
    const online = await Promise.all(Array.from({ length: 4 }, () => timed('online')));
    const batchDone = await Promise.all(batch);
    // Online waited for the next four turns, not behind the backlog: done well before the batch's last ...
    expect(Math.max(...online.map((o) => o.ms))).toBeLessThan(Math.max(...batchDone.map((b) => b.ms)) / 2);
    // ... with most of the backlog still to go.
    const lastOnline = Math.max(...online.map((o) => o.doneAt));
    expect(batchDone.filter((b) => b.doneAt > lastOnline).length).toBeGreaterThanOrEqual(10);
  });

  it('tells a call that cannot expect its turn before its deadline so at once, with the wait', async () => {
    // One a second: of 5 calls at once with 2.5 s to live, the first goes now, the next in 1 s and 2 s; the others
    // cannot have their turn in time.
    const s = await start({ provider: { pools: { requestsPerMinute: 60, burst: 1 } }, route: { minAttemptMs: 200 } });
    const calls = await callsAtOnce(s, 5, ask, 2_500);
    const ok = calls.filter((c) => c.status === 200);
    expect(ok.length).toBeGreaterThanOrEqual(2);
    expect(ok.length).toBeLessThan(5);
    // At once, not at its deadline, told to come back when its turn would be (seconds, not milliseconds).
    expectToldToComeBack(calls, 2_000, 1_500);
    expect(s.mock.requests()).toHaveLength(ok.length);
    // Told the rate it configured holds it, not that the provider is at capacity.
    for (const c of calls.filter((c) => c.status !== 200)) {
      expect(c.body.error?.message).toBe("provider mock's request rate (60/min, pools.requestsPerMinute) leaves no turn for class online before the request's deadline; retry later");
    }
  });
});

describe('a provider paced at its token rate', () => {
  it('sends calls as their estimates fit, and tells those that cannot fit before their deadline to come back', async () => {
    // 12,000 tokens a minute (200 a second); each call counts its body's bytes / 4 and its max_tokens: about 4,025.
    const s = await start({ provider: { pools: { tokensPerMinute: 12_000 } } });
    const calls = await callsAtOnce(s, 6, { ...ask, max_tokens: 4_000 }, 5_000);
    // Two fit at once, the third a fraction of a second later; the next would wait about 20 s.
    expect(calls.filter((c) => c.status === 200)).toHaveLength(3);
    expect(s.mock.requests()).toHaveLength(3);
    expectToldToComeBack(calls, 15_000, 2_500);
    for (const c of calls.filter((c) => c.status !== 200)) expect(c.body.error?.message).toContain("provider mock's token rate (12000/min, pools.tokensPerMinute) leaves no turn");
  });
});

describe('a fleet of two gateways on Redis paced at one provider rate', () => {
  const redis = useRedisServer();
  const gateway = useGateways();

  /**
   * Two gateways on one Redis with `pools`, each with `agents` SDK agents calling back to back for `ms`: the calls each
   * agent had answered (the first instance's agents first), and what the provider saw past the first `settleMs` (the
   * shares' first exchanges) and before the last 200 ms.
   */
  async function fleetRun(pools: object, agents: number, ms: number, settleMs: number) {
    const mock = await startMock({ quiet: true, apiKey: TEST_KEY });
    try {
      const config = ConfigSchema.parse({
        ...defaultConfig(mock.url, { ...RETRY_LOOP_ONLY, provider: { ...RETRY_LOOP_ONLY.provider, pools } }),
        state: { redis: redis().url, keyPrefix: `rate-${randomUUID()}`, commandTimeoutMs: 1000 },
      });
      const urls = await Promise.all([gateway(config), gateway(config)]);
      const until = Date.now() + ms;
      const agent = async (url: string) => {
        const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'client', maxRetries: 0 });
        let ok = 0;
        while (Date.now() < until) {
          await client.chat.completions.create(ask);
          ok++;
        }
        return ok;
      };
      const answered = await Promise.all(urls.flatMap((url) => Array.from({ length: agents }, () => agent(url))));
      const seen = mock.requests();
      expect(answered.reduce((a, b) => a + b, 0)).toBe(seen.length);
      const at = seen.map((r) => r.receivedAt);
      const middle = seen.filter((r) => r.receivedAt > Math.min(...at) + settleMs && r.receivedAt < Math.max(...at) - 200);
      return { perInstance: [answered.slice(0, agents), answered.slice(agents)].map((a) => a.reduce((x, y) => x + y, 0)), middle };
    } finally {
      await mock.close();
    }
  }

  it('sends no more than the rate between them', async () => {
    // Both instances busy for about 4 s at 8 a second between them: each paces at its share of the pool.
    const { perInstance, middle } = await fleetRun({ maxConcurrent: 8, requestsPerMinute: 480, burst: 2 }, 6, 4_000, 1_000);
    // 8 a second between them: in the busy middle (past the first exchange of shares), any second holds at most the
    // rate and a burst at each instance, with room for bunching on the wire; two instances each at the whole rate
    // would send 16.
    expect(mostIn(middle, 1_000)).toBeLessThanOrEqual(12);
    // Each instance did send its part.
    for (const n of perInstance) expect(n).toBeGreaterThan(0);
  });

  it('sends no more than the rate between them when they outnumber the slots', async () => {
    // One slot for two instances: each keeps a slot of its own, and paced at that slot's part of the rate (all of it),
    // the two sent twice the rate. Each paces at its share of the rate instead (src/pools/fleet-share.ts rateShare).
    const { perInstance, middle } = await fleetRun({ maxConcurrent: 1, requestsPerMinute: 240, burst: 1 }, 3, 5_000, 1_500);
    // 4 a second between them: past the first exchanges, a second holds the rate and the two instances' bursts of one
    // at most (each at the whole rate: 8), and the busy middle about the rate.
    expect(mostIn(middle, 1_000)).toBeLessThanOrEqual(6);
    const spanS = (Math.max(...middle.map((r) => r.receivedAt)) - Math.min(...middle.map((r) => r.receivedAt))) / 1000;
    expect(middle.length).toBeLessThanOrEqual(4 * spanS + 3);
    for (const n of perInstance) expect(n).toBeGreaterThan(0);
  });
});
