// A repeat on instance B waits for the run of its Idempotency-Key on instance A, and Redis goes away meanwhile: B must
// not take the key in the process and run the call beside A's run (the coupon twice). It waits, as it would have on
// Redis, until Redis is back or its own deadline (409 idempotency_key_in_progress, which its client retries). And with
// idempotency.waitForRedisMs, a repeat on an instance that never saw the run (an SDK's retry that reached another
// instance) waits the same way in an outage's first waitForRedisMs. Driven with the official `openai` SDK against two
// in-process gateways on a real redis-server the test stops, restarts and freezes (SIGSTOP).
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { useRedisServer } from './helpers/redis-server.ts';
import { eventually } from './helpers/redis-stores.ts';
import { askFleet as ask, metricOf, useRedisFleets } from './helpers/redis-fleet.ts';

const startFleet = useRedisFleets();
const server = useRedisServer();

const degradedOn = async (url: string) => (await metricOf(url, 'stormgate_state_degraded')) === 1;
/** A repeat on the instance waits for a run it found under its key: it holds its body meanwhile. */
const waitingOn = async (url: string) => ((await metricOf(url, 'stormgate_waiting_body_bytes')) ?? 0) > 0;
const keyed = (key: string, timeoutMs: number) => ({ 'Idempotency-Key': key, 'x-stormgate-timeout-ms': String(timeoutMs) });

describe('Redis away while a repeat on B waits for the run of its key on A', () => {
  it("keeps waiting on local state, and once Redis is back gets the run's answer: one upstream request", async () => {
    const f = await startFleet({ latencyMs: 5_000 }, [server().url, server().url], { idempotency: {} });
    const [a, b] = f.urls as [string, string];
    const upstream = () => f.mock.requests().length;
    const key = randomUUID();
    const run = ask(a, keyed(key, 20_000));
    await eventually(() => upstream() === 1, 3_000);
    const repeat = ask(b, keyed(key, 20_000));
    // B has found A's run in Redis (it holds its body while it waits), and looks again every 75-150 ms. Waited for, not
    // slept on: a repeat that reaches B after Redis stops has seen no run, and runs on local state (the default).
    await eventually(() => waitingOn(b), 5_000);
    await server().stop();
    await eventually(() => degradedOn(b), 5_000);
    await sleep(500); // B looks on local state a few times, where the key is free
    expect(upstream()).toBe(1);
    await server().restart();
    expect((await run).status).toBe(200);
    expect((await repeat).status).toBe(200);
    expect(upstream()).toBe(1);
  }, 40_000);

  it('answers 409 idempotency_key_in_progress at its deadline while Redis is still away, and a repeat once it is back replays the answer', async () => {
    const f = await startFleet({ latencyMs: 2_500 }, [server().url, server().url], { idempotency: {} });
    const [a, b] = f.urls as [string, string];
    const upstream = () => f.mock.requests().length;
    const key = randomUUID();
    const run = ask(a, keyed(key, 20_000));
    await eventually(() => upstream() === 1, 3_000);
    const repeat = ask(b, keyed(key, 2_000));
    await eventually(() => waitingOn(b), 1_500);
    await server().stop();
    expect(await repeat).toMatchObject({ status: 409, code: 'idempotency_key_in_progress', shouldRetry: 'true' });
    // A's run ends while Redis is away: its answer is kept on A, and a new repeat on B, still away, waits for it.
    expect((await run).status).toBe(200);
    expect(await ask(b, keyed(key, 1_000))).toMatchObject({ status: 409, code: 'idempotency_key_in_progress' });
    expect(upstream()).toBe(1);
    await server().restart();
    for (const url of f.urls) await eventually(async () => !(await degradedOn(url)), 15_000);
    expect(await ask(b, keyed(key, 5_000))).toMatchObject({ status: 200 });
    expect(upstream()).toBe(1);
  }, 40_000);
});

describe('a repeat on B, which never saw the run on A, while Redis is frozen (idempotency.waitForRedisMs)', () => {
  /** A's keyed run (4 s upstream), then B's repeat once Redis is frozen: B's commands time out, and B goes degraded. */
  async function repeatInFreeze(idempotency: { waitForRedisMs?: number }) {
    const f = await startFleet({ latencyMs: 4_000 }, [server().url, server().url], { idempotency });
    const [a, b] = f.urls as [string, string];
    const upstream = () => f.mock.requests().length;
    const key = randomUUID();
    const run = ask(a, keyed(key, 20_000));
    await eventually(() => upstream() === 1, 3_000);
    const thaw = server().freeze();
    try {
      const repeat = ask(b, keyed(key, 20_000));
      await eventually(() => degradedOn(b), 5_000);
      // Degraded, B looks again within 150 ms: a run on local state is waited for (a loaded machine is slow to send
      // it), and a repeat that waits for Redis is given a whole second to show it does not run.
      for (const until = Date.now() + 1_000; upstream() < 2 && Date.now() < until; ) await sleep(10);
      const duringFreeze = upstream();
      thaw();
      return { run: await run, repeat: await repeat, duringFreeze, upstream: upstream() };
    } finally {
      thaw();
    }
  }

  it('by default runs it on local state once B is degraded (availability before run-once): two upstream requests', async () => {
    const seen = await repeatInFreeze({});
    expect(seen).toMatchObject({ run: { status: 200 }, repeat: { status: 200 }, duringFreeze: 2, upstream: 2 });
  }, 40_000);

  it("with waitForRedisMs 10000 waits through the freeze, and once Redis answers gets A's answer: one upstream request", async () => {
    const seen = await repeatInFreeze({ waitForRedisMs: 10_000 });
    expect(seen).toMatchObject({ run: { status: 200 }, repeat: { status: 200 }, duringFreeze: 1, upstream: 1 });
  }, 40_000);

  it('answers 409 idempotency_key_in_progress naming the state store at its deadline while Redis is away, and runs on local state past waitForRedisMs', async () => {
    const f = await startFleet({ latencyMs: 200 }, [server().url], { idempotency: { waitForRedisMs: 2_500 } });
    const [a] = f.urls as [string];
    const upstream = () => f.mock.requests().length;
    await server().stop();
    try {
      await eventually(() => degradedOn(a), 5_000);
      const awayFrom = Date.now();
      const key = randomUUID();
      const refused = await askWithMessage(a, keyed(key, 1_000));
      expect(refused).toMatchObject({ status: 409, code: 'idempotency_key_in_progress', shouldRetry: 'true' });
      expect(refused.message).toMatch(/may still be running on another instance \(the state store is away\)/);
      expect(upstream()).toBe(0);
      // Past waitForRedisMs of the outage (counted from the instance going degraded), the key is claimed in the process.
      await sleep(Math.max(0, 2_700 - (Date.now() - awayFrom)));
      expect((await ask(a, keyed(key, 5_000))).status).toBe(200);
      expect(upstream()).toBe(1);
    } finally {
      await server().restart();
    }
  }, 40_000);
});

describe("a repeat's 409 while Redis is away names where its run is", () => {
  it('says the run is still running, not that it may be on another instance, when it is a run of this very instance', async () => {
    const f = await startFleet({ latencyMs: 3_000 }, [server().url], { idempotency: {} });
    const [a] = f.urls as [string];
    await server().stop();
    try {
      await eventually(() => degradedOn(a), 5_000);
      const key = randomUUID();
      // Claimed in the process (Redis away, waitForRedisMs 0): the run is this instance's, and its repeat here waits for it.
      const run = ask(a, keyed(key, 10_000));
      await eventually(() => f.mock.requests().length === 1, 3_000);
      const refused = await askWithMessage(a, keyed(key, 1_000));
      expect(refused).toMatchObject({ status: 409, code: 'idempotency_key_in_progress' });
      expect(refused.message).toMatch(/is still running; send it again/);
      expect((await run).status).toBe(200);
    } finally {
      await server().restart();
    }
  }, 40_000);
});

/** askFleet, with the error's message. */
async function askWithMessage(url: string, headers: Record<string, string>) {
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0, timeout: 15_000 });
  try {
    await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }, { headers });
    return { status: 200 };
  } catch (err) {
    if (!(err instanceof OpenAI.APIError)) throw err;
    return { status: err.status, code: err.code, message: err.message, shouldRetry: err.headers?.get('x-should-retry') };
  }
}
