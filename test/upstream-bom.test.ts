// A UTF-8 byte order mark before an upstream's JSON (some servers in front of a model write one: .NET, PowerShell, a
// proxy that re-encodes). JSON.parse refuses it, the gateway's and an SDK's alike: the gateway reads the JSON past it,
// for the answer's shape check, the error's code and its OpenAI-shaped copy, and passes the answer on without it.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import { normaliseUpstreamErrorBody } from '../src/errors.ts';
import { bomLength, withoutBom } from '../src/http/byte-order-mark.ts';
import { jsonEnd, notAnAnswer } from '../src/providers/answer-shape.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { expectOpenAIError } from './helpers/openai-error.ts';
import { defaultConfig, RETRY_LOOP_ONLY, requestLine, useStacks, type Stack } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();

const BOM = Buffer.from([0xef, 0xbb, 0xbf]);
const bom = (json: unknown): Buffer => Buffer.concat([BOM, Buffer.from(JSON.stringify(json))]);
const messages = [{ role: 'user' as const, content: 'hi' }];

const COMPLETION = {
  id: 'chatcmpl-bom',
  object: 'chat.completion',
  created: 1741290958,
  model: 'gpt-4o',
  choices: [{ index: 0, message: { role: 'assistant', content: 'past the mark' }, finish_reason: 'stop' }],
  usage: { prompt_tokens: 1, completion_tokens: 3, total_tokens: 4 },
};

/**
 * A gateway whose chat route goes to one provider (`family`) that answers every request with `status` and `body`;
 * `framed: false` ends the body with the connection (no content-length, not chunked).
 */
async function gatewayAnswering(status: number, body: Buffer, opts: { family?: 'openai' | 'anthropic'; framed?: boolean; contentType?: string } = {}): Promise<{ s: Stack; hits: () => number }> {
  const p = await startProvider((req, res) => {
    req.resume();
    req.on('end', () => {
      const headers: Record<string, string> = { 'content-type': opts.contentType ?? 'application/json' };
      if (opts.framed === false) {
        // HTTP/1.0-style: the body ends when the connection does.
        res.useChunkedEncodingByDefault = false;
        res.shouldKeepAlive = false;
      } else headers['content-length'] = String(body.length);
      res.writeHead(status, headers);
      res.end(body);
    });
  });
  const s = await startStack({
    config: (url): ConfigInput => {
      const base = defaultConfig(url, { ...RETRY_LOOP_ONLY, route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } } });
      const family = opts.family ?? 'openai';
      return {
        ...base,
        providers: { ...base.providers, p: { family, baseUrl: family === 'openai' ? `${p.origin}/v1` : p.origin, apiKey: 'bom-provider-key', breaker: false } },
        routes: base.routes.map((r) => (r.name === 'chat' ? { ...r, targets: [{ provider: 'p', ...(family === 'anthropic' && { model: 'claude-sonnet-4-6' }) }] } : r)),
      };
    },
  });
  return { s, hits: p.hits };
}

async function chatBytes(s: Stack): Promise<{ status: number; bytes: Buffer }> {
  const res = await fetch(`${s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', messages }),
  });
  return { status: res.status, bytes: Buffer.from(await res.arrayBuffer()) };
}

describe('a byte order mark, read past where the gateway reads JSON', () => {
  it('is found in three bytes, and dropped as a view of the same memory', () => {
    const body = bom({ a: 1 });
    expect(bomLength(body)).toBe(3);
    expect(bomLength(Buffer.from('{}'))).toBe(0);
    expect(bomLength(Buffer.from([0xef, 0xbb]))).toBe(0);
    const rest = withoutBom(body);
    expect(rest.toString()).toBe('{"a":1}');
    expect(rest.buffer).toBe(body.buffer);
    const none = Buffer.from('{}');
    expect(withoutBom(none)).toBe(none);
  });

  it('does not make an answer look like no answer, with whitespace after it or not', () => {
    const ctx = { api: 'chat' as const, stream: false, contentType: 'application/json', ownFamily: true };
    expect(notAnAnswer(ctx, bom(COMPLETION))).toBeUndefined();
    expect(notAnAnswer(ctx, Buffer.concat([BOM, Buffer.from(` \n${JSON.stringify(COMPLETION)}\n`)]))).toBeUndefined();
    // ... nor hide a cut one, or an empty one.
    const whole = bom(COMPLETION);
    expect(notAnAnswer(ctx, whole.subarray(0, whole.length - 40))).toMatchObject({ ran: true });
    expect(notAnAnswer(ctx, BOM)).toEqual({ detail: 'the upstream answered with an empty body', ran: false });
    const body = bom({ a: [1, { b: '}' }] });
    expect(jsonEnd(body, 3, body.length - 1)).toBe(body.length - 1);
  });

  it('does not hide an upstream error\'s message, code and type behind "upstream answered 400"', () => {
    const e = normaliseUpstreamErrorBody(400, bom({ error: { message: 'Invalid value for temperature', type: 'invalid_request_error', param: 'temperature', code: 'invalid_value' } }));
    expect(e).toEqual({ error: { message: 'Invalid value for temperature', type: 'invalid_request_error', param: 'temperature', code: 'invalid_value' } });
    // A text body is quoted without it.
    expect(normaliseUpstreamErrorBody(502, Buffer.concat([BOM, Buffer.from('Bad Gateway')])).error.message).toBe('upstream answered 502: Bad Gateway');
  });
});

describe('a byte order mark over HTTP', () => {
  it('passes a whole answer on without it, on the first attempt, so the SDK can parse it', async () => {
    const { s, hits } = await gatewayAnswering(200, bom(COMPLETION));
    const { status, bytes } = await chatBytes(s);
    expect(status).toBe(200);
    expect(bytes[0]).toBe(0x7b);
    expect(JSON.parse(bytes.toString())).toEqual(COMPLETION);
    expect(hits()).toBe(1);
    const sdk = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    expect((await sdk.chat.completions.create({ model: 'gpt-4o', messages })).choices[0]!.message.content).toBe('past the mark');
  });

  it('passes on an answer whose length only the connection\'s end tells, scanned whole past the mark', async () => {
    const { s } = await gatewayAnswering(200, bom(COMPLETION), { framed: false });
    const { status, bytes } = await chatBytes(s);
    expect(status).toBe(200);
    expect(JSON.parse(bytes.toString())).toEqual(COMPLETION);
  });

  it('reads an error\'s code past it: a 429 for an account without quota takes the credentials path, not the rate limit\'s', async () => {
    const { s, hits } = await gatewayAnswering(429, bom({ error: { message: 'You exceeded your current quota', type: 'insufficient_quota', param: null, code: 'insufficient_quota' } }));
    const { status, bytes } = await chatBytes(s);
    expect(status).toBe(502);
    expectOpenAIError(JSON.parse(bytes.toString()), 'upstream_auth_error', 'server_error');
    expect(hits()).toBe(1);
    expect((await requestLine(s)).attempts.map((a: { reason: string }) => a.reason)).toEqual(['insufficient_quota']);
  });

  it('passes the client\'s own mistake on with the upstream\'s message and code, without the mark', async () => {
    const { s } = await gatewayAnswering(400, bom({ error: { message: 'Invalid value for temperature', type: 'invalid_request_error', param: 'temperature', code: 'invalid_value' } }));
    const { status, bytes } = await chatBytes(s);
    expect(status).toBe(400);
    expect(bytes[0]).toBe(0x7b);
    const e = expectOpenAIError(JSON.parse(bytes.toString()), 'invalid_value');
    expect(e).toMatchObject({ message: 'Invalid value for temperature', param: 'temperature' });
  });

  it('translates an Anthropic answer that has one', async () => {
    const message = {
      id: 'msg_bom',
      type: 'message',
      role: 'assistant',
      model: 'claude-sonnet-4-6',
      content: [{ type: 'text', text: 'past the mark' }],
      stop_reason: 'end_turn',
      stop_sequence: null,
      usage: { input_tokens: 1, output_tokens: 3 },
    };
    const { s, hits } = await gatewayAnswering(200, bom(message), { family: 'anthropic' });
    const sdk = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    expect((await sdk.chat.completions.create({ model: 'gpt-4o', messages })).choices[0]!.message.content).toBe('past the mark');
    expect(hits()).toBe(1);
  });
});
