// A provider, or a proxy in front of it, that compresses its answers although the gateway never asked: the gateway
// decodes them, so the answer is judged and passed on as the JSON or SSE it is, not retried as "not JSON".
import { brotliCompressSync, gzipSync } from 'node:zlib';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { useFakeProviders, type FakeProvider } from './helpers/fake-provider.ts';
import { configServedBy, useStacks } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();

const completion = { id: 'chatcmpl-1', object: 'chat.completion', created: 1, model: 'gpt-4o', choices: [{ index: 0, message: { role: 'assistant', content: 'Hello' }, finish_reason: 'stop' }] };
const chunk = (content: string | null, finish: string | null) =>
  `data: ${JSON.stringify({ id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta: content === null ? {} : { content }, finish_reason: finish }] })}\n\n`;

function compressingProvider(): Promise<FakeProvider> {
  return startProvider((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString()));
    req.on('end', () => {
      const json = JSON.parse(body) as { stream?: boolean; model: string };
      if (json.model === 'corrupt-stream') {
        res.writeHead(200, { 'content-type': 'text/event-stream', 'content-encoding': 'gzip' });
        res.end(Buffer.from('this is not gzip either'));
      } else if (json.model === 'odd-encoding') {
        // A name the gateway does not decode (and one that is a property of every JS object): passed as it is.
        res.writeHead(200, { 'content-type': 'text/event-stream', 'content-encoding': 'constructor' });
        res.end(chunk('Hi', null) + chunk(null, 'stop') + 'data: [DONE]\n\n');
      } else if (json.model === 'corrupt') {
        res.writeHead(200, { 'content-type': 'application/json', 'content-encoding': 'gzip' });
        res.end(Buffer.from('this is not gzip'));
      } else if (json.model === 'quota') {
        res.writeHead(429, { 'content-type': 'application/json', 'content-encoding': 'gzip' });
        res.end(gzipSync(JSON.stringify({ error: { message: 'You exceeded your current quota', type: 'insufficient_quota', code: 'insufficient_quota', param: null } })));
      } else if (json.stream) {
        res.writeHead(200, { 'content-type': 'text/event-stream', 'content-encoding': 'br' });
        res.end(brotliCompressSync(chunk('Hel', null) + chunk('lo', null) + chunk(null, 'stop') + 'data: [DONE]\n\n'));
      } else {
        res.writeHead(200, { 'content-type': 'application/json', 'content-encoding': 'gzip' });
        res.end(gzipSync(JSON.stringify(completion)));
      }
    });
  });
}

describe('compressed answers', () => {
  it('decodes a gzip answer, a brotli stream and a gzip error, each from one upstream request', async () => {
    const p = await compressingProvider();
    const s = await startStack({ config: (mockUrl) => configServedBy(mockUrl, 'zipped', `${p.origin}/v1`) });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    const whole = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    expect(whole.choices[0]!.message.content).toBe('Hello');
    expect(p.hits()).toBe(1);
    let text = '';
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    for await (const c of stream) text += c.choices[0]?.delta?.content ?? '';
    expect(text).toBe('Hello');
    expect(p.hits()).toBe(2);
    // Read for its code: insufficient_quota is the gateway's billing problem, not a rate limit to retry.
    await expect(client.chat.completions.create({ model: 'quota', messages: [{ role: 'user', content: 'hi' }] })).rejects.toMatchObject({
      status: 502,
      code: 'upstream_auth_error',
    });
    expect(p.hits()).toBe(3);
    await expect(client.chat.completions.create({ model: 'corrupt-stream', messages: [{ role: 'user', content: 'hi' }], stream: true })).rejects.toMatchObject({
      status: 502,
      code: 'upstream_bad_response',
    });
    let odd = '';
    for await (const c of await client.chat.completions.create({ model: 'odd-encoding', messages: [{ role: 'user', content: 'hi' }], stream: true })) odd += c.choices[0]?.delta?.content ?? '';
    expect(odd).toBe('Hi');
    // Not gzip at all: a failed attempt (retried like any unusable answer), never a crash or a garbled answer.
    await expect(client.chat.completions.create({ model: 'corrupt', messages: [{ role: 'user', content: 'hi' }] })).rejects.toMatchObject({
      status: 502,
      code: 'upstream_bad_response',
    });
  });
});

describe('a compressed error cut on the wire', () => {
  // The status and headers say what it is (attempt.ts keeps what came of it), and what came is gzip: the client's
  // message is the text it decodes to, as a stream request's is, not the compressed bytes read as UTF-8.
  it.each([false, true])('is passed on with the text that decodes, not its raw bytes (stream: %s)', async (stream) => {
    const error = { error: { message: `temperature is not supported with this model; ${'see the documentation '.repeat(20)}`, type: 'invalid_request_error', code: 'unsupported_parameter', param: 'temperature' } };
    const zipped = gzipSync(JSON.stringify(error));
    const p = await startProvider((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(400, { 'content-type': 'application/json', 'content-encoding': 'gzip', 'content-length': String(zipped.length) });
        res.write(zipped.subarray(0, zipped.length - 20));
        setTimeout(() => res.socket?.destroy(), 20);
      });
    });
    const s = await startStack({ config: (mockUrl) => configServedBy(mockUrl, 'zipped', `${p.origin}/v1`) });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    const err = (await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.status).toBe(400);
    expect(err.message).toContain('temperature is not supported with this model');
    expect(err.message).not.toContain('\u001f');
    expect(p.hits()).toBe(1);
  });
});
