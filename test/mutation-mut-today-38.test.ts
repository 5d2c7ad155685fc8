// Mutation round 38: tests that kill mutations the existing suite let live, in code that landed on 2026-12-05: an
// Anthropic error object in a 200 (pipeline/attempt.ts familyErrorIn200: the status and error code it stands for), the
// in-process idempotency store's sweep of expired records over its cap (state/kept-keys.ts #evict, SWEEP_EVERY_MS),
// a Responses API request with a `conversation` (policy/outcome.ts maySendAgain, stream-events.ts addsToConversation),
// and a passthrough error body in an encoding the gateway cannot decode (providers/passthrough.ts errorWithoutKey).
// 53 hand mutations: 24 killed by existing files, 5 equivalent (serve-targets' maySendAgain gets a committing request
// only with its one pinned target; a header value trimmed, or '' for none, as encodingOf takes it anyway; the break's
// `reply.raw.destroyed` guard: no error follows a client's close; familyErrorIn200 for a body cut short: never an error
// object), 24 killed here, none open. The store runs on times the test passes; the rest over real HTTP against
// scripted upstreams.
import { gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { KeptKeys } from '../src/state/kept-keys.ts';
import type { KeyRecord } from '../src/state/store.ts';
import { streamShapeOf } from '../src/streaming/stream-events.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { FILES_PROVIDER, filesPassthrough } from './helpers/passthrough-files.ts';
import { requestLine, useStacks } from './helpers/stack.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';
import { anthropicMessage, completion, json, responsesHead, responsesTail, textDelta, type Script } from './helpers/scripted-provider.ts';

describe('an Anthropic error object in a 200 stands for its status and code (attempt familyErrorIn200)', () => {
  const start = useScriptedUpstreams();
  const tooLong = { type: 'error', error: { type: 'invalid_request_error', message: 'prompt is too long: 215000 tokens > 200000 maximum' } };
  const overloaded = { type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } };

  it("sends a context error in a 200 to the route's contextWindowFallback, as its 400 would go (the errorCode it stands for)", async () => {
    const { client, seen } = await start({ a: { answer: () => json(200, tooLong), family: 'anthropic' }, big: () => completion('from the big one', 'gpt-4.1') }, [{ provider: 'a', model: 'claude-sonnet-4-6' }], {
      route: { contextWindowFallback: { provider: 'big', model: 'gpt-4.1' } },
    });
    const { data, response } = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }).withResponse();
    expect(data.choices[0]!.message.content).toBe('from the big one');
    expect(response.headers.get('x-stormgate-fallback')).toBe('context_length');
    expect(seen.a).toHaveLength(1);
    expect(seen.big).toHaveLength(1);
  });

  it('reaches a chat client (translated) as the 400 it stands for, with its code', async () => {
    const { client } = await start({ a: { answer: () => json(200, tooLong), family: 'anthropic' } }, [{ provider: 'a', model: 'claude-sonnet-4-6' }]);
    const err = (await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }).then(
      () => undefined,
      (e: unknown) => e,
    )) as { status?: number; code?: string | null; message?: string } | undefined;
    expect(err?.status).toBe(400);
    expect(err?.code).toBe('context_length_exceeded');
    expect(err?.message).toContain('prompt is too long');
  });

  it('reaches an Anthropic client as the 400 it stands for, in its own shape', async () => {
    const { s } = await start({ a: { answer: () => json(200, tooLong), family: 'anthropic' } }, [{ provider: 'a' }], { path: '/v1/messages' });
    const res = await fetch(`${s.url}/v1/messages`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-api-key': 'client-key', 'anthropic-version': '2023-06-01' },
      body: JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 16, messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(res.status).toBe(400);
    expect(await res.json()).toMatchObject(tooLong);
  });

  it('logs the attempt with the status the error stands for (529), not the 200 it came with', async () => {
    const { s, client } = await start({ a: { answer: (_b, n) => (n === 1 ? json(200, overloaded) : anthropicMessage('fine')), family: 'anthropic' } }, [{ provider: 'a', model: 'claude-sonnet-4-6' }]);
    const r = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    expect(r.choices[0]!.message.content).toBe('fine');
    const line = await requestLine(s);
    expect(line.attempts[0].status).toBe(529);
  });
});

describe('KeptKeys over its cap: the sweep of expired records, at most once in SWEEP_EVERY_MS (kept-keys #evict)', () => {
  const T = 1_700_000_000_000;
  const BODY = 10_000;
  /** An answer counted for 10,259 bytes under a one-letter key (256 overhead + key + "fp" + body, no headers). */
  const answer: KeyRecord & { state: 'done' } = { state: 'done', fingerprint: 'fp', bytes: BODY, answer: { status: 200, headers: {}, kind: 'whole', body: Buffer.alloc(BODY) } };
  const SIZE = 256 + 1 + 2 + BODY;
  /** A running claim counted as much as an answer (its fingerprint as long as an answer's body). */
  const claim = (sinceMs: number): KeyRecord & { state: 'running' } => ({ state: 'running', fingerprint: 'f'.repeat(BODY + 2), sinceMs, owner: 'o' });
  /** A store that holds three such records (and `slack` bytes more), swept at `sweptAtMs` and empty again. */
  function store(slack: number, sweptAtMs?: number): KeptKeys {
    const keys = new KeptKeys(3 * SIZE + slack);
    if (sweptAtMs !== undefined) {
      for (const k of ['w', 'x', 'y', 'z']) keys.settle(k, answer, 60_000, sweptAtMs);
      for (const k of ['w', 'x', 'y', 'z']) keys.release(k);
    }
    return keys;
  }

  it('sweeps again once SWEEP_EVERY_MS (a second) has passed since the last sweep, to the millisecond', () => {
    const keys = store(100);
    keys.settle('p', answer, 100, T);
    keys.settle('a', answer, 60_000, T);
    keys.settle('s', answer, 500, T);
    // Over the cap: the first sweep takes p, expired.
    keys.settle('b', answer, 60_000, T + 200);
    expect(keys.read('a', T + 200)).toEqual(answer);
    // s lapsed behind a, which is still in force: the sweep SWEEP_EVERY_MS later takes s, not a.
    keys.settle('c', answer, 60_000, T + 1_200);
    expect(keys.read('a', T + 1_200)).toEqual(answer);
    expect(keys.read('b', T + 1_200)).toEqual(answer);
    expect(keys.read('c', T + 1_200)).toEqual(answer);
  });

  it('sweeps a record that lapses at that very millisecond (expired as read() has it)', () => {
    const keys = store(100);
    keys.settle('a', answer, 60_000, T);
    keys.settle('s', answer, 1_000, T);
    keys.settle('b', answer, 60_000, T);
    keys.settle('c', answer, 60_000, T + 1_000);
    expect(keys.read('a', T + 1_000)).toEqual(answer);
    expect(keys.read('c', T + 1_000)).toEqual(answer);
  });

  it('sweeps at once on a clock that starts at 0 (no sweep before it counts as long ago)', () => {
    const keys = store(100);
    keys.settle('a', answer, 60_000, 0);
    keys.settle('s', answer, 100, 0);
    keys.settle('b', answer, 60_000, 0);
    keys.settle('c', answer, 60_000, 200);
    expect(keys.read('a', 200)).toEqual(answer);
  });

  it('within SWEEP_EVERY_MS of a sweep walks from the oldest end only: a record lapsed behind an answer in force costs it its place', () => {
    // The documented trade-off: the walk over every record runs at most once a second.
    const keys = store(100, T);
    keys.settle('a', answer, 60_000, T + 10);
    keys.settle('s', answer, 100, T + 10);
    keys.settle('b', answer, 60_000, T + 200);
    keys.settle('c', answer, 60_000, T + 300);
    expect(keys.read('a', T + 300)).toBeUndefined();
    expect(keys.read('b', T + 300)).toEqual(answer);
    expect(keys.read('c', T + 300)).toEqual(answer);
  });

  it('drops a lapsed running claim at the oldest end for room before an answer in force (within the sweep interval)', () => {
    const keys = store(100, T);
    expect(keys.claim('r', claim(T + 10), 100)).toBeUndefined();
    keys.settle('a', answer, 60_000, T + 10);
    keys.settle('b', answer, 60_000, T + 10);
    keys.settle('c', answer, 60_000, T + 500);
    expect(keys.read('a', T + 500)).toEqual(answer);
    expect(keys.read('b', T + 500)).toEqual(answer);
  });

  it('makes room when a claim takes the store over its cap, not at the next answer kept', () => {
    const keys = store(100);
    for (const k of ['a', 'b', 'c']) keys.settle(k, answer, 60_000, T);
    expect(keys.claim('r', claim(T + 10), 60_000)).toBeUndefined();
    expect(keys.read('a', T + 10)).toBeUndefined();
    expect(keys.read('b', T + 10)).toEqual(answer);
    expect(keys.read('r', T + 10)?.state).toBe('running');
  });

  it('does not sweep a store exactly at its cap: that sweep would hold off the one it needs once over it', () => {
    const keys = store(0);
    keys.settle('a', answer, 60_000, T);
    keys.settle('e', answer, 100, T);
    // Exactly at the cap: within it, no walk, nothing dropped.
    keys.settle('f', answer, 50, T + 200);
    expect(keys.read('a', T + 200)).toEqual(answer);
    // Over it: the first sweep takes e and f, both lapsed.
    keys.settle('b', answer, 60_000, T + 300);
    keys.settle('c', answer, 60_000, T + 400);
    expect(keys.read('a', T + 400)).toEqual(answer);
    expect(keys.read('b', T + 400)).toEqual(answer);
    expect(keys.read('c', T + 400)).toEqual(answer);
  });
});

describe('a passthrough error body by its content-encoding (passthrough errorWithoutKey)', () => {
  const startStack = useStacks();
  const startProvider = useFakeProviders();
  const KEY = `${FILES_PROVIDER}-key`;
  const twice = (text: string) => gzipSync(gzipSync(text));

  it('passes on an error said to be in `Identity` (any case), its key taken out, as one with no coding', async () => {
    const provider = await startProvider((req, res) => {
      req.resume();
      const body = JSON.stringify({ error: { message: `No such File object: file-abc (key ${String(req.headers.authorization)})`, type: 'invalid_request_error', param: 'id', code: null } });
      res.writeHead(404, { 'content-type': 'application/json', 'content-encoding': 'Identity' }).end(body);
    });
    const s = await filesPassthrough(startStack, provider.origin);
    const res = await fetch(`${s.url}/v1/files/file-abc`);
    expect(res.status).toBe(404);
    const text = await res.text();
    expect(text).toContain('No such File object: file-abc');
    expect(text).not.toContain(KEY);
  });

  it('passes on an error with no content-encoding, its key taken out', async () => {
    const provider = await startProvider((req, res) => {
      req.resume();
      const body = JSON.stringify({ error: { message: `No such File object: file-abc (key ${String(req.headers.authorization)})`, type: 'invalid_request_error', param: 'id', code: null } });
      res.writeHead(404, { 'content-type': 'application/json' }).end(body);
    });
    const s = await filesPassthrough(startStack, provider.origin);
    const res = await fetch(`${s.url}/v1/files/file-abc`);
    expect(res.status).toBe(404);
    const text = await res.text();
    expect(text).toContain('No such File object: file-abc (key Bearer [redacted])');
    expect(text).not.toContain(KEY);
  });

  it('does not pass on a redirect body whose coding is stacked over two content-encoding lines', async () => {
    // Two header lines reach the passthrough as an array: joined, they are the stacked `gzip, gzip` it cannot decode.
    const provider = await startProvider((req, res) => {
      req.resume();
      res.setHeader('content-encoding', ['gzip', 'gzip']);
      res.writeHead(307, { location: '/v1/files/file-abc', 'content-type': 'text/plain' }).end(twice(`moved; you sent ${String(req.headers.authorization)}`));
    });
    const s = await filesPassthrough(startStack, provider.origin);
    const res = await fetch(`${s.url}/v1/files/old`, { redirect: 'manual' });
    expect(res.status).toBe(307);
    expect(res.headers.get('content-encoding')).toBeNull();
    expect(Buffer.from(await res.arrayBuffer())).toHaveLength(0);
  });
});

describe('a Responses stream starts at response.created for `background: true` only, as plan-targets pins it (streamShapeOf)', () => {
  it('takes a background that is not the boolean true as none', () => {
    expect(streamShapeOf('responses', { background: 'true' })).toEqual({ choices: 1, usage: false });
    expect(streamShapeOf('responses', { background: 1 })).toEqual({ choices: 1, usage: false });
    expect(streamShapeOf('responses', { background: true })).toEqual({ choices: 1, usage: false, startsAtCreated: 'background' });
  });
});

describe('a Responses stream with a conversation, started at its response.created (attempt beforeOutput)', () => {
  const start = useScriptedUpstreams();

  it('may be silent until its first output for idleMs when that is longer than firstTokenMs, as a background one may', async () => {
    // firstTokenMs 300, idleMs 3000: a model thinking 1.2 s after response.created is within the longer of the two.
    const [head, ...rest] = responsesHead();
    const thinking: Script = { headers: { 'content-type': 'text/event-stream' }, steps: [head!, 1_200, ...rest, textDelta('Noted.', 4), ...responsesTail('Noted.', 5)] };
    const { client, seen } = await start({ a: () => thinking }, [{ provider: 'a' }], {
      path: '/v1/responses',
      provider: { timeouts: { connectMs: 1_000, firstTokenMs: 300, idleMs: 3_000 } },
    });
    const stream = await client.responses.create({ model: 'gpt-4o', input: 'hi', conversation: 'conv_123', stream: true });
    const types: string[] = [];
    for await (const e of stream) types.push(e.type);
    expect(types[0]).toBe('response.created');
    expect(types.at(-1)).toBe('response.completed');
    expect(seen.a).toHaveLength(1);
  });
});

describe('only a Responses API request commits at the provider as it is sent (handle-request commitsOnSend)', () => {
  const start = useScriptedUpstreams();

  it('retries a chat request that carries a `conversation` field after a timeout, as any other', async () => {
    const silent: Script = { status: 200, headers: { 'content-type': 'application/json' }, steps: [], hold: true };
    const { s, seen } = await start({ a: (_b, n) => (n === 1 ? silent : completion('second time', 'gpt-4o')) }, [{ provider: 'a' }], {
      provider: { timeouts: { connectMs: 1_000, responseMs: 400, firstTokenMs: 5_000, idleMs: 5_000 } },
    });
    const res = await fetch(`${s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: 'Bearer sk-client' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], conversation: 'conv_123' }),
    });
    expect(res.status).toBe(200);
    expect(((await res.json()) as { choices: { message: { content: string } }[] }).choices[0]!.message.content).toBe('second time');
    expect(seen.a).toHaveLength(2);
  });
});
