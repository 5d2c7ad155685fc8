// Mutation-found gaps in http/serve-managed.ts, http/request-body.ts, providers/families.ts and
// pipeline/record-outcome.ts: each test kills a change the rest of the suite let through, and names the behaviour that
// change would have broken.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import { prepareUpstream } from '../src/providers/families.ts';
import { chatCompletion, eventStream, useFakeProviders } from './helpers/fake-provider.ts';
import { configFor } from './helpers/one-provider.ts';
import { defaultConfig, RETRY_LOOP_ONLY, useStacks } from './helpers/stack.ts';

const startStack = useStacks();
const startProvider = useFakeProviders();

/** A provider that answers every chat request with a completion, and keeps the URL each one was sent to. */
async function urlKeepingProvider(): Promise<{ origin: string; urls: string[] }> {
  const urls: string[] = [];
  const provider = await startProvider((req: IncomingMessage, res: ServerResponse) => {
    urls.push(req.url ?? '');
    req.resume();
    req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end(chatCompletion('ok')));
  });
  return { origin: provider.origin, urls };
}

const chatBody = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
const post = (url: string, body: string | Buffer = chatBody, headers: Record<string, string> = {}) =>
  fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });

describe("a managed request's query string", () => {
  it('reaches an OpenAI-compatible target as the client sent it', async () => {
    const p = await urlKeepingProvider();
    const s = await startStack({ config: configFor(p.origin, {}) });
    const res = await post(`${s.url}/v1/chat/completions?tenant=a&x=1`);
    expect(res.status).toBe(200);
    await res.text();
    expect(p.urls).toEqual(['/v1/chat/completions?tenant=a&x=1']);
  });

  it("reaches an Anthropic target of the Messages API as the client sent it (the SDK's beta calls add ?beta=true)", async () => {
    const urls: string[] = [];
    const provider = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      urls.push(req.url ?? '');
      req.resume();
      const message = { id: 'msg_1', type: 'message', role: 'assistant', model: 'claude', content: [{ type: 'text', text: 'ok' }], stop_reason: 'end_turn', stop_sequence: null, usage: { input_tokens: 1, output_tokens: 1 } };
      req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(message)));
    });
    const s = await startStack({
      config: () => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: { an: { family: 'anthropic', baseUrl: provider.origin, apiKey: 'an-key-0123456789', breaker: false } },
        routes: [{ name: 'messages', match: { path: '/v1/messages' }, targets: [{ provider: 'an' }], park: false }],
      }),
    });
    const res = await post(`${s.url}/v1/messages?beta=true`, JSON.stringify({ model: 'claude', max_tokens: 5, messages: [{ role: 'user', content: 'hi' }] }));
    expect(res.status).toBe(200);
    await res.text();
    expect(urls).toEqual(['/v1/messages?beta=true']);
  });
});

describe('prepareUpstream', () => {
  const config = parseConfig(
    `providers:
  oa: { family: openai, baseUrl: "https://api.example.com/v1", apiKey: k }
  az: { family: azure-openai, baseUrl: "https://res.openai.azure.com", apiKey: az-key, apiVersion: "2024-10-21" }
  su: { family: openai, baseUrl: "https://api.example.com/v1", apiKey: k, streamUsage: true }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: oa } ]
`,
    'test.yaml',
  );
  const prep = (provider: string, api: Parameters<typeof prepareUpstream>[1]['api'], clientPath: string, json: Record<string, unknown>, model: string | undefined, query = '') =>
    prepareUpstream(config.providers[provider]!, { api, clientPath, query, json, rawBody: Buffer.from(JSON.stringify(json)), model });

  it("refuses the Anthropic Messages API for an OpenAI-compatible or Azure target, whatever route reached it", () => {
    // The config refuses such a route; this is the check behind it, where the request is written for the target.
    for (const p of ['oa', 'az']) {
      expect(prep(p, 'messages', '/v1/messages', { model: 'm', max_tokens: 5, messages: [] }, 'm')).toMatchObject({ ok: false, reason: expect.stringMatching(/do not serve the Anthropic Messages API/) });
    }
  });

  it('names an Azure deployment as one path segment, whatever characters its name has', () => {
    const p = prep('az', 'chat', '/v1/chat/completions', { model: 'x' }, 'team a/../x?y#z');
    expect(p.ok && p.request.path).toBe('/openai/deployments/team%20a%2F..%2Fx%3Fy%23z/chat/completions?api-version=2024-10-21');
  });

  it('asks a streamUsage target for the usage of a streamed chat only, not of an answer sent whole', () => {
    for (const json of [{ model: 'm', messages: [] }, { model: 'm', messages: [], stream: 'yes' }]) {
      const p = prep('su', 'chat', '/v1/chat/completions', json, 'm');
      if (!p.ok) throw new Error(p.reason);
      expect(p.request.body.toString()).toBe(JSON.stringify(json));
      expect(p.request.hideUsage).toBeUndefined();
    }
    const streamed = prep('su', 'chat', '/v1/chat/completions', { model: 'm', messages: [], stream: true }, 'm');
    expect(streamed.ok && JSON.parse(streamed.request.body.toString()).stream_options).toEqual({ include_usage: true });
  });

  it('asks for the usage where stream_options is null, as where it is absent, and leaves an array for the provider to refuse', () => {
    const nulled = prep('su', 'chat', '/v1/chat/completions', { model: 'm', messages: [], stream: true, stream_options: null }, 'm');
    if (!nulled.ok) throw new Error(nulled.reason);
    expect(JSON.parse(nulled.request.body.toString()).stream_options).toEqual({ include_usage: true });
    expect(nulled.request.hideUsage).toBeTypeOf('function');
    const json = { model: 'm', messages: [], stream: true, stream_options: ['include_usage'] };
    const listed = prep('su', 'chat', '/v1/chat/completions', json, 'm');
    if (!listed.ok) throw new Error(listed.reason);
    expect(listed.request.body.toString()).toBe(JSON.stringify(json));
    expect(listed.request.hideUsage).toBeUndefined();
  });

  it("throws a RangeError of the gateway's own (not a stack overflow) rather than blaming the request", () => {
    const broken = Object.defineProperty({ ...config.providers['oa']! }, 'apiKey', {
      get() {
        throw new RangeError('Invalid array length');
      },
    });
    expect(() => prepareUpstream(broken, { api: 'chat', clientPath: '/v1/chat/completions', query: '', json: { model: 'm' }, rawBody: Buffer.from('{"model":"m"}'), model: 'm' })).toThrow(RangeError);
  });
});

describe("an attempt the request's deadline cut short", () => {
  it('opens the breaker once it had waited longer than slowCallMs, as a silent provider should', async () => {
    const provider = await startProvider((req: IncomingMessage) => void req.resume());
    const s = await startStack({
      config: () => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: { p: { family: 'openai', baseUrl: `${provider.origin}/v1`, apiKey: 'p-key-0123456789', breaker: { consecutiveFailures: 2, slowCallMs: 100, openS: 60 } } },
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'p' }], park: false, timeoutMs: 800, retry: { maxAttempts: 1 } }],
      }),
    });
    // 800 ms less the deadline's margin leaves each attempt about 550 ms: past slowCallMs.
    for (let i = 0; i < 2; i++) {
      const res = await post(`${s.url}/v1/chat/completions`);
      expect(res.status).toBe(504);
      await res.text();
    }
    const third = await post(`${s.url}/v1/chat/completions`);
    expect(third.status).toBe(503);
    await third.text();
    expect(provider.hits()).toBe(2);
  });
});

describe('a quota refused after the first output of a stream', () => {
  it('holds the target for authHoldS seconds, not milliseconds: a request a moment later still goes to the next target', async () => {
    const QUOTA = { message: 'You exceeded your current quota.', type: 'insufficient_quota', param: null, code: 'insufficient_quota' };
    const chunk = (content: string) => `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta: { content }, finish_reason: null }] })}\n\n`;
    const broke = await startProvider(
      eventStream((res) => {
        res.write(chunk('Half an ans'));
        res.end(`data: ${JSON.stringify({ error: QUOTA })}\n\n`);
      }),
    );
    const s = await startStack({
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl, { route: { retry: { maxAttempts: 1 } } });
        return {
          ...base,
          providers: { ...base.providers, broke: { family: 'openai', baseUrl: `${broke.origin}/v1`, apiKey: 'broke-key', authHoldS: 2 } },
          routes: base.routes.map((r) => ({ ...r, targets: [{ provider: 'broke' }, { provider: 'mock' }] })),
        };
      },
    });
    const streamed = await post(`${s.url}/v1/chat/completions`, JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true }));
    expect(await streamed.text()).toMatch(/Half an ans[\s\S]*insufficient_quota/);
    // Past 2 ms, well within 2 s.
    await new Promise((r) => setTimeout(r, 100));
    const next = await post(`${s.url}/v1/chat/completions`);
    expect(next.status).toBe(200);
    expect(next.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
    await next.text();
    expect(broke.hits()).toBe(1);
  });
});

describe('a probe whose stream the provider breaks after its first output', () => {
  it('closes the breaker on that first output, its break judged in no window, and the next request is served', async () => {
    let n = 0;
    const provider = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      req.on('end', () => {
        n++;
        if (n === 1) return void res.writeHead(500, { 'content-type': 'application/json' }).end('{"error":{"message":"down","type":"server_error","code":null}}');
        if (n === 2) {
          res.writeHead(200, { 'content-type': 'text/event-stream' });
          res.write(`data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta: { content: 'Half' }, finish_reason: null }] })}\n\n`);
          setTimeout(() => res.socket?.destroy(), 50);
          return;
        }
        res.writeHead(200, { 'content-type': 'application/json' }).end(chatCompletion('ok'));
      });
    });
    const s = await startStack({
      config: () => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: { p: { family: 'openai', baseUrl: `${provider.origin}/v1`, apiKey: 'p-key-0123456789', breaker: { consecutiveFailures: 1, openS: 0.2, halfOpenProbes: 1, closeAfter: 1 } } },
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'p' }], park: false, retry: { maxAttempts: 1 } }],
      }),
    });
    const first = await post(`${s.url}/v1/chat/completions`);
    expect(first.status).toBe(500);
    await first.text();
    // Past openS and its jitter: the next request is the probe.
    await new Promise((r) => setTimeout(r, 400));
    const probe = await post(`${s.url}/v1/chat/completions`, JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true }));
    expect(probe.status).toBe(200);
    expect(await probe.text()).toMatch(/Half/);
    await new Promise((r) => setTimeout(r, 100));
    const next = await post(`${s.url}/v1/chat/completions`);
    expect(next.status).toBe(200);
    await next.text();
    expect(provider.hits()).toBe(3);
  });
});

describe('a request under an idempotency key that its client token rate refuses', () => {
  it('gives its key back: the same request again is refused as promptly, not left waiting for a run that never ends', async () => {
    const s = await startStack({
      config: (mockUrl) => ({ ...defaultConfig(mockUrl, RETRY_LOOP_ONLY), auth: { keys: { agents: 'key-agents' }, limits: { agents: { tokensPerMinute: 600 } } } }),
    });
    const body = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x'.repeat(1600) }] });
    const headers = { authorization: 'Bearer key-agents', 'idempotency-key': 'k-refused-1' };
    // The first request, without a key, takes most of the minute's tokens: admission (headers alone) lets the keyed
    // ones after it in, and their estimate, once their body is read, is refused after the key was claimed.
    const spend = await fetch(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: 'Bearer key-agents' }, body });
    expect(spend.status).toBe(200);
    await spend.text();
    const statuses: number[] = [];
    for (let i = 0; i < 2; i++) {
      const started = Date.now();
      const res = await fetch(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body, signal: AbortSignal.timeout(10_000) });
      statuses.push(res.status);
      await res.text();
      expect(Date.now() - started).toBeLessThan(3_000);
    }
    expect(statuses).toEqual([429, 429]);
    expect(s.mock.stats().total).toBe(1);
  });
});

describe("a whole answer without usage, to a client with a token rate", () => {
  it('charges the client the output it delivered: a long answer leaves no tokens for the next request', async () => {
    const provider = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      const answer = { id: 'c1', object: 'chat.completion', created: 1, model: 'gpt-4o', choices: [{ index: 0, message: { role: 'assistant', content: 'y '.repeat(4000) }, finish_reason: 'stop' }] };
      req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(answer)));
    });
    const s = await startStack({ config: configFor(provider.origin, {}, { auth: { keys: { agents: 'key-agents' }, limits: { agents: { tokensPerMinute: 600 } } } }) });
    const ask = () => post(`${s.url}/v1/chat/completions`, chatBody, { authorization: 'Bearer key-agents' });
    const first = await ask();
    expect(first.status).toBe(200);
    await first.text();
    // The request is settled as it ends on the gateway's side, a moment after the client has read the answer.
    await new Promise((r) => setTimeout(r, 50));
    const second = await ask();
    expect(second.status).toBe(429);
    await second.text();
    expect(provider.hits()).toBe(1);
  });
});
