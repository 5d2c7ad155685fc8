// Failover edge cases, over real HTTP with the bundled mock: a credential hold skips its target at once (never parked,
// never a 429), a fallback's rejection never hides the primary's outage, a request no target can express is the
// client's 400, and the final error names the target that failed last.
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import type { FaultSpec, MockServer } from '../src/mock/server.ts';
import type { ServerDeps } from '../src/server.ts';
import { defaultConfig, RETRY_LOOP_ONLY, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';

const startStack = useStacks();
const startBackup = useExtraMocks();
let backup: MockServer | undefined;

type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];

/** The stack's mock as the OpenAI primary (`mock`) and, unless `family` is null, a second mock as `backup`. */
async function stackWith(opts: {
  faults?: FaultSpec;
  backupFaults?: FaultSpec;
  family?: 'openai' | 'anthropic' | null;
  route?: Partial<RouteInput>;
  provider?: Partial<ProviderInput>;
  backupProvider?: Partial<ProviderInput>;
  /** The backup target's own retry policy. */
  backupRetry?: RouteInput['retry'];
  /** The chat route's targets: the primary then the backup (default), the backup alone, or the backup first. */
  order?: 'primary-first' | 'backup-only' | 'backup-first';
  deps?: ServerDeps;
}): Promise<Stack> {
  const family = opts.family === undefined ? 'anthropic' : opts.family;
  if (family) backup = await startBackup({ faults: opts.backupFaults, quiet: true, apiKey: 'backup-key' });
  return startStack({
    faults: opts.faults,
    ...(opts.deps && { deps: opts.deps }),
    config: (url) => {
      const base = defaultConfig(url, {
        provider: { ...RETRY_LOOP_ONLY.provider, ...opts.provider },
        route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } },
      });
      if (!family) return { ...base, routes: base.routes.map((r) => (r.name === 'chat' ? { ...r, ...opts.route } : r)) };
      const backupTarget = { provider: 'backup', model: family === 'anthropic' ? 'claude-sonnet-4-5' : 'gpt-4.1', ...(opts.backupRetry && { retry: opts.backupRetry }) };
      return {
        ...base,
        providers: {
          ...base.providers,
          backup: { family, baseUrl: family === 'anthropic' ? backup!.url : `${backup!.url}/v1`, apiKey: 'backup-key', breaker: false, ...opts.backupProvider },
        },
        routes: base.routes.map((r) =>
          r.name === 'chat' ? { ...r, targets: targetsIn(opts.order ?? 'primary-first', { provider: 'mock' }, backupTarget), ...opts.route } : r,
        ),
      };
    },
  });
}

type TargetInput = RouteInput['targets'][number];

function targetsIn(order: 'primary-first' | 'backup-only' | 'backup-first', primary: TargetInput, backupTarget: TargetInput): TargetInput[] {
  if (order === 'backup-only') return [backupTarget];
  return order === 'backup-first' ? [backupTarget, primary] : [primary, backupTarget];
}

interface Answer {
  status: number;
  headers: Headers;
  body: { error?: { message: string; type: string; code: string | null; param: string | null } };
  ms: number;
}

async function chat(s: Stack, extra: Record<string, unknown> = {}, headers: Record<string, string> = {}): Promise<Answer> {
  const started = Date.now();
  const res = await fetch(`${s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], ...extra }),
  });
  return { status: res.status, headers: res.headers, body: (await res.json()) as Answer['body'], ms: Date.now() - started };
}

function logLines(s: Stack): Array<Record<string, any>> {
  return s.logs.map((l) => JSON.parse(l) as Record<string, any>).filter((l) => l.route === 'chat');
}

describe('credential hold', () => {
  it.each<[string, FaultSpec['errors']]>([
    ['401', [{ status: 401 }]],
    ['403', [{ status: 403 }]],
    ['429 insufficient_quota', [{ status: 429, code: 'insufficient_quota', type: 'insufficient_quota' }]],
  ])('answers 502 upstream_auth_error at once while the only target is held after a %s, never parked, never a 429', async (_name, errors) => {
    // Parking on (the default) and a breaker: what the hold must not fall into.
    const s = await stackWith({ family: null, faults: { errors }, route: { park: {} }, provider: { breaker: {} } });
    const first = await chat(s);
    expect(first.status).toBe(502);
    expect(first.body.error?.code).toBe('upstream_auth_error');
    for (const headers of [{}, { 'x-stormgate-timeout-ms': '2000' }] as Array<Record<string, string>>) {
      const held = await chat(s, {}, headers);
      expect(held.status).toBe(502);
      expect(held.body.error?.code).toBe('upstream_auth_error');
      // 5x: on a loaded machine a second or two may pass between the rejection and these requests.
      expect(held.body.error?.message).toMatch(/mock\/gpt-4o .*credentials.*not used for another (5\d|60) s/);
      expect(held.headers.get('x-should-retry')).toBe('false');
      expect(held.headers.get('retry-after')).toBeNull();
      // Not parked: a parked request would wait for its deadline (2 s with the header).
      expect(held.ms).toBeLessThan(1_500);
    }
    expect(s.mock.stats().total).toBe(1);
    const line = logLines(s).at(-1)!;
    expect(line.skipped[0]).toMatchObject({ target: 'mock/gpt-4o', reason: expect.stringMatching(/credentials/) });
  });

  it('fails over at once to the next target while the primary is held, with x-stormgate-fallback: credentials', async () => {
    const s = await stackWith({ family: 'openai', faults: { errors: [{ status: 401 }] }, route: { park: {} }, provider: { breaker: {} } });
    expect((await chat(s)).headers.get('x-stormgate-fallback')).toBe('credentials');
    const second = await chat(s, {}, { 'x-stormgate-timeout-ms': '2000' });
    expect(second.status).toBe(200);
    expect(second.headers.get('x-stormgate-target')).toBe('backup/gpt-4.1');
    expect(second.headers.get('x-stormgate-fallback')).toBe('credentials');
    // At once: parked, it would wait for its deadline (2 s with the header); 500 ms left a loaded machine little room.
    expect(second.ms).toBeLessThan(1_500);
    expect(s.mock.stats().total).toBe(1);
    expect(backup!.stats().total).toBe(2);
    // The hold is not a hold-off: no 429 hint ever reaches a parked request or a later one.
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toMatch(/stormgate_fallbacks_total\{route="chat",from="mock\/gpt-4o",to="backup\/gpt-4.1",reason="credentials"\} 2/);
  });

  it('gives the route\'s degraded answer while the only target is held, as for the rejection itself', async () => {
    const s = await stackWith({ family: null, faults: { errors: [{ status: 401 }] }, route: { degraded: { message: 'Try again later.' } } });
    for (let i = 0; i < 2; i++) {
      const a = await chat(s);
      expect(a.status).toBe(200);
      expect(a.headers.get('x-stormgate-degraded')).toBe('true');
    }
    expect(s.mock.stats().total).toBe(1);
  });

  it('holds only the gateway\'s credentials: a retry-after hold-off on the same target still parks and succeeds', async () => {
    const s = await stackWith({
      family: null,
      faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after-ms': '300' } }] },
      route: { retry: { maxAttempts: 1 }, park: {} },
    });
    expect((await chat(s)).status).toBe(429);
    const parked = await chat(s);
    expect(parked.status).toBe(200);
    expect(parked.ms).toBeGreaterThanOrEqual(150);
  });
});

describe('a retry-after on the primary with a backup that can answer', () => {
  const parkings: Array<[string, ConfigInput['routes'][number]['park']]> = [
    ['parking on', {}],
    // It cannot come back through the lot, and did not leave: it waited the 3 s out while every newcomer got the
    // backup's answer at once (20 s, for a retry-after of 20).
    ['parking off', false],
    ['a park.maxWaitMs shorter than the hold-off', { maxWaitMs: 500 }],
  ];
  it.each(parkings)('sends the request that got the hint to the backup at once, as the hold-off sends every newcomer, not after waiting it out (%s)', async (_name, park) => {
    const s = await stackWith({
      family: 'openai',
      faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '3' } }] },
      route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } }, park },
    });
    const first = await chat(s);
    expect(first.status).toBe(200);
    expect(first.headers.get('x-stormgate-target')).toBe('backup/gpt-4.1');
    expect(first.headers.get('x-stormgate-fallback')).toBe('held_off');
    // Waited out, the hint kept this caller 3 to 3.6 s while a newcomer, skipping the held-off primary, took 10 ms.
    expect(first.ms).toBeLessThan(1_500);
    const newcomer = await chat(s);
    expect(newcomer.headers.get('x-stormgate-target')).toBe('backup/gpt-4.1');
    expect(s.mock.stats().total).toBe(1);
    expect(logLines(s)[0]!.attempts.map((a: { target: string; status: number }) => `${a.target} ${a.status}`)).toEqual(['mock/gpt-4o 429', 'backup/gpt-4.1 200']);
  });

  it('comes back for the primary at the hold-off\'s end when the backup cannot answer either', async () => {
    const s = await stackWith({
      family: 'openai',
      faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '2' } }] },
      backupFaults: { errors: [{ status: 503 }] },
      route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } }, park: {} },
      backupRetry: { maxAttempts: 1 },
    });
    const first = await chat(s);
    expect(first.status).toBe(200);
    expect(first.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
    expect(first.ms).toBeGreaterThanOrEqual(1_900);
    expect(s.mock.stats().total).toBe(2);
    expect(backup!.stats().total).toBe(1);
  });

  it('waits a backoff-sized hint (under a second) out on the primary, the target the route prefers', async () => {
    const s = await stackWith({
      family: 'openai',
      faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after-ms': '300' } }] },
      route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } }, park: {} },
    });
    const first = await chat(s);
    expect(first.status).toBe(200);
    expect(first.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
    expect(first.ms).toBeGreaterThanOrEqual(280);
    expect(backup!.stats().total).toBe(0);
  });

  it('judges a pause by its hint, not by the hold-off\'s spread: a 950 ms hint is waited out on the primary', async () => {
    // The spread (up to a tenth) at its largest: 950 ms becomes a hold-off of 1,044 ms.
    const s = await stackWith({
      family: 'openai',
      deps: { random: () => 0.99 },
      faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after-ms': '950' } }] },
      route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } }, park: {} },
    });
    const first = await chat(s);
    expect(first.status).toBe(200);
    expect(first.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
    expect(backup!.stats().total).toBe(0);
  });

  const backupsThatFail: Array<[string, 'openai' | 'anthropic', FaultSpec | undefined, Record<string, unknown>]> = [
    ['a backup that fails', 'openai', { errors: [{ status: 503 }] }, {}],
    ['an Anthropic backup that cannot express the request (n: 2)', 'anthropic', undefined, { n: 2 }],
  ];
  it.each(backupsThatFail)('with parking off, comes back to wait its own hint out on the primary and gets its answer there, given %s', async (_name, family, backupFaults, extra) => {
    // It cannot come back for the primary through the parking lot: ended where it moved on, it got the backup's 503
    // (or the primary's 429) at once where waiting 2 s got an answer.
    const s = await stackWith({
      family,
      faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '2' } }] },
      backupFaults,
      route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } }, park: false },
      backupRetry: { maxAttempts: 1 },
    });
    const first = await chat(s, extra);
    expect(first.status).toBe(200);
    expect(first.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
    expect(first.ms).toBeGreaterThanOrEqual(1_900);
    expect(backup!.stats().total).toBe(backupFaults ? 1 : 0);
    expect(s.mock.stats().total).toBe(2);
  });

  /** The primary's one 429 with `retry-after`, a backup that fails, parking off. */
  const failingBackupParkingOff = (retryAfter: string) =>
    stackWith({
      family: 'openai',
      faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after': retryAfter } }] },
      backupFaults: { errors: [{ status: 503 }] },
      route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } }, park: false },
      backupRetry: { maxAttempts: 1 },
    });

  it('with parking off, ends with the backup\'s failure at once when its deadline leaves no time to wait the hold-off out', async () => {
    const s = await failingBackupParkingOff('3');
    const first = await chat(s, {}, { 'x-stormgate-timeout-ms': '2500' });
    expect(first.status).toBe(503);
    expect(first.headers.get('x-stormgate-target')).toBe('backup/gpt-4.1');
    expect(first.ms).toBeLessThan(1_500);
    expect([s.mock.stats().total, backup!.stats().total]).toEqual([1, 1]);
  });

  it('with parking off, sends nothing more once its client leaves during the wait for the primary', async () => {
    const s = await failingBackupParkingOff('2');
    const gone = fetch(`${s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
      signal: AbortSignal.timeout(700),
    }).catch((e: Error) => e.name);
    expect(await gone).toBe('TimeoutError');
    await sleep(2_500);
    expect([s.mock.stats().total, backup!.stats().total]).toEqual([1, 1]);
    expect(logLines(s).map((l) => l.outcome)).toEqual(['client_gone']);
  });

  it('waits its own hint out on the primary when park.maxWaitMs could not cover the hold-off after a backup that fails', async () => {
    const s = await stackWith({
      family: 'openai',
      faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '2' } }] },
      backupFaults: { errors: [{ status: 503 }] },
      route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } }, park: { maxWaitMs: 500 } },
      backupRetry: { maxAttempts: 1 },
    });
    const first = await chat(s);
    expect(first.status).toBe(200);
    expect(first.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
    expect(s.mock.stats().total).toBe(2);
  });

  it('parks for the primary after a backup that fails when its hint equals maxWaitHintMs and the hold-off\'s spread goes past it', async () => {
    // retry-after: 2 with maxWaitHintMs 2000 is a wait the retry policy takes; the hold-off it starts ends up to 2.2 s later.
    const s = await stackWith({
      family: 'openai',
      deps: { random: () => 0.99 },
      faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '2' } }] },
      backupFaults: { errors: [{ status: 503 }] },
      route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 }, maxWaitHintMs: 2_000 }, park: {} },
      backupRetry: { maxAttempts: 1 },
    });
    const first = await chat(s);
    expect(first.status).toBe(200);
    expect(first.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
    expect(first.ms).toBeGreaterThanOrEqual(2_000);
    expect(s.mock.stats().total).toBe(2);
  });

  it('takes no retry from the primary\'s budget for a request the backup answered: a later failure there is still retried', async () => {
    // A floor of one retry per 10 s window: the retry that never went to the primary spent it.
    const s = await stackWith({
      family: 'openai',
      faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '1' } }, { status: 500, times: 1 }] },
      route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } }, park: {}, budget: { ratio: 0.1, windowS: 10, minRetriesPerSecond: 0.1 } },
    });
    const movedOn = await chat(s);
    expect(movedOn.headers.get('x-stormgate-target')).toBe('backup/gpt-4.1');
    // Past the hold-off (1 s and its spread of up to 100 ms).
    await new Promise((r) => setTimeout(r, 1_300));
    const later = await chat(s);
    expect(later.status).toBe(200);
    expect(later.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
    expect(later.headers.get('x-stormgate-fallback')).toBeNull();
    expect(backup!.stats().total).toBe(1);
  });
});

describe('a newcomer parked behind requests waiting for the backup, its primary held off', () => {
  it('counts its answer from the backup as a fallback, as the request it queued behind', async () => {
    // A: the primary asks for 10 s, the backup for 2 s (A gets the backup's 429). B comes next and parks for the
    // backup; C comes while B waits: it finds the primary held off and B queued for the backup, and parks behind B.
    // Both are answered by the backup when its pause ends.
    const s = await stackWith({
      family: 'openai',
      faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '10' } }] },
      backupFaults: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '2' } }] },
      route: { retry: { maxAttempts: 1 }, park: {} },
    });
    expect((await chat(s)).status).toBe(429);
    const b = chat(s);
    await new Promise((r) => setTimeout(r, 300));
    const c = chat(s);
    const answers = [await b, await c];
    expect(answers.map((x) => [x.status, x.headers.get('x-stormgate-target'), x.headers.get('x-stormgate-fallback')])).toEqual([
      [200, 'backup/gpt-4.1', 'held_off'],
      [200, 'backup/gpt-4.1', 'held_off'],
    ]);
    const lines = logLines(s).filter((l) => l.msg === 'request').slice(1);
    expect(lines.map((l) => l.fallback)).toEqual(['held_off', 'held_off']);
    for (const l of lines) expect(l.skipped.map((k: { target: string }) => k.target)).toContain('mock/gpt-4o');
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toMatch(/^stormgate_fallback_requests_total\{route="chat"\} 2$/m);
    expect(metrics).toMatch(/^stormgate_fallbacks_total\{route="chat",from="mock\/gpt-4o",to="backup\/gpt-4.1",reason="held_off"\} 2$/m);
  }, 15_000);
});

describe('a fallback that rejects the request', () => {
  const maxTokensError = { status: 400, type: 'invalid_request_error', message: 'max_tokens: 100000 > 64000, which is the maximum allowed number of output tokens' };

  it('leaves the client the primary\'s 503, naming the fallback\'s rejection, when the primary was down', async () => {
    const s = await stackWith({ faults: { errors: [{ status: 503, message: 'the primary is overloaded' }] }, backupFaults: { errors: [maxTokensError] } });
    const a = await chat(s, { max_tokens: 100000 });
    expect(a.status).toBe(503);
    expect(a.body.error?.type).toBe('server_error');
    expect(a.body.error?.message).toMatch(/the primary is overloaded/);
    expect(a.body.error?.message).toMatch(/the fallback backup\/claude-sonnet-4-5 rejected the request \(400: max_tokens: 100000 > 64000/);
    expect(a.headers.get('x-should-retry')).toBe('false');
    expect(a.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
    expect(s.mock.stats().total).toBe(2);
    expect(backup!.stats().total).toBe(1);
  });

  it('answers circuit_open with the rejection as a note while the primary\'s breaker is open', async () => {
    const s = await stackWith({
      faults: { errors: [{ status: 503 }] },
      backupFaults: { errors: [maxTokensError] },
      provider: { breaker: { consecutiveFailures: 2, openS: 60 } },
    });
    expect((await chat(s, { max_tokens: 100000 })).status).toBe(503);
    const a = await chat(s, { max_tokens: 100000 });
    expect(a.status).toBe(503);
    expect(a.body.error?.code).toBe('circuit_open');
    expect(a.body.error?.message).toMatch(/circuit breaker is open.*; the fallback backup\/claude-sonnet-4-5 rejected the request \(400: max_tokens/);
    expect(a.headers.get('retry-after')).not.toBeNull();
    expect(s.mock.stats().total).toBe(2);
    expect(backup!.stats().total).toBe(2);
  });

  it('still fails fast with the primary\'s own 400, and never asks the fallback', async () => {
    const s = await stackWith({ faults: { errors: [{ status: 400, message: 'messages[0].content is bad' }] } });
    const a = await chat(s);
    expect(a.status).toBe(400);
    expect(a.body.error?.message).toBe('messages[0].content is bad');
    expect(backup!.stats().total).toBe(0);
  });

  it('ends with the primary\'s own 400, once and without a note, when it judges the request after a park', async () => {
    // The primary is held off (300 ms), the fallback rejects, the request parks for the primary, which then rejects:
    // the first target's word stands, whatever the fallback said before.
    const s = await stackWith({
      family: 'openai',
      faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after-ms': '300' } }, { status: 400, message: 'PRIMARY says: bad messages' }] },
      backupFaults: { errors: [{ status: 400, message: 'BACKUP says: max_tokens too large' }] },
      route: { retry: { maxAttempts: 1 }, park: {} },
    });
    expect((await chat(s)).status).toBe(429);
    const a = await chat(s);
    expect(a.status).toBe(400);
    expect(a.body.error?.message).toBe('PRIMARY says: bad messages');
    expect(a.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
    expect(a.headers.get('x-stormgate-fallback')).toBeNull();
    expect(s.mock.stats().total).toBe(2);
    expect(backup!.stats().total).toBe(2);
  });

  it('parks again for the primary when the fallback it was released for rejects the request', async () => {
    // Both targets are held off, the fallback for less: the request parks for it, and it rejects the request. The
    // primary was down, not judging: the request waits for it rather than taking the fallback's 400 as a verdict.
    const s = await stackWith({
      family: 'openai',
      faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after-ms': '900' } }] },
      backupFaults: { errors: [{ status: 429, times: 1, headers: { 'retry-after-ms': '200' } }, { status: 400, message: 'BACKUP says: max_tokens too large' }] },
      route: { retry: { maxAttempts: 1 }, park: {} },
    });
    expect((await chat(s)).status).toBe(429);
    const a = await chat(s);
    expect(a.status).toBe(200);
    expect(a.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
    expect(s.mock.stats().total).toBe(2);
    expect(backup!.stats().total).toBe(2);
  });

  it('records no fallback when a parked request goes back to the primary and it answers', async () => {
    const s = await stackWith({
      family: 'openai',
      faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after-ms': '300' } }] },
      backupFaults: { errors: [{ status: 400, message: 'BACKUP says: max_tokens too large' }] },
      route: { retry: { maxAttempts: 1 }, park: {} },
    });
    expect((await chat(s)).status).toBe(429);
    const a = await chat(s);
    expect(a.status).toBe(200);
    expect(a.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
    expect(a.headers.get('x-stormgate-fallback')).toBeNull();
    expect(logLines(s).at(-1)!.fallback).toBeUndefined();
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).not.toMatch(/stormgate_fallbacks_total\{route="chat",from="backup\/gpt-4.1",to="mock\/gpt-4o"/);
    expect(metrics).not.toMatch(/stormgate_fallback_requests_total\{route="chat"\} [1-9]/);
  });

  it('passes the fallback\'s 400 on when the primary could not take the request at all', async () => {
    // The Anthropic primary cannot express n > 1, so the OpenAI fallback is the first to judge the request: its word stands.
    const s = await stackWith({ order: 'backup-first', faults: { errors: [{ status: 400, message: 'n is too large' }] } });
    const a = await chat(s, { n: 2 });
    expect(a.status).toBe(400);
    expect(a.body.error?.message).toBe('n is too large');
    expect(backup!.stats().total).toBe(0);
  });
});

describe('a request no target can express', () => {
  it.each<[string, Record<string, unknown>, RegExp]>([
    ['messages that are not a list', { messages: 'x' }, /messages must be an array/],
    ['no messages', { messages: undefined }, /messages must be an array/],
    ['content that is a number', { messages: [{ role: 'user', content: 5 }] }, /messages\[0\]\.content/],
    ['n > 1', { n: 2 }, /n > 1/],
    ['a string tool schema', { tools: [{ type: 'function', function: { name: 'a', parameters: 'str' } }] }, /parameters must be an object schema/],
    ['tool_choice required without tools', { tool_choice: 'required' }, /tool_choice "required" needs tools/],
    ['a named tool_choice without a name', { tools: [{ type: 'function', function: { name: 'a' } }], tool_choice: { type: 'function' } }, /tool_choice\.function\.name/],
  ])('answers 400 invalid_request_error on an Anthropic-only route for %s, not 503', async (_name, extra, reason) => {
    const s = await stackWith({ order: 'backup-only' });
    const a = await chat(s, extra);
    expect(a.status).toBe(400);
    expect(a.body.error?.type).toBe('invalid_request_error');
    expect(a.body.error?.message).toMatch(reason);
    expect(a.body.error?.message).toMatch(/backup\/claude-sonnet-4-5/);
    // The field at fault, as OpenAI's own 400s name it.
    expect(a.body.error?.param).toBeTruthy();
    expect(a.headers.get('x-should-retry')).toBe('false');
    expect(backup!.stats().total).toBe(0);
    // The client's error, not the gateway's: recorded like an upstream's 400, a verdict on the request.
    expect(logLines(s).at(-1)!.outcome).toBe('invalid_request');
  });

  it('answers 503 no_target, not a 400, when a disabled provider\'s target was left out', async () => {
    // The disabled OpenAI primary could have sent n > 1: the request is valid, the configuration is short.
    const s = await stackWith({ provider: { apiKey: '', optional: true } });
    const a = await chat(s, { n: 2 });
    expect(a.status).toBe(503);
    expect(a.body.error?.code).toBe('no_target');
    expect(a.body.error?.message).toMatch(/mock\/gpt-4o: provider disabled.*backup\/claude-sonnet-4-5: .*n > 1/);
    expect(logLines(s).at(-1)!.outcome).toBe('unavailable');
    expect(backup!.stats().total).toBe(0);
  });

  it('keeps the primary\'s 503 when only the fallback cannot express the request', async () => {
    const s = await stackWith({ faults: { errors: [{ status: 503 }] } });
    const a = await chat(s, { n: 2 });
    expect(a.status).toBe(503);
    expect(backup!.stats().total).toBe(0);
    // The client learns why it was not failed over: it can drop n or accept the outage.
    expect(a.body.error?.message).toMatch(/not tried: backup\/claude-sonnet-4-5 \(.*n > 1.*\)/);
  });
});

describe('the final error after parking with probes', () => {
  it('names the target that failed last, with the attempts per target', async () => {
    const s = await stackWith({
      family: 'openai',
      faults: { resetRate: 1 },
      backupFaults: { resetRate: 1 },
      // The primary fails all its attempts; the backup's breaker opens during its retries, so the request parks for
      // the backup's probes, which fail too, until the deadline.
      backupProvider: { breaker: { consecutiveFailures: 2, openS: 60, probeWhileParkedMs: 100 } },
      backupRetry: { maxAttempts: 5, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } },
      route: { park: {}, minAttemptMs: 100 },
    });
    const a = await chat(s, {}, { 'x-stormgate-timeout-ms': '1500' });
    expect(a.status).toBe(502);
    expect(a.body.error?.code).toBe('upstream_unavailable');
    const attempts = logLines(s).at(-1)!.attempts as Array<{ target: string; probe?: boolean }>;
    const last = attempts.at(-1)!.target;
    expect(last).toBe('backup/gpt-4.1');
    const count = (t: string) => attempts.filter((x) => x.target === t).length;
    expect(attempts.some((x) => x.probe)).toBe(true);
    expect(a.headers.get('x-stormgate-target')).toBe(last);
    const other = last === 'mock/gpt-4o' ? 'backup/gpt-4.1' : 'mock/gpt-4o';
    expect(a.body.error?.message).toContain(`upstream ${last} could not be reached after ${count(last)} attempts (last: `);
    expect(a.body.error?.message).toMatch(new RegExp(`; ${attempts.length} attempts in all: .*${other} ${count(other)}`));
  });
});
