// The end of a hold-off capped short of what the provider asked for (retry-after: 3600 from a spent daily quota,
// capped at a minute): the gateway asks the provider again with one request, and holds the rest back for the
// moment its answer takes (REASK_HOLD_MS). Every request that arrived before that answer used to go too, and at high
// traffic the provider got a burst of requests each minute, each one refused.
import { describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { MemoryStore } from '../src/state/memory-store.ts';
import { HoldOffs, MAX_HOLD_OFF_MS, REASK_HOLD_MS, flexTierKey } from '../src/state/hold-offs.ts';
import type { WaitHint } from '../src/policy/wait-hint.ts';
import type { Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';
import { eventually, loggedStores } from './helpers/redis-stores.ts';
import { useRedisServer } from './helpers/redis-server.ts';

const T = 1_700_000_000_000;
const NO_SPREAD = () => 0;
const hint = (delayMs: number): WaitHint => ({ delayMs, source: 'retry-after', fleetWide: true });

describe('HoldOffs.reask', () => {
  it('lets one request ask again at the end of a capped hold-off and holds the others back for its answer', async () => {
    let now = T;
    const holdOffs = new HoldOffs(new MemoryStore(), () => now, NO_SPREAD);
    holdOffs.start('p/m', hint(3_600_000));
    expect(holdOffs.reask('p/m')).toBeUndefined(); // in force: nothing to ask yet
    now = T + MAX_HOLD_OFF_MS;
    expect(holdOffs.until('p/m')).toBeUndefined();
    expect(await holdOffs.reask('p/m')).toBe(true);
    // The others see a short hold-off: they wait for the answer, and are told when it ends.
    expect(holdOffs.until('p/m')).toBe(now + REASK_HOLD_MS);
    expect(holdOffs.askedUntil('p/m')).toBe(now + REASK_HOLD_MS);
    expect(holdOffs.reask('p/m')).toBeUndefined();
    // No answer came to start another hold-off (the provider answered): after the short hold, requests go as ever.
    now += REASK_HOLD_MS;
    expect(holdOffs.until('p/m')).toBeUndefined();
    expect(holdOffs.reask('p/m')).toBeUndefined();
  });

  it('asks nothing again after a hold-off the provider asked for in full, or once its own end has come', () => {
    let now = T;
    const holdOffs = new HoldOffs(new MemoryStore(), () => now, NO_SPREAD);
    holdOffs.start('p/short', hint(30_000));
    holdOffs.start('p/long', hint(90_000));
    now = T + 30_000;
    expect(holdOffs.reask('p/short')).toBeUndefined();
    now = T + 90_000; // the capped one ended at 60 s, and the provider's 90 s have come too
    expect(holdOffs.reask('p/long')).toBeUndefined();
  });

  it('asks again once per capped hold-off: a refusal starts the next one, which is asked again at its end', async () => {
    let now = T;
    const holdOffs = new HoldOffs(new MemoryStore(), () => now, NO_SPREAD);
    holdOffs.start('p/m', hint(3_600_000));
    now = T + MAX_HOLD_OFF_MS;
    expect(await holdOffs.reask('p/m')).toBe(true);
    now += 300;
    holdOffs.start('p/m', hint(3_600_000 - MAX_HOLD_OFF_MS - 300)); // refused again, told the same end
    now += MAX_HOLD_OFF_MS;
    expect(await holdOffs.reask('p/m')).toBe(true);
  });

  it("holds a flex tier's requests for the target's own capped hold-off too", async () => {
    let now = T;
    const holdOffs = new HoldOffs(new MemoryStore(), () => now, NO_SPREAD);
    holdOffs.start('p/m', hint(3_600_000));
    now = T + MAX_HOLD_OFF_MS;
    expect(await holdOffs.reask(flexTierKey('p/m'))).toBe(true);
    expect(holdOffs.until('p/m')).toBe(now + REASK_HOLD_MS);
  });
});

const redis = useRedisServer();
const storeOn = loggedStores('reask');

describe('HoldOffs.reask across a fleet (a real redis-server)', () => {
  it('of two instances claiming at once, one asks', async () => {
    const keyPrefix = `reask-${process.pid}-${Date.now()}`;
    const a = storeOn(redis().url, keyPrefix).store;
    const b = storeOn(redis().url, keyPrefix).store;
    let now = Date.now();
    const first = new HoldOffs(a, () => now, NO_SPREAD);
    const second = new HoldOffs(b, () => now, NO_SPREAD);
    first.start('p/m', hint(3_600_000));
    // Both instances have heard of the capped hold-off and its side keys.
    await second.firstRead('p/m');
    await eventually(() => second.askedUntil('p/m') === first.askedUntil('p/m') && second.askedUntil('p/m')! > now + MAX_HOLD_OFF_MS, 2_000);
    now += MAX_HOLD_OFF_MS;
    const claims = await Promise.all([first.reask('p/m'), second.reask('p/m')]);
    expect(claims.filter((c) => c === true)).toHaveLength(1);
  });
});

const start = useScriptedUpstreams();
const refused = { error: { message: 'You exceeded your current quota for the day.', type: 'requests', param: null, code: 'rate_limit_exceeded' } };
const completion = { id: 'chatcmpl-1', object: 'chat.completion', created: 1, model: 'gpt-4o', choices: [{ index: 0, message: { role: 'assistant', content: 'back' }, finish_reason: 'stop' }], usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } };

const answered: Script = { status: 200, headers: { 'content-type': 'application/json' }, steps: [300, JSON.stringify(completion)] };
/** The daily quota's refusal, its body after `delayMs`. */
const refusal = (delayMs: number): Script => ({ status: 429, headers: { 'content-type': 'application/json', 'retry-after': '3600' }, steps: [delayMs, JSON.stringify(refused)] });

describe('the end of a capped hold-off, through the gateway', () => {
  it('sends one of a burst of requests to the provider: the others are told to come back once it has answered', async () => {
    let skewMs = 0;
    let back = false;
    const { client, seen } = await start(
      {
        primary: () => (back ? answered : refusal(300)),
      },
      [{ provider: 'primary' }],
      { deps: { now: () => Date.now() + skewMs, random: NO_SPREAD } },
    );
    const ask = () => client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }).withResponse().then((r) => ({ status: 200, retryAfter: null, shouldRetry: null, code: null, text: r.data.choices[0]!.message.content }), (e: InstanceType<typeof OpenAI.APIError>) => ({ status: e.status, retryAfter: e.headers?.get('retry-after') ?? null, shouldRetry: e.headers?.get('x-should-retry') ?? null, code: e.code ?? null, text: null }));
    expect((await ask()).status).toBe(429);
    expect(seen.primary).toHaveLength(1);

    // A minute later, still refused: one request asks, the provider's refusal is what the others hear of too.
    skewMs += MAX_HOLD_OFF_MS + 1;
    const burst = await Promise.all(Array.from({ length: 5 }, ask));
    expect(seen.primary).toHaveLength(2);
    expect(burst.every((a) => a.status === 429)).toBe(true);
    const heldBack = burst.filter((a) => a.code === 'provider_held_off');
    expect(heldBack).toHaveLength(4);
    // Told to come back when the answer is in, and invited to (a wait the gateway knows the end of, within 60 s).
    for (const a of heldBack) expect(a).toMatchObject({ shouldRetry: 'true', retryAfter: String(REASK_HOLD_MS / 1000) });

    // Another minute: the provider is back. One request asks and is answered; after the short hold everyone is.
    back = true;
    skewMs += MAX_HOLD_OFF_MS + 1;
    const next = await Promise.all(Array.from({ length: 5 }, ask));
    expect(seen.primary).toHaveLength(3);
    expect(next.filter((a) => a.status === 200)).toHaveLength(1);
    skewMs += REASK_HOLD_MS;
    const after = await Promise.all(Array.from({ length: 3 }, ask));
    expect(after.map((a) => a.text)).toEqual(['back', 'back', 'back']);
    expect(seen.primary).toHaveLength(6);
  });

  it('with parking on, the requests held back wait for the answer and are then served: none refused, one sent first', async () => {
    let skewMs = 0;
    let back = false;
    const { client, seen } = await start(
      {
        primary: () => (back ? answered : refusal(0)),
      },
      [{ provider: 'primary' }],
      { deps: { now: () => Date.now() + skewMs, random: NO_SPREAD }, route: { park: {} } },
    );
    const ask = () => client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    await expect(ask()).rejects.toMatchObject({ status: 429 });
    back = true;
    skewMs += MAX_HOLD_OFF_MS + 1;
    const started = Date.now();
    const burst = await Promise.all(Array.from({ length: 4 }, ask));
    expect(burst.map((c) => c.choices[0]!.message.content)).toEqual(['back', 'back', 'back', 'back']);
    expect(seen.primary).toHaveLength(5);
    // The three held back went once the short hold was over (the clock is real apart from the skew).
    expect(Date.now() - started).toBeGreaterThanOrEqual(REASK_HOLD_MS - 100);
  });

  it('with the state in Redis, one of a burst of twenty asks again', async () => {
    let skewMs = 0;
    const { client, seen } = await start({ primary: () => refusal(300) }, [{ provider: 'primary' }], {
      deps: { now: () => Date.now() + skewMs, random: NO_SPREAD },
      extra: { state: { redis: redis().url, keyPrefix: `reask-burst-${process.pid}-${Date.now()}` } },
    });
    const ask = () => client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }).then(() => 200, (e: { status?: number }) => e.status);
    expect(await ask()).toBe(429);
    skewMs += MAX_HOLD_OFF_MS + 1;
    // The claim goes through Redis (its script says which instance asked first): the others hear of it from the view
    // the claim wrote into at once, not a round trip later.
    const burst = await Promise.all(Array.from({ length: 20 }, ask));
    expect(burst.every((status) => status === 429)).toBe(true);
    expect(seen.primary).toHaveLength(2);
  });
});

