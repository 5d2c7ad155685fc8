// A client's token reservation (auth.limits.<name>.tokensPerMinute) for a request whose attempts found no provider
// listening (connection refused): nothing reached a provider, so the reservation is given back whole, as for a request
// shed before any attempt. Over real HTTP: a gateway whose first target is a port nothing listens on, with and without
// a backup (the bundled mock) that answers. The provider's own rate turn (pools.requestsPerMinute) of such an attempt
// goes back the same way.
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { defaultConfig, RETRY_LOOP_ONLY, TEST_KEY, useExtraMocks, useGateways } from './helpers/stack.ts';
import { freePort } from './helpers/free-port.ts';
import { classify, neverSent, reachedProvider, type AttemptOutcome } from '../src/policy/outcome.ts';
import { failureCode } from '../src/pipeline/record-outcome.ts';

/** About 1,118 tokens as the gateway estimates them: its 4,070 bytes / 4 and its max_tokens of 100. */
const body = JSON.stringify({ model: 'gpt-4o-mini', max_tokens: 100, messages: [{ role: 'user', content: 'x'.repeat(4_000) }] });

describe('an attempt that reached its provider, as its log record says', () => {
  it('did not when its connection was never made; may have once the request could be written', () => {
    // Refused, unreachable, no socket, a TLS handshake refused, the egress proxy's refusal, the connect timer, a request
    // the gateway could not send: nothing of it was written.
    for (const a of [
      { reason: 'network', code: 'ECONNREFUSED' }, { reason: 'network', code: 'ENOTFOUND' }, { reason: 'local_resource', code: 'EMFILE' },
      { reason: 'tls', code: 'DEPTH_ZERO_SELF_SIGNED_CERT' }, { reason: 'network', code: 'PROXY_407' }, { reason: 'timeout_connect' },
      { reason: 'internal', code: 'ERR_INVALID_CHAR' },
    ]) expect(reachedProvider(a), JSON.stringify(a)).toBe(false);
    // A reset after the connection was made, a timeout waiting for the answer, any answer: it may have run.
    for (const a of [{ reason: 'network', code: 'ECONNRESET' }, { reason: 'network', code: 'UND_ERR_SOCKET' }, { reason: 'timeout_headers' }, { reason: 'status_503', status: 503 }, { reason: 'ok' }, { reason: 'deadline' }]) {
      expect(reachedProvider(a), JSON.stringify(a)).toBe(true);
    }
  });
});

describe("an attempt's rate turn and its client's reservation, given back alike", () => {
  it('gives the turn back (neverSent) for exactly the attempts its log record says reached no provider', () => {
    // A request the gateway could not send (an invalid header value) wrote nothing either: its client's reservation went
    // back, and its target's rate turn must too, or a provider paced by pools.requestsPerMinute lost a turn for it.
    const outcomes: AttemptOutcome[] = [
      { kind: 'network', code: 'ECONNREFUSED' }, { kind: 'network', code: 'EMFILE' }, { kind: 'network', code: 'DEPTH_ZERO_SELF_SIGNED_CERT' },
      { kind: 'network', code: 'PROXY_407' }, { kind: 'network', code: 'PROXY_CLOSED' }, { kind: 'network', code: 'ERR_SSL_TLSV1_ALERT_INTERNAL_ERROR' },
      { kind: 'network', code: 'ECONNRESET' }, { kind: 'network', code: 'UND_ERR_SOCKET' }, { kind: 'timeout', phase: 'connect' },
      { kind: 'timeout', phase: 'headers' }, { kind: 'timeout', phase: 'first-token' }, { kind: 'internal', code: 'ERR_INVALID_CHAR' },
      { kind: 'internal', code: 'UND_ERR_INVALID_ARG' }, { kind: 'bad-stream', detail: 'x', ran: true }, { kind: 'aborted', by: 'deadline' },
      { kind: 'http', status: 503, errorCode: null, hint: undefined }, { kind: 'ok' } as AttemptOutcome,
    ];
    for (const outcome of outcomes) {
      const code = failureCode({ outcome } as never);
      const record = { reason: classify(outcome).reason, ...(code !== undefined && { code }) };
      expect(neverSent(outcome), JSON.stringify(outcome)).toBe(!reachedProvider(record));
    }
  });
});

describe('a client token reservation for attempts refused a connection', () => {
  const gateway = useGateways();
  const mocks = useExtraMocks();

  /** A gateway for client `agents` (2,000 tokens a minute) whose route tries a closed port, then `backupUrl` if given. */
  async function start(backupUrl?: string): Promise<(b?: string) => Promise<{ status: number; json: { usage?: { total_tokens: number }; error?: { code: string } } }>> {
    const down = `http://127.0.0.1:${await freePort()}/v1`;
    const base = defaultConfig(backupUrl ?? down, RETRY_LOOP_ONLY);
    const config: ConfigInput = {
      ...base,
      providers: { ...base.providers, down: { family: 'openai', baseUrl: down, apiKey: 'down-key', breaker: false } },
      routes: base.routes.map((r) => ({ ...r, targets: backupUrl ? [{ provider: 'down' }, { provider: 'mock' }] : [{ provider: 'down' }] })),
      auth: { keys: { agents: 'key-agents' }, limits: { agents: { tokensPerMinute: 2_000 } } },
    };
    const url = await gateway(ConfigSchema.parse(config));
    return async (b = body) => {
      const res = await fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { authorization: 'Bearer key-agents', 'content-type': 'application/json' }, body: b });
      return { status: res.status, json: (await res.json()) as { usage?: { total_tokens: number }; error?: { code: string } } };
    };
  }

  it('gives all of it back when no target took the connection: the client keeps its allowance', async () => {
    const call = await start();
    const first = await call();
    expect(first.status).toBeGreaterThanOrEqual(500);
    expect(first.json.error?.code).not.toBe('client_rate_limited');
    // Its ~1,018 prompt tokens kept, the ~982 left would not fit the next estimate of ~1,118: it would be refused.
    for (let i = 0; i < 3; i++) expect((await call()).json.error?.code).not.toBe('client_rate_limited');
  });

  it('settles to the backup\'s usage alone when the first target refused the connection', async () => {
    const backup = await mocks({ apiKey: TEST_KEY });
    const call = await start(backup.url);
    const first = await call();
    expect(first.status).toBe(200);
    const used = first.json.usage!.total_tokens;
    expect(backup.stats().total).toBe(1);
    // What is left is the 2,000 less what the backup's answer used (and a little refilled meanwhile), nothing for the
    // refused attempt: a request that needs all of that is admitted.
    const fits = Math.floor((2_000 - used) * 4) - 200;
    const second = await call(JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'x'.repeat(fits - 60) }] }));
    expect(second.json.error?.code).not.toBe('client_rate_limited');
    expect(second.status).toBe(200);
  });
});

describe("a provider's rate turn for an attempt refused a connection", () => {
  const gateway = useGateways();
  const mocks = useExtraMocks();

  it('goes back: the retries wait for their backoff, not for the turns the refusals spent, then the backup answers', async () => {
    const backup = await mocks({ apiKey: TEST_KEY });
    const down = `http://127.0.0.1:${await freePort()}/v1`;
    const base = defaultConfig(backup.url, RETRY_LOOP_ONLY);
    // One request a second, one at once: each refused attempt that kept its turn held the next one a second.
    const config: ConfigInput = {
      ...base,
      providers: { ...base.providers, down: { family: 'openai', baseUrl: down, apiKey: 'down-key', breaker: false, pools: { requestsPerMinute: 60, burst: 1 } } },
      routes: base.routes.map((r) => ({
        ...r,
        targets: [{ provider: 'down' }, { provider: 'mock' }],
        retry: { maxAttempts: 3, backoff: { strategy: 'full-jitter', baseMs: 20, capMs: 40 }, retryOn: ['network'] },
      })),
    };
    const url = await gateway(ConfigSchema.parse(config));
    const t0 = Date.now();
    const res = await fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
    const ms = Date.now() - t0;
    expect(res.status).toBe(200);
    expect(res.headers.get('x-stormgate-target')).toContain('mock');
    expect(res.headers.get('x-stormgate-attempts')).toBe('4');
    // Three refused attempts and the backup's answer: backoffs of at most 40 ms each, where kept turns took ~2 s.
    expect(ms).toBeLessThan(1_500);
  });
});
