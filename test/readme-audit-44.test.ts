// README claims checked by running them (audit 44: logs and metrics, client limits, idempotency, passthrough), pinned
// here where no other test held them, and the one that did not hold: a passthrough request's line named no
// upstreamRequestId, though README "Logs and metrics" gives every request's line the id of the answer passed on.
import { describe, expect, it, vi } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { mockControl } from './helpers/mock-control.ts';
import { defaultConfig, RETRY_LOOP_ONLY, scrapeMetrics, useStacks, type Stack } from './helpers/stack.ts';

const startStack = useStacks();
const startFake = useFakeProviders();

const CHAT = { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] };

/** The parsed request lines (those with a reqId) of a stack's log. */
function requestLines(s: Stack): Record<string, unknown>[] {
  return s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => typeof l.reqId === 'string');
}

/** The request line of the answer with this x-stormgate-request-id, once written. */
async function lineOf(s: Stack, res: Response): Promise<Record<string, unknown>> {
  const id = res.headers.get('x-stormgate-request-id');
  let line: Record<string, unknown> | undefined;
  await vi.waitFor(() => {
    line = requestLines(s).find((l) => l.reqId === id);
    expect(line).toBeDefined();
  }, { timeout: 5_000, interval: 20 });
  return line!;
}

function chat(s: Stack, headers: Record<string, string> = {}, body: string = JSON.stringify(CHAT)): Promise<Response> {
  return fetch(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
}

describe('a passthrough request\'s log line', () => {
  it('names the upstreamRequestId of the answer passed on, as a managed request\'s line does', async () => {
    const s = await startStack({
      config: (mockUrl) => ({ ...defaultConfig(mockUrl, RETRY_LOOP_ONLY), passthrough: { provider: 'mock', paths: ['/v1/files'] } }),
    });
    // The mock has no files API: its 404 (with its x-request-id) is the answer passed on.
    const res = await fetch(`${s.url}/v1/files`);
    expect(res.status).toBe(404);
    const upstreamId = res.headers.get('x-request-id');
    expect(upstreamId).toMatch(/^req_/);
    await res.arrayBuffer();
    expect((await lineOf(s, res)).upstreamRequestId).toBe(upstreamId);
  });

  it('leaves out the provider key a provider echoes in its request id', async () => {
    const fake = await startFake((req, res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'x-request-id': `req_${String(req.headers.authorization).slice('Bearer '.length)}` });
      res.end('{"object":"list","data":[]}');
    });
    const s = await startStack({
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl, RETRY_LOOP_ONLY);
        const echo = { family: 'openai' as const, baseUrl: `${fake.origin}/v1`, apiKey: 'sk-echoed-audit44-0123456789', breaker: false as const };
        return { ...base, providers: { ...base.providers, echo }, passthrough: { provider: 'echo', paths: ['/v1/files'] } };
      },
    });
    const res = await fetch(`${s.url}/v1/files`);
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    const line = await lineOf(s, res);
    expect(line.upstreamRequestId).toBe('req_[redacted]');
    expect(JSON.stringify(line)).not.toContain('sk-echoed-audit44');
  });
});

describe('the trace id in the request line', () => {
  it('logs none for a traceparent the W3C spec calls invalid (version ff, an all-zero parent id), and forwards it as it came', async () => {
    const s = await startStack(RETRY_LOOP_ONLY);
    const ff = 'ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
    const zeroParent = '00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01';
    for (const traceparent of [ff, zeroParent]) {
      const res = await chat(s, { traceparent });
      expect(res.status).toBe(200);
      await res.arrayBuffer();
      expect((await lineOf(s, res)).traceId).toBeUndefined();
    }
    const seen = (await mockControl(s.mock, 'GET', 'requests')) as { headers: Record<string, string> }[];
    expect(seen.map((r) => r.headers.traceparent)).toEqual([ff, zeroParent]);
  });
});

describe('the default deadline margin', () => {
  it('keeps back 5% of a 120 s route timeout: budgetMs 114000, deadlineSource route', async () => {
    const s = await startStack(RETRY_LOOP_ONLY);
    const res = await chat(s);
    await res.arrayBuffer();
    const line = await lineOf(s, res);
    expect(line.budgetMs).toBe(114_000);
    expect(line.deadlineSource).toBe('route');
  });
});

describe('/healthz, /readyz and /metrics', () => {
  it('write no log line when they succeed (scrapes and probes come every few seconds)', async () => {
    const s = await startStack(RETRY_LOOP_ONLY);
    for (const path of ['/healthz', '/readyz', '/metrics']) {
      const res = await fetch(`${s.url}${path}`);
      expect(res.status).toBe(200);
      await res.arrayBuffer();
    }
    // A request after them is logged: its line is the only one.
    const res = await chat(s);
    await res.arrayBuffer();
    await lineOf(s, res);
    expect(requestLines(s).map((l) => l.path)).toEqual(['/v1/chat/completions']);
  });
});

function limited(mockUrl: string): ConfigInput {
  return { ...defaultConfig(mockUrl, RETRY_LOOP_ONLY), auth: { keys: { bob: 'key-bob-audit44' }, limits: { bob: { requestsPerMinute: 6, burst: 1 } } } };
}

describe('a client past its request rate', () => {
  it('gets 429 client_rate_limited from its headers alone: a broken body and an unknown path too, each counted by client', async () => {
    const s = await startStack({ config: limited });
    const auth = { authorization: 'Bearer key-bob-audit44' };
    const first = await chat(s, auth);
    expect(first.status).toBe(200);
    await first.arrayBuffer();
    const broken = await chat(s, auth, '{broken');
    const unknown = await fetch(`${s.url}/v1/no-such-path`, { method: 'POST', headers: { 'content-type': 'application/json', ...auth }, body: '{}' });
    for (const res of [broken, unknown]) {
      expect(res.status).toBe(429);
      expect(res.headers.get('x-should-retry')).toBe('true');
      expect(Number(res.headers.get('retry-after-ms'))).toBeGreaterThan(0);
      const body = (await res.json()) as { error: { type: string; code: string } };
      expect(body.error).toMatchObject({ type: 'rate_limit_error', code: 'client_rate_limited' });
    }
    const limitedTotal = (await scrapeMetrics(s.url)).find((m) => m.name === 'stormgate_client_limited_total' && m.labels.client === 'bob' && m.labels.by === 'requests');
    expect(limitedTotal?.value).toBe(2);
  });
});

describe('a repeat while its idempotency key\'s run is in flight', () => {
  it('is answered at its own deadline 409 idempotency_key_in_progress with retry-after-ms 1000, and the run still answers', async () => {
    const s = await startStack({ ...RETRY_LOOP_ONLY, faults: { latencyMs: 2_000 } });
    const headers = { 'idempotency-key': 'audit44-key', 'x-stormgate-timeout-ms': '1000' };
    const run = chat(s, headers);
    await new Promise((r) => setTimeout(r, 200));
    const repeat = await chat(s, headers);
    expect(repeat.status).toBe(409);
    expect(repeat.headers.get('x-should-retry')).toBe('true');
    expect(repeat.headers.get('retry-after-ms')).toBe('1000');
    expect(repeat.headers.get('retry-after')).toBe('1');
    expect(((await repeat.json()) as { error: { code: string } }).error.code).toBe('idempotency_key_in_progress');
    // The run is detached from its client's timeout header: it answers after the provider's 2 s, not at 1 s.
    const first = await run;
    expect(first.status).toBe(200);
    await first.arrayBuffer();
  });
});

describe('the per-client pool gauges', () => {
  it('have a zero series for every client key in every class from the start', async () => {
    const s = await startStack({ config: (mockUrl) => ({ ...limited(mockUrl), auth: { keys: { alice: 'key-alice-audit44', bob: 'key-bob-audit44' } } }) });
    const metrics = await scrapeMetrics(s.url);
    for (const name of ['stormgate_pool_client_in_use', 'stormgate_pool_client_queue_depth']) {
      const series = metrics.filter((m) => m.name === name).map((m) => `${m.labels.provider} ${m.labels.priority} ${m.labels.client} ${m.value}`);
      expect(series.sort()).toEqual(['mock batch alice 0', 'mock batch bob 0', 'mock online alice 0', 'mock online bob 0']);
    }
  });
});
