// Idempotency keys across the APIs and the gateway's features, with the openai SDK as the client: the Responses API
// (background included), embeddings, completions, chat with n and usage, failover, client keys, and what a replay's
// headers carry. The first two describe runs that went wrong before: a keyed stream whose client left was counted at
// once, without its usage; a broken background stream gave its key back, and the repeat started a second response.
import { setTimeout as sleep } from 'node:timers/promises';
import { gzipSync } from 'node:zlib';
import OpenAI from 'openai';
import { describe, expect, it, vi } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { configServedBy, defaultConfig, metricSum, RETRY_LOOP_ONLY, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';
import { TEST_SECRETS } from './helpers/test-secrets.ts';

const start = useStacks();
const startBackup = useExtraMocks();
const startProvider = useFakeProviders();

const sdk = (s: Stack, opts: ConstructorParameters<typeof OpenAI>[0] = {}) => new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0, ...opts });
const keyed = (key: string) => ({ headers: { 'Idempotency-Key': key } });
const upstream = (s: Stack, path: string) => s.mock.requests().filter((r) => r.path === path).length;
const messages = [{ role: 'user' as const, content: 'hi' }];

async function post(s: Stack, path: string, key: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(`${s.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key, ...headers }, body: JSON.stringify(body) });
  return { status: res.status, headers: Object.fromEntries(res.headers.entries()), text: await res.text() };
}

describe('runs that went wrong', () => {
  it('a keyed stream whose client left is logged and counted when its run has read it to its end, its usage once', async () => {
    const s = await start({ faults: { stream: { chunks: 6, chunkDelayMs: 40 } } });
    const body = { model: 'gpt-4o', messages, stream: true as const, stream_options: { include_usage: true } };
    const abort = new AbortController();
    const first = await sdk(s).chat.completions.create(body, { ...keyed('k-left'), signal: abort.signal });
    for await (const chunk of first) if (chunk.choices[0]?.delta.content) break;
    abort.abort();
    // The replay waits for the run, then gets the whole stream, usage chunk included.
    let usage: number | undefined;
    for await (const chunk of await sdk(s).chat.completions.create(body, keyed('k-left'))) usage ??= chunk.usage?.total_tokens;
    expect(usage).toBeGreaterThan(0);
    await sleep(100);
    expect(await metricSum(s, 'stormgate_tokens_total')).toBe(usage);
    const run = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.idempotency === 'run');
    expect(run).toMatchObject({ clientGone: true, streamEnd: 'complete', outcome: 'success' });
    expect(upstream(s, '/v1/chat/completions')).toBe(1);
  });

  it('a keyed stream whose client left before its first output, and that then broke, is logged as the run whose client left, with no status', async () => {
    // The run's broken end was taken for the gateway closing the connection of a stream it could write no error event
    // on: the line said status 200 (the client never got a byte) and not clientGone (found by the chaos soak).
    const s = await start({ faults: { stream: { chunks: 6, firstTokenDelayMs: 300, chunkDelayMs: 20, cutAfterChunks: 2 } } });
    const abort = new AbortController();
    setTimeout(() => abort.abort(), 100);
    await expect(sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true }, { ...keyed('k-left-then-cut'), signal: abort.signal })).rejects.toThrow();
    await vi.waitFor(() => expect(s.logs.join('')).toContain('"idempotency":"run"'), { timeout: 3_000 });
    const run = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.idempotency === 'run');
    expect(run).toMatchObject({ clientGone: true, streamEnd: 'cut', outcome: 'stream_error' });
    expect(run).not.toHaveProperty('status');
    expect(upstream(s, '/v1/chat/completions')).toBe(1);
  });

  it('a keyed stream whose client left before its first output, read whole by its run, is logged with no status', async () => {
    // The run writes its answer to the closed response, which marks its headers sent: the line said status 200.
    const s = await start({ faults: { stream: { chunks: 3, firstTokenDelayMs: 300 } } });
    const abort = new AbortController();
    setTimeout(() => abort.abort(), 100);
    await expect(sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true }, { ...keyed('k-left-then-whole'), signal: abort.signal })).rejects.toThrow();
    await vi.waitFor(() => expect(s.logs.join('')).toContain('"idempotency":"run"'), { timeout: 3_000 });
    const run = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.idempotency === 'run');
    expect(run).toMatchObject({ clientGone: true, streamEnd: 'complete', outcome: 'success' });
    expect(run).not.toHaveProperty('status');
  });

  it.each([
    ['a background', { background: true }],
    // The conversation has the turn once response.created came: given back, the key let the repeat append it again.
    ['a conversation\'s', { conversation: 'conv_q3' }],
  ])('%s Responses stream that broke after response.created is kept: the repeat gets the same id, and the provider made one', async (_name, extra) => {
    const s = await start({ faults: { stream: { cutAfterChunks: 1 } } });
    const read = async () => {
      const seen: string[] = [];
      try {
        for await (const ev of await sdk(s).responses.create({ model: 'gpt-4o', input: 'summarise the quarter', stream: true, ...extra }, keyed('k-bg-cut'))) {
          if (ev.type === 'response.created') seen.push(ev.response.id);
        }
      } catch (err) {
        seen.push(`error: ${(err as Error).message}`);
      }
      return seen;
    };
    const first = await read();
    expect(first).toHaveLength(2);
    expect(first[1]).toMatch(/^error: /);
    await sleep(50);
    expect(await read()).toEqual(first);
    expect(upstream(s, '/v1/responses')).toBe(1);
  });
});

describe('the Responses API', () => {
  it('create, stream and background stream: each repeat gets the run\'s response id, and the provider made one each', async () => {
    const s = await start();
    const client = sdk(s);
    const one = await client.responses.create({ model: 'gpt-4o', input: 'hi', store: false }, keyed('r-whole')).withResponse();
    const two = await client.responses.create({ model: 'gpt-4o', input: 'hi', store: false }, keyed('r-whole')).withResponse();
    expect(two.data.id).toBe(one.data.id);
    expect(two.request_id).toBe(one.request_id);
    expect(two.response.headers.get('idempotent-replayed')).toBe('true');
    const ids = async (key: string, background: boolean) => {
      const seen: string[] = [];
      for await (const ev of await client.responses.create({ model: 'gpt-4o', input: 'hi', stream: true, background }, keyed(key))) {
        if (ev.type === 'response.created' || ev.type === 'response.completed') seen.push(`${ev.type} ${ev.response.id}`);
      }
      return seen;
    };
    for (const background of [false, true]) {
      const run = await ids(`r-stream-${background}`, background);
      expect(run).toHaveLength(2);
      expect(await ids(`r-stream-${background}`, background)).toEqual(run);
    }
    expect(upstream(s, '/v1/responses')).toBe(3);
  });
});

describe('embeddings, completions, chat', () => {
  it('an embeddings answer longer than maxAnswerBytes: the repeat is told once (no SDK retries), not run again', async () => {
    const s = await start({ config: (url) => ({ ...defaultConfig(url), idempotency: { maxAnswerBytes: 16 * 1024 } }) });
    const counted = { requests: 0 };
    const client = sdk(s, { maxRetries: 2, fetch: async (url, init) => (counted.requests++, fetch(url, init)) });
    const input = Array.from({ length: 400 }, (_, i) => `document ${i}`);
    const run = await client.embeddings.create({ model: 'text-embedding-3-small', input }, keyed('e-big'));
    expect(run.data).toHaveLength(400);
    const err = await client.embeddings.create({ model: 'text-embedding-3-small', input }, keyed('e-big')).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.ConflictError);
    expect((err as InstanceType<typeof OpenAI.ConflictError>).code).toBe('idempotency_answer_not_kept');
    expect(counted.requests).toBe(2);
    expect(upstream(s, '/v1/embeddings')).toBe(1);
  });

  it('completions and chat with n: 2, streamed with usage: replays equal the run, tokens counted for the run alone', async () => {
    const s = await start();
    const client = sdk(s);
    const completion = await client.completions.create({ model: 'gpt-4o', prompt: 'hi' }, keyed('c-1'));
    expect(await client.completions.create({ model: 'gpt-4o', prompt: 'hi' }, keyed('c-1'))).toEqual(completion);
    const chat = await client.chat.completions.create({ model: 'gpt-4o', n: 2, messages }, keyed('n-2'));
    expect(chat.choices).toHaveLength(2);
    expect(await client.chat.completions.create({ model: 'gpt-4o', n: 2, messages }, keyed('n-2'))).toEqual(chat);
    await sleep(50);
    const before = await metricSum(s, 'stormgate_tokens_total');
    const read = async () => {
      const chunks: unknown[] = [];
      for await (const chunk of await client.chat.completions.create({ model: 'gpt-4o', n: 2, messages, stream: true, stream_options: { include_usage: true } }, keyed('n-2-stream'))) chunks.push(chunk);
      return chunks;
    };
    const run = await read();
    const usage = (run.at(-1) as { usage: { total_tokens: number } }).usage.total_tokens;
    expect(await read()).toEqual(run);
    expect(await read()).toEqual(run);
    await sleep(50);
    expect((await metricSum(s, 'stormgate_tokens_total')) - before).toBe(usage);
    expect(upstream(s, '/v1/chat/completions')).toBe(2);
    expect(upstream(s, '/v1/completions')).toBe(1);
  });
});

describe('failover under a key', () => {
  async function withBackup(family: 'openai' | 'anthropic', faults: object, route: object = {}) {
    const backup = await startBackup({ quiet: true, apiKey: 'backup-key' });
    const s = await start({
      faults,
      config: (url): ConfigInput => {
        const base = defaultConfig(url, { provider: RETRY_LOOP_ONLY.provider, route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } } });
        return {
          ...base,
          providers: { ...base.providers, backup: { family, baseUrl: family === 'anthropic' ? backup.url : `${backup.url}/v1`, apiKey: 'backup-key', breaker: false } },
          routes: base.routes.map((r) => (r.name === 'chat' ? { ...r, targets: [{ provider: 'mock' }, { provider: 'backup', model: family === 'anthropic' ? 'claude-sonnet-4-5' : 'gpt-4.1' }], ...route } : r)),
        };
      },
    });
    return { s, backup };
  }

  it.each(['openai', 'anthropic'] as const)('the primary answers 503, the %s backup answers: the replay is the backup\'s answer, named so', async (family) => {
    const { s, backup } = await withBackup(family, { errors: [{ status: 503, rate: 1 }] });
    for (const stream of [false, true]) {
      const body = { model: 'gpt-4o', messages, ...(stream && { stream, stream_options: { include_usage: true } }) };
      const run = await post(s, '/v1/chat/completions', `f-${stream}`, body);
      const replay = await post(s, '/v1/chat/completions', `f-${stream}`, body);
      expect(run.status).toBe(200);
      expect(replay.text).toBe(run.text);
      expect(replay.headers['x-stormgate-target']).toBe(family === 'anthropic' ? 'backup/claude-sonnet-4-5' : 'backup/gpt-4.1');
      expect(replay.headers['x-stormgate-fallback']).toBe('retries_exhausted');
      expect(replay.headers['x-request-id']).toBe(run.headers['x-request-id']);
    }
    expect(backup.stats().total).toBe(2);
  });

  it('a context-window fallback: the replay is the fallback\'s answer', async () => {
    const { s, backup } = await withBackup('openai', { errors: [{ status: 400, rate: 1, code: 'context_length_exceeded', message: 'too long' }] }, { contextWindowFallback: { provider: 'backup', model: 'gpt-4.1' } });
    const body = { model: 'gpt-4o', messages };
    const run = await post(s, '/v1/chat/completions', 'cw', body);
    const replay = await post(s, '/v1/chat/completions', 'cw', body);
    expect(replay.text).toBe(run.text);
    expect(replay.headers).toMatchObject({ 'x-stormgate-target': 'backup/gpt-4.1', 'x-stormgate-fallback': 'context_length', 'idempotent-replayed': 'true' });
    expect(s.mock.stats().total).toBe(1);
    expect(backup.stats().total).toBe(1);
  });
});

describe('client keys', () => {
  it('two clients under one Idempotency-Key each get their own run; their keys reach no log line', async () => {
    const [A, B] = TEST_SECRETS.slice(-2) as [string, string];
    const s = await start({ config: (url) => ({ ...defaultConfig(url), auth: { keys: { a: A, b: B } } }) });
    const a = new OpenAI({ baseURL: s.baseURL, apiKey: A, maxRetries: 0 });
    const b = new OpenAI({ baseURL: s.baseURL, apiKey: B, maxRetries: 0 });
    const ofA = await a.chat.completions.create({ model: 'gpt-4o', messages }, keyed('shared')).withResponse();
    const ofB = await b.chat.completions.create({ model: 'gpt-4o', messages }, keyed('shared')).withResponse();
    expect(ofB.response.headers.get('idempotent-replayed')).toBeNull();
    expect(ofB.data.id).not.toBe(ofA.data.id);
    // Another body under the same key from the other client is no reuse: its own run.
    const other = await b.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'else' }] }, keyed('shared-2'));
    expect((await a.chat.completions.create({ model: 'gpt-4o', messages }, keyed('shared-2'))).id).not.toBe(other.id);
    expect((await a.chat.completions.create({ model: 'gpt-4o', messages }, keyed('shared')).withResponse()).data.id).toBe(ofA.data.id);
    await sleep(50);
    expect(s.logs.join('')).not.toContain(A);
    expect(s.logs.join('')).not.toContain(B);
  });
});

describe('a replay\'s headers', () => {
  it('from a provider that compressed its answer and set cookies and rate limits: none of it, the replay\'s own request id, a true length', async () => {
    const head = { 'content-encoding': 'gzip', 'set-cookie': 'session=abc', 'x-ratelimit-remaining-requests': '99', 'x-request-id': 'req_upstream_1', date: 'Mon, 01 Jan 2024 00:00:00 GMT' };
    const chunk = (delta: object, finish: string | null) => `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
    const p = await startProvider((req, res) => {
      let text = '';
      req.on('data', (d: Buffer) => (text += d.toString()));
      req.on('end', () => {
        if ((JSON.parse(text) as { stream?: boolean }).stream) {
          res.writeHead(200, { ...head, 'content-type': 'text/event-stream' });
          res.end(gzipSync(chunk({ content: 'Hi' }, null) + chunk({}, 'stop') + 'data: [DONE]\n\n'));
        } else {
          const zipped = gzipSync(JSON.stringify({ id: 'chatcmpl-1', object: 'chat.completion', created: 1, model: 'gpt-4o', choices: [{ index: 0, message: { role: 'assistant', content: 'Hello' }, finish_reason: 'stop' }] }));
          res.writeHead(200, { ...head, 'content-type': 'application/json', 'content-length': String(zipped.length) });
          res.end(zipped);
        }
      });
    });
    const s = await start({ config: (url) => configServedBy(url, 'zipped', `${p.origin}/v1`) });
    for (const stream of [false, true]) {
      const body = { model: 'gpt-4o', messages, stream };
      const run = await post(s, '/v1/chat/completions', `h-${stream}`, body, { 'x-request-id': `client-run-${stream}` });
      const replay = await post(s, '/v1/chat/completions', `h-${stream}`, body, { 'x-request-id': `client-replay-${stream}` });
      expect(replay.text).toBe(run.text);
      expect(replay.headers['x-stormgate-request-id']).toBe(`client-replay-${stream}`);
      expect(replay.headers['x-request-id']).toBe('req_upstream_1');
      expect(Number(replay.headers['content-length'])).toBe(Buffer.byteLength(replay.text));
      expect(replay.headers['date']).not.toBe(head.date);
      for (const name of ['content-encoding', 'set-cookie', 'x-ratelimit-remaining-requests']) expect(replay.headers[name]).toBeUndefined();
    }
    const { request_id, response } = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: false }, keyed('h-false')).withResponse();
    expect(request_id).toBe('req_upstream_1');
    expect(response.headers.get('idempotent-replayed')).toBe('true');
    expect(p.hits()).toBe(2);
  });

  it('the SDK retries a 409 idempotency_key_in_progress and gets the run\'s answer', async () => {
    const s = await start({ faults: { latencyMs: 2000 } });
    const statuses: number[] = [];
    const client = sdk(s, { maxRetries: 3, fetch: async (url, init) => { const res = await fetch(url, init); statuses.push(res.status); return res; } });
    const run = post(s, '/v1/chat/completions', 'k-409', { model: 'gpt-4o', messages });
    await sleep(100);
    const repeat = await client.chat.completions.create({ model: 'gpt-4o', messages }, { headers: { 'Idempotency-Key': 'k-409', 'x-stormgate-timeout-ms': '700' } }).withResponse();
    expect(repeat.response.headers.get('idempotent-replayed')).toBe('true');
    expect(statuses.at(-1)).toBe(200);
    expect(statuses.slice(0, -1).every((st) => st === 409)).toBe(true);
    expect(repeat.data.id).toBe((JSON.parse((await run).text) as { id: string }).id);
    expect(upstream(s, '/v1/chat/completions')).toBe(1);
  });
});
