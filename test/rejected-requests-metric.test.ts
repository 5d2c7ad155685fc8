// stormgate_requests_total counts every client request a managed path answered, those refused before any route took
// them too (outcome rejected): a client that sends only invalid requests must show on the dashboard, not only in logs.
import { readFileSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it, vi } from 'vitest';
import { MemoryStore } from '../src/state/memory-store.ts';
import { defaultConfig, metricSum, useStacks, type Stack } from './helpers/stack.ts';

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
    // An ops endpoint is no client request of a route; an unknown path's 404 is one refused before any route (rejected).
    expect((await fetch(`${s.url}/healthz`)).status).toBe(200);
    expect((await fetch(`${s.url}/v1/nothing-here`, { method: 'POST' })).status).toBe(404);
    expect(await post(chat)).toBe(200);
    await new Promise((r) => setTimeout(r, 50));
    expect(await metricSum(s, rejected)).toBe(5);
    expect(await metricSum(s, 'stormgate_requests_total{route="chat"')).toBe(1);
    expect(await metricSum(s, 'stormgate_upstream_attempts_total')).toBe(1);
    expect(s.mock.stats().total).toBe(1);
  });

  it('a request the pipeline answered is counted under its route alone, whatever the repeats watch says (windowS: 0)', async () => {
    // With the watch off a failed request was counted twice: under its route, and again as rejected under route none.
    const s = await startStack({ route: { budget: { repeats: { windowS: 0 } } }, faults: { errors: [{ status: 400, rate: 1 }] } });
    const r = await fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }) });
    expect(r.status).toBe(400);
    await r.arrayBuffer();
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(await metricSum(s, 'stormgate_requests_total{route="none"')).toBe(0);
    expect(await metricSum(s, 'stormgate_requests_total{route="chat"')).toBe(1);
  });

  it("log the outcome they are counted under, as every request's line does", async () => {
    const s = await startStack();
    const r = await fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{not json' });
    expect(r.status).toBe(400);
    await r.arrayBuffer();
    await vi.waitFor(() => expect(s.logs.map((l) => JSON.parse(l) as { status?: number; outcome?: string }).find((l) => l.status === 400)).toMatchObject({ outcome: 'rejected' }), { timeout: 2_000, interval: 20 });
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

  it('a client over its rate (requests, or tokens by its estimate) and every other refusal before a route count as rejected, each named in the README', async () => {
    // The README's list of what `rejected` counts left out client_rate_limited, a request too large, a wrong method...
    const s = await startStack({
      config: (url) => ({
        ...defaultConfig(url),
        routes: defaultConfig(url).routes.map((r) => (r.name === 'chat' ? { ...r, match: { ...r.match, models: ['gpt-4o'] } } : r)),
        server: { host: '127.0.0.1', port: 0, bodyLimitBytes: 2000 },
        auth: { keys: { a: 'sk-client-a-0123456789', b: 'sk-client-b-0123456789' }, limits: { a: { requestsPerMinute: 1, burst: 1 }, b: { tokensPerMinute: 100 } } },
      }),
    });
    const chat = (extra: Record<string, unknown> = {}) => JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], ...extra });
    // node:http, not fetch: fetch sets Host itself.
    const send = (key: string | undefined, body: string, headers: Record<string, string> = {}, method = 'POST') =>
      new Promise<{ status: number; code: string | null }>((resolve, reject) => {
        const req = httpRequest(`${s.baseURL}/chat/completions`, { method, headers: { 'content-type': 'application/json', ...(key && { authorization: `Bearer ${key}` }), ...headers } }, (res) => {
          let text = '';
          res.on('data', (c: Buffer) => (text += c.toString()));
          res.on('end', () => resolve({ status: res.statusCode!, code: res.statusCode === 200 ? null : (JSON.parse(text) as { error: { code: string } }).error.code }));
        });
        req.on('error', reject);
        req.end(method === 'GET' ? undefined : body);
      });
    const a = 'sk-client-a-0123456789';
    const b = 'sk-client-b-0123456789';
    expect(await send(a, chat())).toEqual({ status: 200, code: null });
    // One larger than a minute's worth is let in when the rate is full, and overdraws it: the next is refused.
    expect(await send(b, chat({ max_tokens: 500 }))).toEqual({ status: 200, code: null });
    // The Via entry this instance sends upstream, as a provider whose baseUrl points back at the gateway returns it.
    const { instance } = JSON.parse(s.logs.find((l) => l.includes('"instance"'))!) as { instance: string };
    const refused = [
      await send(a, chat()),
      await send(b, chat({ max_tokens: 500 })),
      await send(undefined, chat()),
      await send(b, '{not json'),
      await send(b, JSON.stringify({ messages: [] })),
      await send(b, chat({ model: 'nope' })),
      await send(b, chat(), { 'x-stormgate-timeout-ms': 'soon' }),
      await send(b, chat(), { 'content-type': 'text/plain' }),
      await send(b, chat({ padding: 'x'.repeat(3000) })),
      await send(b, '', {}, 'GET'),
      await send(b, chat(), { host: 'evil.example.com' }),
      await send(b, chat(), { via: `1.1 ${instance}` }),
    ];
    expect(refused.map((r) => r.status)).toEqual([429, 429, 401, 400, 400, 404, 400, 415, 413, 405, 403, 508]);
    await vi.waitFor(async () => expect(await metricSum(s, 'stormgate_requests_total{route="none",target="none",priority="none",outcome="rejected"}')).toBe(refused.length), { timeout: 2_000, interval: 20 });
    expect(await metricSum(s, 'stormgate_requests_total{route="chat"')).toBe(2);
    const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
    const rejected = /`rejected` \(with route, target and priority `none`\)[^|]*/.exec(readme)?.[0] ?? '';
    const codes = [...new Set(refused.map((r) => r.code!))];
    expect(codes.filter((code) => !rejected.includes(`\`${code}\``)), 'name these in the README\'s stormgate_requests_total row, under `rejected`').toEqual([]);
  });
});

describe('a repeat under an idempotency key whose client leaves', () => {
  const CHAT = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'hi' }] };
  const sdk = (s: Stack) => new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0 });

  /** Sends a repeat of `key` and cancels it after `leaveAfterMs`; resolves once the SDK has given it up. */
  async function repeatThatLeaves(s: Stack, key: string, leaveAfterMs: number): Promise<void> {
    const ctrl = new AbortController();
    setTimeout(() => ctrl.abort(), leaveAfterMs);
    await expect(sdk(s).chat.completions.create(CHAT, { headers: { 'Idempotency-Key': key }, signal: ctrl.signal })).rejects.toThrow(OpenAI.APIUserAbortError);
  }

  it('while it waits for the run is counted once, as client_gone under route none: it sent nothing upstream', async () => {
    // A random cancellation storm found such repeats in no series at all: their client left, the wait gave up, and the
    // request ended with no summary and no status, so stormgate_requests_total fell short of the requests received.
    const s = await startStack({ faults: { latencyMs: 800 } });
    const run = sdk(s).chat.completions.create(CHAT, { headers: { 'Idempotency-Key': 'k-leaves' } });
    await sleep(100);
    await repeatThatLeaves(s, 'k-leaves', 200);
    await run;
    await vi.waitFor(async () => expect(await metricSum(s, 'stormgate_requests_total')).toBe(2), { timeout: 3_000, interval: 20 });
    expect(await metricSum(s, 'stormgate_requests_total{route="none",target="none",priority="none",outcome="client_gone"}')).toBe(1);
    expect(await metricSum(s, 'stormgate_requests_total{route="chat",target="mock/gpt-4o",priority="online",outcome="success"}')).toBe(1);
    expect(s.mock.stats().total).toBe(1);
  });

  it('as the run\'s answer comes is counted once, as client_gone under the run\'s labels', async () => {
    // The repeat's look at the key is slow (a Redis round trip): the client leaves during it, and it finds the answer.
    const store = new MemoryStore();
    const readKey = store.readKey.bind(store);
    store.readKey = async (key, nowMs) => {
      await sleep(400);
      return readKey(key, nowMs);
    };
    const s = await startStack({ faults: { latencyMs: 300 }, deps: { store } });
    const run = sdk(s).chat.completions.create(CHAT, { headers: { 'Idempotency-Key': 'k-replay' } });
    await sleep(50);
    // Its first look (75-150 ms after it came) reads until after the run's answer; its client leaves in between.
    await repeatThatLeaves(s, 'k-replay', 350);
    await run;
    await vi.waitFor(async () => expect(await metricSum(s, 'stormgate_requests_total')).toBe(2), { timeout: 3_000, interval: 20 });
    expect(await metricSum(s, 'stormgate_requests_total{route="chat",target="mock/gpt-4o",priority="online",outcome="client_gone"}')).toBe(1);
    expect(s.mock.stats().total).toBe(1);
  });
});
