// Mutation testing of the mock provider (src/mock): each test here kills a change to the mock that the rest of the
// suite let through (a per-model setting read from the global scope, a term dropped, a header left off, a counter
// skipped), so it names the documented behaviour an outside failure-scenario suite relies on that the change broke.
import { describe, expect, it } from 'vitest';
import { decide, FaultCounters, latencyFor, type FaultSpec } from '../src/mock/faults.ts';
import { mockCli } from './helpers/mock-cli.ts';
import { mockWithSdks } from './helpers/mock-sdks.ts';
import { facts, noRandom } from './helpers/mock-facts.ts';

/** Polls until cond holds (a socket's close reaches the mock a tick after the client's abort). */
const until = async (cond: () => boolean, ms = 3000) => {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error('condition never held');
    await new Promise((r) => setTimeout(r, 10));
  }
};
const status = (spec: FaultSpec, c: FaultCounters, model: string) => {
  const d = decide(spec, c, facts({ model }), noRandom);
  return d.kind === 'error' ? d.rule.status : 200;
};

describe('per-model overrides (pure)', () => {
  it("count a model's error rule from that model's own first request, whatever other models were sent before", () => {
    const c = new FaultCounters();
    const spec: FaultSpec = { errors: [{ status: 503, rate: 0.5 }], models: { 'gpt-4.1': { errors: [{ status: 429, rate: 0.5 }] } } };
    expect(status(spec, c, 'gpt-4o')).toBe(200);
    // gpt-4.1's rule has counted nothing yet: its first request is the first of its period.
    expect([status(spec, c, 'gpt-4.1'), status(spec, c, 'gpt-4.1')]).toEqual([200, 429]);
    expect(status(spec, c, 'gpt-4o')).toBe(503);
  });

  it("limit a model's own concurrency with its capacity, not the whole server's", () => {
    const spec: FaultSpec = { models: { 'gpt-4.1': { capacity: 1 } } };
    const c = new FaultCounters();
    // Three other models' requests in flight, none of this model's: its one slot is free.
    expect(decide(spec, c, facts({ model: 'gpt-4.1', inflight: 3, modelInflight: 0 }), noRandom).kind).toBe('answer');
    expect(decide(spec, c, facts({ model: 'gpt-4.1', inflight: 3, modelInflight: 1 }), noRandom).kind).toBe('capacity');
    // The global capacity counts every request in flight.
    expect(decide({ capacity: 2 }, c, facts({ model: 'gpt-4.1', inflight: 2, modelInflight: 0 }), noRandom).kind).toBe('capacity');
  });

  it("slow a model down by its own requests in flight with its latencyPerInflightMs, the server by all of them", () => {
    const spec: FaultSpec = { latencyPerInflightMs: 1, models: { 'gpt-4.1': { latencyPerInflightMs: 10 } } };
    expect(latencyFor(spec, facts({ model: 'gpt-4.1', inflight: 5, modelInflight: 2 }), noRandom)).toBe(20);
    expect(latencyFor(spec, facts({ model: 'gpt-4o', inflight: 5, modelInflight: 2 }), noRandom)).toBe(5);
  });
});

describe('latency (pure)', () => {
  it('adds the seeded jitter, a share of latencyJitterMs, to the base latency', () => {
    const d = decide({ latencyMs: 100, latencyJitterMs: 50 }, new FaultCounters(), facts(), () => 0.5);
    expect(d).toEqual({ kind: 'answer', latencyMs: 125, stream: {} });
  });
});

describe('the mock over HTTP', () => {
  const sdks = mockWithSdks();
  const chatStatus = async (model = 'gpt-4o') => {
    const res = await fetch(`${sdks.mock.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }] }),
    });
    await res.arrayBuffer();
    return res.status;
  };
  const control = async (method: string, path: string, body?: unknown) => {
    const res = await fetch(sdks.mock.url + path, { method, ...(body === undefined ? {} : { body: JSON.stringify(body) }) });
    return { status: res.status, body: (await res.json()) as any };
  };

  it("PATCH of models restarts the models' counters; PATCH of a global field leaves a model's counting alone", async () => {
    const models = { 'gpt-4.1': { errors: [{ status: 429, rate: 0.5 }] } };
    sdks.mock.setFaults({ errors: [{ status: 503, rate: 0.5 }], models });
    expect(await chatStatus('gpt-4.1')).toBe(200);
    // The global rules replaced: gpt-4.1's override counts on (one counted, its next one fails).
    await control('PATCH', '/_mock/faults', { errors: [{ status: 500, rate: 0.5 }] });
    expect(await chatStatus('gpt-4.1')).toBe(429);
    expect(await chatStatus('gpt-4.1')).toBe(200);
    // models replaced (with the same override): its counting starts over.
    await control('PATCH', '/_mock/faults', { models });
    expect(await chatStatus('gpt-4.1')).toBe(200);
    expect(await chatStatus('gpt-4.1')).toBe(429);
  });

  it('POST /_mock/brownout with no body is a 503 brownout of 10 s, as --help says', async () => {
    expect(await control('POST', '/_mock/brownout')).toEqual({ status: 200, body: { ok: true, mode: '503', durationMs: 10_000 } });
    expect(await chatStatus()).toBe(503);
    await control('POST', '/_mock/brownout', { durationMs: 0 });
    expect(await chatStatus()).toBe(200);
  });

  it('GET /_mock/requests?limit=0 lists none of the requests, limit=N the last N', async () => {
    for (const model of ['a', 'b', 'c']) await chatStatus(model);
    expect((await control('GET', '/_mock/requests?limit=0')).body).toEqual([]);
    expect((await control('GET', '/_mock/requests?limit=2')).body.map((e: { model: string }) => e.model)).toEqual(['b', 'c']);
    expect((await control('GET', '/_mock/requests')).body).toHaveLength(3);
  });

  it('refuses a rateLimit whose burstSeconds is over 60 (or 0), or whose limit is not positive, with 400 and keeps the spec', async () => {
    sdks.mock.setFaults({ latencyMs: 1 });
    for (const burstSeconds of [61, 0, 600]) {
      const res = await control('PATCH', '/_mock/faults', { rateLimit: { requestsPerMinute: 60, burstSeconds } });
      expect(res.status).toBe(400);
      expect(res.body.error).toMatch(/burstSeconds/);
    }
    for (const limit of [{ requestsPerMinute: 0 }, { tokensPerMinute: 0 }, { tokensPerMinute: -5 }]) {
      const res = await control('PATCH', '/_mock/faults', { rateLimit: limit });
      expect(res.status).toBe(400);
      expect(res.body.error).toMatch(/must be a positive number/);
    }
    expect((await control('GET', '/_mock/faults')).body).toEqual({ latencyMs: 1 });
    expect((await control('PATCH', '/_mock/faults', { rateLimit: { requestsPerMinute: 60, burstSeconds: 60 } })).status).toBe(200);
  });

  it('POST /_mock/reset clears the rate limit\'s 429 counts with the rest, and keeps a request still in flight as the highest', async () => {
    sdks.mock.setFaults({ rateLimit: { requestsPerMinute: 1 } });
    expect([await chatStatus(), await chatStatus()]).toEqual([200, 429]);
    expect(sdks.mock.stats().rateLimited).toEqual({ requests: 1, tokens: 0 });
    await control('POST', '/_mock/reset');
    expect((await control('GET', '/_mock/stats')).body).toMatchObject({ total: 0, byStatus: {}, rateLimited: { requests: 0, tokens: 0 } });

    sdks.mock.setFaults({ hangRate: 1 });
    const ac = new AbortController();
    const hung = fetch(`${sdks.mock.url}/v1/chat/completions`, { method: 'POST', body: JSON.stringify({ model: 'gpt-4o', messages: [] }), signal: ac.signal }).catch(() => undefined);
    await until(() => sdks.mock.stats().inflight === 1);
    await control('POST', '/_mock/reset');
    expect((await control('GET', '/_mock/stats')).body).toMatchObject({ total: 0, inflight: 1, maxInflight: 1 });
    ac.abort();
    await hung;
    await until(() => sdks.mock.stats().inflight === 0);
  });

  it('a hang brownout counts its requests as "hang" in byStatus, per second too, once their clients leave', async () => {
    sdks.mock.brownout('hang', 5000);
    const ac = new AbortController();
    const hung = fetch(`${sdks.mock.url}/v1/chat/completions`, { method: 'POST', body: JSON.stringify({ model: 'gpt-4o', messages: [] }), signal: ac.signal }).catch(() => undefined);
    await until(() => sdks.mock.stats().inflight === 1);
    ac.abort();
    await hung;
    await until(() => sdks.mock.stats().inflight === 0);
    const stats = (await control('GET', '/_mock/stats')).body;
    expect(stats).toMatchObject({ aborted: 1, inflight: 0, byStatus: { hang: 1 } });
    expect(stats.perSecond.map((s: { byStatus: Record<string, number> }) => s.byStatus)).toContainEqual({ hang: 1 });
    expect(sdks.mock.requests()[0]).toMatchObject({ status: 'hang', aborted: true });
  });

  it('pingBeforeFirstToken sends an SSE comment `: ping` after the head and before the first content chunk', async () => {
    sdks.mock.setFaults({ stream: { pingBeforeFirstToken: true } });
    const res = await fetch(`${sdks.mock.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', stream: true, messages: [{ role: 'user', content: 'hi' }] }),
    });
    const events = (await res.text()).split('\n\n').filter((e) => e !== '');
    expect(events[1]).toBe(': ping');
    expect(JSON.parse(events[0]!.slice('data: '.length)).choices[0].delta).toMatchObject({ role: 'assistant' });
    expect(JSON.parse(events[2]!.slice('data: '.length)).choices[0].delta.content).not.toBe('');
    sdks.mock.setFaults({});
    expect(await (await fetch(`${sdks.mock.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', stream: true, messages: [{ role: 'user', content: 'hi' }] }),
    })).text()).not.toContain(': ping');
  });

  it('a firstAttemptsOnly rule fails a request whose x-retry-attempt is "0" as a first attempt, and lets "1" through', async () => {
    sdks.mock.setFaults({ errors: [{ status: 503, firstAttemptsOnly: true }] });
    const attempt = async (value: string) => {
      const res = await fetch(`${sdks.mock.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-retry-attempt': value },
        body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
      });
      await res.arrayBuffer();
      return res.status;
    };
    expect([await attempt('0'), await attempt('1'), await attempt('0')]).toEqual([503, 200, 503]);
  });
});

describe('npm run mock', () => {
  const run = mockCli();

  it("merges the --rate-limit-* flags into --faults' rateLimit, keeping its other fields", async () => {
    const r = await run(['--quiet', '--faults', '{"rateLimit":{"burstSeconds":1,"retryAfter":true},"latencyMs":2}', '--rate-limit-rpm', '120']);
    const spec = (await (await fetch(`${r.url!}/_mock/faults`)).json()) as FaultSpec;
    expect(spec).toEqual({ latencyMs: 2, rateLimit: { burstSeconds: 1, retryAfter: true, requestsPerMinute: 120 } });
  });
});
