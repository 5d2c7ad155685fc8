// Review of idempotency keys (2026-12-06): an answer larger than the in-process store's whole idempotency.memoryBytes
// was dropped the moment it was kept, leaving its key free, so the agent's retry ran the tool call a second time; and
// what the README promises of a key's refusals that no test pinned.
import OpenAI from 'openai';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { KeptKeys } from '../src/state/kept-keys.ts';
import { expectOpenAIError, sdkError } from './helpers/openai-error.ts';
import { countingClient, defaultConfig, useStacks, type Stack } from './helpers/stack.ts';

const start = useStacks();

const BODY = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'give the user one coupon' }] };
const upstreamChats = (s: Stack) => s.mock.requests().filter((r) => r.path === '/v1/chat/completions');

/** A raw POST of `text` (the body's bytes as given) under an Idempotency-Key. */
function postRaw(s: Stack, key: string, text: string, headers: Record<string, string> = {}) {
  return fetch(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key, ...headers }, body: text });
}

describe('an answer larger than idempotency.memoryBytes', () => {
  it('is kept as an answer not kept, for ttlMs by the clock it is given: not dropped with its key left free', () => {
    const keys = new KeptKeys(1_000);
    expect(keys.claim('k', { state: 'running', fingerprint: 'fp', sinceMs: 0, owner: 'o' }, 10_000)).toBeUndefined();
    const answer = { status: 200, headers: { 'content-type': 'application/json' }, kind: 'whole' as const, body: Buffer.alloc(2_000, 0x20) };
    keys.settle('k', { state: 'done', fingerprint: 'fp', bytes: 2_000, answer }, 60_000, 100, 'o');
    // Not the answer (it would pass the cap), but the record that it ran: a repeat is told, not run.
    expect(keys.read('k', 59_999)).toEqual({ state: 'done', fingerprint: 'fp', bytes: 2_000 });
    expect(keys.read('k', 60_100)).toBeUndefined();
    // An answer that fits is kept whole, as before.
    keys.settle('small', { state: 'done', fingerprint: 'fp', bytes: 2, answer: { ...answer, body: Buffer.from('{}') } }, 60_000, 100);
    expect(keys.read('small', 200)).toMatchObject({ answer: { body: Buffer.from('{}') } });
  });

  it("the SDK's repeat under the key gets 409 idempotency_answer_not_kept, not a second run of the call", async () => {
    // A gateway without Redis whose memoryBytes is below one answer (as maxAnswerBytes' default, 1 MiB, is above a
    // memoryBytes set to 1 MiB less the record's own bytes): the answer passes maxAnswerBytes' check, then the cap's.
    const s = await start({ config: (url) => ({ ...defaultConfig(url), idempotency: { memoryBytes: 512 } }) });
    const { client, counter } = countingClient(s, { maxRetries: 2 });
    const first = await client.chat.completions.create(BODY, { headers: { 'Idempotency-Key': 'big-1' } });
    expect(first.choices[0]!.message.content).toContain('coupon');
    const err = await sdkError(client.chat.completions.create(BODY, { headers: { 'Idempotency-Key': 'big-1' } }));
    expect(err.status).toBe(409);
    expect(err.code).toBe('idempotency_answer_not_kept');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    // Told once (no SDK retries), and the provider ran the call once.
    expect(counter.requests).toBe(2);
    expect(upstreamChats(s)).toHaveLength(1);
  });
});

describe('what the README promises of a key, pinned', () => {
  it('the same JSON re-serialised (other spacing, other key order) is another body: 422 idempotency_key_reused, nothing sent; the exact bytes are replayed', async () => {
    const s = await start({ faults: { latencyMs: 300 } });
    const exact = JSON.stringify(BODY);
    const run = postRaw(s, 'resend-1', exact);
    await sleep(50);
    // While the run is in flight, and after it: neither waits for it, and neither goes upstream.
    const spaced = await postRaw(s, 'resend-1', JSON.stringify(BODY, null, 2));
    expect((await run).status).toBe(200);
    const reordered = await postRaw(s, 'resend-1', JSON.stringify({ messages: BODY.messages, model: BODY.model }));
    for (const res of [spaced, reordered]) {
      expect(res.status).toBe(422);
      expect(res.headers.get('x-should-retry')).toBe('false');
      // An error the gateway made itself: its own request id, for the SDK's err.requestID.
      expect(res.headers.get('x-request-id')).toBe(res.headers.get('x-stormgate-request-id'));
      expect(expectOpenAIError(await res.json(), 'idempotency_key_reused').param).toBeNull();
    }
    const again = await postRaw(s, 'resend-1', exact);
    expect(again.status).toBe(200);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(upstreamChats(s)).toHaveLength(1);
  });

  it("a provider's 4xx is no answer to keep: the key is given back, and the SDK's next call under it runs and gets the answer", async () => {
    const s = await start({ faults: { errors: [{ status: 400, code: 'invalid_value', message: 'rejected once', times: 1 }] } });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client', maxRetries: 2 });
    const refused = await sdkError(client.chat.completions.create(BODY, { headers: { 'Idempotency-Key': 'fourxx-1' } }));
    expect(refused.status).toBe(400);
    const { data, response } = await client.chat.completions.create(BODY, { headers: { 'Idempotency-Key': 'fourxx-1' } }).withResponse();
    expect(data.choices[0]!.message.content).toContain('coupon');
    expect(response.headers.get('idempotent-replayed')).toBeNull();
    // Once for the 400 (not retried, by the SDK or the gateway), once for the answer; the answer is kept from then on.
    expect(upstreamChats(s)).toHaveLength(2);
    const replay = await client.chat.completions.create(BODY, { headers: { 'Idempotency-Key': 'fourxx-1' } }).withResponse();
    expect(replay.response.headers.get('idempotent-replayed')).toBe('true');
    expect(replay.data.id).toBe(data.id);
    expect(upstreamChats(s)).toHaveLength(2);
  });
});
