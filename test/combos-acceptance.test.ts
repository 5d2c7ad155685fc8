// An SRE's acceptance scenarios that combine features each tested alone elsewhere: a model-specific fault beside a
// healthy model of the same provider, a brownout with parking while SDK clients with short timeouts give up, and
// idempotency keys on streams failing over to an Anthropic backup. Driven with the official `openai` SDK over real
// HTTP against the bundled mock; the numbers asserted are what the mock saw.
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { defaultConfig, metricSum, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';

const start = useStacks();
const startBackup = useExtraMocks();

/** A W3C traceparent whose trace id is `i`: forwarded upstream, so the mock's log tells whose request it got. */
function traceparent(i: number): string {
  return `00-${i.toString(16).padStart(32, '0')}-${'1'.padStart(16, '0')}-01`;
}

async function gauge(s: Stack, series: string): Promise<number | undefined> {
  const line = (await (await fetch(`${s.url}/metrics`)).text()).split('\n').find((l) => l.startsWith(series));
  return line === undefined ? undefined : Number(line.split(' ').at(-1));
}

describe('a model failing beside a healthy model of the same provider', () => {
  it('opens the failing model\'s breaker only: every request for the healthy one is answered, once upstream each', async () => {
    const s = await start({
      faults: { models: { 'gpt-4o': { errors: [{ status: 503 }] } } },
      provider: { breaker: { consecutiveFailures: 3, openS: 5, probeWhileParkedMs: 300 }, pools: { maxConcurrent: 8 } },
      route: { timeoutMs: 10_000, retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 20, capMs: 20 } } },
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client', maxRetries: 0 });
    const results = await Promise.all(
      Array.from({ length: 40 }, async (_, i) => {
        await sleep(i * 20);
        const model = i % 2 === 0 ? 'gpt-4o' : 'gpt-4o-mini';
        return client.chat.completions
          .create({ model, messages: [{ role: 'user', content: `hi ${i}` }] }, { timeout: 3_000 })
          .then(() => ({ model, outcome: 'ok' }), (e: { status?: number }) => ({ model, outcome: String(e.status) }));
      }),
    );
    expect(results.filter((r) => r.model === 'gpt-4o-mini').map((r) => r.outcome)).toEqual(Array(20).fill('ok'));
    // The failing model's requests get the gateway's 503 (its own, or circuit_open) within their deadline.
    expect(results.filter((r) => r.model === 'gpt-4o').map((r) => r.outcome)).toEqual(Array(20).fill('503'));
    const seen = s.mock.requests();
    expect(seen.filter((r) => r.model === 'gpt-4o-mini')).toHaveLength(20);
    // Its breaker opened: 20 requests of 2 attempts each would be 40; the breaker keeps it to a few and the probes.
    expect(seen.filter((r) => r.model === 'gpt-4o').length).toBeLessThan(20);
    expect(await gauge(s, 'stormgate_breaker_state{target="mock/gpt-4o"}')).toBe(1);
    expect(await gauge(s, 'stormgate_breaker_state{target="mock/gpt-4o-mini"}')).toBe(0);
    expect(await metricSum(s, 'stormgate_parked_requests')).toBe(0);
  }, 30_000);
});

describe('a brownout with parking while SDK clients with short timeouts give up', () => {
  it('sends nothing upstream after a client\'s deadline, leaves nothing parked, and closes the breaker after it', async () => {
    const s = await start({
      faults: { latencyMs: 50 },
      provider: { breaker: { consecutiveFailures: 2, openS: 10, probeWhileParkedMs: 400, probeWhileParkedMaxMs: 800, closeAfter: 2 } },
      route: { timeoutMs: 30_000, retry: { maxAttempts: 3, backoff: { strategy: 'full-jitter', baseMs: 100, capMs: 400 } } },
    });
    s.mock.brownout('503', 3_000);
    const deadlines = new Map<string, number>();
    const outcomes = await Promise.all(
      Array.from({ length: 30 }, async (_, i) => {
        await sleep((i % 10) * 50);
        const timeout = 1_000 + (i % 6) * 700;
        const tp = traceparent(i + 1);
        const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client', maxRetries: 0, defaultHeaders: { traceparent: tp } });
        deadlines.set(tp.split('-')[1]!, Date.now() + timeout);
        try {
          if (i % 3 === 0) {
            const stream = await client.chat.completions.create({ model: 'gpt-4o', stream: true, messages: [{ role: 'user', content: `s${i}` }] }, { timeout });
            for await (const _ of stream);
          } else {
            await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: `n${i}` }] }, { timeout });
          }
          return 'ok';
        } catch (e) {
          return e instanceof OpenAI.APIConnectionTimeoutError ? 'client-timeout' : String((e as { status?: number }).status);
        }
      }),
    );
    // The gateway answers each before its SDK gives up.
    expect(outcomes.filter((o) => o === 'client-timeout')).toEqual([]);
    await sleep(200);
    const late = s.mock.requests().filter((r) => r.receivedAt > deadlines.get(r.headers['traceparent']!.split('-')[1]!)!);
    expect(late).toEqual([]);
    // Only the first failures and the lot's probes reached the provider, not 30 requests times 3 attempts.
    expect(s.mock.stats().total).toBeLessThan(15);
    expect(await metricSum(s, 'stormgate_parked_requests')).toBe(0);
    // After the brownout, the next requests are answered and close the breaker.
    await sleep(1_000);
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client', maxRetries: 0 });
    for (let i = 0; i < 3; i++) await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'after' }] }, { timeout: 15_000 });
    expect(await gauge(s, 'stormgate_breaker_state{target="mock/gpt-4o"}')).toBe(0);
  }, 60_000);
});

describe('idempotency keys while the primary is down and the backup is Anthropic', () => {
  it('runs each key once on the backup, and replays the translated stream byte for byte', async () => {
    const backup = await startBackup({ faults: { latencyMs: 400, stream: { chunks: 4, chunkDelayMs: 50 } }, apiKey: 'backup-key' });
    const s = await start({
      faults: { errors: [{ status: 503 }] },
      config: (url) => {
        const base = defaultConfig(url, { provider: { breaker: { consecutiveFailures: 2, openS: 30 } } });
        return {
          ...base,
          providers: { ...base.providers, backup: { family: 'anthropic', baseUrl: backup.url, apiKey: 'backup-key' } },
          routes: base.routes.map((r) =>
            r.name === 'chat'
              ? { ...r, targets: [{ provider: 'mock' }, { provider: 'backup', model: 'claude-sonnet-4-5' }], idempotency: { bodyAsKeyMs: 5_000 }, retry: { maxAttempts: 2, backoff: { strategy: 'fixed' as const, baseMs: 10, capMs: 10 } } }
              : r,
          ),
        };
      },
    });
    const send = (key: string | undefined, content: string) =>
      fetch(`${s.baseURL}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...(key && { 'idempotency-key': key }) },
        body: JSON.stringify({ model: 'gpt-4o', stream: true, messages: [{ role: 'user', content }] }),
      }).then(async (r) => ({ status: r.status, replayed: r.headers.get('idempotent-replayed'), target: r.headers.get('x-stormgate-target'), body: await r.text() }));
    // Five agents' retries under one key at once, and one after the answer.
    const concurrent = await Promise.all(Array.from({ length: 5 }, () => send('call-1', 'hello')));
    const after = await send('call-1', 'hello');
    for (const r of [...concurrent, after]) {
      expect(r).toMatchObject({ status: 200, target: 'backup/claude-sonnet-4-5' });
      expect(r.body).toBe(concurrent[0]!.body);
    }
    expect(concurrent[0]!.body).toContain('data: [DONE]');
    expect([...concurrent, after].filter((r) => r.replayed === 'true')).toHaveLength(5);
    expect(backup.stats().total).toBe(1);
    // An SDK whose timeout is shorter than the backup's answer retries under the same key and gets the one run's answer.
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client', maxRetries: 3 });
    const answer = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'coupon' }] }, { timeout: 300, headers: { 'Idempotency-Key': 'call-2' } });
    expect(answer.choices[0]!.message.content).toContain('coupon');
    // A keyless agent on the body-keyed route: the same.
    const keyless = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'body-keyed' }] }, { timeout: 300 });
    expect(keyless.choices[0]!.message.content).toContain('body-keyed');
    expect(backup.stats().total).toBe(3);
    // The primary saw the attempts that opened its breaker, and nothing after it.
    expect(s.mock.stats().total).toBeLessThanOrEqual(3);
  }, 60_000);
});
