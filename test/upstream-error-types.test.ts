// An upstream error whose `code` (or `param`) is not a string: some OpenAI-compatible servers send `"code": 400` or
// `"code": 1234`. The client still gets the OpenAI shape's types (code and param a string or null), and the
// classification still reads the error: the name beside a numeric code, or the code's digits.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import { normaliseUpstreamErrorBody, stringOrNull } from '../src/errors.ts';
import { errorEventForClient, upstreamErrorOf } from '../src/streaming/stream-events.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { expectOpenAIError } from './helpers/openai-error.ts';
import { useScriptedGateway } from './helpers/scripted-provider.ts';
import { defaultConfig, RETRY_LOOP_ONLY, requestLine, useStacks, type Stack } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();
const scriptedGateway = useScriptedGateway((c) => {
  for (const r of c.routes as Array<Record<string, unknown>>) r.retry = { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } };
});
const messages = [{ role: 'user' as const, content: 'hi' }];
const json = (v: unknown) => Buffer.from(JSON.stringify(v));

/** A gateway whose chat route goes to one provider that answers every request with `status` and `body` as JSON. */
async function gatewayAnswering(status: number, body: unknown): Promise<{ s: Stack; hits: () => number }> {
  const p = await startProvider((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify(body));
    });
  });
  const s = await startStack({
    config: (url): ConfigInput => {
      const base = defaultConfig(url, { ...RETRY_LOOP_ONLY, route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } } });
      return {
        ...base,
        providers: { ...base.providers, p: { family: 'openai', baseUrl: `${p.origin}/v1`, apiKey: 'typed-provider-key', breaker: false } },
        routes: base.routes.map((r) => ({ ...r, targets: [{ provider: 'p' }] })),
      };
    },
  });
  return { s, hits: p.hits };
}

async function chat(s: Stack): Promise<{ status: number; body: unknown }> {
  const res = await fetch(`${s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', messages }),
  });
  return { status: res.status, body: await res.json() };
}

describe('an upstream error\'s code and param, in the OpenAI shape\'s types', () => {
  it('gives a numeric code and param as their digits, and anything else that is not a string as null', () => {
    expect(stringOrNull('invalid_value')).toBe('invalid_value');
    expect(stringOrNull(400)).toBe('400');
    expect(stringOrNull(1234)).toBe('1234');
    for (const v of [null, undefined, true, {}, ['messages', 0], Number.NaN]) expect(stringOrNull(v)).toBeNull();
  });

  it('normalises an error body with a numeric code and a list for param, keeping its own fields', () => {
    const e = normaliseUpstreamErrorBody(400, json({ error: { message: 'bad', type: 'invalid_request_error', param: ['messages', 0], code: 1234, innererror: { code: 'x' } } }));
    expect(e).toEqual({ error: { message: 'bad', type: 'invalid_request_error', param: null, code: '1234', innererror: { code: 'x' } } });
    expect(normaliseUpstreamErrorBody(400, json({ error: { message: 'bad', code: 400, param: 7 } })).error).toMatchObject({ code: '400', param: '7', type: 'invalid_request_error' });
    expect(normaliseUpstreamErrorBody(500, json({ error: { message: 'bad', code: { nested: true } } })).error).toMatchObject({ code: null, param: null, type: 'server_error' });
  });

  it('reads a stream error event\'s numeric code as its digits', () => {
    expect(upstreamErrorOf({ raw: '', event: null, data: JSON.stringify({ error: { message: 'boom', code: 500, param: 3 } }) })).toEqual({ message: 'boom', code: '500', type: undefined, param: '3' });
  });
});

describe('an error event after the first output', () => {
  it('goes on with a numeric code and param as strings, its event name and other fields kept', () => {
    const data = JSON.stringify({ error: { message: 'boom', type: 'server_error', code: 500, param: 7, extra: 1 } });
    expect(errorEventForClient('chat', { raw: `event: error\ndata: ${data}`, event: 'error', data })).toBe(
      `event: error\ndata: ${JSON.stringify({ error: { message: 'boom', type: 'server_error', code: '500', param: '7', extra: 1 } })}\n\n`,
    );
  });

  it('is given the OpenAI shape when its error is a bare string, so the SDK raises it with a code and type', async () => {
    const data = JSON.stringify({ error: 'model crashed' });
    expect(errorEventForClient('chat', { raw: `data: ${data}`, event: null, data })).toBe(
      `data: ${JSON.stringify({ error: { message: 'the upstream stream failed: model crashed', type: 'server_error', param: null, code: 'upstream_error' } })}\n\n`,
    );
    const { client } = await scriptedGateway(() => ({ steps: ['data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}\n\n', `data: ${data}\n\n`] }));
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    const err = (await (async () => {
      for await (const _ of stream) void _;
    })().catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.code).toBe('upstream_error');
    expect(err.type).toBe('server_error');
    expect(err.message).toBe('the upstream stream failed: model crashed');
  });

  it('goes on byte for byte when its code and param are already a string or null', () => {
    const data = JSON.stringify({ error: { message: 'boom', type: 'server_error', code: 'server_error', param: null } });
    expect(errorEventForClient('chat', { raw: `data: ${data}`, event: null, data })).toBe(`data: ${data}\n\n`);
  });
});

describe('an upstream error with a numeric code, over HTTP', () => {
  it('passes the client\'s own mistake on with its code as a string the SDK exposes', async () => {
    const { s, hits } = await gatewayAnswering(400, { error: { message: 'Unknown parameter', type: 'invalid_request_error', param: null, code: 1234 } });
    const { status, body } = await chat(s);
    expect(status).toBe(400);
    expect(expectOpenAIError(body, '1234').message).toBe('Unknown parameter');
    expect(hits()).toBe(1);
    const sdk = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    const err = await sdk.chat.completions.create({ model: 'gpt-4o', messages }).catch((e: unknown) => e);
    expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('1234');
  });

  it('passes a 5xx on after its retries with its code as a string', async () => {
    const { s, hits } = await gatewayAnswering(503, { error: { message: 'busy', type: 'server_error', code: 503 } });
    const { status, body } = await chat(s);
    expect(status).toBe(503);
    expectOpenAIError(body, '503', 'server_error');
    expect(hits()).toBe(3);
  });

  it('classifies by the name beside a numeric code: a 429 for an account without quota takes the credentials path', async () => {
    const { s, hits } = await gatewayAnswering(429, { error: { message: 'You exceeded your current quota', type: 'insufficient_quota', param: null, code: 429 } });
    const { status, body } = await chat(s);
    expect(status).toBe(502);
    expectOpenAIError(body, 'upstream_auth_error', 'server_error');
    expect(hits()).toBe(1);
    expect((await requestLine(s)).attempts.map((a: { reason: string }) => a.reason)).toEqual(['insufficient_quota']);
  });

  it('names a stream error event\'s numeric code in the 502 for a stream that failed before its output', async () => {
    const { client } = await scriptedGateway(() => ({ steps: ['data: {"error":{"message":"boom","type":"server_error","code":500}}\n\n'] }));
    const err = await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }).catch((e: unknown) => e);
    expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(502);
    expect((err as InstanceType<typeof OpenAI.APIError>).message).toContain('error event before any output: 500');
  });
});

describe('an HTML page an upstream (a load balancer, a proxy) answered with', () => {
  const nginx = '<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n';
  it('is wrapped by its title, never its markup', () => {
    expect(normaliseUpstreamErrorBody(502, Buffer.from(nginx)).error.message).toBe('upstream answered 502: 502 Bad Gateway');
    const cloudflare = `<!DOCTYPE html>\n<!--[if lt IE 7]> <html class="no-js ie6 oldie" lang="en-US"> <![endif]-->\n<html><head><title>api.example.com | 502: Bad gateway</title><style>body{color:red}</style></head><body>${'x'.repeat(3000)}</body></html>`;
    expect(normaliseUpstreamErrorBody(502, Buffer.from(cloudflare)).error.message).toBe('upstream answered 502: api.example.com | 502: Bad gateway');
  });

  it('without a title, by its text: scripts and styles dropped, entities read, at most 200 characters', () => {
    const page = '<html><head><style>h1 { color: red }</style><script>var a = "<b>";</script></head><body><h1>Service&nbsp;Unavailable</h1><p>Back &amp; running soon.</p></body></html>';
    expect(normaliseUpstreamErrorBody(503, Buffer.from(page)).error.message).toBe('upstream answered 503: Service Unavailable Back & running soon.');
    const long = `<html><body><p>${'word '.repeat(200)}</p></body></html>`;
    const message = normaliseUpstreamErrorBody(503, Buffer.from(long)).error.message;
    expect(message).not.toContain('<');
    expect(message.length).toBeLessThanOrEqual('upstream answered 503: '.length + 200);
  });

  it('leaves a body that is no page as it was: its first 200 characters, spaces collapsed', () => {
    expect(normaliseUpstreamErrorBody(500, Buffer.from('Internal   Server\nError <b>not a page</b>')).error.message).toBe('upstream answered 500: Internal Server Error <b>not a page</b>');
  });
});
