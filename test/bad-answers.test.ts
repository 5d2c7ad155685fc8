// A 2xx that is not the answer: a captive portal's HTML, an empty body, JSON where a stream was asked for. Passed
// on, the SDK returns the HTML as the completion, crashes, or ends a stream with no chunks and no error. The gateway
// treats them as failed attempts: retried, then failed over, and never counted as a success.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import { useFakeProviders, type FakeProvider } from './helpers/fake-provider.ts';
import { defaultConfig, requestLine, RETRY_LOOP_ONLY, useStacks, type Stack } from './helpers/stack.ts';

type Wrong = { status?: number; contentType?: string; body: string };

const WRONG: Record<string, Wrong> = {
  html: { contentType: 'text/html; charset=utf-8', body: '<html><body>Please log in to the Wi-Fi</body></html>' },
  empty: { contentType: 'application/json', body: '' },
  truncated: { contentType: 'application/json', body: '{"id":"chatcmpl-1","object":"chat.comp' },
  // A router's error delivered with a 200 (OpenRouter does this), and JSON with no choice in it.
  'an error object': { contentType: 'application/json', body: '{"error":{"message":"Provider returned error","code":502}}' },
  'an empty object': { contentType: 'application/json', body: '{}' },
  'no choices': { contentType: 'application/json', body: '{"id":"chatcmpl-1","object":"chat.completion","choices": [ ]}' },
};

const startProvider = useFakeProviders();
/** The provider of the test's wrong answers. */
let wrong: FakeProvider;

/** An OpenAI-compatible "provider" that answers every request with the same wrong 2xx. */
async function wrongProvider(answer: Wrong): Promise<string> {
  wrong = await startProvider((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(answer.status ?? 200, answer.contentType ? { 'content-type': answer.contentType } : {});
      res.end(answer.body);
    });
  });
  return `${wrong.origin}/v1`;
}

/** The default config with a provider `custom` at `baseUrl` that alone serves a route of its own on `path`. */
function routeTo(mockUrl: string, path: string, baseUrl: string, provider: Partial<ConfigInput['providers'][string]> = {}): ConfigInput {
  const base = defaultConfig(mockUrl, RETRY_LOOP_ONLY);
  return {
    ...base,
    providers: { ...base.providers, custom: { family: 'openai', baseUrl, apiKey: 'custom-key', breaker: false, ...provider } },
    routes: [...base.routes, { name: 'custom', match: { path }, targets: [{ provider: 'custom' }] }],
  };
}

const startStack = useStacks();

/** The wrong provider first (2 attempts), the healthy mock as the fallback. */
async function stack(answer: Wrong, withFallback = true): Promise<Stack> {
  const wrongUrl = await wrongProvider(answer);
  return startStack({
    config: (mockUrl) => {
      const base = defaultConfig(mockUrl, {
        ...RETRY_LOOP_ONLY,
        route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } },
      });
      return {
        ...base,
        providers: { ...base.providers, wrong: { family: 'openai', baseUrl: wrongUrl, apiKey: 'wrong-key', breaker: false } },
        routes: base.routes.map((r) => ({ ...r, targets: withFallback ? [{ provider: 'wrong' }, { provider: 'mock' }] : [{ provider: 'wrong' }] })),
      };
    },
  });
}

const sdk = (s: Stack) => new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
const messages = [{ role: 'user' as const, content: 'hi' }];

describe('a 2xx that is not the answer', () => {
  for (const [name, answer] of Object.entries(WRONG)) {
    it(`retries and fails over on a 200 with ${name} body`, async () => {
      const s = await stack(answer);
      const { data, response } = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
      expect(data.choices[0]!.message.content).toMatch(/Mock answer/);
      expect(wrong.hits()).toBe(2);
      expect(response.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
      expect(response.headers.get('x-stormgate-attempts')).toBe('3');
    });
  }

  it('fails over on a proxy\'s HTML page even when retryOn leaves network out: a page is no run of the request', async () => {
    const url = await wrongProvider(WRONG.html!);
    const s = await startStack({
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl, { ...RETRY_LOOP_ONLY, route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 1, retryOn: [503] } } });
        return {
          ...base,
          providers: { ...base.providers, wrong: { family: 'openai', baseUrl: url, apiKey: 'wrong-key', breaker: false } },
          routes: base.routes.map((r) => ({ ...r, targets: [{ provider: 'wrong' }, { provider: 'mock' }] })),
        };
      },
    });
    const { response } = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(response.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
    expect(wrong.hits()).toBe(1);
  });

  it('treats JSON where a stream was asked for as a failed attempt, so the SDK never sees an empty stream', async () => {
    const s = await stack({ contentType: 'application/json', body: '{"id":"chatcmpl-1","object":"chat.completion","choices":[]}' });
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text).toMatch(/Mock answer/);
    expect(wrong.hits()).toBe(2);
  });

  it('ends in a 502 in the OpenAI shape, logged as a failure, when no target gives a real answer', async () => {
    const s = await stack(WRONG.html!, false);
    const err = await sdk(s)
      .chat.completions.create({ model: 'gpt-4o', messages })
      .then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    const apiErr = err as InstanceType<typeof OpenAI.APIError>;
    expect(apiErr.status).toBe(502);
    expect(apiErr.headers?.get('x-should-retry')).toBe('false');
    expect(apiErr.message).toMatch(/text\/html, not JSON/);
    expect(wrong.hits()).toBe(2);
    const line = s.logs.map((l) => JSON.parse(l) as { msg: string; outcome?: string }).find((l) => l.msg === 'request' || l.msg === 'stream ended abnormally');
    expect(line?.outcome).not.toBe('success');
  });

  it('streams an event-stream answer on a path it does not know, event by event, longer than firstTokenMs', async () => {
    // Six events 300 ms apart (1.8 s in all) against a 1 s first-token limit: read whole, the answer would time out. The
    // first event comes 700 ms before that limit, room for a loaded machine's lag.
    const custom = await startProvider((req, res) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      let n = 0;
      const timer = setInterval(() => {
        res.write(`data: {"choices":[{"delta":{"content":"part ${n}"}}]}\n\n`);
        if (++n === 6) {
          clearInterval(timer);
          res.end('data: [DONE]\n\n');
        }
      }, 300);
      res.on('close', () => clearInterval(timer));
    });
    const s = await startStack({ config: (mockUrl) => routeTo(mockUrl, '/v1/custom/stream', `${custom.origin}/v1`, { timeouts: { firstTokenMs: 1_000 } }) });
    const started = Date.now();
    const res = await fetch(`${s.url}/v1/custom/stream`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'm', stream: true }) });
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    const first = await reader.read();
    // The first event (at ~300 ms) arrives long before the upstream has sent the last (at ~1.8 s).
    expect(Date.now() - started).toBeLessThan(1_200);
    let text = new TextDecoder().decode(first.value);
    for (let r = await reader.read(); !r.done; r = await reader.read()) text += new TextDecoder().decode(r.value);
    expect(text).toContain('part 5');
    expect(custom.hits()).toBe(1);
  });

  it('counts a stream the upstream cut on a path it does not know as stream_error, not as a client that left', async () => {
    // No error event can be written in a format the gateway does not know, so it cuts the client's connection: that
    // close is the gateway's, and was logged and counted as client_gone (clientGone: true) as if the client had left.
    const custom = await startProvider((req, res) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"part":1}\n\n');
      setTimeout(() => res.socket!.destroy(), 50);
    });
    const s = await startStack({ config: (mockUrl) => routeTo(mockUrl, '/v1/custom/stream', `${custom.origin}/v1`) });
    const res = await fetch(`${s.url}/v1/custom/stream`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'm', stream: true }) });
    expect(res.status).toBe(200);
    await expect(res.text()).rejects.toThrow();
    const line = await requestLine(s, 'custom');
    expect(line.outcome).toBe('stream_error');
    expect(line.clientGone).toBeUndefined();
    expect(line.streamEnd).toBe('cut');
  });

  it('passes an Anthropic stream on a /v1/messages route through once, to its end, with nothing added', async () => {
    // Anthropic's Messages events: no `choices`, no [DONE]. Judged as chat, the stream had "no output", failed, and
    // was sent upstream again.
    const events = [
      'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","content":[]}}\n\n',
      'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}\n\n',
      'event: message_stop\ndata: {"type":"message_stop"}\n\n',
    ];
    const custom = await startProvider((req, res) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(events.join(''));
    });
    const s = await startStack({ config: (mockUrl) => routeTo(mockUrl, '/v1/messages', custom.origin, { family: 'anthropic' }) });
    const res = await fetch(`${s.url}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'claude-x', stream: true, max_tokens: 5, messages: [] }) });
    expect(res.status).toBe(200);
    expect(await res.text()).toBe(events.join(''));
    expect(custom.hits()).toBe(1);
  });

  it('leaves the answers of paths it does not know (api "other") alone', async () => {
    const wrongUrl = await wrongProvider({ contentType: 'audio/mpeg', body: 'ID3...' });
    const s = await startStack({ config: (mockUrl) => routeTo(mockUrl, '/v1/audio/speech', wrongUrl) });
    const res = await fetch(`${s.url}/v1/audio/speech`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'tts-1', input: 'hi', voice: 'alloy' }) });
    expect(res.status).toBe(200);
    expect(await res.text()).toBe('ID3...');
  });
});

describe('an answer broken on the wire', () => {
  /** A provider that answers with `send` (raw socket writes after the request), alone on the route, 2 attempts. */
  async function broken(send: (socket: import('node:net').Socket) => void): Promise<Stack> {
    wrong = await startProvider((req, res) => {
      req.resume();
      req.on('end', () => send(res.socket!));
    });
    return startStack({
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl, { ...RETRY_LOOP_ONLY, route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } } });
        return {
          ...base,
          providers: { ...base.providers, wrong: { family: 'openai', baseUrl: `${wrong.origin}/v1`, apiKey: 'wrong-key', breaker: false } },
          routes: base.routes.map((r) => ({ ...r, targets: [{ provider: 'wrong' }] })),
        };
      },
    });
  }

  const failure = async (s: Stack) =>
    (await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).then(() => undefined, (e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;

  it('reads a body cut short of its content-length as a cut answer the provider ran, not an unreachable provider', async () => {
    const s = await broken((socket) => socket.end('HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{"id":"chatcmpl-1",'));
    const err = await failure(s);
    expect(err.status).toBe(502);
    expect((err.error as { code: string }).code).toBe('upstream_bad_response');
    expect(err.message).toMatch(/the answer was cut before its end/);
  });

  it('reads headers larger than undici takes as an unusable answer, not an unreachable provider', async () => {
    const s = await broken((socket) => socket.end(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-big: ${'a'.repeat(40_000)}\r\ncontent-length: 2\r\n\r\n{}`));
    const err = await failure(s);
    expect(err.status).toBe(502);
    expect((err.error as { code: string }).code).toBe('upstream_bad_response');
    expect(err.message).toMatch(/headers are too large/);
  });
});

