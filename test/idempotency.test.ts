// Idempotency keys end to end, with the openai SDK as the agent: the coupon incident (a call timed out just before
// the provider finished, and the agent's retries must not run it again), repeats that wait for a run or get its
// answer again, keys used for another request, and what a run under a key may send upstream.
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it, onTestFinished } from 'vitest';
import { readFileSync } from 'node:fs';
import { parseConfig } from '../src/config/load.ts';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { fingerprintOf, idempotencyKeyOf, repeatVerdict, scopedKey } from '../src/policy/idempotency.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { countingClient, defaultConfig, metricSum, RETRY_LOOP_ONLY, requestLine, useGateways, useStacks, type Stack } from './helpers/stack.ts';

const start = useStacks();
const startGateway = useGateways();
const redis = useRedisServer();

const BODY = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'give the user one coupon' }] };

/** The mock's chat requests (what the provider ran). */
const upstreamChats = (s: Stack) => s.mock.requests().filter((r) => r.path === '/v1/chat/completions');

function post(url: string, key: string | undefined, body: unknown = BODY, signal?: AbortSignal) {
  return fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(key !== undefined && { 'idempotency-key': key }) },
    body: JSON.stringify(body),
    signal,
  });
}

describe('the key, pure', () => {
  it('takes 1 to 255 visible ASCII characters, one header; says what is wrong with anything else', () => {
    expect(idempotencyKeyOf({})).toBeUndefined();
    expect(idempotencyKeyOf({ 'idempotency-key': ' stainless-node-retry-0b6e4a1c ' })).toBe('stainless-node-retry-0b6e4a1c');
    for (const bad of ['', 'a b', 'k\u00e9', 'x'.repeat(256)]) expect(idempotencyKeyOf({ 'idempotency-key': bad })).toBeInstanceOf(Error);
    expect(idempotencyKeyOf({ 'idempotency-key': ['a', 'b'] })).toBeInstanceOf(Error);
    // As Node hands over a header sent twice.
    expect((idempotencyKeyOf({ 'idempotency-key': 'a, b' }) as Error).message).toBe('send one idempotency-key header, not several');
  });

  it('is scoped by client and path, so two clients or two endpoints never share an answer', () => {
    const keys = new Set([scopedKey(undefined, '/v1/chat/completions', 'k'), scopedKey('team-a', '/v1/chat/completions', 'k'), scopedKey('team-b', '/v1/chat/completions', 'k'), scopedKey('team-a', '/v1/responses', 'k')]);
    expect(keys.size).toBe(4);
    expect(fingerprintOf(Buffer.from('{"a":1}'))).not.toBe(fingerprintOf(Buffer.from('{"a":2}')));
    // The query string goes upstream with the body: another query is another request (none: the body's hash, as before).
    expect(fingerprintOf(Buffer.from('{"a":1}'), '?user=u2')).not.toBe(fingerprintOf(Buffer.from('{"a":1}'), '?user=u1'));
    expect(fingerprintOf(Buffer.from('{"a":1}'), '')).toBe(fingerprintOf(Buffer.from('{"a":1}')));
  });

  it('tells a repeat to wait, replay, give up on an answer not kept, or refuse another request', () => {
    const answer = { status: 200, headers: {}, kind: 'whole' as const, body: Buffer.from('{}') };
    expect(repeatVerdict({ state: 'running', fingerprint: 'a', sinceMs: 0 }, 'a')).toBe('wait');
    expect(repeatVerdict({ state: 'done', fingerprint: 'a', bytes: 2, answer }, 'a')).toBe('replay');
    expect(repeatVerdict({ state: 'done', fingerprint: 'a', bytes: 9e6 }, 'a')).toBe('not-kept');
    expect(repeatVerdict({ state: 'done', fingerprint: 'a', bytes: 2, answer }, 'b')).toBe('mismatch');
    expect(repeatVerdict({ state: 'running', fingerprint: 'a', sinceMs: 0 }, 'b')).toBe('mismatch');
  });
});

describe('the coupon incident', () => {
  it('an agent whose call times out just before the provider commits gets that answer on its retry, and the provider runs it once', async () => {
    // The provider commits at 1.5 s; the agent gives up at 1 s and retries (the SDK's own retries, the same key).
    const s = await start({ faults: { latencyMs: 1500 } });
    const { client, counter } = countingClient(s, { timeout: 1000, maxRetries: 4 });
    const started = Date.now();
    const completion = await client.chat.completions.create(BODY, { headers: { 'Idempotency-Key': 'coupon-7' } });
    expect(completion.choices[0]!.message.content).toContain('coupon');
    // Timed out once, then waited for the run: the answer came with the run, not after four more tries.
    expect(counter.requests).toBe(2);
    expect(Date.now() - started).toBeLessThan(6000);
    const upstream = upstreamChats(s);
    expect(upstream).toHaveLength(1);
    // The first client left; its run was not cut (a cut run is a coupon given with nobody told).
    await sleep(50);
    expect(upstream[0]!.aborted).toBe(false);
    const lines = s.logs.map((l) => JSON.parse(l) as { idempotency?: string; outcome?: string; clientGone?: boolean });
    // Its line tells how the run ended, and that its client left.
    expect(lines.filter((l) => l.idempotency === 'run')).toMatchObject([{ outcome: 'success', clientGone: true }]);
    expect(lines.filter((l) => l.idempotency === 'replayed')).toHaveLength(1);
  });

  it('without a key the same agent runs it on every retry', async () => {
    const s = await start({ faults: { latencyMs: 1500 } });
    const { client } = countingClient(s, { timeout: 1000, maxRetries: 2 });
    await expect(client.chat.completions.create(BODY)).rejects.toThrow(/timed out/i);
    await sleep(100);
    expect(upstreamChats(s).length).toBe(3);
  });
});

describe('repeats', () => {
  it('repeats sent while the run is in flight wait for it and get its answer; the provider sees one request', async () => {
    const s = await start({ faults: { latencyMs: 400 } });
    const first = post(s.url, 'k-parallel');
    await sleep(50);
    const answers = await Promise.all([first, post(s.url, 'k-parallel'), post(s.url, 'k-parallel')]);
    const bodies = await Promise.all(answers.map((a) => a.text()));
    expect(answers.map((a) => a.status)).toEqual([200, 200, 200]);
    expect(new Set(bodies).size).toBe(1);
    expect(answers.map((a) => a.headers.get('idempotent-replayed'))).toEqual([null, 'true', 'true']);
    expect(answers[1]!.headers.get('x-stormgate-target')).toBe(answers[0]!.headers.get('x-stormgate-target'));
    expect(upstreamChats(s)).toHaveLength(1);
  });

  it('a repeat after the answer gets it again, through the SDK (with its request id), until the key expires', async () => {
    const s = await start({ config: (url) => ({ ...defaultConfig(url), idempotency: { ttlMs: 300 } }) });
    const { client } = countingClient(s);
    const one = await client.chat.completions.create(BODY, { headers: { 'Idempotency-Key': 'k-again' } }).withResponse();
    const two = await client.chat.completions.create(BODY, { headers: { 'Idempotency-Key': 'k-again' } }).withResponse();
    expect(two.data).toEqual(one.data);
    expect(two.response.headers.get('idempotent-replayed')).toBe('true');
    expect(two.request_id).toBe(one.request_id);
    expect(upstreamChats(s)).toHaveLength(1);
    await sleep(400);
    const three = await client.chat.completions.create(BODY, { headers: { 'Idempotency-Key': 'k-again' } }).withResponse();
    expect(three.response.headers.get('idempotent-replayed')).toBeNull();
    expect(upstreamChats(s)).toHaveLength(2);
  });

  it('replays a stream event for event, after a client that left it half way: the run read it to its end', async () => {
    const s = await start({ faults: { stream: { chunks: 6, chunkDelayMs: 60 } } });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client', maxRetries: 0 });
    const abort = new AbortController();
    const first = await client.chat.completions.create({ ...BODY, stream: true }, { headers: { 'Idempotency-Key': 'k-stream' }, signal: abort.signal });
    for await (const chunk of first) {
      if (chunk.choices[0]?.delta.content) break;
    }
    abort.abort();
    const again = await client.chat.completions.create({ ...BODY, stream: true }, { headers: { 'Idempotency-Key': 'k-stream' } });
    let text = '';
    let finish: string | null | undefined;
    for await (const chunk of again) {
      text += chunk.choices[0]?.delta.content ?? '';
      finish ??= chunk.choices[0]?.finish_reason;
    }
    expect(finish).toBe('stop');
    expect(text.length).toBeGreaterThan(0);
    const upstream = upstreamChats(s);
    expect(upstream).toHaveLength(1);
    expect(upstream[0]!.aborted).toBe(false);
    expect(upstream[0]!.chunksSent).toBe(6);
  });

  it('a key sent with another body is refused (422), and nothing goes upstream', async () => {
    const s = await start();
    expect((await post(s.url, 'k-body')).status).toBe(200);
    const { client } = countingClient(s, { maxRetries: 3 });
    const err = await client.chat.completions.create({ ...BODY, messages: [{ role: 'user', content: 'two coupons' }] }, { headers: { 'Idempotency-Key': 'k-body' } }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.UnprocessableEntityError);
    expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('idempotency_key_reused');
    expect(upstreamChats(s)).toHaveLength(1);
  });

  it('a repeat that runs out of its own time while the run goes on gets 409, invited back', async () => {
    const s = await start({ faults: { latencyMs: 1500 } });
    const run = post(s.url, 'k-slow');
    await sleep(50);
    const res = await fetch(`${s.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': 'k-slow', 'x-stormgate-timeout-ms': '600' },
      body: JSON.stringify(BODY),
    });
    expect(res.status).toBe(409);
    expect(res.headers.get('x-should-retry')).toBe('true');
    expect(Number(res.headers.get('retry-after-ms'))).toBeGreaterThan(0);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('idempotency_key_in_progress');
    expect((await run).status).toBe(200);
  });

  it('an answer longer than maxAnswerBytes is not kept: a repeat is told so, and is not run again', async () => {
    const s = await start({ config: (url) => ({ ...defaultConfig(url), idempotency: { maxAnswerBytes: 64 } }) });
    expect((await post(s.url, 'k-long')).status).toBe(200);
    const res = await post(s.url, 'k-long');
    expect(res.status).toBe(409);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('idempotency_answer_not_kept');
    expect(upstreamChats(s)).toHaveLength(1);
  });

  it('a malformed key is a 400 naming the header', async () => {
    const s = await start();
    const res = await post(s.url, 'two words');
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { code: string; param: string } }).error).toMatchObject({ code: 'invalid_idempotency_key', param: 'idempotency-key' });
  });

  it('with idempotency off, the key is only forwarded', async () => {
    const s = await start({ config: (url) => ({ ...defaultConfig(url), idempotency: { enabled: false } }) });
    await post(s.url, 'k-off');
    await post(s.url, 'k-off');
    const upstream = upstreamChats(s);
    expect(upstream).toHaveLength(2);
    expect(upstream[0]!.headers['idempotency-key']).toBe('k-off');
  });
});

describe('what is kept', () => {
  it.each([500, 503])('a run that ends in a %i (after the retries retryOn allows) gives the key back: the repeat runs it again', async (status) => {
    const s = await start({ ...RETRY_LOOP_ONLY, faults: { errors: [{ status, times: 3 }] } });
    const res = await post(s.url, `k-${status}`);
    expect(res.status).toBe(status);
    expect(res.headers.get('x-stormgate-attempts')).toBe('3');
    const again = await post(s.url, `k-${status}`);
    expect(again.status).toBe(200);
    expect(again.headers.get('idempotent-replayed')).toBeNull();
    expect(upstreamChats(s)).toHaveLength(4);
    expect((await requestLine(s)).idempotency).toBe('run');
  });

  it('a stream that broke after its first output is not kept: the repeat runs it again, and keeps the whole one', async () => {
    const s = await start({ ...RETRY_LOOP_ONLY, faults: { models: { 'gpt-4o': { stream: { cutAfterChunks: 2 } } } } });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client', maxRetries: 0 });
    const read = async () => {
      let text = '';
      for await (const chunk of await client.chat.completions.create({ ...BODY, stream: true }, { headers: { 'Idempotency-Key': 'k-cut' } })) text += chunk.choices[0]?.delta.content ?? '';
      return text;
    };
    await expect(read()).rejects.toThrow();
    s.mock.setFaults({});
    const whole = await read();
    expect(await read()).toBe(whole);
    expect(upstreamChats(s)).toHaveLength(2);
  });
});

describe('what is kept, streams', () => {
  it('a stream whose provider never sends [DONE] (the gateway adds it) is whole: kept, and the repeat gets it again', async () => {
    const s = await start({ faults: { stream: { omitDone: true } } });
    const read = async () => {
      const res = await post(s.url, 'k-done-added', { ...BODY, stream: true });
      return { replayed: res.headers.get('idempotent-replayed'), text: await res.text() };
    };
    const first = await read();
    expect(first.text).toContain('data: [DONE]');
    await sleep(50);
    const again = await read();
    expect(again).toEqual({ replayed: 'true', text: first.text });
    expect(upstreamChats(s)).toHaveLength(1);
  });
});

describe('a client that stops reading its stream', () => {
  it('is let go, its connection closed, and the run read on to its end without it: kept, not cut and given back', async () => {
    const { connect } = await import('node:net');
    // A long answer, sent at once: the client's socket fills and the run would wait on it, not on the upstream.
    const s = await start({
      config: (url) => ({
        ...defaultConfig(url, { provider: { timeouts: { idleMs: 100 } } }),
        idempotency: { maxAnswerBytes: 64 * 1024 * 1024, memoryBytes: 256 * 1024 * 1024 },
      }),
      faults: { stream: { chunks: 100_000 } },
    });
    const { port } = new URL(s.url);
    const socket = connect(Number(port), '127.0.0.1');
    const body = JSON.stringify({ ...BODY, stream: true });
    socket.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nidempotency-key: k-stalled\r\ncontent-length: ${body.length}\r\n\r\n${body}`);
    socket.pause();
    try {
      const connections = () => new Promise<number>((resolve) => s.gateway.server.getConnections((_e, n) => resolve(n)));
      // Bounds, not waits: on a loaded machine the sockets' buffers take seconds to fill.
      const deadline = Date.now() + 20_000;
      while ((await connections()) > 0 && Date.now() < deadline) await sleep(50);
      expect(await connections()).toBe(0);
      while (!s.logs.join('').includes('"idempotency":"run"') && Date.now() < deadline) await sleep(20);
      const run = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.idempotency === 'run');
      expect(run).toMatchObject({ outcome: 'success', streamEnd: 'complete', clientGone: true });
      // Once: in the log and in the count, whichever of the let-go and the stream's end came first.
      await sleep(200);
      expect(s.logs.filter((l) => l.includes('"idempotency":"run"'))).toHaveLength(1);
      expect(await metricSum(s, 'stormgate_requests_total{route="chat"')).toBe(1);
      const upstream = upstreamChats(s);
      expect(upstream).toHaveLength(1);
      expect(upstream[0]!.aborted).toBe(false);
      expect(upstream[0]!.chunksSent).toBe(100_000);
      const again = await post(s.url, 'k-stalled', { ...BODY, stream: true });
      expect(again.headers.get('idempotent-replayed')).toBe('true');
      await again.body?.cancel();
      expect(upstreamChats(s)).toHaveLength(1);
    } finally {
      socket.destroy();
    }
  });
});

describe('replays in the metrics', () => {
  it('a replay is counted under the target key and priority class its run was counted under, never a label made of the client\'s model name', async () => {
    const s = await start();
    // A name no key is made of (a space): the run is counted under mock/other; x-stormgate-target shows it as sent.
    const body = { ...BODY, model: 'my model' };
    const run = await post(s.url, 'k-label', body);
    expect(run.status).toBe(200);
    expect(run.headers.get('x-stormgate-target')).toBe('mock/my model');
    expect((await post(s.url, 'k-label', body)).headers.get('idempotent-replayed')).toBe('true');
    await sleep(50);
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    const series = [...metrics.matchAll(/^stormgate_requests_total\{route="chat",target="([^"]*)",priority="([^"]*)",outcome="(success|replayed)"\} 1$/gm)].map((m) => `${m[3]} ${m[1]} ${m[2]}`);
    expect(series.sort()).toEqual(['replayed mock/other online', 'success mock/other online']);
  });

  // Before, each replay was observed in stormgate_request_duration_seconds{attempt="first"} as a request the route had
  // answered in a millisecond or two: the dashboard's latency quantiles for first attempts fell with every agent retry.
  it('keeps replays out of the request duration histogram: the route did not serve them again', async () => {
    const s = await start({ faults: { latencyMs: 300 } });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 });
    const headers = { 'Idempotency-Key': 'k-latency' };
    const run = await client.chat.completions.create(BODY, { headers }).withResponse();
    expect(run.response.headers.get('idempotent-replayed')).toBeNull();
    for (let i = 0; i < 4; i++) {
      const again = await client.chat.completions.create(BODY, { headers }).withResponse();
      expect(again.response.headers.get('idempotent-replayed')).toBe('true');
    }
    await sleep(50);
    expect(await metricSum(s, 'stormgate_requests_total{route="chat",target="mock/gpt-4o",priority="online",outcome="replayed"}')).toBe(4);
    expect(await metricSum(s, 'stormgate_request_duration_seconds_count{route="chat"')).toBe(1);
    // The one observation is the run's, provider's latency included.
    expect(await metricSum(s, 'stormgate_request_duration_seconds_sum{route="chat"')).toBeGreaterThanOrEqual(0.3);
  });
});

describe('a fleet on one Redis', () => {
  it('a repeat that reaches another instance waits for the run on the first, and gets its answer', async () => {
    const s = await start({ faults: { latencyMs: 500 } });
    const config = ConfigSchema.parse({ ...defaultConfig(s.mock.url), state: { redis: redis().url, keyPrefix: `idem-fleet-${Date.now()}` } });
    const [a, b] = await Promise.all([startGateway(config), startGateway(config)]);
    const run = post(a, 'k-fleet');
    await sleep(100);
    const repeat = await post(b, 'k-fleet');
    expect(repeat.status).toBe(200);
    expect(repeat.headers.get('idempotent-replayed')).toBe('true');
    expect(await repeat.text()).toBe(await (await run).text());
    expect(upstreamChats(s)).toHaveLength(1);
  });
});

describe('a tool behind the gateway', () => {
  /** A coupon tool that commits each call 400 ms after it arrives, behind a route on its path; `route` adds to it. */
  async function couponTool(route: Partial<ConfigInput['routes'][number]> = {}) {
    const { createServer } = await import('node:http');
    const tool = { coupons: 0 };
    const server = createServer((req, res) => {
      let body = '';
      req.on('data', (c: Buffer) => (body += c));
      req.on('end', () =>
        setTimeout(() => {
          tool.coupons++;
          res.writeHead(200, { 'content-type': 'application/json' });
          // The user in the body, or (a tool that takes its arguments so) in the query string.
          const user = (JSON.parse(body) as { user?: string }).user ?? new URL(req.url!, 'http://tool').searchParams.get('user');
          res.end(JSON.stringify({ coupon: `C-${tool.coupons}`, for: user }));
        }, 400),
      );
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    onTestFinished(() => new Promise<void>((resolve) => server.close(() => resolve())));
    const port = (server.address() as { port: number }).port;
    const s = await start({
      config: (url) => ({
        ...defaultConfig(url),
        providers: { ...defaultConfig(url).providers, coupons: { family: 'openai', baseUrl: `http://127.0.0.1:${port}/v1`, apiKey: 'tool-key' } },
        routes: [{ name: 'coupon-tool', match: { path: '/v1/tools/coupon' }, targets: [{ provider: 'coupons', model: 'coupon-tool' }], retry: { retryOn: [429, 503] }, ...route }],
      }),
    });
    /** The agent's own loop: a 300 ms timeout, then the same call again, four times at most. */
    const agent = async (user: string | undefined, headers: Record<string, string> = {}, query = '') => {
      const call = () =>
        fetch(`${s.url}/v1/tools/coupon${query}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify({ user }), signal: AbortSignal.timeout(300) });
      for (let attempt = 0; attempt < 5; attempt++) {
        const res = await call().catch(() => undefined);
        if (res?.ok) return (await res.json()) as { coupon: string; for: string };
      }
      return undefined;
    };
    return { tool, agent, s };
  }

  it('the agent times out at 300 ms, the tool commits at 400 ms: one coupon, and the retry under the same key gets it', async () => {
    const { tool, agent } = await couponTool();
    expect(await agent('u1', { 'idempotency-key': 'call-42' })).toMatchObject({ coupon: 'C-1', for: 'u1' });
    await sleep(600);
    expect(tool.coupons).toBe(1);
  });

  it('an agent that sends no key: on a route with bodyAsKeyMs its retries are repeats of the first call, another body is another call', async () => {
    const { tool, agent } = await couponTool({ idempotency: { bodyAsKeyMs: 60_000 } });
    expect(await agent('u1')).toMatchObject({ coupon: 'C-1', for: 'u1' });
    expect(await agent('u2')).toMatchObject({ coupon: 'C-2', for: 'u2' });
    await sleep(600);
    expect(tool.coupons).toBe(2);
  });

  it('bodyAsKeyMs after the answer: a repeat within it gets the answer again, one after it runs again', async () => {
    const { tool, agent } = await couponTool({ idempotency: { bodyAsKeyMs: 1_500 } });
    expect(await agent('u1')).toMatchObject({ coupon: 'C-1' });
    await sleep(500);
    expect(await agent('u1')).toMatchObject({ coupon: 'C-1' });
    await sleep(2_000);
    expect(await agent('u1')).toMatchObject({ coupon: 'C-2' });
    await sleep(600);
    expect(tool.coupons).toBe(2);
  });

  it('bodyAsKeyMs: the same body with another query string (which goes upstream with it) is another call', async () => {
    const { tool, agent } = await couponTool({ idempotency: { bodyAsKeyMs: 60_000 } });
    expect(await agent(undefined, {}, '?user=u1')).toMatchObject({ coupon: 'C-1', for: 'u1' });
    // Before the fix u2 got u1's coupon: the key was the body alone.
    expect(await agent(undefined, {}, '?user=u2')).toMatchObject({ coupon: 'C-2', for: 'u2' });
    await sleep(600);
    expect(tool.coupons).toBe(2);
  });

  it('bodyAsKeyMs: a repeat refused while the call runs is told of its body, not of an Idempotency-Key it never sent', async () => {
    const { agent, s } = await couponTool({ idempotency: { bodyAsKeyMs: 60_000 } });
    const run = agent('u1');
    await sleep(50);
    const res = await fetch(`${s.url}/v1/tools/coupon`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-stormgate-timeout-ms': '150' },
      body: JSON.stringify({ user: 'u1' }),
    });
    expect(res.status).toBe(409);
    const { error } = (await res.json()) as { error: { code: string; message: string } };
    expect(error.code).toBe('idempotency_key_in_progress');
    expect(error.message).not.toMatch(/Idempotency-Key|same key/);
    expect(error.message).toContain('bodyAsKeyMs');
    expect(await run).toMatchObject({ coupon: 'C-1' });
  });

  it('without a key or bodyAsKeyMs, every retry of the agent is a new call: the incident', async () => {
    const { tool, agent } = await couponTool();
    await agent('u1');
    await sleep(600);
    expect(tool.coupons).toBe(5);
  });
});

it("the README's tool route loads as written", () => {
  const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
  const block = /```yaml\n([^`]*coupon-tool[^`]*)```/.exec(readme)![1]!;
  const text = block.replace(/^ {2}/gm, '');
  const config = parseConfig(text, 'README.md', { COUPONS_TOKEN: 'tool-key' });
  expect(config.routes[0]).toMatchObject({ name: 'coupon-tool', match: { path: '/v1/tools/coupon' }, targets: [{ provider: 'coupons', model: 'coupon-tool' }] });
  expect(config.idempotency).toEqual({ enabled: true, ttlMs: 600_000, maxAnswerBytes: 1024 * 1024, memoryBytes: 64 * 1024 * 1024, leaseMs: 10_000, waitForRedisMs: 10_000 });
});
