// stormgate_requests_total counts every client request a managed path answered, those refused before any route took
// them too (outcome rejected): a client that sends only invalid requests must show on the dashboard, not only in logs.
import { describe, expect, it } from 'vitest';
import { metricSum, useStacks } from './helpers/stack.ts';

const startStack = useStacks();

describe('requests refused before the pipeline', () => {
  it('count once each as rejected, under route none, and never as an upstream attempt', async () => {
    const s = await startStack();
    const rejected = 'stormgate_requests_total{route="none",target="none",priority="none",outcome="rejected"}';
    // The series exists at zero before the first refusal, so rate() and increase() see the first burst.
    expect(await (await fetch(`${s.url}/metrics`)).text()).toMatch(/^stormgate_requests_total\{route="none",target="none",priority="none",outcome="rejected"\} 0$/m);
    const post = (body: string, headers: Record<string, string> = {}) =>
      fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body }).then(async (r) => {
        await r.arrayBuffer();
        return r.status;
      });
    const chat = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    const statuses = [
      await post('{not json'),
      await post(JSON.stringify({ messages: [] })),
      await post(chat, { 'x-stormgate-timeout-ms': 'soon' }),
      await post(chat, { 'content-type': 'text/plain' }),
    ];
    expect(statuses).toEqual([400, 400, 400, 415]);
    // An ops endpoint and an unknown path are no client requests of a route.
    expect((await fetch(`${s.url}/healthz`)).status).toBe(200);
    expect((await fetch(`${s.url}/v1/nothing-here`, { method: 'POST' })).status).toBe(404);
    expect(await post(chat)).toBe(200);
    await new Promise((r) => setTimeout(r, 50));
    expect(await metricSum(s, rejected)).toBe(4);
    expect(await metricSum(s, 'stormgate_requests_total{route="chat"')).toBe(1);
    expect(await metricSum(s, 'stormgate_upstream_attempts_total')).toBe(1);
    expect(s.mock.stats().total).toBe(1);
  });

  it('requests refused under their idempotency key count as rejected too: none went upstream', async () => {
    const s = await startStack();
    const post = (key: string, content: string) =>
      fetch(`${s.baseURL}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': key },
        body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content }] }),
      }).then(async (r) => {
        await r.arrayBuffer();
        return r.status;
      });
    expect([await post('k-1', 'hi'), await post('k-1', 'another body'), await post('\u00e9', 'hi')]).toEqual([200, 422, 400]);
    await new Promise((r) => setTimeout(r, 50));
    expect(await metricSum(s, 'stormgate_requests_total{route="none",target="none",priority="none",outcome="rejected"}')).toBe(2);
    expect(await metricSum(s, 'stormgate_requests_total{route="chat"')).toBe(1);
    expect(s.mock.stats().total).toBe(1);
  });
});
