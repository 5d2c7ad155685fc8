// `npm run demo`: the gateway's main job on one machine with no keys, Redis or Docker. It starts two bundled mock
// providers (the primary flaky, the backup healthy), sends the same burst of traffic with the official openai SDK
// once straight at the flaky provider (the SDK's own retries) and once through stormgate, and prints what happened.
import { performance } from 'node:perf_hooks';
import OpenAI from 'openai';
import { loadConfigFile } from '../src/config/load.ts';
import { buildServer } from '../src/server.ts';
import { startMock, type FaultSpec } from '../src/mock/server.ts';
import { percent, percentile } from '../bench/lib/stats.ts';

const REQUESTS = Number(process.env.DEMO_REQUESTS ?? 300);
const CONCURRENCY = Number(process.env.DEMO_CONCURRENCY ?? 30);

/** A provider having a bad day: slow-ish, 25% of first attempts fail with 503, some 429s with a wait hint, some resets. */
const FLAKY: FaultSpec = {
  latencyMs: 40,
  latencyJitterMs: 40,
  resetRate: 0.03,
  errors: [
    { status: 429, rate: 0.05, headers: { 'retry-after-ms': '300' } },
    { status: 503, rate: 0.25, firstAttemptsOnly: true },
    { status: 500, rate: 0.05 },
  ],
  models: { 'gpt-4o-mini': { errors: [{ status: 503, rate: 1 }] } },
  stream: { chunks: 8, chunkDelayMs: 5 },
};

interface RunResult {
  label: string;
  requests: number;
  succeeded: number;
  upstreamAttempts: number;
  latenciesMs: number[];
  retries: number;
  fallbacks: number;
}

async function burst(label: string, client: OpenAI, count: () => { attempts: number; retries: number; fallbacks: number }): Promise<RunResult> {
  const latencies: number[] = [];
  let succeeded = 0;
  let next = 0;
  const one = async (i: number) => {
    const started = performance.now();
    try {
      // Mostly chat, some streamed, some embeddings, and one model the primary cannot serve at all.
      if (i % 10 === 9) await client.embeddings.create({ model: 'text-embedding-3-small', input: `doc ${i}` });
      else if (i % 5 === 0) {
        const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: `stream ${i}` }], stream: true });
        for await (const _ of stream) void _;
      } else {
        await client.chat.completions.create({ model: i % 25 === 1 ? 'gpt-4o-mini' : 'gpt-4o', messages: [{ role: 'user', content: `hello ${i}` }] });
      }
      succeeded++;
    } catch {
      // counted as a failure
    }
    latencies.push(performance.now() - started);
  };
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next < REQUESTS) await one(next++);
    }),
  );
  const c = count();
  return { label, requests: REQUESTS, succeeded, upstreamAttempts: c.attempts, latenciesMs: latencies, retries: c.retries, fallbacks: c.fallbacks };
}

function table(results: RunResult[]): string {
  const rows: Array<[string, (r: RunResult) => string]> = [
    ['client requests', (r) => String(r.requests)],
    ['upstream attempts', (r) => String(r.upstreamAttempts)],
    ['retries', (r) => String(r.retries)],
    ['fallbacks to backup', (r) => String(r.fallbacks)],
    ['successes', (r) => `${r.succeeded} (${percent(r.succeeded / r.requests)})`],
    ['p50 latency', (r) => `${percentile(r.latenciesMs, 50).toFixed(0)} ms`],
    ['p99 latency', (r) => `${percentile(r.latenciesMs, 99).toFixed(0)} ms`],
  ];
  const width = [22, ...results.map(() => 30)];
  const line = (cells: string[]) => cells.map((c, i) => c.padEnd(width[i]!)).join('');
  return [line(['', ...results.map((r) => r.label)]), line(['-'.repeat(20), ...results.map(() => '-'.repeat(28))]), ...rows.map(([name, f]) => line([name, ...results.map(f)]))].join('\n');
}

async function main(): Promise<void> {
  const primary = await startMock({ faults: FLAKY, quiet: true });
  const backup = await startMock({ faults: { latencyMs: 60, stream: { chunks: 8, chunkDelayMs: 5 } }, quiet: true });
  process.env.STORMGATE_DEMO_PRIMARY = `${primary.url}/v1`;
  process.env.STORMGATE_DEMO_BACKUP = `${backup.url}/v1`;
  const config = loadConfigFile(new URL('../config/demo.yaml', import.meta.url).pathname);
  const gateway = await buildServer(config);
  const gatewayUrl = await gateway.listen({ host: '127.0.0.1', port: 0 });
  console.log(`stormgate demo: mock providers at ${primary.url} (flaky) and ${backup.url} (backup), gateway at ${gatewayUrl}`);
  console.log(`sending ${REQUESTS} requests (chat, streamed chat, embeddings) with ${CONCURRENCY} in flight, twice...\n`);
  try {
    // 1. Straight at the flaky provider, the SDK's default retries (2) doing what they can.
    primary.reset();
    const direct = await burst('direct, SDK retries', new OpenAI({ baseURL: `${primary.url}/v1`, apiKey: 'demo-key', maxRetries: 2 }), () => {
      const s = primary.stats();
      const retries = primary.requests().filter((r) => Number(r.headers['x-stainless-retry-count'] ?? 0) > 0).length;
      return { attempts: s.total, retries, fallbacks: 0 };
    });
    // 2. Through stormgate: same SDK, same defaults, base URL pointed at the gateway.
    primary.reset();
    backup.reset();
    const through = await burst('through stormgate', new OpenAI({ baseURL: `${gatewayUrl}/v1`, apiKey: 'any-client-key' }), () => {
      const all = [...primary.requests(), ...backup.requests()];
      const retries = all.filter((r) => r.headers['x-retry-attempt'] !== undefined).length;
      const fallbacks = backup.requests().filter((r) => r.headers['x-retry-attempt'] === undefined).length;
      return { attempts: all.length, retries, fallbacks };
    });
    console.log(table([direct, through]));
    const metrics = await (await fetch(`${gatewayUrl}/metrics`)).text();
    // Series start at 0: only those that counted an opening.
    const opened = metrics.split('\n').filter((l) => l.startsWith('stormgate_breaker_transitions_total') && l.includes('to="open"') && Number(l.split(' ').at(-1)) > 0);
    if (opened.length > 0) console.log(`\nThe primary's circuit breaker opened (${opened.map((l) => l.match(/target="([^"]+)"/)?.[1]).join(', ')}): its traffic went to the backup at once, and probes check when it is back.`);
    const reasons = fallbackReasons(metrics);
    if (reasons !== '') console.log(`Why requests went to the backup (stormgate_fallbacks_total by reason): ${reasons}.`);
    console.log(
      `\nThrough the gateway every failure is absorbed before the client sees it (retries with jitter, Retry-After honoured,` +
        `\nthe backup taking what the primary cannot serve), and SDK retries never multiply the gateway's (x-should-retry: false).` +
        `\nA 429 with retry-after holds the primary off for every request until then, so new requests go to the backup meanwhile.` +
        `\nTo watch the metrics yourself: npm run mock, then OPENAI_BASE_URL=http://127.0.0.1:9000/v1 OPENAI_API_KEY=any npm start,` +
        `\nand curl http://127.0.0.1:8080/metrics; the full retry-storm benchmark: npm run bench:storm.`,
    );
  } finally {
    await gateway.close();
    await primary.close();
    await backup.close();
  }
}

/** `held_off 200, breaker_open 40`: the fallback counter summed by reason, largest first. */
function fallbackReasons(metrics: string): string {
  const byReason = new Map<string, number>();
  for (const line of metrics.split('\n')) {
    if (!line.startsWith('stormgate_fallbacks_total{')) continue;
    const reason = line.match(/reason="([^"]+)"/)?.[1] ?? 'unknown';
    byReason.set(reason, (byReason.get(reason) ?? 0) + Number(line.split(' ').at(-1)));
  }
  return [...byReason].filter(([, n]) => n > 0).sort((a, b) => b[1] - a[1]).map(([r, n]) => `${r} ${n}`).join(', ');
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
