// Once a second during the run: the gateway's pool gauges and shed counters (GET /metrics) and the provider's
// requests in flight (GET /_mock/stats). The gateway's side of the story over time, next to the clients' figures.
import { request } from 'undici';
import type { MockStats } from '../../src/mock/server.ts';
import { epochMs } from './traffic.ts';

export interface Sample {
  /** ms since the epoch. */
  at: number;
  /** stormgate_pool_limit by target (the adaptive limit, floored). */
  limit: Record<string, number>;
  /** stormgate_pool_in_use / stormgate_pool_queue_depth by priority class. */
  inUse: Record<string, number>;
  queued: Record<string, number>;
  /** stormgate_shed_total by `priority/reason`, cumulative. */
  shed: Record<string, number>;
  /** stormgate_retry_budget_exhausted_total, all routes and targets, cumulative. */
  budgetExhausted: number;
  /** stormgate_upstream_attempts_total by status_class, cumulative. */
  upstreamAttempts: Record<string, number>;
  /** The provider's admitted requests in flight at that moment. */
  mockInflight: number | undefined;
}

/** One Prometheus text-format sample line: name, labels, value. */
function parseLine(line: string): { name: string; labels: Record<string, string>; value: number } | undefined {
  const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$/.exec(line);
  if (!m) return undefined;
  const labels: Record<string, string> = {};
  for (const l of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]!] = l[2]!;
  return { name: m[1]!, labels, value: Number(m[3]) };
}

function parseMetrics(text: string, at: number): Omit<Sample, 'mockInflight'> {
  const s: Omit<Sample, 'mockInflight'> = { at, limit: {}, inUse: {}, queued: {}, shed: {}, budgetExhausted: 0, upstreamAttempts: {} };
  for (const line of text.split('\n')) {
    if (line.startsWith('#') || line === '') continue;
    const p = parseLine(line);
    if (!p) continue;
    const { name, labels, value } = p;
    if (name === 'stormgate_pool_limit') s.limit[labels['target'] ?? '?'] = value;
    else if (name === 'stormgate_pool_in_use') s.inUse[labels['priority'] ?? '?'] = value;
    else if (name === 'stormgate_pool_queue_depth') s.queued[labels['priority'] ?? '?'] = value;
    else if (name === 'stormgate_shed_total') s.shed[`${labels['priority']}/${labels['reason']}`] = value;
    else if (name === 'stormgate_retry_budget_exhausted_total') s.budgetExhausted += value;
    else if (name === 'stormgate_upstream_attempts_total') {
      const k = labels['status_class'] ?? '?';
      s.upstreamAttempts[k] = (s.upstreamAttempts[k] ?? 0) + value;
    }
  }
  return s;
}

async function getText(url: string): Promise<string | undefined> {
  try {
    const res = await request(url, { method: 'GET', headersTimeout: 2_000, bodyTimeout: 2_000 });
    const text = await res.body.text();
    return res.statusCode === 200 ? text : undefined;
  } catch {
    return undefined;
  }
}

/** Samples every `everyMs` until stopped; a scrape that fails (a busy gateway) is skipped, not retried. */
export function startSampler(gatewayUrl: string, mockUrl: string, everyMs: number): { stop(): Promise<Sample[]> } {
  const samples: Sample[] = [];
  let stopped = false;
  const loop = (async () => {
    while (!stopped) {
      const tick = epochMs();
      const [metrics, stats] = await Promise.all([getText(`${gatewayUrl}/metrics`), getText(`${mockUrl}/_mock/stats`)]);
      if (metrics !== undefined) {
        const mockInflight = stats === undefined ? undefined : (JSON.parse(stats) as MockStats).inflight;
        samples.push({ ...parseMetrics(metrics, tick), mockInflight });
      }
      await new Promise((r) => setTimeout(r, Math.max(0, tick + everyMs - epochMs())));
    }
  })();
  return {
    async stop() {
      stopped = true;
      await loop;
      return samples;
    },
  };
}
