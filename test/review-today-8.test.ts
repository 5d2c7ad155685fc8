// An adversarial review of the day's changes (drain's grace-aware retry waits, errorCode / traceId in the log line):
// the bugs it found, each pinned by a test that failed before its fix.
// - A retry wait that ends within minAttemptMs of the grace period's end (at its very end, say) was taken: the retry
//   had no time left, was cut at the grace end, and its client, held all that time, got 503 gateway_draining with a
//   1 s retry-after (src/pipeline/target-attempts.ts: the one wait rule, with the grace end as the deadline).
// - traceId: a traceparent the W3C spec calls invalid (version ff, an all-zero parent id, version 00 with more
//   fields after its flags) gave the line a traceId (src/http/request-log.ts).
// - errorCode: a passthrough request's error answer (the provider's, passed on, or the gateway's own
//   upstream_auth_error) had none (src/providers/passthrough.ts).
import type { IncomingMessage, ServerResponse } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { chatCompletion, useFakeProviders } from './helpers/fake-provider.ts';
import { ask, busyOnceThen, configFor } from './helpers/one-provider.ts';
import { useStacks } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const stack = useStacks();


describe('draining: a retry wait that leaves no time for its attempt before the grace period ends', () => {
  it('is not taken: answered 503 gateway_draining at once with the wait as retry-after, not cut at the grace end after it', async () => {
    // The first attempt fails at once; the retry would answer in 2 s. The grace period ends 2.5 s after the drain
    // begins, the backoff is a fixed 2.2 s: it ends inside the grace period, but with less than minAttemptMs (1 s) left.
    const p = await startProvider(busyOnceThen(2_000));
    const s = await stack({ config: configFor(p.origin, { retry: { backoff: { strategy: 'fixed', baseMs: 2_200, capMs: 2_200 } }, minAttemptMs: 1_000 }, { drain: { preStopMs: 2_000, graceMs: 500 } }) });
    const drained = s.gateway.drain();
    await sleep(50);
    const sent = Date.now();
    const answer = await ask(s.url);
    const tookMs = Date.now() - sent;
    expect(answer).toMatchObject({ status: 503, code: 'gateway_draining' });
    // Told the wait it was not given, not a second: the retry is due then, at another instance.
    expect(answer.retryAfterMs).toBeGreaterThanOrEqual(2_200);
    expect(tookMs).toBeLessThan(1_500);
    expect(p.hits()).toBe(1);
    await drained;
  });
});

describe("traceId from a traceparent the W3C spec calls invalid", () => {
  it('is left out for version ff, an all-zero parent id, and a version-00 header with fields after its flags; kept for a future version', async () => {
    const s = await stack();
    const trace = '4bf92f3577b34da6a3ce929d0e0e4736';
    const cases: Array<[string, string, string | undefined]> = [
      ['ff', `ff-${trace}-00f067aa0ba902b7-01`, undefined],
      ['zero-parent', `00-${trace}-0000000000000000-01`, undefined],
      ['v00-extra', `00-${trace}-00f067aa0ba902b7-01-what-follows`, undefined],
      ['v00-upper', `00-${trace.toUpperCase()}-00f067aa0ba902b7-01`, undefined],
      // A higher version may add fields after a dash (the spec's forward compatibility): its trace id is read.
      ['v01-extra', `01-${trace}-00f067aa0ba902b7-01-what-follows`, trace],
      ['good', `00-${trace}-00f067aa0ba902b7-01`, trace],
    ];
    for (const [id, traceparent] of cases) expect((await ask(s.url, { traceparent, 'x-request-id': id })).status).toBe(200);
    await sleep(50);
    const byId = new Map(s.logs.map((l) => JSON.parse(l) as { reqId?: string; traceId?: string }).filter((l) => l.reqId).map((l) => [l.reqId, l]));
    for (const [id, , want] of cases) {
      expect(byId.get(id), id).toBeDefined();
      expect(byId.get(id)?.traceId, id).toBe(want);
    }
  });
});

describe('errorCode on a passthrough path', () => {
  it("names the code of the provider's error passed on, and of the gateway's own upstream_auth_error", async () => {
    const p = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      if (req.url?.startsWith('/v1/files/auth')) return void res.writeHead(401, { 'content-type': 'application/json' }).end('{"error":{"message":"bad key","type":"invalid_request_error","code":"invalid_api_key"}}');
      res.writeHead(429, { 'content-type': 'application/json' }).end('{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}');
    });
    const s = await stack({
      config: () => ({
        ...configFor(p.origin, {}, {})(),
        passthrough: { provider: 'p', paths: ['/v1/files'], methods: ['GET'] },
      }),
    });
    const limited = await fetch(`${s.url}/v1/files`, { headers: { 'x-request-id': 'limited' } });
    expect(limited.status).toBe(429);
    await limited.text();
    const auth = await fetch(`${s.url}/v1/files/auth`, { headers: { 'x-request-id': 'auth' } });
    expect(auth.status).toBe(502);
    expect(((await auth.json()) as { error: { code: string } }).error.code).toBe('upstream_auth_error');
    await sleep(50);
    const byId = new Map(s.logs.map((l) => JSON.parse(l) as { reqId?: string; errorCode?: string }).filter((l) => l.reqId).map((l) => [l.reqId, l]));
    expect(byId.get('limited')?.errorCode).toBe('rate_limit_exceeded');
    expect(byId.get('auth')?.errorCode).toBe('upstream_auth_error');
  });
});

describe('draining: a retry that cannot wait within the grace period, and one the grace end cuts', () => {
  it('goes to the next target at once when the route has one, rather than the 503', async () => {
    const primary = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      res.writeHead(503, { 'content-type': 'application/json' }).end('{"error":{"message":"busy","type":"server_error","code":null}}');
    });
    const backup = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'application/json' }).end(chatCompletion('from the backup'));
    });
    const s = await stack({
      config: () => {
        const c = configFor(primary.origin, { retry: { backoff: { strategy: 'fixed', baseMs: 5_000, capMs: 5_000 } } }, { drain: { preStopMs: 2_000, graceMs: 500 } })();
        return { ...c, providers: { ...c.providers, b: { family: 'openai', baseUrl: `${backup.origin}/v1`, apiKey: 'b-key-0123456789', breaker: false } }, routes: c.routes.map((r) => ({ ...r, targets: [{ provider: 'p' }, { provider: 'b' }] })) };
      },
    });
    const drained = s.gateway.drain();
    await sleep(50);
    const sent = Date.now();
    expect((await ask(s.url)).status).toBe(200);
    expect(Date.now() - sent).toBeLessThan(1_500);
    expect([primary.hits(), backup.hits()]).toEqual([1, 1]);
    await drained;
  });

  it('cut at the grace end, is told the rest of its wait as retry-after, not a second', async () => {
    const p = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      res.writeHead(503, { 'content-type': 'application/json' }).end('{"error":{"message":"busy","type":"server_error","code":null}}');
    });
    // The wait (8 s) begins before the drain; the grace period ends 600 ms after the drain begins.
    const s = await stack({ config: configFor(p.origin, { retry: { backoff: { strategy: 'fixed', baseMs: 8_000, capMs: 8_000 } }, minAttemptMs: 100 }, { drain: { preStopMs: 100, graceMs: 500 } }) });
    const answer = ask(s.url);
    await sleep(300);
    const drained = s.gateway.drain();
    const got = await answer;
    expect(got).toMatchObject({ status: 503, code: 'gateway_draining' });
    // About 8,000 - 300 - 600 left of the wait; bounds for a loaded machine.
    expect(got.retryAfterMs).toBeGreaterThan(5_000);
    expect(got.retryAfterMs).toBeLessThanOrEqual(8_000);
    expect(p.hits()).toBe(1);
    await drained;
  });
});
