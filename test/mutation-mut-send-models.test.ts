// Mutation testing of src/http/send-answer.ts, src/http/models-routes.ts (with the Anthropic shape of
// src/routing/models-list.ts), src/config/ca-file.ts and src/config/schema-walk.ts: 79 hand mutants, 48 killed by the
// suite, 18 by the tests here, 9 equivalent, 4 left (the error code of the log line only: a body over the error cap, a
// BOM'd upstream error passed on byte for byte, an infinite numeric code, the 128-character cut). Each test names the
// behaviour its mutant would have broken. No bug found.
// Equivalent: unwrap's pipe and lazy cases (the one pipe wraps a literal; no lazy), mapValueKind's unwrap of the value
// (no map's value is wrapped), Object.hasOwn in childSchema (a path holds only keys the schema took), the order of an
// error's own headers and the retry headers (none overlap), a stream head's status (streams answer 200), the piped path
// for every stream and writeOpening before pipe (the same bytes a tick later), clearHeaders' raw-header loop (nothing
// sets a raw header before an answer).
import { once } from 'node:events';
import { writeFileSync } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { connect } from 'node:net';
import { Readable } from 'node:stream';
import Anthropic from '@anthropic-ai/sdk';
import Fastify from 'fastify';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfigFile } from '../src/config/load.ts';
import { sendAnswer } from '../src/http/send-answer.ts';
import type { PipelineAnswer } from '../src/pipeline/handle-request.ts';
import { configErrorOf, validConfigText } from './helpers/config-text.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { TEST_KEY, useStacks, type Stack } from './helpers/stack.ts';
import { makeTestCerts, type TestCerts } from './helpers/tls-certs.ts';

const startStack = useStacks();
const fakeProvider = useFakeProviders();

const env = { OPENAI_API_KEY: 'sk-test' };
const lines = (text: string) => configErrorOf(text, env).message.split('\n');
/** The valid text with `extra` under the openai provider, after its apiKey (line 6 on). */
const withProvider = (extra: string) => validConfigText().replace('    apiKey: ${OPENAI_API_KEY}\n', () => `    apiKey: \${OPENAI_API_KEY}\n${extra}`);

describe('the key meant by an unknown key, inside a union and a defaulted map', () => {
  it('is guessed among the keys of the object option of a union (breaker: false or an object)', () => {
    expect(lines(withProvider('    breaker: { opens: 5 }\n'))).toEqual(['gw.yaml:6: providers.openai.breaker: unknown key "opens"; did you mean "openS"?']);
  });

  it("is guessed in a per-model breaker override, a defaulted map inside the union's object", () => {
    expect(lines(withProvider('    breaker: { models: { gpt-4o: { opens: 5 } } }\n'))).toEqual([
      'gw.yaml:6: providers.openai.breaker.models.gpt-4o: unknown key "opens"; did you mean "openS"?',
    ]);
  });
});

describe('a tls.caFile that cannot be used, at start-up', () => {
  let certs: TestCerts;
  beforeAll(() => {
    certs = makeTestCerts();
  });
  afterAll(() => certs.remove());
  const configWith = (caFile: string) => {
    const file = `${certs.dir}/gateway.yaml`;
    writeFileSync(
      file,
      `providers:\n  vllm: { family: openai, baseUrl: "https://127.0.0.1:8000/v1", apiKey: none, tls: { caFile: "${caFile}" } }\n` +
        'routes:\n  - { name: chat, match: { path: /v1/chat/completions }, targets: [{ provider: vllm }] }\n',
    );
    return () => loadConfigFile(file, {});
  };

  it('says a file of a private key only (the key given for the CA) holds no certificate, not that one does not parse', () => {
    writeFileSync(`${certs.dir}/server.key.pem`, certs.key);
    expect(configWith(`${certs.dir}/server.key.pem`)).toThrow(`providers.vllm.tls.caFile: ${certs.dir}/server.key.pem holds no PEM certificate (-----BEGIN CERTIFICATE-----)`);
  });

  it("names OpenSSL's code for a certificate that does not parse", () => {
    writeFileSync(`${certs.dir}/cut.pem`, certs.ca.slice(0, 120) + '\n-----END CERTIFICATE-----\n');
    expect(configWith(`${certs.dir}/cut.pem`)).toThrow(/providers\.vllm\.tls\.caFile: .*cut\.pem holds a certificate that does not parse \(ERR_OSSL_[A-Z0-9_]+\)$/);
  });

  it('takes a PEM file that holds the key before the certificate', () => {
    writeFileSync(`${certs.dir}/key-then-cert.pem`, certs.key + certs.ca);
    expect(configWith(`${certs.dir}/key-then-cert.pem`)().providers.vllm!.tls!.caFile).toBe(`${certs.dir}/key-then-cert.pem`);
  });
});

/** A provider that answers GET <path> with `body`, and 404 to any other request (so a wrong listing path lists nothing). */
const listing =
  (path: string, body: unknown, wantHeader?: string) =>
  (req: IncomingMessage, res: ServerResponse): void => {
    const ok = req.method === 'GET' && req.url === path && (wantHeader === undefined || req.headers[wantHeader] !== undefined);
    res.writeHead(ok ? 200 : 404, { 'content-type': 'application/json' }).end(JSON.stringify(ok ? body : { error: { message: 'no' } }));
  };

/**
 * An Anthropic provider listing two Claude models (one without a display_name), its baseUrl ending in /v1 as often
 * written; an OpenAI-compatible server listing one model with a field of its own; /v1/messages takes `claude-*` from the
 * first, chat `gpt-*` from the second.
 */
async function listingStack(): Promise<Stack> {
  const claude = await fakeProvider(
    listing(
      '/v1/models',
      {
        data: [
          { type: 'model', id: 'claude-x-1', display_name: 'Claude X', created_at: '2025-02-19T00:00:00Z' },
          { type: 'model', id: 'claude-y-2', created_at: '2024-10-22T00:00:00Z' },
        ],
        has_more: false,
        first_id: 'claude-x-1',
        last_id: 'claude-y-2',
      },
      'anthropic-version',
    ),
  );
  const vllm = await fakeProvider(listing('/v1/models', { object: 'list', data: [{ id: 'gpt-x', object: 'model', created: 1_700_000_000, owned_by: 'acme', max_model_len: 131072 }] }));
  return startStack({
    config: () => ({
      server: { host: '127.0.0.1', port: 0 },
      providers: {
        claude: { family: 'anthropic', baseUrl: `${claude.origin}/v1`, apiKey: TEST_KEY, breaker: false },
        vllm: { family: 'openai', baseUrl: `${vllm.origin}/v1`, apiKey: TEST_KEY, breaker: false },
      },
      routes: [
        { name: 'messages', match: { path: '/v1/messages', models: ['claude-*'] }, targets: [{ provider: 'claude' }] },
        { name: 'chat', match: { path: '/v1/chat/completions', models: ['gpt-*'] }, targets: [{ provider: 'vllm' }] },
      ],
    }),
  });
}

describe("GET /v1/models in both APIs' shapes", () => {
  it("lists to the Anthropic SDK each model as Anthropic describes it, on one page it does not page past", async () => {
    const s = await listingStack();
    const client = new Anthropic({ baseURL: s.url, apiKey: 'unused', maxRetries: 0 });
    const page = await client.models.list();
    expect(page.data).toEqual([
      expect.objectContaining({ type: 'model', id: 'claude-x-1', display_name: 'Claude X', created_at: '2025-02-19T00:00:00Z' }),
      expect.objectContaining({ type: 'model', id: 'claude-y-2', display_name: 'claude-y-2', created_at: '2024-10-22T00:00:00Z' }),
    ]);
    expect(page).toMatchObject({ has_more: false, first_id: 'claude-x-1', last_id: 'claude-y-2' });
    const all: string[] = [];
    for await (const m of client.models.list()) all.push(m.id);
    expect(all).toEqual(['claude-x-1', 'claude-y-2']);
  });

  it('retrieves a model with the Anthropic SDK in its shape, and not one only the chat route serves', async () => {
    const s = await listingStack();
    const client = new Anthropic({ baseURL: s.url, apiKey: 'unused', maxRetries: 0 });
    expect(await client.models.retrieve('claude-y-2')).toMatchObject({ type: 'model', id: 'claude-y-2', display_name: 'claude-y-2', created_at: '2024-10-22T00:00:00Z' });
    const missing = await client.models.retrieve('gpt-x').then(() => undefined, (e: unknown) => e);
    expect(missing).toBeInstanceOf(Anthropic.NotFoundError);
  });

  it("lists to the OpenAI SDK each model in OpenAI's shape, a provider's own fields, created and owned_by kept", async () => {
    const s = await listingStack();
    const models = (await new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 }).models.list()).data;
    expect(models).toEqual([
      { id: 'claude-x-1', object: 'model', created: 1739923200, owned_by: 'claude', type: 'model', display_name: 'Claude X', created_at: '2025-02-19T00:00:00Z' },
      { id: 'claude-y-2', object: 'model', created: 1729555200, owned_by: 'claude', type: 'model', created_at: '2024-10-22T00:00:00Z' },
      { id: 'gpt-x', object: 'model', created: 1_700_000_000, owned_by: 'acme', max_model_len: 131072 },
    ]);
  });

  it("answers a model it does not list 404 model_not_found naming the `model` param, the id cut short and made printable", async () => {
    const s = await listingStack();
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 });
    const err = (await client.models.retrieve(`gpt-\u0007${'z'.repeat(1000)}`).then(() => undefined, (e: unknown) => e)) as InstanceType<typeof OpenAI.NotFoundError>;
    expect(err).toBeInstanceOf(OpenAI.NotFoundError);
    expect(err.error).toMatchObject({ code: 'model_not_found', param: 'model', type: 'invalid_request_error' });
    const message = (err.error as { message: string }).message;
    expect(message).toContain('`gpt-?zzz');
    expect(message.length).toBeLessThan(400);
  });

  it('answers another method on the listing and on a model 405 with Allow: GET, HEAD, in the shape the client reads', async () => {
    const s = await listingStack();
    for (const path of ['/v1/models', '/v1/models/gpt-x']) {
      const plain = await fetch(`${s.url}${path}`, { method: 'POST' });
      expect(plain.status).toBe(405);
      expect(plain.headers.get('allow')).toBe('GET, HEAD');
      expect(((await plain.json()) as { error: { code: string } }).error.code).toBe('method_not_allowed');
      const anthropic = await fetch(`${s.url}${path}`, { method: 'DELETE', headers: { 'anthropic-version': '2023-06-01' } });
      expect(anthropic.status).toBe(405);
      expect(await anthropic.json()).toMatchObject({ type: 'error', error: { type: 'invalid_request_error', code: 'method_not_allowed' } });
    }
  });
});

describe('a stream answer whose client left before it was sent', () => {
  it('destroys the body at once (its close aborts the upstream), though the response closed before the listener was there', async () => {
    const app = Fastify();
    let body: Readable | undefined;
    app.post('/s', async (request, reply) => {
      // The client is gone by the time the pipeline has its answer: the response's 'close' has fired.
      if (!reply.raw.destroyed) await once(reply.raw, 'close');
      body = new Readable({ read() {} });
      body.push('data: {"choices":[]}\n\n');
      return sendAnswer(reply, { status: 200, headers: { 'content-type': 'text/event-stream' }, body, summary: {} as PipelineAnswer['summary'] });
    });
    const origin = await app.listen({ host: '127.0.0.1', port: 0 });
    try {
      const socket = connect(Number(new URL(origin).port), '127.0.0.1');
      await once(socket, 'connect');
      socket.end('POST /s HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}');
      socket.destroy();
      await expect.poll(() => body?.destroyed, { timeout: 5_000 }).toBe(true);
    } finally {
      await app.close();
    }
  });
});

describe("a stream's head", () => {
  it('carries the headers set before the answer (x-stormgate-request-id) beside its own (x-stormgate-target, content-type)', async () => {
    const s = await startStack();
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 });
    const { data: stream, response } = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true }).withResponse();
    for await (const chunk of stream) void chunk;
    expect(response.headers.get('x-stormgate-request-id')).toMatch(/\S/);
    expect(response.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
    expect(response.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
  });
});

describe('a whole answer on a path of another API', () => {
  it("reaches the client with the provider's content-type and bytes (speech as audio/mpeg, not JSON)", async () => {
    const audio = Buffer.from([0xff, 0xf3, 0x44, 0xc4, 0x00, 0x01, 0x02, 0x03]);
    const p = await fakeProvider((req, res) => {
      req.resume();
      req.on('end', () => res.writeHead(200, { 'content-type': 'audio/mpeg' }).end(audio));
    });
    const s = await startStack({
      config: () => ({
        server: { host: '127.0.0.1', port: 0 },
        providers: { tts: { family: 'openai', baseUrl: `${p.origin}/v1`, apiKey: TEST_KEY, breaker: false } },
        routes: [{ name: 'speech', match: { path: '/v1/audio/speech' }, targets: [{ provider: 'tts' }] }],
      }),
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 });
    const speech = await client.audio.speech.create({ model: 'tts-1', input: 'hi', voice: 'alloy' });
    expect(speech.headers.get('content-type')).toBe('audio/mpeg');
    expect(Buffer.from(await speech.arrayBuffer())).toEqual(audio);
  });
});

describe("a provider's 400 passed on", () => {
  it("carries the gateway's request id when the provider sent none, and its code is in the log line", async () => {
    const p = await fakeProvider((req, res) => {
      req.resume();
      req.on('end', () =>
        res
          .writeHead(400, { 'content-type': 'application/json' })
          .end(JSON.stringify({ error: { message: 'too long', type: 'invalid_request_error', param: 'messages', code: 'context_length_exceeded' } })),
      );
    });
    const s = await startStack({
      config: () => ({
        server: { host: '127.0.0.1', port: 0 },
        providers: { vllm: { family: 'openai', baseUrl: `${p.origin}/v1`, apiKey: TEST_KEY, breaker: false } },
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'vllm' }] }],
      }),
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 });
    const err = (await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }] }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect(err.code).toBe('context_length_exceeded');
    expect(err.requestID).toBeTruthy();
    expect(err.requestID).toBe(err.headers?.get('x-stormgate-request-id'));
    await expect.poll(() => s.logs.find((l) => l.includes('"errorCode"'))).toContain('"errorCode":"context_length_exceeded"');
  });
});

describe("an Anthropic-compatible provider's error on /v1/messages", () => {
  it("gives the Anthropic SDK the provider's x-request-id as its request id when the provider sent no request-id", async () => {
    const p = await fakeProvider((req, res) => {
      req.resume();
      req.on('end', () =>
        res
          .writeHead(400, { 'content-type': 'application/json', 'x-request-id': 'up-req-400' })
          .end(JSON.stringify({ type: 'error', error: { type: 'invalid_request_error', message: 'max_tokens: too large' } })),
      );
    });
    const s = await startStack({
      config: () => ({
        server: { host: '127.0.0.1', port: 0 },
        providers: { claude: { family: 'anthropic', baseUrl: p.origin, apiKey: TEST_KEY, breaker: false } },
        routes: [{ name: 'messages', match: { path: '/v1/messages' }, targets: [{ provider: 'claude' }] }],
      }),
    });
    const client = new Anthropic({ baseURL: s.url, apiKey: 'unused', maxRetries: 0 });
    const err = (await client.messages.create({ model: 'claude-x', max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] }).catch((e: unknown) => e)) as InstanceType<typeof Anthropic.APIError>;
    expect(err).toBeInstanceOf(Anthropic.BadRequestError);
    expect(err.error).toMatchObject({ type: 'error', error: { type: 'invalid_request_error', message: 'max_tokens: too large' } });
    expect(err.requestID).toBe('up-req-400');
  });
});

describe('an error on an OpenAI route', () => {
  it('stays in the OpenAI shape for a client that also sends anthropic-version (only the listing reads that header)', async () => {
    const s = await startStack();
    const res = await fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01' }, body: '{"model":' });
    expect(res.status).toBe(400);
    const body = (await res.json()) as Record<string, unknown>;
    expect(body.type).toBeUndefined();
    expect(body.error).toMatchObject({ type: 'invalid_request_error', code: 'invalid_json' });
    expect(res.headers.get('request-id')).toBeNull();
  });
});
