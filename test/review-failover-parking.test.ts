// Adversarial review of the failover-and-parking path (rev-park). A hand-over is counted from the target the request
// came from, once it is sent to the next one: a request that parks for a fallback and is released to it was handed
// over from the target it left before it parked, never from a target after it in order that it merely found
// unavailable on the way (its breaker open) and was never sent to.
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import { defaultConfig, scrapeMetrics, useExtraMocks, useStacks } from './helpers/stack.ts';

const extraMock = useExtraMocks();
const start = useStacks();

/** Primary: 503 to everything. Backup: one 429 with retry-after 1 s, then answers. Third: its breaker opened beforehand. */
async function threeTargets() {
  const backup = await extraMock({ faults: { errors: [{ status: 429, headers: { 'retry-after': '1' }, times: 1 }] }, apiKey: 'backup-key' });
  const third = await extraMock({ faults: { errors: [{ status: 503, times: 1 }] }, apiKey: 'third-key' });
  const s = await start({
    faults: { errors: [{ status: 503 }] },
    config: (url) => {
      const base = defaultConfig(url, { provider: { breaker: false } });
      const thirdBreaker = { consecutiveFailures: 1, openS: 60, probeWhileParkedMs: 30_000, probeWhileParkedMaxMs: 30_000 };
      return {
        ...base,
        providers: {
          ...base.providers,
          backup: { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: 'backup-key', breaker: false },
          third: { family: 'openai', baseUrl: `${third.url}/v1`, apiKey: 'third-key', breaker: thirdBreaker },
        },
        routes: base.routes.map((r) =>
          r.name === 'chat'
            ? { ...r, targets: [{ provider: 'mock' }, { provider: 'backup' }, { provider: 'third' }], retry: { maxAttempts: 2, backoff: { baseMs: 10, capMs: 20 } }, park: { maxQueue: 10 } }
            : r.name === 'completions'
              ? { ...r, targets: [{ provider: 'third' }], retry: { maxAttempts: 1 }, park: false }
              : r,
        ),
      };
    },
  });
  // The third target's breaker opens on its one 503 (a completion for the same model: the same breaker key).
  const opened = await fetch(`${s.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', prompt: 'hi' }) });
  await opened.arrayBuffer();
  expect(opened.status).toBe(503);
  return { s, backup, third };
}

const chat = async (url: string) => {
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-stormgate-timeout-ms': '15000' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
  });
  await res.arrayBuffer();
  return { status: res.status, target: res.headers.get('x-stormgate-target'), fallback: res.headers.get('x-stormgate-fallback') };
};

describe('a request released from the lot to a fallback, with a later target found unavailable on the way', () => {
  it('is one hand-over from the primary, not a second one from a target it was never sent to', { timeout: 30_000 }, async () => {
    const { s, backup, third } = await threeTargets();
    // A: primary 503 twice, backup 429 (a 1 s hold-off), the third's breaker open: it parks for the backup and is
    // answered there once the hold-off is over. B, during that hold-off: primary 503 twice, the backup held off (not
    // sent), the third's breaker open: it parks for the backup too.
    const a = chat(s.url);
    await new Promise((r) => setTimeout(r, 300));
    const b = chat(s.url);
    const answers = await Promise.all([a, b]);
    expect(answers.map((x) => x.status)).toEqual([200, 200]);
    expect(answers.every((x) => x.target?.startsWith('backup'))).toBe(true);
    // The hand-over's reason is why the request left the primary, not the third's open breaker.
    expect(answers.map((x) => x.fallback)).toEqual(['retries_exhausted', 'retries_exhausted']);
    expect(third.requests().length).toBe(1); // the completion that opened its breaker, nothing from the chat route
    expect(backup.requests().length).toBe(3);
    const fallbacks = (await scrapeMetrics(s.url)).filter((m) => m.name === 'stormgate_fallbacks_total' && m.labels.route === 'chat' && m.value > 0);
    expect(fallbacks.map((m) => [m.labels.from, m.labels.to, m.value])).toEqual([['mock/gpt-4o', 'backup/gpt-4o', 2]]);
  });
});

// The parking lot keeps one queue per target, whatever route parked there: a route on a path the gateway has no API
// for (count_tokens) neither starts nor obeys hold-offs, so /v1/messages requests parked for a hold-off must not hold it.
describe('a count_tokens request while /v1/messages requests are parked for a hold-off on the same target', () => {
  it('is answered at once, not parked behind them until the hold-off ends', { timeout: 30_000 }, async () => {
    const mock = await extraMock({ faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '3' } }] }, apiKey: 'sk-claude-0123456789' });
    const s = await start({
      config: () =>
        parseConfig(
          `
server: { host: 127.0.0.1, port: 0 }
providers:
  claude: { family: anthropic, baseUrl: "${mock.url}", apiKey: sk-claude-0123456789, breaker: false }
routes:
  - name: messages
    match: { path: /v1/messages }
    targets: [ { provider: claude } ]
    timeoutMs: 20000
  - name: tokens
    match: { path: /v1/messages/count_tokens }
    targets: [ { provider: claude } ]
    timeoutMs: 20000
`,
          'count-tokens-park.yaml',
          {},
        ),
    });
    const post = async (path: string, body: Record<string, unknown>) => {
      const started = Date.now();
      const res = await fetch(`${s.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01' }, body: JSON.stringify(body) });
      await res.arrayBuffer();
      return { status: res.status, tookMs: Date.now() - started };
    };
    const message = { model: 'claude-haiku-4-5', max_tokens: 50, messages: [{ role: 'user', content: 'hi' }] };
    // The first gets the 429 (a 3 s hold-off on the target) and waits it out; the second, during it, parks.
    const first = post('/v1/messages', message);
    await new Promise((r) => setTimeout(r, 300));
    const second = post('/v1/messages', message);
    await new Promise((r) => setTimeout(r, 300));
    const count = await post('/v1/messages/count_tokens', { model: 'claude-haiku-4-5', messages: [{ role: 'user', content: 'hi' }] });
    expect(count.status).toBe(200);
    expect(count.tookMs).toBeLessThan(1_500);
    expect((await first).status).toBe(200);
    expect((await second).status).toBe(200);
  });
});
