// Mutation testing of the day's changes (TLS alerts, the 429 token-limit hint, minShare sums, outcome recording for
// stream recoveries, retriesStopped when the target is held back): each test kills mutants the other files let live.
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import type { AttemptResult } from '../src/pipeline/attempt.ts';
import { failureAnswer } from '../src/pipeline/final-answer.ts';
import { recordOutcome } from '../src/pipeline/record-outcome.ts';
import type { Guards, TargetPlan } from '../src/pipeline/target-attempts.ts';
import { classify, mayHaveRun, type AttemptOutcome } from '../src/policy/outcome.ts';
import { httpOutcome } from '../src/providers/error-outcome.ts';
import { configErrorOf, validConfigText } from './helpers/config-text.ts';
import { freePort } from './helpers/free-port.ts';
import { handedOverStream, readAll, upstream } from './helpers/live-stream.ts';
import { cc, delta, recoveringToNext, useScriptedGateway } from './helpers/scripted-provider.ts';
import { requestLine, useStacks, type Stack } from './helpers/stack.ts';

const network = (code: string): AttemptOutcome => ({ kind: 'network', code });

describe('TLS codes: a refusal that comes again on every attempt, or a connection that the next may pass', () => {
  it.each([
    // Alerts from the provider that say the two ends cannot agree.
    'ERR_SSL_TLSV1_ALERT_ACCESS_DENIED',
    'ERR_SSL_TLSV1_ALERT_INSUFFICIENT_SECURITY',
    'ERR_SSL_SSLV3_ALERT_BAD_CERTIFICATE',
    // The gateway's own OpenSSL refuses a server that old.
    'ERR_SSL_UNSAFE_LEGACY_RENEGOTIATION_DISABLED',
    'ERR_SSL_DH_KEY_TOO_SMALL',
  ])('%s is tls: not retried, never sent', (code) => {
    expect(classify(network(code))).toEqual({ cls: 'tls', retryKey: null, reason: 'tls' });
    expect(mayHaveRun(network(code))).toBe(false);
  });

  it.each([
    // Alerts about this connection (a record damaged on the way), and a damaged record the gateway itself detected.
    'ERR_SSL_TLSV1_ALERT_DECRYPTION_FAILED',
    'ERR_SSL_TLSV1_ALERT_RECORD_OVERFLOW',
    'ERR_SSL_DECRYPTION_FAILED_OR_BAD_RECORD_MAC',
  ])('%s stays a network failure, retried, that may have run', (code) => {
    expect(classify(network(code))).toEqual({ cls: 'network', retryKey: 'network', reason: 'network' });
    expect(mayHaveRun(network(code))).toBe(true);
  });

  it("a connect the gateway's own file descriptors refused sent nothing", () => {
    expect(mayHaveRun(network('EMFILE'))).toBe(false);
  });
});

describe('what the TLS failure message tells the operator to fix', () => {
  const messageFor = (code: string) => {
    const outcome = network(code);
    return failureAnswer({ result: { outcome }, cls: classify(outcome), retryAfterMs: undefined, attempts: [['p/m', 1]], target: 'p/m', budgetMs: 0 }).body.error.message;
  };
  const CLIENT_CERT = /the provider asks for a client certificate \(mutual TLS\)/;
  const NO_COMMON = /the provider shares no TLS version or cipher with the gateway/;
  it.each([
    ['ERR_SSL_WRONG_VERSION_NUMBER', /its port does not speak TLS: check that provider's baseUrl/],
    ['ERR_SSL_SSLV3_ALERT_NO_CERTIFICATE', CLIENT_CERT],
    ['ERR_SSL_SSLV3_ALERT_BAD_CERTIFICATE', CLIENT_CERT],
    ['ERR_SSL_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE', CLIENT_CERT],
    ['ERR_SSL_TLSV1_ALERT_UNKNOWN_CA', CLIENT_CERT],
    ['ERR_SSL_TLSV1_ALERT_ACCESS_DENIED', CLIENT_CERT],
    ['ERR_SSL_TLSV1_ALERT_INSUFFICIENT_SECURITY', NO_COMMON],
    ['ERR_SSL_NO_PROTOCOLS_AVAILABLE', NO_COMMON],
    ['ERR_SSL_UNSUPPORTED_PROTOCOL', NO_COMMON],
    ['ERR_SSL_UNSAFE_LEGACY_RENEGOTIATION_DISABLED', NO_COMMON],
    ['ERR_SSL_DH_KEY_TOO_SMALL', NO_COMMON],
    ['ERR_SSL_TLSV1_UNRECOGNIZED_NAME', /refused the handshake with that alert: check its TLS settings and the host name/],
    ['CERT_HAS_EXPIRED', /an expired certificate, or one for another host name, is the provider's to fix/],
  ])('%s', (code, fix) => {
    const message = messageFor(code);
    expect(message).toContain(`failed after 1 attempt (${code}): `);
    expect(message).toMatch(fix);
  });
});

describe('minShare values that add up to more than the pool', () => {
  const env = { OPENAI_API_KEY: 'sk-test' };
  const classes = (shares: string) => validConfigText().replace('    apiKey:', `    pools:\n      classes: { ${shares} }\n    apiKey:`);

  it('allows a sum of 1 that floating point adds up to a hair over it', () => {
    // 0.34 + 0.56 + 0.1 is 1.0000000000000002 in floating point.
    expect(0.34 + 0.56 + 0.1).toBeGreaterThan(1);
    expect(parseConfig(classes('online: { minShare: 0.34 }, batch: { minShare: 0.56 }, bulk: { minShare: 0.1 }'), 'gw.yaml', env).providers.openai!.pools.classes).toHaveProperty('bulk');
  });

  it('names the sum as written, not its floating point digits nor a rounding of them', () => {
    // 0.7 + 0.2 + 0.15 is 1.0499999999999998 in floating point.
    expect(configErrorOf(classes('online: { minShare: 0.7 }, batch: { minShare: 0.2 }, bulk: { minShare: 0.15 }'), env).message).toBe(
      'gw.yaml:6: providers.openai.pools.classes: the minShare values add up to 1.05 (online 0.7, batch 0.2, bulk 0.15), more than the whole pool: expected at most 1 in all, as each is a share of maxConcurrent kept for its class under contention',
    );
  });
});

describe('the 429 fallback to the token limits is for 429s only', () => {
  it('gives a 503 with room left in every limit no hint', () => {
    const headers = { 'x-ratelimit-reset-requests': '40s', 'x-ratelimit-remaining-requests': '12', 'x-ratelimit-reset-tokens': '3s', 'x-ratelimit-remaining-tokens': '1200' };
    const body = Buffer.from('{"error":{"message":"busy","type":"server_error"}}');
    expect(httpOutcome(503, headers, body, 0)).toMatchObject({ kind: 'http', status: 503, hint: undefined });
    expect(httpOutcome(429, headers, body, 0)).toMatchObject({ kind: 'http', status: 429, hint: { delayMs: 3_000, source: 'x-ratelimit-reset' } });
  });
});

describe("recordOutcome: what an attempt tells its target's guards", () => {
  interface Seen {
    records: Array<{ verdict: string; facts: unknown }>;
    holdOffs: number[];
    credentialHolds: number[];
  }
  function guardsSeeing(recordDone: Promise<void> = Promise.resolve()): { guards: Guards; seen: Seen } {
    const seen: Seen = { records: [], holdOffs: [], credentialHolds: [] };
    const board = {
      record: async (_key: string, _s: unknown, verdict: string, _ms: number, _probe: unknown, facts: unknown) => {
        seen.records.push({ verdict, facts });
        await recordDone;
      },
    };
    const holdOffs = {
      start: (_key: string, hint: { delayMs: number }) => {
        seen.holdOffs.push(hint.delayMs);
        return 1_000 + hint.delayMs;
      },
      holdCredentials: (_key: string, ms: number) => void seen.credentialHolds.push(ms),
    };
    return { guards: { board, holdOffs, budget: {} } as unknown as Guards, seen };
  }
  /** What the plan's pool heard: the adaptive limit's signal per attempt, with its round trip. */
  let limitSignals: Array<[string, string, number]> = [];
  const plan = (sharesHoldOffs = true) =>
    ({ key: 'p/m', limitKey: 'p/m', breaker: {}, sharesHoldOffs, client: { config: { authHoldS: 60 } }, pool: { observe: (...a: [string, string, number]) => void limitSignals.push(a), unansweredSince: () => false } }) as unknown as TargetPlan;
  const record = (guards: Guards, result: AttemptResult, p = plan()) => recordOutcome(guards, p, result, classify(result.outcome), 5, undefined);
  const http = (status: number, errorCode: string | null, delayMs?: number): AttemptResult => ({
    outcome: { kind: 'http', status, errorCode, hint: delayMs === undefined ? undefined : { delayMs, source: 'retry-after', fleetWide: true } },
    status,
  });

  it('resolves only once the breaker has written the outcome', async () => {
    let written!: () => void;
    const { guards } = guardsSeeing(new Promise((r) => (written = r)));
    let settled = false;
    const recorded = record(guards, { outcome: network('ECONNREFUSED') }).then(() => (settled = true));
    await new Promise((r) => setTimeout(r, 20));
    expect(settled).toBe(false);
    written();
    await recorded;
    expect(settled).toBe(true);
  });

  it("gives the breaker a network failure's code, and the gateway's own failure's", async () => {
    const { guards, seen } = guardsSeeing();
    await record(guards, { outcome: network('ECONNREFUSED') });
    await record(guards, { outcome: { kind: 'internal', code: 'ERR_INVALID_CHAR' } });
    expect(seen.records).toEqual([
      { verdict: 'failure', facts: { reason: 'network', code: 'ECONNREFUSED' } },
      { verdict: 'ignore-request', facts: { reason: expect.any(String), code: 'ERR_INVALID_CHAR' } },
    ]);
  });

  it("starts the hold-off a 503's retry-after asks for, and returns its end, when the plan shares hold-offs", async () => {
    const { guards, seen } = guardsSeeing();
    expect(await record(guards, http(503, null, 2_000))).toBe(3_000);
    expect(await record(guards, http(503, null, 2_000), plan(false))).toBeUndefined();
    expect(seen.holdOffs).toEqual([2_000]);
  });

  it("tells the target's adaptive limit of a 429 and of a success, whichever path sent the attempt", async () => {
    limitSignals = [];
    const { guards } = guardsSeeing();
    await record(guards, http(429, 'rate_limit_exceeded'));
    await record(guards, { outcome: { kind: 'ok', status: 200 }, status: 200 });
    await record(guards, http(503, null));
    expect(limitSignals).toEqual([
      ['p/m', 'rate-limited', 5],
      ['p/m', 'success', 5],
      ['p/m', 'none', 5],
    ]);
  });

  it("holds the credentials on a 429 that is the account's, and starts no hold-off for its retry-after", async () => {
    const { guards, seen } = guardsSeeing();
    expect(await record(guards, http(429, 'insufficient_quota', 2_000))).toBeUndefined();
    expect(seen.holdOffs).toEqual([]);
    expect(seen.credentialHolds).toEqual([60_000]);
  });
});

const start = useStacks();
/** A chat request's status; its log line is read with requestLine. */
const chat = async (s: Stack) =>
  (await fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }) })).status;
/** The request log lines of route chat, once there are `n`. */
async function chatLines(s: Stack, n: number): Promise<Array<Record<string, any>>> {
  const lines = () => s.logs.map((l) => JSON.parse(l) as Record<string, any>).filter((l) => l.route === 'chat');
  for (let i = 0; i < 100 && lines().length < n; i++) await new Promise((r) => setTimeout(r, 10));
  return lines();
}

describe('a retry the target is held back from', () => {
  it("waits out the hold-off its own 429 started, spread included, instead of taking it for another's", async () => {
    // The hold-off's spread takes the first draw (the most it can be: ~100 ms past the 1 s), the hint's jitter the next
    // (none): the retry's wait ends before the hold-off does, which is the request's own to wait out.
    let draws = 0;
    const s = await start({
      faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '1' } }] },
      route: { park: false, retry: { maxAttempts: 2 } },
      provider: { breaker: false },
      deps: { random: () => (draws++ === 0 ? 0.999_999 : 0) },
    });
    expect(await chat(s)).toBe(200);
    expect(s.mock.stats().total).toBe(2);
    expect((await requestLine(s)).attempts).toHaveLength(2);
  });

  it('says breaker_open for a retry whose backoff another request\'s failure opened the breaker in', async () => {
    const s = await start({
      faults: { errors: [{ status: 503 }] },
      route: { park: false, retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 600 } } },
      provider: { breaker: { consecutiveFailures: 2 } },
    });
    // The first request's failure is the first in a row; it waits 600 ms to retry. The second's, 200 ms in, opens the breaker.
    const first = chat(s);
    await new Promise((r) => setTimeout(r, 200));
    expect(await chat(s)).toBe(503);
    expect(await first).toBe(503);
    const lines = await chatLines(s, 2);
    expect(s.mock.stats().total).toBe(2);
    expect(lines.map((l) => [l.attempts.length, l.retriesStopped])).toEqual([
      [1, 'breaker_open'],
      [1, 'breaker_open'],
    ]);
  });

  /** p with one slot, no breaker; chat retried up to 3 times, 300 ms apart, never parked. */
  const oneSlot = useScriptedGateway((c) => {
    Object.assign(c.providers.p!, { breaker: false, pools: { maxConcurrent: 1 } });
    for (const r of c.routes) Object.assign(r, { park: false, retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 300 } } });
  });
  const json = { 'content-type': 'application/json' };

  it("says held_off for a retry waiting for the pool's one slot when another request's answer holds the target off", async () => {
    // The first request's 503 comes at once; its retry, 300 ms later, waits for the slot the second holds until its
    // 429 (asking for 30 s, past maxWaitHintMs) comes at ~600 ms and holds the target off.
    const { s } = await oneSlot((_b, n) =>
      n === 1
        ? { status: 503, headers: json, steps: ['{"error":{"message":"busy","type":"server_error"}}'] }
        : { status: 429, headers: { ...json, 'retry-after': '30' }, steps: [500, '{"error":{"message":"slow down","type":"rate_limit_error"}}'] },
    );
    const first = chat(s);
    await new Promise((r) => setTimeout(r, 100));
    expect(await chat(s)).toBe(429);
    expect(await first).toBe(503);
    const lines = await chatLines(s, 2);
    expect(lines.map((l) => [l.attempts.length, l.retriesStopped]).sort()).toEqual([
      [1, 'held_off'],
      [1, 'wait_hint'],
    ]);
  });
});

describe("a stream recovery's continuation in the request's log", () => {
  /** Where the continuation's target q is: set by the test before its gateway starts. */
  let qBaseUrl = '';
  const startScripted = useScriptedGateway((c, origin) => {
    recoveringToNext()(c, origin);
    c.providers.q!.baseUrl = qBaseUrl;
  });

  it('names the code of a continuation that could not connect, as any attempt does', async () => {
    qBaseUrl = `http://127.0.0.1:${await freePort()}/v1`;
    // p's answer is "Hel", then a cut; the continuation goes to q, where nobody listens.
    const { client, s } = await startScripted(() => ({ steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hel' })]), 30, { destroy: true }] }));
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    await (async () => {
      for await (const _ of stream) {
        // the cut ends it with an error event
      }
    })().catch(() => undefined);
    const line = await requestLine(s);
    expect(line.attempts).toEqual([expect.objectContaining({ target: 'p/gpt-4o' }), expect.objectContaining({ target: 'q/gpt-4o', reason: 'network', code: 'ECONNREFUSED' })]);
  });
});

describe('a stream handed over before its first output, one of whose choices finishes empty', () => {
  const event = (index: number, delta: Record<string, string>, finish: string | null = null) =>
    `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', choices: [{ index, delta, finish_reason: finish }] })}\n\n`;

  it("stops the first-token timer at that finish, as at a first output: the other choice's text may come after it", async () => {
    // n = 2, both opened by their role chunks; choice 0 finishes with no text at 100 ms, choice 1's text comes 500 ms
    // later. 300 ms was left of the first-token timer: the answer has begun at the finish, and idleMs (2 s) bounds it.
    const roles = event(0, { role: 'assistant', content: '' }) + event(1, { role: 'assistant', content: '' });
    const controller = new AbortController();
    const steps = [100, event(0, {}, 'stop'), 500, event(1, { content: 'Hi' }, 'stop'), 'data: [DONE]\n\n'];
    const { live, ended } = handedOverStream({ first: roles, iterator: upstream(controller, steps), controller, shape: { choices: 2, usage: false }, idleMs: 2_000, firstTokenLeftMs: 300 });
    const text = await readAll(live);
    expect(text).toContain('"content":"Hi"');
    expect((await ended).kind).toBe('complete');
  });
});
