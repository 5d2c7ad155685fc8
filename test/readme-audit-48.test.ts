// README claims checked by running them (audit 48: today's and yesterday's README edits — Anthropic errors as data
// alone and in a 200, message_delta's counts that only grow, the end of a stream that pings after its finish,
// OpenRouter's in-band 429, escaped key echoes, the config loader's pointers and refusals, an optional provider without
// its key, 405 on the ops paths — and sections no earlier audit covered: Client keys' Host check and key headers,
// readiness, the mock provider). Pings after a stream's finish held it idleMs and a second past the finish (twice
// idleMs while a usage chunk was waited for), not idleMs as the README said: the gateway now ends it idleMs after the
// finish at the latest. Two README sentences were corrected: the mock's OpenAI-path overload message ends "(mock).";
// a `$VAR` apiKey's refusal wording.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { parseConfig, ConfigError } from '../src/config/load.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { useGatewayProcesses, waitReady } from './helpers/gateway-process.ts';
import { freePort } from './helpers/free-port.ts';
import { mockControl } from './helpers/mock-control.ts';
import { sdkError, expectOpenAIError } from './helpers/openai-error.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';
import { cc, delta, failsThen, json, type Script } from './helpers/scripted-provider.ts';
import { RETRY_LOOP_ONLY, TEST_KEY, configServedBy, defaultConfig, metricSum, useExtraMocks, useStacks } from './helpers/stack.ts';

const start = useScriptedUpstreams();
const startStack = useStacks();
const startFake = useFakeProviders();
const startMock = useExtraMocks();
const startProcess = useGatewayProcesses();

const msgs = [{ role: 'user' as const, content: 'hi' }];
const ask = { model: 'claude-sonnet-4-6', max_tokens: 256, messages: msgs };
const anthropicClient = (url: string, apiKey = 'client-key') => new Anthropic({ baseURL: url, apiKey, maxRetries: 0, logLevel: 'off' });

/** An Anthropic SSE event as Anthropic frames it. */
const aev = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
const messageStart = (usage: Record<string, unknown> = { input_tokens: 12, output_tokens: 1 }) =>
  aev('message_start', { message: { id: 'msg_01', type: 'message', role: 'assistant', model: 'claude-sonnet-4-6', content: [], stop_reason: null, stop_sequence: null, usage } });
const textBlock = (text: string) => [
  aev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
  aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text } }),
  aev('content_block_stop', { index: 0 }),
];
const finish = (usage: Record<string, unknown>) => [aev('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage }), aev('message_stop', {})];
/** An error as a proxy in front of Anthropic may write it: data alone, no `event:` line, no `"type"`. */
const bareError = (type: string, message: string) => `data: ${JSON.stringify({ error: { type, message } })}\n\n`;
const anthropicError = (type: string, message: string) => ({ type: 'error', error: { type, message } });

async function rejection(p: Promise<unknown>): Promise<unknown> {
  return p.then(() => undefined, (e: unknown) => e);
}

describe('Anthropic: an error object answered with a 200 (README "A 2xx that is not the answer")', () => {
  it('on /v1/messages, rate_limit_error is the 429 it stands for: retried, then the SDK raises a RateLimitError with the body as it came', async () => {
    const body = anthropicError('rate_limit_error', 'Number of request tokens has exceeded your per-minute rate limit');
    const { s, seen } = await start({ a: { answer: () => json(200, body), family: 'anthropic' } }, [{ provider: 'a' }], { path: '/v1/messages' });
    const err = await rejection(anthropicClient(s.url).messages.create(ask));
    expect(err).toBeInstanceOf(Anthropic.RateLimitError);
    expect((err as InstanceType<typeof Anthropic.APIError>).status).toBe(429);
    expect((err as InstanceType<typeof Anthropic.APIError>).error).toMatchObject(body);
    expect(seen.a).toHaveLength(2); // retried as a 429 would be (FAST: two attempts)
  });

  it('on a chat completion translated for Anthropic, invalid_request_error is the client\'s 400: not retried, not a 502', async () => {
    const body = anthropicError('invalid_request_error', 'messages: text content blocks must be non-empty');
    const { client, seen } = await start({ a: { answer: () => json(200, body), family: 'anthropic' } }, [{ provider: 'a', model: 'claude-sonnet-4-6' }]);
    const err = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages: msgs }));
    expect(err.status).toBe(400);
    expect(err.message).toContain('text content blocks must be non-empty');
    expect(seen.a).toHaveLength(1);
  });
});

describe('Anthropic: an error sent as data alone, with no event line and no type (README "Anthropic clients")', () => {
  it('on /v1/messages before the first output, rate_limit_error is a 429: retried, then the SDK raises a RateLimitError', async () => {
    const { s, seen } = await start(
      { a: { answer: () => ({ steps: [messageStart(), bareError('rate_limit_error', 'Rate limited')], hold: true }), family: 'anthropic' } },
      [{ provider: 'a' }],
      { path: '/v1/messages', provider: { timeouts: { connectMs: 1_000, firstTokenMs: 30_000, idleMs: 30_000 } } },
    );
    const t0 = Date.now();
    const err = await rejection(
      anthropicClient(s.url).messages.create({ ...ask, stream: true }).then(async (st) => {
        for await (const _ of st) void _;
      }),
    );
    expect(err).toBeInstanceOf(Anthropic.RateLimitError);
    expect(seen.a).toHaveLength(2);
    expect(Date.now() - t0).toBeLessThan(10_000); // not held until the first-token timeout (30 s)
  });

  it('on a chat completion translated for Anthropic before the first output, api_error is a 500: retried, then raised as one', async () => {
    const { client, seen } = await start(
      { a: { answer: () => ({ steps: [messageStart(), bareError('api_error', 'Internal server error')], hold: true }), family: 'anthropic' } },
      [{ provider: 'a', model: 'claude-sonnet-4-6' }],
      { provider: { timeouts: { connectMs: 1_000, firstTokenMs: 30_000, idleMs: 30_000 } } },
    );
    const t0 = Date.now();
    const err = await sdkError(
      client.chat.completions.create({ model: 'gpt-4o', messages: msgs, stream: true }).then(async (st) => {
        for await (const _ of st) void _;
      }),
    );
    expect(err.status).toBe(500);
    expect(seen.a).toHaveLength(2);
    expect(Date.now() - t0).toBeLessThan(10_000);
  });
});

describe('Anthropic: the ids and the gateway\'s own errors on /v1/messages (README "Anthropic clients", "What the client sees")', () => {
  it('a deadline is the OpenAI shape with Anthropic\'s added (timeout_error, deadline_exceeded) and the gateway\'s id as request-id and x-request-id', async () => {
    const { s } = await start({ a: { answer: () => ({ steps: [], hold: true }), family: 'anthropic' } }, [{ provider: 'a' }], {
      path: '/v1/messages',
      route: { timeoutMs: 1_500, retry: { maxAttempts: 1 } },
    });
    const err = await rejection(anthropicClient(s.url).messages.create(ask));
    expect(err).toBeInstanceOf(Anthropic.APIError);
    const e = err as InstanceType<typeof Anthropic.APIError>;
    expect(e.status).toBe(504);
    expect(e.error).toMatchObject({ type: 'error', error: { type: 'timeout_error', param: null, code: 'deadline_exceeded' } });
    const id = e.headers?.get('x-stormgate-request-id');
    expect(id).toBeTruthy();
    expect(e.headers?.get('request-id')).toBe(id);
    expect(e.requestID).toBe(id);
    expect(e.headers?.get('x-should-retry')).toBe('false');
  });

  it('an answer passes Anthropic\'s request-id on also as x-request-id', async () => {
    const body = { id: 'msg_01', type: 'message', role: 'assistant', model: 'claude-sonnet-4-6', content: [{ type: 'text', text: 'Hello' }], stop_reason: 'end_turn', stop_sequence: null, usage: { input_tokens: 3, output_tokens: 1 } };
    const { s } = await start({ a: { answer: () => json(200, body, { 'request-id': 'req_011CAnthropic48' }), family: 'anthropic' } }, [{ provider: 'a' }], { path: '/v1/messages' });
    const { data, response } = await anthropicClient(s.url).messages.create(ask).withResponse();
    expect(data.content).toEqual(body.content);
    expect(response.headers.get('request-id')).toBe('req_011CAnthropic48');
    expect(response.headers.get('x-request-id')).toBe('req_011CAnthropic48');
  });
});

describe('Anthropic: message_delta counts are cumulative (README "usage (only as the upstream reported it")', () => {
  it('on /v1/messages an input_tokens: 0 in message_delta does not lower the prompt count message_start gave; the client gets the events as they came', async () => {
    const steps = [messageStart({ input_tokens: 30, output_tokens: 1 }), ...textBlock('Hello'), ...finish({ input_tokens: 0, output_tokens: 7 })];
    const { s } = await start({ a: { answer: () => ({ steps }), family: 'anthropic' } }, [{ provider: 'a' }], { path: '/v1/messages' });
    const final = await anthropicClient(s.url).messages.stream(ask).finalMessage();
    expect(final.content.map((b) => (b.type === 'text' ? b.text : b.type))).toEqual(['Hello']);
    // The SDK takes message_delta's counts as they came (passed on untouched) ...
    expect(final.usage.output_tokens).toBe(7);
    // ... and the gateway bills the prompt as message_start said it.
    expect(await metricSum(s, 'stormgate_tokens_total{route="chat",target="a/claude-sonnet-4-6",kind="prompt"}')).toBe(30);
    expect(await metricSum(s, 'stormgate_tokens_total{route="chat",target="a/claude-sonnet-4-6",kind="completion"}')).toBe(7);
  });
});

describe('a stream that finishes without [DONE] (README Streaming)', () => {
  /** An upstream that sends one finished chunk, then (with `pingEveryMs`) pings for ever, or stays silent and open. */
  async function finishedThen(pingEveryMs: number | undefined) {
    return startFake((req, res) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(cc([delta({ role: 'assistant', content: 'done' }, 'stop')]));
      if (pingEveryMs === undefined) return;
      const timer = setInterval(() => res.write(': ping\n\n'), pingEveryMs);
      res.on('close', () => clearInterval(timer));
    });
  }

  /** Streams with the SDK; the ms from the chunk with the finish to the stream's end, and the text. */
  async function afterFinishMs(baseURL: string, extra: Record<string, unknown> = {}): Promise<{ ms: number; text: string; chunks: number }> {
    const client = new OpenAI({ baseURL, apiKey: 'client-key', maxRetries: 0 });
    const st = await client.chat.completions.create({ model: 'gpt-4o', messages: msgs, stream: true, ...extra });
    let finishedAt = 0;
    let text = '';
    let chunks = 0;
    for await (const c of st) {
      chunks++;
      text += c.choices[0]?.delta.content ?? '';
      if (c.choices[0]?.finish_reason) finishedAt = Date.now();
    }
    return { ms: Date.now() - finishedAt, text, chunks };
  }

  async function gateway(origin: string, idleMs: number) {
    return startStack({
      config: (mockUrl) => {
        const c = configServedBy(mockUrl, 'p', `${origin}/v1`);
        return { ...c, providers: { ...c.providers, p: { ...c.providers['p']!, timeouts: { idleMs } } } };
      },
    });
  }

  it('gets [DONE] after a second of quiet once every choice has finished: the SDK\'s loop ends cleanly', async () => {
    const p = await finishedThen(undefined);
    const s = await gateway(p.origin, 20_000);
    const { ms, text } = await afterFinishMs(s.baseURL);
    expect(text).toBe('done');
    expect(ms).toBeGreaterThanOrEqual(800);
    expect(ms).toBeLessThan(5_000); // a second, not idleMs (20 s)
  });

  it('pings after the finish put the end off, but never past idleMs from the finish', async () => {
    const p = await finishedThen(100);
    const s = await gateway(p.origin, 2_000);
    const { ms, text } = await afterFinishMs(s.baseURL);
    expect(text).toBe('done');
    expect(ms).toBeGreaterThanOrEqual(1_900); // the pings did put the second off
    expect(ms).toBeLessThan(2_000 + 900); // but an upstream that pings for ever still ends, idleMs after the finish (was 3.0 s)
  });

  it('a usage chunk asked for (include_usage) and never sent is waited for up to idleMs after the finish, then the stream ends whole', async () => {
    const p = await finishedThen(undefined);
    const s = await gateway(p.origin, 2_000);
    const { ms, text } = await afterFinishMs(s.baseURL, { stream_options: { include_usage: true } });
    expect(text).toBe('done');
    expect(ms).toBeGreaterThanOrEqual(1_900);
    expect(ms).toBeLessThan(2_000 + 1_000 + 1_500);
  });

  it('a usage chunk asked for and never sent, with pings after the finish, ends idleMs after the finish all the same', async () => {
    const p = await finishedThen(100);
    const s = await gateway(p.origin, 2_000);
    const { ms, text } = await afterFinishMs(s.baseURL, { stream_options: { include_usage: true } });
    expect(text).toBe('done');
    expect(ms).toBeGreaterThanOrEqual(1_900);
    expect(ms).toBeLessThan(2_000 + 900); // was twice idleMs (4.0 s)
  });
});

describe('OpenRouter\'s in-band 429 (README Streaming)', () => {
  /** OpenRouter's error once its stream has begun: a 200, a role chunk, then the error with the status as its code. */
  const inBand429 = (): Script => ({
    steps: [cc([delta({ role: 'assistant', content: '' })]), `data: ${JSON.stringify({ error: { code: 429, message: 'Rate limit exceeded: free-models-per-min.' } })}\n\n`],
  });

  it('is retried as a rate limit and, when retries are over, the client\'s 429 with the provider\'s message; the breaker never counts it', async () => {
    const { client, seen } = await start({ a: failsThen(6, inBand429) }, [{ provider: 'a' }], {
      providers: { a: { breaker: { consecutiveFailures: 2, minRequests: 2, windowS: 10, failureRate: 0.5 } } },
    });
    for (let i = 0; i < 3; i++) {
      const err = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages: msgs, stream: true }).then(async (st) => {
        for await (const _ of st) void _;
      }));
      expect(err.status).toBe(429);
      expect(err.type).toBe('rate_limit_error');
      expect(err.message).toContain('Rate limit exceeded: free-models-per-min.');
    }
    expect(seen.a).toHaveLength(6); // two attempts each: retried, not refused by an open breaker
    // Six failures in a row would have opened a breaker that counted them: the next request still reaches the provider.
    const ok = await client.chat.completions.create({ model: 'gpt-4o', messages: msgs });
    expect(ok.choices[0]!.message.content).toBe('recovered');
  });
});

describe('a provider key echoed in an escaped form (README Errors)', () => {
  // A key holding `/`, `+`, `<` and `=`: base64 keys and keys of any printable ASCII.
  const KEY = 'sk-au48/Zm9v+YmFy<key=0123';
  const goEscaped = JSON.stringify(KEY).slice(1, -1).replace(/[<>&]/g, (c) => `\\u00${c.charCodeAt(0).toString(16)}`).replaceAll('/', '\\/');

  function gatewayFor(origin: string, extra: Record<string, unknown> = {}) {
    return startStack({
      config: (mockUrl) => {
        const c = configServedBy(mockUrl, 'p', `${origin}/v1`);
        return { ...c, providers: { ...c.providers, p: { ...c.providers['p']!, apiKey: KEY } }, ...extra };
      },
    });
  }

  it('is [redacted] in a whole error quoting it JSON-escaped (\\/, \\u003c) and in a request id quoting it URL-encoded', async () => {
    const p = await startFake((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(400, { 'content-type': 'application/json', 'x-request-id': `req_${encodeURIComponent(KEY)}` });
        res.end(`{"error":{"message":"Invalid key ${goEscaped} for this model","type":"invalid_request_error","param":null,"code":null}}`);
      });
    });
    const s = await gatewayFor(p.origin);
    const res = await fetch(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages: msgs }) });
    expect(res.status).toBe(400);
    const text = await res.text();
    const e = (JSON.parse(text) as { error: { message: string } }).error;
    expect(e.message).toBe('Invalid key [redacted] for this model');
    expect(res.headers.get('x-request-id')).toBe('req_[redacted]');
    for (const form of [KEY, goEscaped, encodeURIComponent(KEY), 'Zm9v+YmFy']) expect(text).not.toContain(form);
  });

  it('is [redacted] in a stream\'s error event quoting it JSON-escaped, after the first output', async () => {
    const p = await startFake((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(cc([delta({ role: 'assistant', content: 'Hel' })]));
        res.end(`data: {"error":{"message":"upstream auth failed for ${goEscaped}","type":"server_error","param":null,"code":null}}\n\n`);
      });
    });
    const s = await gatewayFor(p.origin);
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    let text = '';
    const err = await sdkError((async () => {
      const st = await client.chat.completions.create({ model: 'gpt-4o', messages: msgs, stream: true });
      for await (const c of st) text += c.choices[0]?.delta.content ?? '';
    })());
    expect(text).toBe('Hel');
    expect(err.message).toContain('[redacted]');
    expect(err.message).not.toContain('Zm9v');
  });

  it('is [redacted] in a passthrough error the provider gzipped, quoting it with PHP\'s escaped slashes', async () => {
    const p = await startFake((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(404, { 'content-type': 'application/json', 'content-encoding': 'gzip' });
        res.end(gzipSync(`{"error":{"message":"key ${JSON.stringify(KEY).slice(1, -1).replaceAll('/', '\\/')} not found"}}`));
      });
    });
    const s = await gatewayFor(p.origin, { passthrough: { provider: 'p', paths: ['/v1/files'] } });
    const res = await fetch(`${s.url}/v1/files/file-abc`, { headers: { 'accept-encoding': 'gzip' } });
    expect(res.status).toBe(404);
    const text = await res.text(); // fetch decodes what the gateway sent
    expect(text).toContain('[redacted]');
    expect(text).not.toContain('Zm9v');
  });
});

describe('config errors (README Configuration reference)', () => {
  const env = { OPENAI_API_KEY: 'sk-audit48-secret-0123456789' };
  const base = (provider = '    apiKey: ${OPENAI_API_KEY}\n', route = '') => `providers:
  openai:
    family: openai
    baseUrl: https://api.openai.com/v1
${provider}routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: openai } ]
${route}`;
  function refusal(text: string, e: NodeJS.ProcessEnv = env): string {
    try {
      parseConfig(text, 'gw.yaml', e);
    } catch (err) {
      expect(err).toBeInstanceOf(ConfigError);
      return (err as Error).message;
    }
    throw new Error('the config loaded');
  }

  it('points a route\'s maxAttempts to retry.maxAttempts, in the README\'s words', () => {
    expect(refusal(base(undefined, '    maxAttempts: 3\n'))).toContain('routes[0]: unknown key "maxAttempts"; did you mean retry.maxAttempts?');
  });

  it('suggests the closest key of the same level for a typo: providers.openai "timeoutz" is "timeouts"', () => {
    expect(refusal(base('    apiKey: ${OPENAI_API_KEY}\n    timeoutz: { connectMs: 1000 }\n'))).toContain('providers.openai: unknown key "timeoutz"; did you mean "timeouts"?');
  });

  it('refuses a second YAML document at its --- line', () => {
    const text = `${base()}---\nserver: { port: 8080 }\n`;
    const message = refusal(text);
    const line = text.split('\n').indexOf('---') + 1;
    expect(message).toContain(`gw.yaml:${line}`);
    expect(message).toContain('more than one YAML document');
  });

  it('refuses an apiKey written as $VAR (text, not a reference) and says to write ${VAR}; $VAR elsewhere stays text', () => {
    expect(refusal(base('    apiKey: $OPENAI_API_KEY\n'))).toContain('write ${OPENAI_API_KEY}');
    const loaded = parseConfig(base().replace('{ provider: openai }', '{ provider: openai, model: $MODEL }'), 'gw.yaml', env);
    expect(loaded.routes[0]!.targets[0]!.model).toBe('$MODEL');
  });

  it('refuses an apiKey that starts with "Bearer " without repeating the key', () => {
    const message = refusal(base('    apiKey: "Bearer ${OPENAI_API_KEY}"\n'));
    expect(message).toContain('starts with "Bearer "');
    expect(message).not.toContain(env.OPENAI_API_KEY);
  });

  it('names an optional provider\'s unset variable and how to read it with a default; set empty, the provider is disabled', () => {
    const optional = base('    apiKey: ${OPENAI_API_KEY}\n  azure:\n    family: openai\n    baseUrl: https://example.invalid/v1\n    optional: true\n    apiKey: ${AZURE_OPENAI_KEY}\n');
    expect(refusal(optional)).toContain('"${AZURE_OPENAI_KEY:-}"');
    expect(() => parseConfig(optional, 'gw.yaml', { ...env, AZURE_OPENAI_KEY: '' })).not.toThrow();
    expect(() => parseConfig(optional.replace('${AZURE_OPENAI_KEY}', '"${AZURE_OPENAI_KEY:-}"'), 'gw.yaml', env)).not.toThrow();
  });

  it('does not repeat a number from the environment in its error', () => {
    const message = refusal(`server:\n  port: \${PORT}\n${base()}`, { ...env, PORT: '99999' });
    expect(message).toContain('server.port');
    expect(message).not.toContain('99999');
    expect(message).toContain('$PORT');
  });

  it('exits with code 2 under "stormgate: invalid config" from npx tsx src/main.ts, naming file, line and the fix', async () => {
    const g = startProcess('bearer', base('    apiKey: "Bearer ${OPENAI_API_KEY}"\n'), env);
    expect(await g.exited).toBe(2);
    const out = g.output();
    expect(out).toContain('stormgate: invalid config');
    expect(out).toMatch(/bearer\.yaml:5/);
    expect(out).toContain('starts with "Bearer "');
    expect(out).not.toContain(env.OPENAI_API_KEY);
  });
});

describe('an optional provider without a key, started with npx tsx src/main.ts (README "Failover and API families")', () => {
  it('is disabled: said once at start-up, skipped as a target, the route served by the next', async () => {
    const mock = await startMock({ apiKey: TEST_KEY });
    const port = await freePort();
    const yaml = `server: { host: 127.0.0.1, port: ${port} }
providers:
  azure:
    family: openai
    baseUrl: http://127.0.0.1:9/v1
    optional: true
    apiKey: "\${AZURE_OPENAI_KEY:-}"
  mock:
    family: openai
    baseUrl: ${mock.url}/v1
    apiKey: ${TEST_KEY}
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: azure }, { provider: mock } ]
`;
    const g = startProcess('optional', yaml, { AZURE_OPENAI_KEY: undefined });
    await waitReady(g, port);
    const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'client-key', maxRetries: 0 });
    for (let i = 0; i < 2; i++) {
      const { data, response } = await client.chat.completions.create({ model: 'gpt-4o', messages: msgs }).withResponse();
      expect(data.choices[0]!.message.content).toBeTruthy();
      expect(response.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
    }
    expect(g.output().match(/provider azure is optional and has no key/g)).toHaveLength(1);
    g.proc.kill('SIGINT'); // closes at once (no preStopMs), exit 0
    expect(await g.exited).toBe(0);
  });
});

describe('the ops paths (README Errors, method_not_allowed)', () => {
  it('a wrong method on /healthz, /readyz or /metrics is 405 method_not_allowed with allow: GET, HEAD; HEAD is served', async () => {
    const s = await startStack(RETRY_LOOP_ONLY);
    for (const path of ['/healthz', '/readyz', '/metrics']) {
      for (const method of ['POST', 'PUT', 'DELETE']) {
        const res = await fetch(`${s.url}${path}`, { method });
        expect(res.status, `${method} ${path}`).toBe(405);
        expect(res.headers.get('allow'), `${method} ${path}`).toBe('GET, HEAD');
        expectOpenAIError(await res.json(), 'method_not_allowed');
      }
      const head = await fetch(`${s.url}${path}`, { method: 'HEAD' });
      expect(head.status, `HEAD ${path}`).toBe(200);
    }
  });
});

describe('health and readiness (README "Health, readiness, shutdown")', () => {
  it('/healthz is 200 and /readyz 200 naming the state store and whether it is degraded', async () => {
    const s = await startStack(RETRY_LOOP_ONLY);
    expect((await fetch(`${s.url}/healthz`)).status).toBe(200);
    const ready = await fetch(`${s.url}/readyz`);
    expect(ready.status).toBe(200);
    expect(await ready.json()).toEqual({ status: 'ready', store: 'memory', degraded: false });
  });
});

describe('the Host header on a loopback address (README Client keys)', () => {
  async function withHost(url: string, host: string): Promise<Response> {
    // fetch will not set Host; node:http does.
    const { request } = await import('node:http');
    return new Promise((resolve, reject) => {
      const req = request(`${url}/v1/models`, { headers: { host } }, (res) => {
        let body = '';
        res.on('data', (d: Buffer) => (body += d.toString()));
        res.on('end', () => resolve(new Response(body, { status: res.statusCode })));
      });
      req.on('error', reject);
      req.end();
    });
  }

  it('answers its local names (IP literals, localhost, *.localhost, names without a dot) and refuses a DNS name with 403 host_not_allowed', async () => {
    const s = await startStack(RETRY_LOOP_ONLY);
    const port = new URL(s.url).port;
    for (const host of [`127.0.0.1:${port}`, `localhost:${port}`, `app.localhost:${port}`, 'gateway', `[::1]:${port}`]) {
      const res = await withHost(s.url, host);
      expect(res.status, host).toBe(200);
      await res.arrayBuffer();
    }
    const evil = await withHost(s.url, `rebind.attacker.example:${port}`);
    expect(evil.status).toBe(403);
    expectOpenAIError(await evil.json(), 'host_not_allowed');
  });

  it('answers a name listed in server.allowedHosts', async () => {
    const s = await startStack({
      config: (mockUrl) => {
        const c = defaultConfig(mockUrl, RETRY_LOOP_ONLY);
        return { ...c, server: { ...c.server, allowedHosts: ['gw.internal.example'] } };
      },
    });
    const res = await withHost(s.url, 'gw.internal.example');
    expect(res.status).toBe(200);
    await res.arrayBuffer();
  });
});

describe('client keys (README Client keys)', () => {
  const CLIENT_KEY = 'client-secret-audit48-0123';
  it('reads x-api-key and api-key, also beside a Basic authorization; without a key the SDK gets 401 invalid_api_key and does not retry', async () => {
    const s = await startStack({
      config: (mockUrl) => ({ ...defaultConfig(mockUrl, RETRY_LOOP_ONLY), auth: { keys: { agents: CLIENT_KEY } } }),
    });
    const chat = (headers: Record<string, string>) =>
      fetch(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify({ model: 'gpt-4o', messages: msgs }) });
    const keyed: Array<Record<string, string>> = [{ 'x-api-key': CLIENT_KEY, authorization: 'Basic cHJveHk6cGFzcw==' }, { 'api-key': CLIENT_KEY, authorization: 'Basic cHJveHk6cGFzcw==' }, { authorization: `Bearer ${CLIENT_KEY}` }];
    for (const headers of keyed) {
      const res = await chat(headers);
      expect(res.status, Object.keys(headers).join()).toBe(200);
      await res.arrayBuffer();
    }
    let requests = 0;
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-wrong-guess-audit48', fetch: (u, i) => (requests++, fetch(u, i)) });
    const err = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages: msgs }));
    expect(err).toBeInstanceOf(OpenAI.AuthenticationError);
    expect(err.code).toBe('invalid_api_key');
    expect(requests).toBe(1);
    // The ops paths need no key.
    expect((await fetch(`${s.url}/healthz`)).status).toBe(200);
  });
});

describe('the mock provider (README "The mock provider")', () => {
  it('fails exactly 3 of every 10 requests at --error 503:0.3', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 503, rate: 0.3 }] } });
    const statuses: number[] = [];
    for (let i = 0; i < 20; i++) {
      const res = await fetch(`${mock.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages: msgs }) });
      statuses.push(res.status);
      await res.arrayBuffer();
    }
    expect(statuses.slice(0, 10).filter((x) => x === 503)).toHaveLength(3);
    expect(statuses.slice(10).filter((x) => x === 503)).toHaveLength(3);
  });

  it('answers a brownout with its mode and duration (503 for 10000 ms by default), and its end with the mode that ran', async () => {
    const mock = await startMock();
    expect(await mockControl(mock, 'POST', 'brownout', {})).toEqual({ ok: true, mode: '503', durationMs: 10_000 });
    expect(await mockControl(mock, 'POST', 'brownout', { mode: '429', durationMs: 15_000 })).toEqual({ ok: true, mode: '429', durationMs: 15_000 });
    const limited = await fetch(`${mock.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages: msgs }) });
    expect(limited.status).toBe(429);
    expect(Number(limited.headers.get('retry-after'))).toBeGreaterThanOrEqual(14);
    await limited.arrayBuffer();
    expect(await mockControl(mock, 'POST', 'brownout', { durationMs: 0 })).toEqual({ ok: true, ended: '429', durationMs: 0 });
    expect(await mockControl(mock, 'POST', 'brownout', { durationMs: 0 })).toEqual({ ok: true, ended: null, durationMs: 0 });
  });

  it('a 529 brownout is Anthropic\'s overloaded_error on /v1/messages and OpenAI\'s documented 503 overload on its paths', async () => {
    const mock = await startMock();
    await mockControl(mock, 'POST', 'brownout', { mode: '529', durationMs: 15_000 });
    const openai = await fetch(`${mock.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages: msgs }) });
    expect(openai.status).toBe(503);
    const e = ((await openai.json()) as { error: { type: string; message: string } }).error;
    expect(e.type).toBe('server_error');
    expect(e.message).toBe('The engine is currently overloaded, please try again later (mock).');
    const messages = await fetch(`${mock.url}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01' }, body: JSON.stringify(ask) });
    expect(messages.status).toBe(529);
    expect(((await messages.json()) as { error: { type: string } }).error.type).toBe('overloaded_error');
  });

  it('refuses a fault spec with a status outside 400-599 or a misspelt field, with 400, leaving the spec as it was', async () => {
    const mock = await startMock({ faults: { latencyMs: 5 } });
    const before = await mockControl(mock, 'GET', 'faults');
    const put = (body: unknown) => fetch(`${mock.url}/_mock/faults`, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    const bad = await put({ errors: [{ status: 600 }] });
    expect(bad.status).toBe(400);
    await bad.arrayBuffer();
    const typo = await put({ erors: [{ status: 503 }] });
    expect(typo.status).toBe(400);
    expect(((await typo.json()) as { error: string }).error).toContain('did you mean "errors"');
    expect(await mockControl(mock, 'GET', 'faults')).toEqual(before);
  });

  it('errorAfterChunks on /v1/messages ends with Anthropic\'s event: error, which the Anthropic SDK raises through the gateway', async () => {
    const s = await startStack({
      faults: { stream: { errorAfterChunks: 2 } },
      config: (mockUrl) => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: { claude: { family: 'anthropic', baseUrl: mockUrl, apiKey: TEST_KEY, breaker: false } },
        routes: [{ name: 'msgs', match: { path: '/v1/messages' }, targets: [{ provider: 'claude' }], park: false }],
      }),
    });
    let text = '';
    const err = await rejection(
      (async () => {
        const st = await anthropicClient(s.url).messages.create({ ...ask, stream: true });
        for await (const ev of st) if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
      })(),
    );
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(String((err as Error).message)).toContain('Overloaded');
    expect(text.length).toBeGreaterThan(0);
  });
});
