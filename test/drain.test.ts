// SIGTERM drains the real process: readiness off at once, requests still served for preStopMs, then new requests
// refused with an OpenAI-shaped 503 (x-should-retry: true), in-flight streams finish (or, past the grace period, end
// with an error event), and the process exits 0.
import { once } from 'node:events';
import { connect } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { randomUUID } from 'node:crypto';
import type { FaultSpec } from '../src/mock/server.ts';
import { scopedKey } from '../src/policy/idempotency.ts';
import { RedisStore } from '../src/state/redis-store.ts';
import { openRawStream, readRawRest } from './helpers/chat-stream.ts';
import { useOneGatewayProcess } from './helpers/gateway-process.ts';
import { useRedisServer } from './helpers/redis-server.ts';

const one = useOneGatewayProcess();

/** The real gateway process in front of a mock whose streams take `chunks` x 150 ms; resolves its URL once ready. */
async function startGateway(chunks: number, drain: { preStopMs: number; graceMs: number }, faults: FaultSpec = {}, extra: Record<string, unknown> = {}): Promise<string> {
  return (await one.start({ faults: { stream: { chunks, chunkDelayMs: 150 }, ...faults }, drain, extra })).url;
}

describe('SIGTERM', () => {
  it('drains: readiness off, then new requests refused, the stream in flight completes, exit 0', async () => {
    const url = await startGateway(12, { preStopMs: 400, graceMs: 10_000 });
    expect((await fetch(`${url}/readyz`)).status).toBe(200);
    const reader = await openRawStream(url);
    const exited = one.gateway!.exited;
    one.gateway!.proc.kill('SIGTERM');
    await sleep(100);
    const ready = await fetch(`${url}/readyz`);
    expect(ready.status).toBe(503);
    expect(((await ready.json()) as { status: string }).status).toBe('draining');
    await sleep(600);
    // After preStopMs: a new request is refused (an OpenAI-shaped 503, or no connection at all).
    const late = await fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [] }),
    }).then(
      async (r) => ({ status: r.status, retry: r.headers.get('x-should-retry'), code: ((await r.json()) as { error: { code: string } }).error.code }),
      () => ({ status: 0, retry: null, code: 'refused' }),
    );
    if (late.status !== 0) expect(late).toEqual({ status: 503, retry: 'true', code: 'gateway_draining' });
    const text = await readRawRest(reader);
    expect(text.trimEnd().endsWith('data: [DONE]')).toBe(true);
    const code = await exited;
    expect(code).toBe(0);
  });

  it('ends a stream still running when the grace period is over with an error event the SDKs raise, not a reset', async () => {
    const url = await startGateway(100, { preStopMs: 0, graceMs: 500 });
    const reader = await openRawStream(url);
    const exited = one.gateway!.exited;
    one.gateway!.proc.kill('SIGTERM');
    // Reading ends cleanly (no network error), with the error event last and no [DONE] that would look complete.
    const text = await readRawRest(reader);
    const events = text.trim().split('\n\n');
    const last = JSON.parse(events.at(-1)!.replace(/^data: /, '')) as { error: { code: string; message: string } };
    expect(last.error.code).toBe('stream_interrupted');
    expect(last.error.message).toMatch(/shutting down/);
    expect(text).not.toContain('[DONE]');
    const code = await exited;
    expect(code).toBe(0);
  });

  it('answers requests still waiting for the upstream when the grace period is over with 503 gateway_draining, not a reset', async () => {
    // A 3 s answer and a stream whose first token takes 3 s, against a 500 ms grace period.
    const url = await startGateway(3, { preStopMs: 0, graceMs: 500 }, { latencyMs: 3_000 });
    const ask = (stream: boolean) =>
      fetch(`${url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream }),
      }).then(async (r) => ({ status: r.status, retry: r.headers.get('x-should-retry'), code: ((await r.json()) as { error?: { code: string } }).error?.code }));
    const answers = Promise.all([ask(false), ask(true)]);
    await sleep(200);
    const exited = one.gateway!.exited;
    const started = Date.now();
    one.gateway!.proc.kill('SIGTERM');
    expect(await answers).toEqual([
      { status: 503, retry: 'true', code: 'gateway_draining' },
      { status: 503, retry: 'true', code: 'gateway_draining' },
    ]);
    const code = await exited;
    expect(code).toBe(0);
    expect(Date.now() - started).toBeLessThan(2_500);
  });
});

describe('SIGTERM, a retry waiting out a wait hint', () => {
  const ask = (url: string) =>
    fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    }).then(async (r) => ({ status: r.status, retry: r.headers.get('x-should-retry'), retryAfterMs: Number(r.headers.get('retry-after-ms')), code: ((await r.json()) as { error?: { code: string } }).error?.code }));

  it('answers at once, 503 gateway_draining with the wait as retry-after, when the wait would outlast the grace period; the exit does not wait for it', async () => {
    // Grace ends 5 s after SIGTERM; the provider asks for 8 s. Waiting would hold the request (and the exit) 5 s for a
    // 503 anyway; another instance can take the retry once the 8 s are over.
    const url = await startGateway(1, { preStopMs: 1_000, graceMs: 4_000 }, { errors: [{ status: 429, rate: 1, times: 1, headers: { 'retry-after-ms': '8000' } }] });
    const exited = one.gateway!.exited;
    one.gateway!.proc.kill('SIGTERM');
    await sleep(100);
    const sent = Date.now();
    const answer = await ask(url);
    expect(Date.now() - sent).toBeLessThan(2_500);
    expect(answer).toMatchObject({ status: 503, retry: 'true', code: 'gateway_draining' });
    expect(answer.retryAfterMs).toBeGreaterThanOrEqual(8_000);
    expect(answer.retryAfterMs).toBeLessThanOrEqual(9_700);
    expect(one.mock!.stats().total).toBe(1);
    const code = await exited;
    expect(code).toBe(0);
    expect(Date.now() - sent).toBeLessThan(3_500);
  });

  it('still waits out a hint that ends within the grace period, and retries', async () => {
    const url = await startGateway(1, { preStopMs: 1_000, graceMs: 4_000 }, { errors: [{ status: 429, rate: 1, times: 1, headers: { 'retry-after-ms': '300' } }] });
    const exited = one.gateway!.exited;
    one.gateway!.proc.kill('SIGTERM');
    await sleep(100);
    expect(await ask(url)).toMatchObject({ status: 200 });
    expect(one.mock!.stats().total).toBe(2);
    expect(await exited).toBe(0);
  });
});

describe('SIGTERM with a run under an idempotency key', () => {
  const redis = useRedisServer();

  it('waits for the run whose client left, and leaves its answer under the key in Redis for the fleet', async () => {
    const keyPrefix = `drain-${randomUUID()}`;
    const url = await startGateway(6, { preStopMs: 0, graceMs: 10_000 }, {}, { state: { redis: redis().url, keyPrefix } });
    const abort = new AbortController();
    const res = await fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': 'deploy-1' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'a long answer' }], stream: true }),
      signal: abort.signal,
    });
    await res.body!.getReader().read();
    // The client leaves; the instance is told to go (a rolling deploy) while the run is still being read.
    abort.abort();
    await sleep(100);
    const exited = one.gateway!.exited;
    one.gateway!.proc.kill('SIGTERM');
    const code = await exited;
    expect(code).toBe(0);
    expect(one.mock!.requests().filter((r) => r.path === '/v1/chat/completions').map((r) => ({ aborted: r.aborted, chunks: r.chunksSent }))).toEqual([{ aborted: false, chunks: 6 }]);
    const store = new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 500, keyPrefix } });
    try {
      expect(await store.ready()).toBe(true);
      const record = await store.readKey(scopedKey(undefined, '/v1/chat/completions', 'deploy-1'), Date.now());
      expect(record).toMatchObject({ state: 'done', answer: { kind: 'stream', status: 200 } });
    } finally {
      await store.close();
    }
  });
});

describe('SIGINT', () => {
  it('exits at once although a client stopped half-way through its body, answering it 503 gateway_draining', async () => {
    const url = await startGateway(3, { preStopMs: 0, graceMs: 10_000 });
    const socket = connect(Number(new URL(url).port), '127.0.0.1');
    await once(socket, 'connect');
    let out = '';
    socket.on('data', (d: Buffer) => (out += d.toString()));
    const closed = once(socket, 'close');
    // Headers promise 1000 bytes of body; 10 come, then nothing (until requestTimeoutMs, 60 s, Node would wait).
    socket.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{"model":"');
    await sleep(300);
    const exited = one.gateway!.exited;
    const started = Date.now();
    one.gateway!.proc.kill('SIGINT');
    const code = await Promise.race([exited, sleep(3_000, 'still running')]);
    socket.destroy();
    expect(code).toBe(0);
    expect(Date.now() - started).toBeLessThan(3_000);
    await closed;
    expect(out).toMatch(/^HTTP\/1\.1 503 /);
    expect(out).toContain('"code":"gateway_draining"');
  });
});

describe('SIGHUP', () => {
  it('is ignored: the stream in flight completes and the gateway keeps serving', async () => {
    const url = await startGateway(4, { preStopMs: 0, graceMs: 1_000 });
    const reader = await openRawStream(url);
    one.gateway!.proc.kill('SIGHUP');
    expect(await readRawRest(reader)).toContain('data: [DONE]');
    await sleep(100);
    expect(one.gateway!.proc.exitCode).toBeNull();
    expect((await fetch(`${url}/readyz`)).status).toBe(200);
  });
});
