// README claims checked as a new user and operator meets them (audit 60), following the README from the top: `npm run
// demo` (its table against the README's sample), `npm start` on config/gateway.yaml with `npm run mock -- --error
// 503:0.3 --latency-ms 50` in the provider's place, the curl call and the brownout, the request's log line, `--check`
// and `--help`, every fenced YAML block of the README loaded by the gateway's own parser, /metrics against the metrics
// table (types and labels), the Grafana dashboard's and the rules' names, `promtool check rules` and `promtool test
// rules`; they held, and earlier audits and tests pin them. What did not: README "Shared state" said "Only two
// decisions wait for Redis on the request path: taking a probe permit and taking a retry from the budget", while a
// limited client's rates (`auth.limits`: one script as a request arrives, one more for its token estimate) and an
// idempotency key's claim wait for Redis there too, each bounded by `commandTimeoutMs` (as the config reference's own
// entry for it says of the client rates). The README now names all four; the config reference names the key's claim.
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { RedisStore } from '../src/state/redis-store.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { running } from './helpers/redis-stores.ts';

const README = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
const COMMAND_TIMEOUT_MS = 200;
const RATES = { requests: { intervalMs: 1_000, burst: 5 }, tokens: { intervalMs: 1, burst: 10_000 } };

const redis = useRedisServer();
const stores: RedisStore[] = [];
afterEach(async () => {
  await Promise.all(stores.splice(0).map((s) => s.close()));
});

async function storeOnRedis(): Promise<RedisStore> {
  const store = new RedisStore({ config: { redis: redis().url, commandTimeoutMs: COMMAND_TIMEOUT_MS, keyPrefix: `ra60-${randomUUID()}` } });
  stores.push(store);
  expect(await store.ready()).toBe(true);
  return store;
}

/** How long `call` took, in ms. */
async function timed(call: () => Promise<unknown>): Promise<number> {
  const start = performance.now();
  await call();
  return performance.now() - start;
}

describe('what waits for Redis on the request path (README "Shared state")', () => {
  it("a limited client's rates and an idempotency key's claim wait for a paused Redis up to commandTimeoutMs, then answer", async () => {
    const store = await storeOnRedis();
    const resume = redis().freeze();
    try {
      // Each waited for Redis (not answered from local state at once), and no longer than its time limit (with a loaded
      // machine's slack). Timeouts a whole commandTimeoutMs apart count apart: the third one puts the store on local state.
      const waits = [
        await timed(() => store.admitClient('agents', RATES, Date.now())),
        await timed(() => store.reserveTokens('agents', RATES, 500, Date.now())),
        await timed(() => store.claimKey(`k-${randomUUID()}`, running('instance-a', Date.now()), 10_000)),
      ];
      for (const ms of waits) {
        expect(ms).toBeGreaterThanOrEqual(COMMAND_TIMEOUT_MS * 0.8);
        expect(ms).toBeLessThan(COMMAND_TIMEOUT_MS + 1_500);
      }
      expect(store.degraded).toBe(true);
      // On local state, none of them waits any more.
      expect(await timed(() => store.admitClient('agents', RATES, Date.now()))).toBeLessThan(COMMAND_TIMEOUT_MS * 0.5);
    } finally {
      resume();
    }
  });

  it('the README and the config reference name every decision that waits for Redis there', () => {
    const shared = /\*\*Shared state\*\*([\s\S]*?)Outcome and request counts/.exec(README)![1]!.replace(/\s+/g, ' ');
    expect(shared).not.toContain('Only two decisions');
    for (const what of ['probe permit', 'retry from the budget', "limited client's rates", "idempotency key's claim"]) expect(shared).toContain(what);
    const doc = /^\| `state\.commandTimeoutMs` \|.*$/m.exec(README)![0];
    for (const what of ['probe permit', 'retry from the budget', "limited client's rates", "idempotency key's claim"]) expect(doc).toContain(what);
  });
});
