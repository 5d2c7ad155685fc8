// Review of the reask at the end of a capped hold-off (state/hold-offs.ts reask) and of the credential hold begun
// during a pool slot wait (target-attempts.ts goneMeanwhile): cases the change's own tests left out.
import { describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { MAX_HOLD_OFF_MS, REASK_HOLD_MS } from '../src/state/hold-offs.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import type { Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';

const NO_SPREAD = () => 0;
const start = useScriptedUpstreams();
const refused = { error: { message: 'You exceeded your current quota for the day.', type: 'requests', param: null, code: 'rate_limit_exceeded' } };
const completion = (content: string) => ({ id: 'chatcmpl-1', object: 'chat.completion', created: 1, model: 'gpt-4o', choices: [{ index: 0, message: { role: 'assistant', content }, finish_reason: 'stop' }], usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } });
const answer = (content: string, delayMs = 0): Script => ({ status: 200, headers: { 'content-type': 'application/json' }, steps: [delayMs, JSON.stringify(completion(content))] });
const dailyQuota: Script = { status: 429, headers: { 'content-type': 'application/json', 'retry-after': '3600' }, steps: [JSON.stringify(refused)] };

type Outcome = { status: number | undefined; code: string | null; text: string | null };
const asker = (client: OpenAI) => (model: string): Promise<Outcome> =>
  client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }] }).then(
    (c) => ({ status: 200, code: null, text: c.choices[0]!.message.content }),
    (e: InstanceType<typeof OpenAI.APIError>) => ({ status: e.status, code: (e.code as string | null) ?? null, text: null }),
  );

describe('the request that asks again at the end of a capped hold-off', () => {
  it('is not turned away by its own claim when it waits for a slot in the provider pool', async () => {
    let skewMs = 0;
    let back = false;
    const { client, seen } = await start(
      // One provider, two models (two targets, one pool of one connection): a slow answer on one holds the slot.
      { primary: (body) => (body['model'] === 'slow' ? answer('slow', 1_000) : back ? answer('back') : dailyQuota) },
      [{ provider: 'primary' }],
      { providers: { primary: { maxConnections: 1 } }, deps: { now: () => Date.now() + skewMs, random: NO_SPREAD } },
    );
    const ask = asker(client);
    expect((await ask('gpt-4o')).status).toBe(429); // a daily quota: held off for a minute, capped
    back = true;
    skewMs += MAX_HOLD_OFF_MS + 1;
    const slow = ask('slow');
    while (seen.primary!.length < 2) await new Promise((r) => setTimeout(r, 10));
    // The capped hold-off is over: this request is the one to ask again, and waits for the slot the slow one holds.
    const reasker = await ask('gpt-4o');
    expect(reasker).toMatchObject({ status: 200, text: 'back' });
    expect((await slow).text).toBe('slow');
    expect(seen.primary!.map((s) => s.body['model'])).toEqual(['gpt-4o', 'slow', 'gpt-4o']);
  });
});

describe("the adaptive limit after a capped hold-off's end is asked again", () => {
  /** The adaptive limit of the one target, as the gateway reports it. */
  async function limitOf(url: string): Promise<number> {
    const text = await (await fetch(`${url}/metrics`)).text();
    return Number(text.split('\n').find((l) => l.startsWith('stormgate_pool_limit{target="primary/gpt-4o"}'))?.split(' ')[1]);
  }

  // The limit restarts at half once per hold-off, when it is over (runtime.ts): the short hold the request that asks
  // again puts on the others is no second pause of the provider's, and halved the limit once more (64 -> 16).
  it('restarts at half once, not again when the hold of the request that asked again is over', async () => {
    const store = new MemoryStore();
    const { s, client } = await start({ primary: () => answer('back') }, [{ provider: 'primary' }], { deps: { store, random: NO_SPREAD } });
    const ask = asker(client);
    expect((await ask('gpt-4o')).status).toBe(200);
    const full = await limitOf(s.url);
    // What a daily quota's retry-after: 3600 leaves (hold-offs.ts start), its capped minute cut to 300 ms here.
    const now = Date.now();
    await store.setHoldOff('primary/gpt-4o#asked', now + 3_600_000);
    await store.setHoldOff('primary/gpt-4o#long', now + 300);
    await store.setHoldOff('primary/gpt-4o', now + 300, now);
    await new Promise((r) => setTimeout(r, 500));
    const halved = await limitOf(s.url);
    expect(halved).toBeLessThan(full);
    // One request asks again (the provider answers), holding the others back for REASK_HOLD_MS.
    expect((await ask('gpt-4o')).text).toBe('back');
    expect(store.getHoldOff('primary/gpt-4o')).toBeGreaterThanOrEqual(now + 300 + REASK_HOLD_MS); // its claim
    await new Promise((r) => setTimeout(r, REASK_HOLD_MS + 300));
    expect(await limitOf(s.url)).toBeGreaterThanOrEqual(halved);
  });
});
