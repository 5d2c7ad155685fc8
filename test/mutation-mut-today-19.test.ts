// Mutants of serve-targets.ts the other tests let live. Over real HTTP: a request that ends in the lot (its queue
// full, the gateway closing, its client gone) or cannot park at all names in its log line the target that held it back
// (`noteBlocked`), as one whose wait ran out does; without it the line says `unavailable` and nothing of why. On its
// own (tryTarget and the lot scripted, the clock fixed): the last look once a wait with two targets down runs out, and
// no park after it; the failure a target gave preferred to another's unavailability (`worst`); the time parked shown as
// the wait before the attempt it led to (released, or moved: `movedWaitMs`), and only that one; a fallback sent to
// after all no longer named as skipped (`forgetSkipped`), one never sent to still named; the reason a wait behind the
// release is shed with (max_wait, deadline); the lot's options (maxWaitMs left, notBeforeMs, alternates); the wait-hint
// cap, own hold-offs aside; the unlooked targets after a release; a failed probe's failure; the soonest shed; the
// hand-over owed to a fallback queued behind.
import { setTimeout as sleep } from 'node:timers/promises';
import type { FastifyInstance } from 'fastify';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import type { Config } from '../src/config/schema.ts';
import type { MockServer } from '../src/mock/server.ts';
import { createLogger } from '../src/observability/logger.ts';
import { createMetrics } from '../src/observability/metrics.ts';
import { buildServer } from '../src/server.ts';
import { classify } from '../src/policy/outcome.ts';
import { serveScripted, type ParkOutcome, type ScriptedServeOptions } from './helpers/scripted-serve.ts';
import { scrapeMetrics, testLogSink, useExtraMocks } from './helpers/stack.ts';

// serve-targets.ts alone (the tests at the end): tryTarget and heldBack answer from a script while one is set; the
// gateways of the other tests use the real ones.
const script = vi.hoisted(() => ({
  on: false,
  answers: new Map<string, unknown[]>(),
  held: new Map<string, { reason: 'breaker' | 'hold-off'; availableAtMs: number }>(),
}));
vi.mock('../src/pipeline/target-attempts.ts', async (importOriginal) => {
  const real = await importOriginal<typeof import('../src/pipeline/target-attempts.ts')>();
  return {
    ...real,
    heldBack: (...args: Parameters<typeof real.heldBack>) => (script.on ? script.held.get(args[1].key) : real.heldBack(...args)),
    tryTarget: async (...args: Parameters<typeof real.tryTarget>) => {
      if (!script.on) return real.tryTarget(...args);
      const [ctx, plan, run] = args;
      const next = script.answers.get(plan.key)?.shift() as { kind: string; sent?: true } | undefined;
      if (next === undefined) throw new Error(`no answer scripted for ${plan.key}`);
      if ((next as { probeFailed?: true }).probeFailed) run.lastFailure = { kind: 'failed' } as never;
      if (next.sent) {
        run.sent++;
        ctx.attempts.push({ target: plan.label, attempt: run.sent - 1, reason: next.kind, waitMs: run.waitMs, durationMs: 0 });
      }
      return next as never;
    },
  };
});

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- a log line is JSON: tests read whatever field they check
type Line = Record<string, any>;

const startMock = useExtraMocks();
const gateways: FastifyInstance[] = [];
afterEach(async () => {
  await Promise.all(gateways.splice(0).map((g) => g.close()));
});

async function gateway(config: Config): Promise<{ app: FastifyInstance; url: string; lines: () => Line[] }> {
  const logs: string[] = [];
  const app = await buildServer(config, { logger: createLogger(config, testLogSink(logs)), metrics: createMetrics({ defaultMetrics: false }) });
  gateways.push(app);
  const url = await app.listen({ host: '127.0.0.1', port: 0 });
  return { app, url, lines: () => logs.map((l) => JSON.parse(l) as Line).filter((l) => l.route === 'chat') };
}

/** One target, held off 5 s by its first answer (a 429 with retry-after), and a lot of `park`. */
async function heldOffTarget(park: string): Promise<{ mock: MockServer; app: FastifyInstance; url: string; lines: () => Line[] }> {
  const mock = await startMock({ faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '5' } }] } });
  const config = parseConfig(
    `
server: { host: 127.0.0.1, port: 0 }
providers:
  p: { family: openai, baseUrl: "${mock.url}/v1", apiKey: sk-p }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: p } ]
    retry: { maxAttempts: 1 }
    park: ${park}
`,
    'mut19.yaml',
    {},
  );
  return { mock, ...(await gateway(config)) };
}

const ask = (url: string, signal?: AbortSignal) =>
  fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-stormgate-timeout-ms': '20000' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    signal,
  }).then(async (res) => ({ status: res.status, body: (await res.json()) as { error?: { code?: string } } }));

/** Waits (up to 10 s) until a request is parked on the gateway at `url`. */
async function oneParked(url: string): Promise<void> {
  const until = Date.now() + 10_000;
  for (;;) {
    const parked = (await scrapeMetrics(url)).filter((m) => m.name === 'stormgate_parked_requests').reduce((sum, m) => sum + m.value, 0);
    if (parked >= 1) return;
    if (Date.now() > until) throw new Error('no request parked');
    await sleep(20);
  }
}

/** Waits (up to 5 s) for the log lines `want` picks. */
async function linesWhere(lines: () => Line[], want: (l: Line) => boolean, n = 1): Promise<Line[]> {
  const until = Date.now() + 5_000;
  for (;;) {
    const found = lines().filter(want);
    if (found.length >= n || Date.now() > until) return found;
    await sleep(20);
  }
}

const HELD_OFF = [{ target: 'p/gpt-4o', reason: expect.stringContaining('held off') }];

describe('a request that ends in the lot without an attempt names the target that held it back', () => {
  it('when the queue is full (503 park_queue_full)', { timeout: 30_000 }, async () => {
    const { url, lines } = await heldOffTarget('{ maxQueue: 1 }');
    expect((await ask(url)).status).toBe(429); // starts the 5 s hold-off
    const parked = ask(url).catch(() => undefined); // parks for the target, filling the queue
    await oneParked(url);
    const full = await ask(url);
    expect(full).toMatchObject({ status: 503, body: { error: { code: 'park_queue_full' } } });
    const [line] = await linesWhere(lines, (l) => l.status === 503 && l.attempts.length === 0);
    expect(line, JSON.stringify(lines())).toMatchObject({ skipped: HELD_OFF });
    void parked;
  });

  it('when the gateway closes while it is parked', { timeout: 30_000 }, async () => {
    const { app, url, lines } = await heldOffTarget('{}');
    expect((await ask(url)).status).toBe(429);
    const parked = ask(url);
    await oneParked(url);
    gateways.splice(gateways.indexOf(app), 1);
    const closed = app.close();
    expect((await parked).status).toBe(503);
    await closed;
    const [line] = await linesWhere(lines, (l) => l.status === 503 && l.attempts.length === 0);
    expect(line, JSON.stringify(lines())).toMatchObject({ skipped: HELD_OFF });
  });

  it('when its client leaves while it is parked', { timeout: 30_000 }, async () => {
    const { url, lines } = await heldOffTarget('{}');
    expect((await ask(url)).status).toBe(429);
    const gone = new AbortController();
    const parked = ask(url, gone.signal).catch(() => 'aborted');
    await oneParked(url);
    gone.abort();
    expect(await parked).toBe('aborted');
    const [line] = await linesWhere(lines, (l) => l.status !== 429 && l.attempts.length === 0);
    expect(line, JSON.stringify(lines())).toMatchObject({ skipped: HELD_OFF });
  });
});

describe('a request that cannot park names the target that held it back', () => {
  it('on a route with park: false (provider_held_off)', { timeout: 30_000 }, async () => {
    const { url, lines } = await heldOffTarget('false');
    expect((await ask(url)).status).toBe(429);
    const held = await ask(url);
    expect(held).toMatchObject({ body: { error: { code: 'provider_held_off' } } });
    const [line] = await linesWhere(lines, (l) => l.attempts.length === 0);
    expect(line, JSON.stringify(lines())).toMatchObject({ outcome: 'unavailable', skipped: HELD_OFF });
  });
});

describe('serve-targets.ts on its own (tryTarget scripted, the lot a stub)', () => {
  const clock = { now: 1_000_000 };
  const serve = (keys: string[], parks: ParkOutcome[], o?: ScriptedServeOptions) => serveScripted(clock, keys, parks, o);
  beforeEach(() => {
    script.on = true;
    script.answers.clear();
    script.held.clear();
    clock.now = 1_000_000;
  });
  afterEach(() => {
    script.on = false;
  });

  const http503 = { outcome: { kind: 'http' as const, status: 503, errorCode: null, hint: undefined }, status: 503, headers: {}, body: Buffer.from('') };
  const failed = { kind: 'failed', result: http503, cls: classify(http503.outcome), retryAfterMs: undefined, sent: true };
  const ok = { kind: 'ok', result: { outcome: { kind: 'ok' } }, sent: true };
  const down = (inMs: number, reason: 'breaker' | 'hold-off' = 'breaker') => ({ kind: 'unavailable', reason, availableAtMs: clock.now + inMs });


  it('takes a last look at every target when its wait runs out with two down, and is served by one back by then', async () => {
    script.answers.set('a', [down(5_000), down(5_000)]);
    script.answers.set('b', [down(3_000), ok]);
    const r = await serve(['a', 'b'], [{ kind: 'timeout' }]);
    expect(r.served).toMatchObject({ kind: 'ok', plan: { key: 'b' } });
    expect(r.parked).toEqual(['b']);
  });

  it('parks no more after that last look', async () => {
    script.answers.set('a', [down(5_000), down(5_000)]);
    script.answers.set('b', [down(3_000), down(3_000)]);
    const r = await serve(['a', 'b'], [{ kind: 'timeout' }]);
    expect(r.served).toMatchObject({ kind: 'unavailable', plan: { key: 'b' }, reason: 'breaker' });
    expect(r.parked).toEqual(['b']);
    expect(r.skipped).toEqual([{ target: 'a', reason: 'circuit breaker open' }, { target: 'b', reason: 'circuit breaker open' }]);
  });

  it("ends with the failure a target gave when the wait for the other runs out, not the other's unavailability", async () => {
    script.answers.set('a', [failed]);
    script.answers.set('b', [down(3_000, 'hold-off')]);
    // Still held off when the wait runs out (the request is answered for what holds the target then).
    script.held.set('b', { reason: 'hold-off', availableAtMs: clock.now + 3_000 });
    const r = await serve(['a', 'b'], [{ kind: 'timeout' }]);
    expect(r.served).toMatchObject({ kind: 'failed', plan: { key: 'a' } });
    expect(r.skipped).toEqual([{ target: 'b', reason: expect.stringContaining('held off') }]);
  });

  it('ends with that failure too when it cannot park at all', async () => {
    script.answers.set('a', [failed]);
    script.answers.set('b', [down(3_000, 'hold-off')]);
    const r = await serve(['a', 'b'], [], { park: false });
    expect(r.served).toMatchObject({ kind: 'failed', plan: { key: 'a' } });
    expect(r.parked).toEqual([]);
  });

  it('shows the time parked before it was moved as the wait before the first attempt sent, and only that one', async () => {
    script.answers.set('a', [down(5_000), failed]);
    script.answers.set('b', [down(3_000), ok]);
    const r = await serve(['a', 'b'], [{ kind: 'moved' }], { parkMs: 700 });
    expect(r.served).toMatchObject({ kind: 'ok', plan: { key: 'b' } });
    expect(r.attempts.map((x) => [x.target, x.waitMs])).toEqual([['a', 700], ['b', 0]]);
  });

  it('shows the time parked as the wait before the attempt it was released to', async () => {
    script.answers.set('a', [down(3_000)]);
    const ticket = { done: () => undefined };
    script.answers.get('a')!.push(ok);
    const r = await serve(['a'], [{ kind: 'released', ticket } as unknown as ParkOutcome], { parkMs: 900 });
    expect(r.served).toMatchObject({ kind: 'ok' });
    expect(r.attempts.map((x) => [x.target, x.waitMs])).toEqual([['a', 900]]);
  });

  it('no longer names as passed over a fallback it was sent to once released, and still names one it was not', async () => {
    const ticket = { done: () => undefined };
    script.answers.set('a', [failed]);
    script.answers.set('b', [down(3_000, 'hold-off'), ok]);
    const sent = await serve(['a', 'b'], [{ kind: 'released', ticket } as unknown as ParkOutcome]);
    expect(sent.served).toMatchObject({ kind: 'ok', plan: { key: 'b' } });
    expect(sent.skipped).toEqual([]);
    // Released, it found no slot there (shed): the fallback was never sent it, and the line still says why.
    script.answers.set('a', [failed]);
    script.answers.set('b', [down(3_000, 'hold-off'), { kind: 'shed', reason: 'deadline', retryAfterMs: 500, className: 'online', lowestClass: false }]);
    const shed = await serve(['a', 'b'], [{ kind: 'released', ticket } as unknown as ParkOutcome]);
    expect(shed.served).toMatchObject({ kind: 'failed', plan: { key: 'a' } });
    expect(shed.skipped).toEqual([{ target: 'b', reason: expect.stringContaining('held off') }]);
  });

  it("names a fallback the request last waited for behind the release at capacity, not as held off any more", async () => {
    script.answers.set('a', [failed]);
    script.answers.set('b', [down(3_000, 'hold-off')]);
    // Moved once the hold-off ended; the fallback then has requests parked before this one, being let go.
    const r = await serve(['a', 'b'], [{ kind: 'moved' }, { kind: 'timeout' }], { waiting: (key, parks) => (key === 'b' && parks > 0 ? 1 : 0) });
    expect(r.parked).toEqual(['b', 'b']);
    expect(r.served).toMatchObject({ kind: 'failed', plan: { key: 'a' } });
    expect(r.skipped).toEqual([{ target: 'b', reason: expect.stringContaining('at capacity') }]);
  });

  const pacing = (key: string, parks: number) => (key === 'b' && parks > 0 ? 1 : 0);

  it("sheds one that waited behind the release as max_wait when park.maxWaitMs ran out, as deadline when its deadline did", async () => {
    script.answers.set('b', [down(3_000, 'hold-off')]);
    const maxWait = await serve(['b'], [{ kind: 'moved' }, { kind: 'timeout' }], { waiting: pacing, park: { maxQueue: 100, maxWaitMs: 1_000 } });
    expect(maxWait.served).toMatchObject({ kind: 'shed', shed: { reason: 'max_wait', retryAfterMs: 1_234 } });
    // Moved out of a wait bounded by maxWaitMs, it finds its deadline too near to park again: that is the deadline's.
    script.answers.set('b', [down(3_000, 'hold-off')]);
    const deadline = await serve(['b'], [{ kind: 'moved' }], { waiting: pacing, parkMs: 29_950, park: { maxQueue: 100, maxWaitMs: 20_000 } });
    expect(deadline.parked).toEqual(['b']);
    expect(deadline.served).toMatchObject({ kind: 'shed', shed: { reason: 'deadline' } });
  });

  it('gives each wait in the lot what is left of park.maxWaitMs, waits for the time expected, and watches only the others held', async () => {
    script.answers.set('a', [down(5_000, 'hold-off')]);
    script.answers.set('b', [down(3_000, 'hold-off')]);
    const r = await serve(['a', 'b'], [{ kind: 'moved' }, { kind: 'timeout' }], { parkMs: 700, waiting: (key, parks) => (parks > 0 ? 1 : 0), park: { maxQueue: 100, maxWaitMs: 1_000 } });
    expect(r.opts[0]).toMatchObject({ maxWaitMs: 1_000, notBeforeMs: 1_000_000 + 3_000, alternates: ['a'] });
    // Both back, their parked requests being let go: it waits behind the first, and watches no other for a return.
    expect(r.opts[1]).toMatchObject({ maxWaitMs: 300, alternates: [] });
    expect(r.opts[1]!.notBeforeMs).toBeUndefined();
  });

  it("parks past retry.maxWaitHintMs only for the hold-off its own answer started", async () => {
    script.answers.set('b', [down(15_000, 'hold-off')]);
    const other = await serve(['b'], [], {});
    expect(other.parked).toEqual([]);
    expect(other.served).toMatchObject({ kind: 'unavailable', reason: 'hold-off' });
    script.answers.set('b', [{ ...down(15_000, 'hold-off'), own: true }]);
    const own = await serve(['b'], [{ kind: 'timeout' }], {});
    expect(own.parked).toEqual(['b']);
  });

  it('looks at the targets left unlooked when the one it was released to is away again', async () => {
    const ticket = { done: () => undefined };
    script.answers.set('a', [down(5_000), ok]);
    script.answers.set('b', [down(3_000), down(3_000)]);
    const r = await serve(['a', 'b'], [{ kind: 'released', ticket } as unknown as ParkOutcome]);
    expect(r.served).toMatchObject({ kind: 'ok', plan: { key: 'a' } });
  });

  it('ends with the failure of a probe that failed before the target went away again', async () => {
    script.answers.set('a', [{ ...down(3_000), probeFailed: true }]);
    const r = await serve(['a'], [{ kind: 'timeout' }]);
    expect(r.served).toMatchObject({ kind: 'failed', plan: { key: 'a' } });
  });

  it('tells a request shed by every target the soonest turn of any', async () => {
    const shed = (retryAfterMs: number) => ({ kind: 'shed', reason: 'deadline', retryAfterMs, className: 'online', lowestClass: false });
    script.answers.set('a', [shed(5_000)]);
    script.answers.set('b', [shed(2_000)]);
    script.answers.set('c', [shed(4_000)]);
    const r = await serve(['a', 'b', 'c'], []);
    expect(r.served).toMatchObject({ kind: 'shed', plan: { key: 'b' }, shed: { retryAfterMs: 2_000 } });
  });

  it('counts the hand-over to a fallback it queued behind, once released to it and sent there', async () => {
    const ticket = { done: () => undefined };
    script.answers.set('a', [failed]);
    script.answers.set('b', [ok]);
    const r = await serve(['a', 'b'], [{ kind: 'released', ticket } as unknown as ParkOutcome], { waiting: (key) => (key === 'b' ? 1 : 0) });
    expect(r.served).toMatchObject({ kind: 'ok', plan: { key: 'b' }, fallback: expect.any(String) });
    expect(r.fallbacks).toEqual(['a>b']);
  });

  it('never names as at capacity a target it was sent to, whose hold-off then held it behind the release', async () => {
    script.answers.set('b', [{ ...down(3_000, 'hold-off'), own: true, sent: true }]);
    const r = await serve(['b'], [{ kind: 'moved' }, { kind: 'timeout' }], { waiting: pacing });
    expect(r.parked).toEqual(['b', 'b']);
    expect(r.attempts.map((x) => x.target)).toEqual(['b']);
    expect(r.skipped).toEqual([]);
  });
});
