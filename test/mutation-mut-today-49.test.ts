// Mutation round 49 on the day's changes (the drain's grace end, upstream error bodies that stall, the idle-connection
// sweep, Anthropic's 404 for an unrouted path, the mock's refusal of messages of the wrong type): a test for each mutant
// the existing tests let live (idleMs bounding a gap in an error's body, not the body, nor a 2xx's; an error exactly as
// long as the cap is whole; a body still arriving at the close gets the grace period; the grace end counts preStopMs;
// a wait over with no grace left leaves nothing of itself to retry-after). And one defect: the wait a request that
// tried other targets takes out of the hold-off its own answer started (serve-targets.ts waitOutOwnHoldOff) was
// weighed against the drain's grace end before it, not after it: begun before SIGTERM, it sent its attempt with less
// than minAttemptMs of grace left, only to be cut at the grace end (the provider billed for nothing).
import type { IncomingMessage, ServerResponse } from 'node:http';
import { connect } from 'node:net';
import { once } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ConfigSchema } from '../src/config/schema.ts';
import { serveTargets, type ServeDeps } from '../src/pipeline/serve-targets.ts';
import { MAX_ERROR_BODY_BYTES } from '../src/providers/read-capped.ts';
import type { RequestContext } from '../src/pipeline/target-attempts.ts';
import { chatCompletion, useFakeProviders } from './helpers/fake-provider.ts';
import { ask, busyOnceThen, configFor } from './helpers/one-provider.ts';
import { rawGet } from './helpers/passthrough-files.ts';
import { scriptedAnswers, scriptedPlan } from './helpers/scripted-serve.ts';
import { defaultConfig, useGateways, useStacks } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startGateway = useGateways();
const startStack = useStacks();

// serve-targets.ts alone: tryTarget answers from a script for the keys it has (any other goes to the real one), noting
// the clock; nothing holds a target once the lot's wait ran out (heldBack).
const script = vi.hoisted(() => ({
  answers: new Map<string, unknown[]>(),
  calls: [] as Array<{ key: string; atMs: number }>,
  clock: { now: 0 },
}));
vi.mock('../src/pipeline/target-attempts.ts', async (importOriginal) => {
  const real = await importOriginal<typeof import('../src/pipeline/target-attempts.ts')>();
  return {
    ...real,
    heldBack: (...args: Parameters<typeof real.heldBack>) => (script.answers.size > 0 ? undefined : real.heldBack(...args)),
    tryTarget: async (...args: Parameters<typeof real.tryTarget>) => {
      const [, plan] = args;
      if (!script.answers.has(plan.key)) return real.tryTarget(...args);
      script.calls.push({ key: plan.key, atMs: script.clock.now });
      const next = script.answers.get(plan.key)!.shift();
      if (next === undefined) throw new Error(`no answer scripted for ${plan.key}`);
      return next as never;
    },
  };
});

describe('a request waiting out the hold-off its own 429 started, after the backup failed, when SIGTERM comes during the wait (serve-targets.ts waitOutOwnHoldOff)', () => {
  const clock = script.clock;
  const { failed503, ok, ownHoldOff } = scriptedAnswers(clock);
  beforeEach(() => {
    clock.now = 1_000_000;
    script.answers.clear();
    script.calls.length = 0;
  });
  afterEach(() => {
    script.answers.clear();
  });

  /** Serves one request on a (primary) and b, parking off; SIGTERM comes during its wait, the grace end `graceAfterWaitMs` after it. */
  async function serve(graceAfterWaitMs: number) {
    let graceEndsAtMs: number | undefined;
    const budget = { counted: 0 };
    const ctx = {
      route: { name: 'chat', config: { minAttemptMs: 100, budget: {} } },
      deadlineAtMs: clock.now + 30_000,
      signal: new AbortController().signal,
      skipped: [],
      attempts: [],
      parkable: true,
      graceLeftMs: () => (graceEndsAtMs === undefined ? undefined : graceEndsAtMs - clock.now),
    } as unknown as RequestContext;
    const deps = {
      now: () => clock.now,
      sleep: async (ms: number) => {
        // Not draining when the wait began; the grace period ends after it is over, so it does not cut it.
        graceEndsAtMs = clock.now + ms + graceAfterWaitMs;
        clock.now += ms;
      },
      lot: { waiting: () => 0, park: async () => ({ kind: 'timeout' }) },
      guards: {
        holdOffs: { credentialsHeldFor: () => undefined },
        budget: { countRetry: async () => void budget.counted++, tryRetry: async () => false },
      },
    } as unknown as ServeDeps;
    const served = await serveTargets(ctx, ['a', 'b'].map(scriptedPlan), undefined, false, deps);
    return { served, budget };
  }

  it('sends no attempt when its wait ends with less than minAttemptMs of grace left: 503 gateway_draining (shutdown) at once', async () => {
    script.answers.set('a', [ownHoldOff(3_000), ok]);
    script.answers.set('b', [failed503]);
    // 50 ms of grace after the wait, minAttemptMs 100: the attempt would be cut at the grace end.
    const r = await serve(50);
    expect(script.calls.map((c) => c.key)).toEqual(['a', 'b']);
    expect(r.served).toMatchObject({ kind: 'failed', plan: { key: 'a' }, failure: { result: { outcome: { kind: 'aborted', by: 'shutdown' } }, retryAfterMs: undefined } });
    // No retry went, none is paid.
    expect(r.budget.counted).toBe(0);
  });

  it('sends its attempt when minAttemptMs of grace is left after the wait', async () => {
    script.answers.set('a', [ownHoldOff(3_000), ok]);
    script.answers.set('b', [failed503]);
    const r = await serve(100);
    expect(script.calls.map((c) => c.key)).toEqual(['a', 'b', 'a']);
    expect(r.served).toMatchObject({ kind: 'ok', plan: { key: 'a' } });
  });
});

// ---- Real HTTP from here on: a provider of the test's own (node:http), the gateway, the openai SDK (maxRetries: 0). ----

/** Writes `pieces` of a body `gapMs` apart after the head (chunked), then ends it. */
function trickled(status: number, contentType: string, pieces: string[], gapMs: number) {
  return (req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(status, { 'content-type': contentType });
      const next = (i: number) => {
        if (res.destroyed) return;
        if (i === pieces.length) return void res.end();
        res.write(pieces[i]!);
        setTimeout(() => next(i + 1), gapMs);
      };
      next(0);
    });
  };
}

/** A gateway with one target on `origin` (no retry, no parking), its idleMs `idleMs`; a client of it. */
async function gatewayOn(origin: string, idleMs: number) {
  const config = ConfigSchema.parse({
    server: { host: '127.0.0.1', port: 0, logLevel: 'warn' },
    providers: { p: { family: 'openai', baseUrl: `${origin}/v1`, apiKey: 'sk-provider-49-0123456789abcdef', breaker: false, timeouts: { idleMs } } },
    routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'p' }], park: false, timeoutMs: 20_000, retry: { maxAttempts: 1 } }],
    passthrough: { provider: 'p', paths: ['/v1/files'], methods: ['GET'] },
  });
  const url = await startGateway(config);
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sk-client-49', maxRetries: 0, timeout: 30_000 });
  return { url, client };
}

// The error's code comes last: a body cut before its end has none.
const ERROR_PIECES = ['{"error":{"message":"the file ', 'is not one ', 'this key may ', 'read","type":"invalid_request_error",', '"param":null,"code":"file_not_readable"}}'];

describe("an upstream error's body that comes in pieces, each gap within idleMs, the whole longer than idleMs (idleMs bounds a gap, not the body)", () => {
  for (const stream of [false, true]) {
    it(`is read whole: the client gets its 400 with its message and code (${stream ? 'stream' : 'non-stream'} request)`, async () => {
      // 5 pieces 300 ms apart: 1.2 s of body, with idleMs 800.
      const p = await startProvider(trickled(400, 'application/json', ERROR_PIECES, 300));
      const g = await gatewayOn(p.origin, 800);
      const err = await g.client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(OpenAI.BadRequestError);
      expect((err as InstanceType<typeof OpenAI.BadRequestError>).error).toMatchObject({ message: 'the file is not one this key may read', code: 'file_not_readable' });
    });
  }
});

describe('a whole (non-stream) answer, status 200, with a silence longer than idleMs inside its body', () => {
  it('is waited for (only responseMs and the deadline bound it; idleMs is for streams and error bodies): the client gets it', async () => {
    const body = chatCompletion('ok');
    const half = Math.floor(body.length / 2);
    const p = await startProvider(trickled(200, 'application/json', [body.slice(0, half), body.slice(half)], 1_500));
    const g = await gatewayOn(p.origin, 500);
    const answer = await g.client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    expect(answer.choices[0]!.message.content).toBe('ok');
  });
});

describe("a passthrough error that is not OpenAI's JSON, exactly as long as the gateway reads of an error (MAX_ERROR_BODY_BYTES)", () => {
  it('is whole, so it reaches the client in the OpenAI shape, as a shorter one does (only one cut at the cap goes on as read)', async () => {
    const head = '<html><body>';
    const page = head + 'x'.repeat(MAX_ERROR_BODY_BYTES - head.length - '</body></html>'.length) + '</body></html>';
    expect(Buffer.byteLength(page)).toBe(MAX_ERROR_BODY_BYTES);
    const p = await startProvider((req, res) => {
      req.resume();
      req.on('end', () => res.writeHead(503, { 'content-type': 'text/html' }).end(page));
    });
    const g = await gatewayOn(p.origin, 5_000);
    const res = await rawGet(`${g.url}/v1/files/file-1`);
    expect(res.status).toBe(503);
    expect(res.headers['content-type']).toMatch(/application\/json/);
    expect(res.body).not.toContain('<html>');
    expect(JSON.parse(res.body)).toMatchObject({ error: { message: expect.any(String) } });
  });
});

describe('a request whose body is still arriving when a drain closes the server (past preStopMs)', () => {
  it('is given the grace period for the rest of its body, then answered (only the grace end cuts a body still arriving)', async () => {
    const s = await startStack({ config: (mockUrl) => ({ ...defaultConfig(mockUrl), drain: { preStopMs: 200, graceMs: 8_000 } }) });
    const body = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    const socket = connect(Number(new URL(s.url).port), '127.0.0.1');
    await once(socket, 'connect');
    let out = '';
    socket.on('data', (d: Buffer) => (out += d.toString()));
    const closed = once(socket, 'close');
    socket.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body.slice(0, 10)}`);
    await sleep(100);
    const drained = s.gateway.drain();
    // Past preStopMs: the server is closing, its idle connections swept.
    await sleep(1_200);
    socket.write(body.slice(10));
    await closed;
    await drained;
    expect(out).toMatch(/^HTTP\/1\.1 200 /);
    expect(out).toContain('chat.completion');
  });
});

describe("the drain's grace end, as the retry waits weigh it (drain.ts graceLeftMs)", () => {
  it('is preStopMs and graceMs after SIGTERM: a backoff that fits in both together is taken, and its retry answers', async () => {
    // The first attempt's 503 comes 300 ms in, after the drain began at 100 ms: its 1 s backoff and minAttemptMs
    // (500 ms) fit in the 3.2 s left of preStopMs (3 s) and graceMs (500 ms), though not in graceMs alone.
    let n = 0;
    const p = await startProvider((req, res) => {
      req.resume();
      if (n++ === 0) setTimeout(() => res.writeHead(503, { 'content-type': 'application/json' }).end('{"error":{"message":"busy","type":"server_error","code":null}}'), 300);
      else res.writeHead(200, { 'content-type': 'application/json' }).end(chatCompletion('ok'));
    });
    const s = await startStack({
      config: configFor(p.origin, { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 1_000, capMs: 1_000 } }, minAttemptMs: 500 }, { drain: { preStopMs: 3_000, graceMs: 500 } }),
    });
    const answer = ask(s.url);
    await sleep(100);
    const drained = s.gateway.drain();
    expect(await answer).toMatchObject({ status: 200 });
    expect(n).toBe(2);
    await drained;
  });
});

describe('a backoff begun before SIGTERM that ends with less than minAttemptMs of grace left (target-attempts.ts)', () => {
  it('is answered 503 gateway_draining as the drain begins, with what is left of its wait as retry-after-ms', async () => {
    // As review-shutdown-2026-12-06: a 1.5 s backoff from 0, the drain at 300 ms, the grace end at 1.8 s (minAttemptMs
    // 1 s). Weighed as the drain begins (drain-backup-at-once), not once it is over (then it got the 1 s floor).
    const p = await startProvider(busyOnceThen(2_000));
    const s = await startStack({
      config: configFor(p.origin, { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 1_500, capMs: 1_500 } }, minAttemptMs: 1_000 }, { drain: { preStopMs: 500, graceMs: 1_000 } }),
    });
    const startedAt = Date.now();
    const answer = ask(s.url);
    await sleep(300);
    const drained = s.gateway.drain();
    const got = await answer;
    expect(Date.now() - startedAt).toBeLessThan(1_300);
    expect(got).toMatchObject({ status: 503, code: 'gateway_draining' });
    // About 1.2 s: the backoff's 1.5 s less the 300 ms slept before the drain.
    expect(got.retryAfterMs).toBeGreaterThan(1_000);
    expect(got.retryAfterMs).toBeLessThanOrEqual(1_500);
    await drained;
  });
});
