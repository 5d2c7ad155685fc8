// Mutation round 40 on the day's changes (park 'timeout' answered for what holds the target now, the deadline margin's
// cap, the providers' undici backstops, an Anthropic error's own code, the second Ctrl-C, the close flushes): a test
// for each mutant the existing tests let live.
import { setTimeout as sleep } from 'node:timers/promises';
import { Pool } from 'undici';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { startMock, type MockServer } from '../src/mock/server.ts';
import { toOpenAIError } from '../src/providers/anthropic/response.ts';
import { createProviderClients } from '../src/providers/provider-client.ts';
import { freePort } from './helpers/free-port.ts';
import { serveScripted } from './helpers/scripted-serve.ts';
import { killNow, useGatewayProcesses, waitReady, type GatewayProcess } from './helpers/gateway-process.ts';

// serve-targets.ts alone: tryTarget and heldBack answer from a script while one is set (heldBack noting the
// `parkable` it was asked with); the gateway processes below use the real ones.
const script = vi.hoisted(() => ({
  on: false,
  answers: new Map<string, unknown[]>(),
  held: new Map<string, { reason: 'breaker' | 'hold-off'; availableAtMs: number }>(),
  parkableAsked: [] as boolean[],
}));
vi.mock('../src/pipeline/target-attempts.ts', async (importOriginal) => {
  const real = await importOriginal<typeof import('../src/pipeline/target-attempts.ts')>();
  return {
    ...real,
    heldBack: (...args: Parameters<typeof real.heldBack>) => {
      if (!script.on) return real.heldBack(...args);
      script.parkableAsked.push(args[2]);
      return script.held.get(args[1].key);
    },
    tryTarget: async (...args: Parameters<typeof real.tryTarget>) => {
      if (!script.on) return real.tryTarget(...args);
      const next = script.answers.get(args[1].key)?.shift();
      if (next === undefined) throw new Error(`no answer scripted for ${args[1].key}`);
      return next as never;
    },
  };
});

describe("a route's only target, when the request's wait in the lot runs out (answered for what holds it then)", () => {
  const clock = { now: 1_000_000 };
  beforeEach(() => {
    script.on = true;
    script.answers.clear();
    script.held.clear();
    script.parkableAsked.length = 0;
    clock.now = 1_000_000;
  });
  afterEach(() => {
    script.on = false;
  });

  const down = (inMs: number, reason: 'breaker' | 'hold-off') => ({ kind: 'unavailable', reason, availableAtMs: clock.now + inMs });

  /** Serves a request on target 'a', whose wait in the lot (`parkMs`) runs out. */
  const serveTimedOut = (parkMs: number) => serveScripted(clock, ['a'], [], { parkMs, park: { maxQueue: 100, maxWaitMs: 2_000 } });

  it('parked under a hold-off, its breaker open by then: circuit_open with the breaker\'s time, and the line names the breaker', async () => {
    script.answers.set('a', [down(1_000, 'hold-off')]);
    script.held.set('a', { reason: 'breaker', availableAtMs: clock.now + 2_000 + 1_500 });
    const r = await serveTimedOut(2_000);
    expect(r.served).toMatchObject({ kind: 'unavailable', reason: 'breaker', availableAtMs: 1_003_500 });
    expect(r.skipped).toEqual([{ target: 'a', reason: 'circuit breaker open' }]);
    // Asked as what it is, a request that may park: its breaker's time is the next parked probe's, not openS's end.
    expect(script.parkableAsked).toEqual([true]);
  });

  it('parked under a hold-off that has ended, the target pacing its release: shed, and the line says at capacity, not held off', async () => {
    script.answers.set('a', [down(1_000, 'hold-off')]);
    const r = await serveTimedOut(2_000);
    expect(r.served).toMatchObject({ kind: 'shed', shed: { reason: 'max_wait', retryAfterMs: 1_234 } });
    expect(r.skipped).toEqual([{ target: 'a', reason: expect.stringContaining('at capacity') }]);
  });
});

describe("an Anthropic error's own code (toOpenAIError)", () => {
  it('is kept only where the type maps to no code: a type that names one keeps its own', () => {
    const e = toOpenAIError(401, { type: 'error', error: { type: 'authentication_error', message: 'invalid x-api-key', code: 'from_a_proxy' } });
    expect(e.body.error.code).toBe('invalid_api_key');
  });

  it("yields to Anthropic's own details.error_code when both are there", () => {
    const e = toOpenAIError(500, { type: 'error', error: { type: 'api_error', message: 'x', code: 'loop_detected', details: { error_code: 'internal_detail' } } });
    expect(e.body.error.code).toBe('internal_detail');
  });

  it('is a non-empty string or nothing: an empty code or a number is no code', () => {
    expect(toOpenAIError(508, { error: { type: 'api_error', message: 'x', code: '' } }).body.error.code).toBeNull();
    expect(toOpenAIError(508, { error: { type: 'api_error', message: 'x', code: 508 } }).body.error.code).toBeNull();
    expect(toOpenAIError(508, { error: { type: 'api_error', message: 'x', code: 'loop_detected' } }).body.error.code).toBe('loop_detected');
  });
});

describe("a provider's undici backstops (headersTimeout, bodyTimeout)", () => {
  /** The options the provider's Pool was built with (undici keeps them under its `options` symbol). */
  function poolTimeouts(input: ConfigInput): { headersTimeout: number; bodyTimeout: number } {
    const clients = createProviderClients(ConfigSchema.parse(input));
    const { dispatcher } = clients.get('p')!;
    expect(dispatcher).toBeInstanceOf(Pool);
    const sym = Object.getOwnPropertySymbols(dispatcher).find((s) => s.description === 'options')!;
    const { headersTimeout, bodyTimeout } = (dispatcher as unknown as Record<symbol, { headersTimeout: number; bodyTimeout: number }>)[sym]!;
    void dispatcher.close();
    return { headersTimeout, bodyTimeout };
  }
  const config = (routeTimeoutMs: number, timeouts: Record<string, number> = {}): ConfigInput => ({
    providers: { p: { family: 'openai', baseUrl: 'http://127.0.0.1:9/v1', apiKey: 'k', timeouts } },
    routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'p' }], timeoutMs: routeTimeoutMs }],
  });

  it("lie 5 s past the longer of the provider's idleMs and firstTokenMs, both timers, whichever of the two is longer", () => {
    expect(poolTimeouts(config(1_000, { idleMs: 40_000, firstTokenMs: 2_000 }))).toEqual({ headersTimeout: 45_000, bodyTimeout: 45_000 });
    expect(poolTimeouts(config(1_000, { idleMs: 2_000, firstTokenMs: 40_000 }))).toEqual({ headersTimeout: 45_000, bodyTimeout: 45_000 });
  });

  it("lie 5 s past the longest route's timeoutMs when that is longer than the provider's stream timers", () => {
    expect(poolTimeouts(config(200_000))).toEqual({ headersTimeout: 205_000, bodyTimeout: 205_000 });
  });
});

describe('a SIGTERM repeated a second or more into the drain (systemd, a supervisor; not a Ctrl-C)', () => {
  const startProcess = useGatewayProcesses();
  let mock: MockServer | undefined;
  let gateway: GatewayProcess | undefined;
  afterEach(async () => {
    await killNow(gateway?.proc);
    await mock?.close();
    mock = gateway = undefined;
  });

  it('changes nothing: the stream in flight completes and the process exits 0', { timeout: 40_000 }, async () => {
    // 20 chunks 150 ms apart: the stream runs about 3 s, past the second signal at 1.3 s.
    mock = await startMock({ quiet: true, faults: { stream: { chunks: 20, chunkDelayMs: 150 } } });
    const port = await freePort();
    gateway = startProcess('gateway-sigterm-twice', {
      server: { host: '127.0.0.1', port, logLevel: 'warn' },
      providers: { mock: { family: 'openai', baseUrl: `${mock.url}/v1`, apiKey: 'k' } },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }] }],
      drain: { preStopMs: 0, graceMs: 20_000 },
    });
    await waitReady(gateway, port);
    const res = await fetch(`http://127.0.0.1:${port}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'a long answer' }], stream: true }),
    });
    const reader = res.body!.getReader();
    await reader.read();
    const exited = gateway.exited;
    gateway.proc.kill('SIGTERM');
    await sleep(1_300);
    gateway.proc.kill('SIGTERM');
    let text = '';
    for (;;) {
      const { value, done } = await reader.read().catch(() => ({ value: undefined, done: true as const }));
      if (done) break;
      text += new TextDecoder().decode(value);
    }
    expect(text.trimEnd().endsWith('data: [DONE]')).toBe(true);
    expect(await exited).toBe(0);
    expect(gateway.output()).not.toContain('exiting now');
  });
});
