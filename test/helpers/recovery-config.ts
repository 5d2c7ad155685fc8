// The config of the stream-recovery tests: a primary `p` whose streams break, a backup `q` whose pool the continuation
// waits in, one chat route with streamRecovery: 'continue' and nothing else in the way (no breaker, no retries, no
// budget refusals, no parking).
import type { ConfigInput } from '../../src/config/schema.ts';

export const RECOVERY_TIMEOUTS = { connectMs: 2_000, firstTokenMs: 10_000, idleMs: 10_000 };

export interface RecoveryConfigOptions {
  pOrigin: string;
  qOrigin: string;
  qPools: Record<string, unknown>;
  /** The primary's idle timeout, when not the default 10 s. */
  pIdleMs?: number;
  /** Top-level sections added to the config (auth, drain). */
  extra?: Partial<ConfigInput>;
}

export function recoveryConfig(o: RecoveryConfigOptions): ConfigInput {
  const timeouts = RECOVERY_TIMEOUTS;
  return {
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    providers: {
      p: { family: 'openai', baseUrl: `${o.pOrigin}/v1`, apiKey: 'p-key-0123456789', breaker: false, timeouts: { ...timeouts, idleMs: o.pIdleMs ?? timeouts.idleMs } },
      q: { family: 'openai', baseUrl: `${o.qOrigin}/v1`, apiKey: 'q-key-0123456789', breaker: false, timeouts, pools: o.qPools },
    },
    routes: [
      {
        name: 'chat',
        match: { path: '/v1/chat/completions' },
        targets: [{ provider: 'p' }, { provider: 'q' }],
        streamRecovery: 'continue',
        retry: { maxAttempts: 1 },
        budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 },
        park: false,
      },
    ],
    ...o.extra,
  } as ConfigInput;
}
