// Adversarial review of deadlines and timeouts (2026-12-05): the provider's own stream timers (idleMs, firstTokenMs)
// against undici's coarse body backstop, which was set from the routes' timeoutMs alone. Real HTTP, a fake provider
// playing the bytes and their timing.
import { request as httpRequest } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import { computeDeadline, timeoutHeaderMs } from '../src/policy/deadline.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { cc, delta, DONE } from './helpers/scripted-provider.ts';
import { requestLine, useStacks } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();

/** A streamed chat call over real HTTP: its status, when its head came, and its whole text. */
function stream(url: string, headers: Record<string, string> = {}): Promise<{ status: number; headMs: number; text: string }> {
  const started = Date.now();
  return new Promise((resolve, reject) => {
    const req = httpRequest(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers } }, (res) => {
      const headMs = Date.now() - started;
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (text += d));
      res.on('end', () => resolve({ status: res.statusCode!, headMs, text }));
    });
    req.on('error', reject);
    req.end(JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true }));
  });
}

/** One provider p behind the chat route, whose timeoutMs is `routeTimeoutMs`, with the provider's `timeouts`. */
const oneRoute = (origin: string, routeTimeoutMs: number, timeouts: Record<string, number>) => (): ConfigInput => ({
  server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
  providers: { p: { family: 'openai', baseUrl: `${origin}/v1`, apiKey: 'p-key-0123456789', breaker: false, timeouts } },
  routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'p' }], park: false, timeoutMs: routeTimeoutMs }],
});

/** An upstream that sends `first`, is silent for `gapMs`, then finishes the answer. */
async function silentFor(gapMs: number, first: string) {
  return startProvider((req, res) => {
    req.resume();
    req.on('end', async () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(first);
      await sleep(gapMs);
      if (res.destroyed) return;
      res.write(cc([delta({ content: 'b' }, 'stop')]));
      res.end(DONE);
    });
  });
}

describe("a provider's stream timers longer than the routes' timeoutMs", () => {
  it('a gap within idleMs but past the longest route timeoutMs (+5 s) is not cut by undici', async () => {
    // The route bounds the answer's start (1 s); a started stream's gaps are idleMs's (15 s). undici's bodyTimeout,
    // set to the routes' longest timeoutMs + 5 s, cut an 8 s gap at about 6 s: "cut: Body Timeout Error", a
    // breaker failure for the provider, where the operator allowed 15 s.
    const p = await silentFor(8_000, cc([delta({ role: 'assistant', content: 'a' })]));
    const s = await startStack({ config: oneRoute(p.origin, 1_000, { idleMs: 15_000 }) });
    const res = await stream(s.url);
    expect(res.status).toBe(200);
    expect(res.text).not.toContain('stream_interrupted');
    expect(res.text).toContain('"content":"b"');
    expect(res.text).toContain(DONE);
    expect((await requestLine(s)).streamEnd).toBe('complete');
  }, 30_000);

  it('a stream started early at the client deadline may think until firstTokenMs, past the longest route timeoutMs (+5 s)', async () => {
    // README: "The model may go on thinking as long as the provider's firstTokenMs allows". Started at the client's
    // deadline (about 0.55 s), the role chunk its only bytes, the model thinks 8.5 s: within firstTokenMs (15 s), but
    // undici's body backstop (route 1 s + 5 s) cut it first.
    const p = await silentFor(8_500, cc([delta({ role: 'assistant', content: '' })]));
    const s = await startStack({ config: oneRoute(p.origin, 1_000, { firstTokenMs: 15_000, idleMs: 2_000 }) });
    const res = await stream(s.url, { 'x-stormgate-timeout-ms': '800' });
    expect(res.status).toBe(200);
    expect(res.headMs).toBeLessThan(3_000);
    expect(res.text).not.toContain('stream_interrupted');
    expect(res.text).toContain('"content":"b"');
    expect(res.text).toContain(DONE);
    const line = await requestLine(s);
    expect(line.startedEarly).toBe(true);
    expect(line.streamEnd).toBe('complete');
  }, 30_000);
});

describe('x-stormgate-timeout-ms past what a double holds', () => {
  it('a positive decimal too long for a number is a timeout longer than any route, not a 400', () => {
    // 400 nines is a positive number of milliseconds, as the 400 it got claimed it was not ("must be a positive
    // number of milliseconds"); it is longer than any route's timeout, so the route's deadline applies.
    const huge = '9'.repeat(400);
    expect(timeoutHeaderMs(huge)).toBeGreaterThan(2 ** 31);
    expect(computeDeadline({ routeTimeoutMs: 10_000, marginMs: undefined, headers: { 'x-stormgate-timeout-ms': huge } })).toEqual({ budgetMs: 9_500, timeoutMs: 10_000, source: 'route' });
  });
});

describe('a configured deadlineMarginMs and a client timeout just under the route\'s', () => {
  it('never gives more time than the route itself would (asking for more never gives less)', () => {
    const budget = (clientMs: number | undefined) =>
      computeDeadline({ routeTimeoutMs: 10_000, marginMs: 6_000, headers: clientMs === undefined ? {} : { 'x-stormgate-timeout-ms': String(clientMs) } }).budgetMs;
    expect(budget(undefined)).toBe(4_000);
    // Halved, the margin left these 4,999 and 4,000 ms: more than the route's own 4,000 for less time asked.
    expect(budget(9_999)).toBe(4_000);
    expect(budget(8_000)).toBe(4_000);
    expect(budget(7_000)).toBe(3_500);
    // Far under the route's, a short timeout keeps half of itself, as before.
    expect(budget(3_000)).toBe(1_500);
    let last = 0;
    for (let ms = 100; ms <= 12_000; ms += 97) {
      const b = budget(ms);
      expect(b, `${ms} ms`).toBeGreaterThanOrEqual(last);
      last = b;
    }
  });
});
