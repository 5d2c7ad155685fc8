// The upstream's own x-should-retry, over real HTTP with the bundled mock (its error rules' `headers`). The OpenAI and
// Anthropic SDKs obey it before they look at the status (openai/openai-node src/client.ts shouldRetry); the gateway
// obeys its `false` on the target that sent it (no retry there; failover as the status would have it) unless the
// answer names a wait (a gateway in front's open breaker), never lets a
// `true` retry what the route's retryOn leaves out, and answers the client with its own x-should-retry rule.
import { describe, expect, it } from 'vitest';
import type { ConfigInput, RetryOn } from '../src/config/schema.ts';
import type { FaultSpec, MockServer } from '../src/mock/server.ts';
import { sdkError } from './helpers/openai-error.ts';
import { completion, failsThen, json } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';
import { defaultConfig, RETRY_LOOP_ONLY, requestLine, scrapeMetrics, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';

const startStack = useStacks();
const startBackup = useExtraMocks();
let backup: MockServer | undefined;

/**
 * The stack's mock (OpenAI's API, or with `primaryFamily` Anthropic's, sent claude-sonnet-4-5) as the chat route's only
 * target, or, with `backupFamily`, the primary before a second mock.
 */
async function stackWith(opts: { faults: FaultSpec; primaryFamily?: 'anthropic'; backupFamily?: 'openai' | 'anthropic'; retryOn?: RetryOn[] }): Promise<Stack> {
  if (opts.backupFamily) backup = await startBackup({ quiet: true, apiKey: 'backup-key' });
  return startStack({
    faults: opts.faults,
    config: (url): ConfigInput => {
      const base = defaultConfig(url, {
        provider: RETRY_LOOP_ONLY.provider,
        route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 }, ...(opts.retryOn && { retryOn: opts.retryOn }) } },
      });
      const primary = opts.primaryFamily === 'anthropic' ? { ...base.providers.mock!, family: 'anthropic' as const, baseUrl: url } : base.providers.mock!;
      // Anthropic's API has no embeddings, completions nor Responses: the chat route alone.
      const routes = opts.primaryFamily ? base.routes.filter((r) => r.name === 'chat') : base.routes;
      const family = opts.backupFamily;
      if (!family) return { ...base, providers: { mock: primary }, routes };
      return {
        ...base,
        providers: { mock: primary, backup: { family, baseUrl: family === 'anthropic' ? backup!.url : `${backup!.url}/v1`, apiKey: 'backup-key', breaker: false } },
        routes: routes.map((r) =>
          r.name === 'chat' ? { ...r, targets: [{ provider: 'mock', ...(opts.primaryFamily && { model: 'claude-sonnet-4-5' }) }, { provider: 'backup', model: family === 'anthropic' ? 'claude-sonnet-4-5' : 'gpt-4.1' }] } : r,
        ),
      };
    },
  });
}

const chat = (s: Stack) =>
  fetch(`${s.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
  });

const says = (status: number, value: 'true' | 'false', more: Record<string, string> = {}): FaultSpec => ({ errors: [{ status, headers: { 'x-should-retry': value, ...more } }] });

describe('x-should-retry: false from the upstream', () => {
  it('ends retries on that target though retryOn lists the status, and the log line says the upstream stopped them', async () => {
    const s = await stackWith({ faults: says(503, 'false') });
    const res = await chat(s);
    expect(res.status).toBe(503);
    // The gateway's own rule for the client: an error it did not invite back.
    expect(res.headers.get('x-should-retry')).toBe('false');
    await res.arrayBuffer();
    expect(s.mock.stats().total).toBe(1);
    const line = await requestLine(s);
    expect(line.retriesStopped).toBe('upstream_no_retry');
    expect(line.attempts).toHaveLength(1);
  });

  it('still fails over a 503 to the next target, named as the upstream\'s refusal', async () => {
    const s = await stackWith({ faults: says(503, 'false'), backupFamily: 'openai' });
    const res = await chat(s);
    expect(res.status).toBe(200);
    expect(res.headers.get('x-stormgate-fallback')).toBe('upstream_no_retry');
    await res.arrayBuffer();
    expect(s.mock.stats().total).toBe(1);
    expect(backup!.stats().total).toBe(1);
    const metrics = await scrapeMetrics(s.url);
    expect(metrics.find((m) => m.name === 'stormgate_fallbacks_total' && m.labels.reason === 'upstream_no_retry')?.value).toBe(1);
  });

  it('fails over a 500 only where retryOn consents to running it twice, as a 500 without the header', async () => {
    const consent = await stackWith({ faults: says(500, 'false'), backupFamily: 'openai' });
    expect((await chat(consent)).status).toBe(200);
    expect(consent.mock.stats().total).toBe(1);
    await consent.close();
    const none = await stackWith({ faults: says(500, 'false'), backupFamily: 'openai', retryOn: [429, 503, 'network'] });
    expect((await chat(none)).status).toBe(500);
    expect(none.mock.stats().total).toBe(1);
    expect(backup!.stats().total).toBe(0);
  });

  it("ends retries of Anthropic's 529 overloaded_error on its target, and the backup answers", async () => {
    const s = await stackWith({ faults: says(529, 'false'), primaryFamily: 'anthropic', backupFamily: 'openai' });
    const res = await chat(s);
    expect(res.status).toBe(200);
    expect(res.headers.get('x-stormgate-fallback')).toBe('upstream_no_retry');
    await res.arrayBuffer();
    expect(s.mock.stats().total).toBe(1);
  });
});

describe('x-should-retry: true from the upstream', () => {
  it('retries nothing retryOn leaves out: a 409 is the client\'s answer at once, with the gateway\'s x-should-retry: false', async () => {
    const s = await stackWith({ faults: says(409, 'true') });
    const res = await chat(s);
    expect(res.status).toBe(409);
    expect(res.headers.get('x-should-retry')).toBe('false');
    await res.arrayBuffer();
    expect(s.mock.stats().total).toBe(1);
  });

  it('never retries a status the gateway never retries (400), whatever it says', async () => {
    const s = await stackWith({ faults: says(400, 'true'), retryOn: [400, 503] });
    expect((await chat(s)).status).toBe(400);
    expect(s.mock.stats().total).toBe(1);
  });

  it('changes nothing for a status retryOn lists: a 503 is retried maxAttempts times', async () => {
    const s = await stackWith({ faults: says(503, 'true') });
    const res = await chat(s);
    expect(res.status).toBe(503);
    await res.arrayBuffer();
    expect(s.mock.stats().total).toBe(3);
    expect((await requestLine(s)).retriesStopped).toBe('retries_exhausted');
  });

  it('retries a 409 that retryOn lists, as without the header', async () => {
    const s = await stackWith({ faults: says(409, 'true'), retryOn: [409, 503] });
    expect((await chat(s)).status).toBe(409);
    expect(s.mock.stats().total).toBe(3);
  });
});

describe('x-should-retry: false beside a wait the upstream names', () => {
  const gw = useScriptedUpstreams();
  const ask = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'hi' }] };
  // What a gateway in front answers while its breaker is open (stormgate's own 503 circuit_open): the wait it means,
  // and false, since the provider, not it, is what failed.
  const circuitOpen = () =>
    json(503, { error: { message: 'circuit open for mock/gpt-4o', type: 'server_error', param: null, code: 'circuit_open' } }, { 'retry-after': '1', 'x-should-retry': 'false' });

  it("is waited out as without the header: a gateway behind a gateway whose breaker is open answers a second later", async () => {
    const g = await gw({ a: failsThen(1, circuitOpen, 'served') }, [{ provider: 'a' }], { route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } } });
    const { data, response } = await g.client.chat.completions.create(ask).withResponse();
    expect(data.choices[0]?.message.content).toBe('served');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(g.seen.a![1]!.at - g.seen.a![0]!.at).toBeGreaterThanOrEqual(950);
  });

  it('without a wait named, still ends retries on that target', async () => {
    const g = await gw({ a: () => json(503, { error: { message: 'upstream retried already', type: 'server_error', param: null, code: null } }, { 'x-should-retry': 'false' }) }, [{ provider: 'a' }], { route: { retry: { maxAttempts: 3 } } });
    const err = await sdkError(g.client.chat.completions.create(ask));
    expect(err.status).toBe(503);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(g.seen.a).toHaveLength(1);
  });

  it("costs a parked request nothing when it came to the breaker's probe the request carried: it parks again, and is served", async () => {
    // 1: a 503 opens the breaker (one failure); 2: the probe a parked request carries gets false with no wait; 3: served.
    const answers = [
      () => json(503, { error: { message: 'overloaded', type: 'server_error', param: null, code: null } }),
      () => json(503, { error: { message: 'upstream retried already', type: 'server_error', param: null, code: null } }, { 'x-should-retry': 'false' }),
    ];
    const g = await gw({ a: (body, n) => (n <= answers.length ? answers[n - 1]!() : completion('served', 'gpt-4o')) }, [{ provider: 'a' }], {
      route: { park: {}, retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } },
      provider: { breaker: { consecutiveFailures: 1, openS: 1, halfOpenProbes: 1, closeAfter: 1, probeWhileParkedMs: 200, probeWhileParkedMaxMs: 400 } },
    });
    const { data } = await g.client.chat.completions.create(ask).withResponse();
    expect(data.choices[0]?.message.content).toBe('served');
    expect(g.seen.a).toHaveLength(3);
  });
});
