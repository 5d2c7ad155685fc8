// Mutation tests for the client token rate's reservations (commit a0cb981, QA rev11): the estimate of a body sending
// images and files inline (src/policy/token-estimate.ts), a reservation settled for a request that never went
// upstream (src/http/client-limits.ts, src/server.ts), and the refusal queue's told time as Redis forgets it
// (src/policy/client-rate.ts against RESERVE_TOKENS).
// Hand mutants, all killed here: M1 no walk for large bodies (image test), M2 every payload an image (file test), M3 any
// long `data` string a payload (prose test), M4 server.ts settles as sent whenever a summary exists (shed test), M5
// settlement keeps the prompt without usage whether sent or not (settlement test), M6 the in-process queue never
// forgets a told time (told test); the Lua twin of M6 (RESERVE_TOKENS keeps a stale told) fails the parity test too.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { describe, expect, it } from 'vitest';
import { ConfigSchema } from '../src/config/schema.ts';
import { clientLimits } from '../src/http/client-limits.ts';
import { clientRates, QUEUE_AHEAD_MS, reserveTokens, settlement } from '../src/policy/client-rate.ts';
import { INLINE_IMAGE_TOKENS, INLINE_WALK_FROM_BYTES, tokenEstimate } from '../src/policy/token-estimate.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import { RedisKeys } from '../src/state/redis-keys.ts';
import { defineScripts } from '../src/state/redis-scripts.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { defaultConfig, RETRY_LOOP_ONLY, useExtraMocks, useGateways } from './helpers/stack.ts';

/** A base64 payload of `bytes` decoded bytes (no padding for a multiple of 3). */
const base64Of = (bytes: number) => Buffer.alloc(bytes, 7).toString('base64');
const estimateOf = (api: Parameters<typeof tokenEstimate>[0], body: Record<string, unknown>) => tokenEstimate(api, Buffer.byteLength(JSON.stringify(body)), body);
const text = 'Describe this. '.repeat(40);

describe('the estimate of a body that sends images and files inline', () => {
  const megabyteImage = base64Of(786_432); // 1 MiB of base64

  it('counts an image as INLINE_IMAGE_TOKENS, not its bytes / 4, in every API\'s shape', () => {
    const chat = { model: 'm', messages: [{ role: 'user', content: [{ type: 'text', text }, { type: 'image_url', image_url: { url: `data:image/png;base64,${megabyteImage}` } }] }] };
    const responses = { model: 'm', input: [{ role: 'user', content: [{ type: 'input_text', text }, { type: 'input_image', image_url: `data:image/jpeg;base64,${megabyteImage}` }] }] };
    const messages = { model: 'm', max_tokens: 100, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: megabyteImage } }, { type: 'text', text }] }] };
    for (const [api, body] of [['chat', chat], ['responses', responses], ['messages', messages]] as const) {
      const rest = Buffer.byteLength(JSON.stringify(body)) - (JSON.stringify(body).length - JSON.stringify(body).replace(megabyteImage, '').length);
      const { prompt } = estimateOf(api, body);
      // The body without the payload, at bytes / 4, plus one image's allowance (the data URL's prefix aside).
      expect(prompt).toBeGreaterThanOrEqual(Math.ceil(rest / 4) - 10 + INLINE_IMAGE_TOKENS);
      expect(prompt).toBeLessThanOrEqual(Math.ceil(rest / 4) + INLINE_IMAGE_TOKENS);
      expect(prompt).toBeLessThan(3_000);
    }
    // Two images, two allowances.
    const two = { model: 'm', messages: [{ role: 'user', content: [1, 2].map(() => ({ type: 'image_url', image_url: { url: `data:image/webp;base64,${megabyteImage}` } })) }] };
    expect(estimateOf('chat', two).prompt).toBeGreaterThanOrEqual(2 * INLINE_IMAGE_TOKENS);
    expect(estimateOf('chat', two).prompt).toBeLessThan(2 * INLINE_IMAGE_TOKENS + 100);
  });

  it('counts a file (a PDF, audio) by its decoded bytes / 4, and leaves prose, URLs and small bodies alone', () => {
    const pdf = base64Of(300_000);
    const file = { model: 'm', input: [{ role: 'user', content: [{ type: 'input_file', filename: 'a.pdf', file_data: `data:application/pdf;base64,${pdf}` }] }] };
    expect(estimateOf('responses', file).prompt).toBeGreaterThanOrEqual(75_000);
    expect(estimateOf('responses', file).prompt).toBeLessThan(75_000 + 100);
    const document = { model: 'm', max_tokens: 10, messages: [{ role: 'user', content: [{ type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: pdf } }] }] };
    expect(estimateOf('messages', document).prompt).toBeLessThan(75_000 + 100);
    const audio = { model: 'm', messages: [{ role: 'user', content: [{ type: 'input_audio', input_audio: { format: 'wav', data: pdf } }] }] };
    expect(estimateOf('chat', audio).prompt).toBeLessThan(75_000 + 100);
    // A long text under a `data` key, or an image by URL, is prompt: its bytes / 4 as before.
    const prose = { model: 'm', messages: [{ role: 'user', content: 'x' }], metadata: { data: text.repeat(200) } };
    expect(estimateOf('chat', prose).prompt).toBe(Math.ceil(Buffer.byteLength(JSON.stringify(prose)) / 4));
    const url = { model: 'm', messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: `https://example.com/${'a'.repeat(100_000)}.png` } }] }] };
    expect(estimateOf('chat', url).prompt).toBe(Math.ceil(Buffer.byteLength(JSON.stringify(url)) / 4));
    // A body up to INLINE_WALK_FROM_BYTES is not walked: a 40 KiB image counts by its bytes.
    const small = { model: 'm', messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: `data:image/png;base64,${base64Of(30_000)}` } }] }] };
    const smallBytes = Buffer.byteLength(JSON.stringify(small));
    expect(smallBytes).toBeLessThanOrEqual(INLINE_WALK_FROM_BYTES);
    expect(estimateOf('chat', small).prompt).toBe(Math.ceil(smallBytes / 4));
  });
});

describe('a reservation settled for a request that never went upstream', () => {
  it('gives back the whole estimate when no attempt was sent, and keeps the prompt when one was', () => {
    expect(settlement({ prompt: 1_000, completion: 300 }, undefined, false)).toBe(-1_300);
    expect(settlement({ prompt: 1_000, completion: 300 }, undefined, true)).toBe(-300);
    expect(settlement({ prompt: 1_000, completion: 300 }, 700, true)).toBe(-600);
    const store = new MemoryStore();
    const spent: number[] = [];
    store.spendTokens = (_client, _rate, tokens) => void spent.push(tokens);
    const limit = clientLimits({ agents: { tokensPerMinute: 600 } }, { store, now: () => 0, random: () => 0, onLimited: () => {} })!;
    limit.settle('agents', { prompt: 400, completion: 100 }, { usage: [], sentUpstream: false });
    limit.settle('agents', { prompt: 400, completion: 100 }, { usage: [undefined], sentUpstream: true });
    expect(spent).toEqual([-500, -100]);
  });

  const startGateway = useGateways();
  const startMock = useExtraMocks();

  it('a request the provider\'s pool sheds (no attempt sent) costs its client none of its estimate', async () => {
    const mock = await startMock({ faults: { latencyMs: 800 } });
    const base = defaultConfig(mock.url, RETRY_LOOP_ONLY);
    const config = ConfigSchema.parse({
      ...base,
      // One request at a time, none queued: a second one is shed before it is sent.
      providers: { mock: { ...base.providers.mock!, maxConnections: 1, pools: { maxConcurrent: 1, classes: { online: { minShare: 0.5, maxQueue: 0 } } } } },
      routes: base.routes.map((r) => ({ ...r, park: false })),
      auth: { keys: { agents: 'key-agents' }, limits: { agents: { tokensPerMinute: 6_000 } } },
    });
    const url = await startGateway(config);
    const call = (chars: number) => fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: 'Bearer key-agents', 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'x'.repeat(chars) }] }),
    }).then(async (r) => ({ status: r.status, json: (await r.json()) as { error?: { code?: string } } }));
    // Each reserves ~2,000 of the 6,000 a minute; the first holds the pool's one slot.
    const first = call(8_000);
    await sleep(150);
    const shed = await call(8_000);
    expect(shed.status).toBe(429);
    expect(shed.json.error?.code).toBe('load_shed');
    expect((await first).status).toBe(200);
    await sleep(100);
    // ~4,000 left (and a second's worth back): a request of ~3,000 fits. Had the shed one kept its prompt's ~2,000,
    // ~2,100 would be left, and it would be refused.
    const after = await call(12_000);
    expect(after.json.error?.code).toBeUndefined();
    expect(after.status).toBe(200);
  });
});

describe('the refusal queue\'s told time, once it has passed', () => {
  const redis = useRedisServer();

  it('is forgotten a second after it, by the in-process store as by RESERVE_TOKENS (whose key expires): a refusal then waits its own time, not a whole slot after it', async () => {
    const client = defineScripts(new Redis(redis().url));
    try {
      const keys = new RedisKeys(`told-${randomUUID()}`);
      const rates = clientRates({ tokensPerMinute: 600 }); // a token each 100 ms, 600 at once
      const tokens = { ...rates, tokens: rates.tokens! };
      const [requestsKey, tokensKey, toldKey] = [keys.clientRate('a', 'requests', undefined), keys.clientRate('a', 'tokens', rates.tokens), keys.clientTold('a', rates)];
      // An estimate of 500: its slot in the queue is 50 s. The bucket holds 100 ms too few for it.
      const reserve = async (nowMs: number, shortMs: number) => {
        await client.set(tokensKey, String(nowMs + 100 * 100 + shortMs), 'PX', 60_000);
        const [waitMs] = await client.sgReserveTokens(requestsKey, tokensKey, toldKey, nowMs, 0, rates.tokens!.intervalMs, rates.tokens!.burst, 500, QUEUE_AHEAD_MS);
        return waitMs;
      };
      const firstMs = Date.now();
      expect(await reserve(firstMs, 100)).toBe(100);
      const first = reserveTokens({ tokens: firstMs + 10_100 }, firstMs, tokens, 500);
      expect(first).toMatchObject({ admitted: false, waitMs: 100, toldMs: firstMs + 100 });
      // Past the told time and its second, Redis has dropped the key: the next refusal is told its own wait.
      await sleep(1_400);
      const laterMs = Date.now();
      expect(await reserve(laterMs, 200)).toBe(200);
      const later = reserveTokens({ tokens: laterMs + 10_200, told: firstMs + 100 }, laterMs, tokens, 500);
      expect(later).toMatchObject({ admitted: false, waitMs: 200 });
      // Within its second, both still queue behind it.
      const within = reserveTokens({ tokens: firstMs + 900 + 10_100, told: firstMs + 100 }, firstMs + 900, tokens, 500);
      expect(within).toMatchObject({ admitted: false, toldMs: firstMs + 100 + 50_000 });
    } finally {
      client.disconnect();
    }
  });
});
