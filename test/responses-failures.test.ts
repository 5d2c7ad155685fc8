// The Responses API's own ways of failing outside a stream's events, and its conversations under failover: a whole
// Response whose status is failed (the non-stream form of response.failed), and a conversation named by the
// Conversations API (`conversation`) rather than by previous_response_id.
import { request as httpRequest } from 'node:http';
import { describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { baseResponse, fastRetries, msgItem, responsesHead, responsesTail, scripted, textDelta, useScriptedGateway, type Script, type Seen } from './helpers/scripted-provider.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { configServedBy, useStacks } from './helpers/stack.ts';

const gw = useScriptedGateway(fastRetries);
const startProvider = useFakeProviders();
const startStack = useStacks();

const json = (body: unknown): Script => ({ headers: { 'content-type': 'application/json' }, steps: [JSON.stringify(body)] });
const failed = (code: string, message = 'The model failed') => json({ ...baseResponse('failed'), error: { code, message } });
const completed = () => json(baseResponse('completed', [msgItem('Hello')], { input_tokens: 1, output_tokens: 1, total_tokens: 2 }));
const down: Script = { status: 503, headers: { 'content-type': 'application/json' }, steps: ['{"error":{"message":"down","type":"server_error","param":null,"code":null}}'] };

/** Every route served by provider a, then b, two attempts each; `extra` adds to the config (a passthrough, say). */
async function aThenB(a: { origin: string }, b: { origin: string }, extra: Record<string, unknown> = {}): Promise<OpenAI> {
  const s = await startStack({
    config: (mockUrl) => {
      const c = configServedBy(mockUrl, 'a', `${a.origin}/v1`);
      c.providers.b = { family: 'openai', baseUrl: `${b.origin}/v1`, apiKey: 'b-key', breaker: false };
      for (const r of c.routes as Array<Record<string, unknown>>) {
        r.targets = [{ provider: 'a' }, { provider: 'b' }];
        r.retry = { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 10 } };
      }
      return { ...c, ...extra };
    },
  });
  return new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
}

describe('a whole Response whose status is failed', () => {
  it('is retried like a stream\'s response.failed before output, and the client gets the retry\'s answer', async () => {
    const { client, seen } = await gw((_b, n) => (n === 1 ? failed('server_error') : completed()));
    const r = await client.responses.create({ model: 'gpt-4.1', input: 'hi' });
    expect(r.status).toBe('completed');
    expect(seen.length).toBe(2);
    expect(seen[1]!.headers['x-retry-reason']).toBe('bad_stream');
  });

  it('ends as 502 upstream_bad_response naming its code when every attempt failed, never as a 200 with an empty output', async () => {
    const { client, seen } = await gw(() => failed('server_error'));
    const err = await client.responses.create({ model: 'gpt-4.1', input: 'hi' }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(502);
    expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('upstream_bad_response');
    expect((err as Error).message).toContain('the response failed: server_error');
    expect((err as InstanceType<typeof OpenAI.APIError>).headers?.get('x-should-retry')).toBe('false');
    expect(seen.length).toBe(3);
  });

  it('whose code says the request is at fault (invalid_prompt) is the upstream\'s 400 at once, not retried', async () => {
    const { client, seen } = await gw(() => failed('invalid_prompt', 'Invalid prompt: flagged'));
    const err = await client.responses.create({ model: 'gpt-4.1', input: 'hi' }).catch((e: unknown) => e);
    expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(400);
    expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('invalid_prompt');
    expect((err as Error).message).toContain('Invalid prompt: flagged');
    expect(seen.length).toBe(1);
  });

  it('is told apart from a completed Response with a failed tool call item, which is an answer', async () => {
    const search = { id: 'ws_1', type: 'web_search_call', status: 'failed', action: { type: 'search', query: 'x' } };
    const { client, seen } = await gw(() => json(baseResponse('completed', [search, msgItem('Hello')], { input_tokens: 1, output_tokens: 1, total_tokens: 2 })));
    const r = await client.responses.create({ model: 'gpt-4.1', input: 'hi' });
    expect(r.status).toBe('completed');
    expect(r.output_text).toBe('Hello');
    expect(seen.length).toBe(1);
  });
});

describe('a Responses conversation under failover', () => {
  const full = (): string[] => [...responsesHead(), textDelta('Hel', 4), textDelta('lo', 5), ...responsesTail('Hello', 6)];

  it('stays on the first target when named by `conversation` (an id or {id}), as with previous_response_id; a new one fails over', async () => {
    const seenA: Seen[] = [];
    const seenB: Seen[] = [];
    const a = await startProvider(scripted(() => down, seenA));
    const b = await startProvider(scripted(() => ({ steps: full() }), seenB));
    const client = await aThenB(a, b);

    const fresh = await client.responses.stream({ model: 'gpt-4.1', input: 'hi' }).finalResponse();
    expect(fresh.status).toBe('completed');
    expect(seenB.length).toBe(1);

    for (const conversation of ['conv_1', { id: 'conv_1' }]) {
      seenA.length = 0;
      seenB.length = 0;
      const err = await client.responses.stream({ model: 'gpt-4.1', input: 'and then?', conversation }).finalResponse().catch((e: unknown) => e);
      expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(503);
      expect(seenA.length).toBe(2);
      expect(seenB.length).toBe(0);
    }
  });
});

describe('a background Response under failover', () => {
  it('stays on the first target, which stores it and serves its retrieve and cancel, rather than being created at a fallback', async () => {
    const seenA: Seen[] = [];
    const seenB: Seen[] = [];
    let aDown = true;
    const queued = (id: string) => ({ headers: { 'content-type': 'application/json' }, steps: [JSON.stringify({ ...baseResponse('queued'), id, background: true })] });
    const a = await startProvider(scripted(() => (aDown ? down : queued('resp_a')), seenA));
    const b = await startProvider(scripted(() => queued('resp_b'), seenB));
    // The stored response's calls go to the first target, as the README says to set it up.
    const client = await aThenB(a, b, { passthrough: { provider: 'a', paths: ['/v1/responses/'], methods: ['GET', 'POST', 'DELETE'] } });

    // resp_b would have been queued at b, where the client's retrieve and cancel (sent to a) never find it.
    const err = await client.responses.create({ model: 'gpt-4.1', input: 'hi', background: true }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(503);
    expect(seenA.length).toBe(2);
    expect(seenB.length).toBe(0);

    aDown = false;
    const r = await client.responses.create({ model: 'gpt-4.1', input: 'hi', background: true });
    expect(r.id).toBe('resp_a');
    expect(seenB.length).toBe(0);
  });
});

describe('a Responses conversation too long for its model', () => {
  it('moves to the contextWindowFallback only when that is at the provider holding the conversation', async () => {
    const seenA: Seen[] = [];
    const seenB: Seen[] = [];
    const tooLong = { status: 400, headers: { 'content-type': 'application/json' }, steps: ['{"error":{"message":"too long","type":"invalid_request_error","param":"input","code":"context_length_exceeded"}}'] };
    const full = (): string[] => [...responsesHead(), textDelta('Hel', 4), textDelta('lo', 5), ...responsesTail('Hello', 6)];
    const a = await startProvider(scripted((body) => (body.model === 'big' ? { steps: full() } : tooLong), seenA));
    const b = await startProvider(scripted(() => ({ steps: full() }), seenB));
    const withFallback = (provider: 'a' | 'b') =>
      startStack({
        config: (mockUrl) => {
          const c = configServedBy(mockUrl, 'a', `${a.origin}/v1`);
          c.providers.b = { family: 'openai', baseUrl: `${b.origin}/v1`, apiKey: 'b-key', breaker: false };
          for (const r of c.routes as Array<Record<string, unknown>>) if (r.name === 'responses') r.contextWindowFallback = { provider, model: 'big' };
          return c;
        },
      });

    // Elsewhere: the fallback does not hold the conversation, so the client gets the upstream's 400.
    let s = await withFallback('b');
    let client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    const err = await client.responses.stream({ model: 'gpt-4.1', input: 'more', previous_response_id: 'resp_1' }).finalResponse().catch((e: unknown) => e);
    expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(400);
    expect(seenB.length).toBe(0);
    // A new conversation may go there.
    expect((await client.responses.stream({ model: 'gpt-4.1', input: 'hi' }).finalResponse()).status).toBe('completed');
    expect(seenB.length).toBe(1);
    await s.close();

    // At the same provider: the larger model answers the conversation.
    seenA.length = 0;
    s = await withFallback('a');
    client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    expect((await client.responses.stream({ model: 'gpt-4.1', input: 'more', conversation: 'conv_1' }).finalResponse()).status).toBe('completed');
    expect(seenA.map((x) => x.body.model)).toEqual(['gpt-4.1', 'big']);
  });
});

describe('stored-response calls through passthrough', () => {
  it('retrieve, cancel, delete and inputItems.list reach the provider; a create spelled POST /v1/responses/ does not bypass the route', async () => {
    const seen: string[] = [];
    const p = await startProvider((req, res) => {
      req.resume();
      req.on('end', () => {
        seen.push(`${req.method} ${req.url}`);
        const url = req.url ?? '';
        const body = url.includes('input_items')
          ? { object: 'list', data: [], first_id: null, last_id: null, has_more: false }
          : req.method === 'DELETE'
            ? { id: 'resp_1', object: 'response', deleted: true }
            : baseResponse(url.endsWith('/cancel') ? 'cancelled' : 'completed', [msgItem('Hello')]);
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify(body));
      });
    });
    const s = await startStack({
      config: (mockUrl) => ({ ...configServedBy(mockUrl, 'p', `${p.origin}/v1`), passthrough: { provider: 'p', paths: ['/v1/responses/'], methods: ['GET', 'POST', 'DELETE'] } }),
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    expect((await client.responses.retrieve('resp_1')).status).toBe('completed');
    expect((await client.responses.cancel('resp_1')).status).toBe('cancelled');
    expect((await client.responses.delete('resp_1')) as unknown).toMatchObject({ deleted: true });
    expect((await client.responses.inputItems.list('resp_1')).data).toEqual([]);
    expect(seen).toEqual(['GET /v1/responses/resp_1', 'POST /v1/responses/resp_1/cancel', 'DELETE /v1/responses/resp_1', 'GET /v1/responses/resp_1/input_items']);

    for (const path of ['/v1/responses/', '/v1/responses//', '/v1/responses/%2F']) {
      const r = await fetch(`${s.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4.1', input: 'hi' }) });
      expect(r.status).toBe(404);
      expect(((await r.json()) as { error: { code: string } }).error.code).toBe('unknown_url');
    }
    expect(seen.length).toBe(4);
  });

  it('a create spelled with a dot segment (POST /v1/responses/., /v1/responses/%2e) does not bypass the route either', async () => {
    const seen: string[] = [];
    const p = await startProvider((req, res) => {
      seen.push(`${req.method} ${req.url}`);
      req.resume();
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(baseResponse('completed', [msgItem('Hello')])));
    });
    const s = await startStack({
      config: (mockUrl) => ({ ...configServedBy(mockUrl, 'p', `${p.origin}/v1`), passthrough: { provider: 'p', paths: ['/v1/responses/'], methods: ['GET', 'POST', 'DELETE'] } }),
    });
    // fetch would resolve the dot segment itself; node:http sends the path as written, as any raw client can. The
    // provider was sent POST /v1/responses/ (the URL parser that builds the upstream URL resolves `.` and `%2e`): a create.
    const post = (path: string) =>
      new Promise<{ status: number; code: string }>((resolve, reject) => {
        const req = httpRequest(`${s.url}${path}`, { method: 'POST', path, headers: { 'content-type': 'application/json' } }, (res) => {
          let text = '';
          res.on('data', (d: Buffer) => (text += d));
          res.on('end', () => resolve({ status: res.statusCode!, code: (JSON.parse(text) as { error?: { code: string } }).error?.code ?? 'none' }));
        });
        req.on('error', reject);
        req.end(JSON.stringify({ model: 'gpt-4.1', input: 'hi' }));
      });
    for (const path of ['/v1/responses/.', '/v1/responses/%2e', '/v1/responses/%2E/', '/v1/responses/./', '/v1/responses//.', '/v1/responses/%2e%2F']) {
      expect({ path, ...(await post(path)) }).toEqual({ path, status: 404, code: 'unknown_url' });
    }
    expect(seen).toEqual([]);
    // A stored response's own path with a dot segment in it still goes through, where it leads.
    expect(await post('/v1/responses/resp_1/./cancel')).toEqual({ status: 200, code: 'none' });
    expect(seen).toEqual(['POST /v1/responses/resp_1/cancel']);
  });
});
