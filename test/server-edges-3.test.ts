// A client that leaves still gets its one log line and its one count (outcome client_gone), whenever it leaves:
// while the pipeline waits for the upstream, or in the middle of a stream. Never two.
import { describe, expect, it } from 'vitest';
import { defaultConfig, useStacks, type Stack } from './helpers/stack.ts';

const startStack = useStacks();
let stack: Stack;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function requestLines(s: Stack, reqId: string): Array<Record<string, unknown>> {
  return s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.reqId === reqId && (l.msg === 'request' || l.msg === 'stream ended abnormally'));
}

async function requestsTotal(s: Stack): Promise<Map<string, number>> {
  const text = await (await fetch(`${s.url}/metrics`)).text();
  const counts = new Map<string, number>();
  for (const m of text.matchAll(/^stormgate_requests_total\{[^}]*outcome="([a-z_]+)"[^}]*\} (\d+)/gm)) counts.set(m[1]!, (counts.get(m[1]!) ?? 0) + Number(m[2]));
  return counts;
}

/** Waits until `check` passes or a second went by (the line comes when the pipeline's answer settles). */
async function eventually(check: () => boolean | Promise<boolean>): Promise<void> {
  for (let i = 0; i < 50 && !(await check()); i++) await sleep(20);
}

function chat(s: Stack, reqId: string, signal: AbortSignal, stream: boolean) {
  return fetch(`${s.baseURL}/chat/completions`, {
    method: 'POST',
    signal,
    headers: { 'content-type': 'application/json', 'x-request-id': reqId },
    body: JSON.stringify({ model: 'gpt-4o', stream, messages: [{ role: 'user', content: 'x' }] }),
  });
}

describe('a client that leaves', () => {
  it('is logged once and counted once as client_gone when it leaves before the answer', async () => {
    stack = await startStack({ faults: { latencyMs: 2_000 } });
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 200);
    await expect(chat(stack, 'gone-early', ac.signal, false)).rejects.toThrow();
    await eventually(() => requestLines(stack, 'gone-early').length > 0);
    const lines = requestLines(stack, 'gone-early');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ route: 'chat', outcome: 'client_gone', clientGone: true });
    expect(lines[0]!.status).toBeUndefined();
    expect((await requestsTotal(stack)).get('client_gone')).toBe(1);
    await sleep(100);
    expect(requestLines(stack, 'gone-early')).toHaveLength(1);
  });

  it('is logged once and counted once as client_gone when it leaves in the middle of a stream', async () => {
    stack = await startStack({ faults: { stream: { chunks: 30, chunkDelayMs: 50 } } });
    const ac = new AbortController();
    const res = await chat(stack, 'gone-mid-stream', ac.signal, true);
    const reader = res.body!.getReader();
    await reader.read();
    await reader.read();
    ac.abort();
    await eventually(() => requestLines(stack, 'gone-mid-stream').length > 0);
    const lines = requestLines(stack, 'gone-mid-stream');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ route: 'chat', outcome: 'client_gone', clientGone: true, status: 200, streamEnd: 'client-gone' });
    const counts = await requestsTotal(stack);
    expect(counts.get('client_gone')).toBe(1);
    expect(counts.get('success') ?? 0).toBe(0);
    await sleep(100);
    expect(requestLines(stack, 'gone-mid-stream')).toHaveLength(1);
  });

  it('leaves a request answered in full with its single success line and count', async () => {
    stack = await startStack({});
    for (const stream of [false, true]) {
      const res = await chat(stack, `whole-${stream}`, new AbortController().signal, stream);
      await res.text();
    }
    await sleep(50);
    for (const stream of [false, true]) expect(requestLines(stack, `whole-${stream}`)).toEqual([expect.objectContaining({ outcome: 'success', status: 200 })]);
    const counts = await requestsTotal(stack);
    expect(counts.get('success')).toBe(2);
    expect(counts.get('client_gone') ?? 0).toBe(0);
  });
});

describe('metrics of a healthy gateway', () => {
  it('has the series the dashboard reads from the first scrape, and counts every pool slot\'s wait, 0 included', async () => {
    stack = await startStack();
    const before = await (await fetch(`${stack.url}/metrics`)).text();
    expect(before).toMatch(/^stormgate_park_outcomes_total\{route="chat",outcome="released"\} 0$/m);
    // The route serves any model: its target keys are learnt from traffic, and none is made up before (no `mock/other`).
    expect(before).not.toMatch(/target="mock\//);
    const res = await chat(stack, 'pool-wait-1', new AbortController().signal, false);
    expect(res.status).toBe(200);
    await res.text();
    const after = await (await fetch(`${stack.url}/metrics`)).text();
    expect(after).toMatch(/^stormgate_breaker_transitions_total\{target="mock\/gpt-4o",to="open"\} 0$/m);
    expect(after).toMatch(/^stormgate_breaker_state\{target="mock\/gpt-4o"\} 0$/m);
    expect(after).toMatch(/^stormgate_pool_wait_seconds_count\{provider="mock",priority="online"\} 1$/m);
    expect(after).toMatch(/^stormgate_pool_wait_seconds_bucket\{le="0.001",provider="mock",priority="online"\} 1$/m);
  });
});

describe('metrics of a fresh gateway', () => {
  it('start every series of the targets and hand-overs the config names at zero, so a first burst shows in increase()', async () => {
    stack = await startStack({
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl);
        return { ...base, routes: base.routes.map((r) => (r.name === 'chat' ? { ...r, match: { ...r.match, models: ['gpt-4o'] }, targets: [{ provider: 'mock' }, { provider: 'mock', model: 'gpt-4.1' }] } : r)) };
      },
    });
    const text = await (await fetch(`${stack.url}/metrics`)).text();
    expect(text).toMatch(/^stormgate_upstream_attempts_total\{target="mock\/gpt-4o",status_class="5xx"\} 0$/m);
    expect(text).toMatch(/^stormgate_requests_total\{route="chat",target="mock\/gpt-4\.1",priority="online",outcome="upstream_error"\} 0$/m);
    expect(text).toMatch(/^stormgate_fallbacks_total\{route="chat",from="mock\/gpt-4o",to="mock\/gpt-4\.1",reason="breaker_open"\} 0$/m);
    expect(text).toMatch(/^stormgate_stream_ends_total\{route="chat",end="cut"\} 0$/m);
    expect(text).toMatch(/^stormgate_ttft_seconds_count\{route="chat"\} 0$/m);
  });

  it('start every way a parked request leaves and, on a route with a degraded answer, every degraded reason at zero', async () => {
    stack = await startStack({
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl);
        return { ...base, routes: base.routes.map((r) => (r.name === 'chat' ? { ...r, degraded: { message: 'busy' } } : r)) };
      },
    });
    const text = await (await fetch(`${stack.url}/metrics`)).text();
    for (const outcome of ['released', 'moved', 'full', 'timeout', 'aborted', 'closing']) {
      expect(text).toMatch(new RegExp(`^stormgate_park_outcomes_total\\{route="chat",outcome="${outcome}"\\} 0$`, 'm'));
    }
    for (const reason of ['failed', 'unavailable', 'deadline', 'shed', 'park_full']) {
      expect(text).toMatch(new RegExp(`^stormgate_degraded_total\\{route="chat",reason="${reason}"\\} 0$`, 'm'));
    }
    // Only routes that have a degraded answer can count one.
    expect(text).not.toMatch(/^stormgate_degraded_total\{route="embeddings"/m);
  });
});

describe('the gateway\'s own endpoints', () => {
  it('log no line per scrape or probe that went well', async () => {
    stack = await startStack({});
    for (const path of ['/metrics', '/healthz', '/readyz']) expect((await fetch(`${stack.url}${path}`)).status).toBe(200);
    expect((await fetch(`${stack.url}/nope`)).status).toBe(404);
    const paths = stack.logs.map((l) => JSON.parse(l) as { path?: string }).map((l) => l.path).filter(Boolean);
    expect(paths).toEqual(['/nope']);
  });
});

describe('server.logSuccessRate', () => {
  it('samples plain successes only: retried requests and failures are always logged, and metrics count them all', async () => {
    stack = await startStack({
      faults: { models: { flaky: { errors: [{ status: 503, rate: 1, times: 1 }] }, wrong: { errors: [{ status: 400, rate: 1 }] } } },
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl, { route: { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } } });
        return { ...base, server: { ...base.server, logSuccessRate: 0 } };
      },
    });
    const send = (id: string, model: string) =>
      fetch(`${stack.baseURL}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-request-id': id },
        body: JSON.stringify({ model, messages: [{ role: 'user', content: 'x' }] }),
      }).then((r) => r.text());
    for (let i = 0; i < 5; i++) await send(`plain-${i}`, 'gpt-4o');
    await send('retried', 'flaky');
    await send('rejected', 'wrong');
    const ids = stack.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === 'request').map((l) => l.reqId);
    expect(ids).toEqual(['retried', 'rejected']);
    expect((await requestsTotal(stack)).get('success')).toBe(6);
  });
});
