// Mutation testing of src/pipeline/attempt.ts and src/pipeline/final-answer.ts: each test here fails on a change to
// that code the rest of the suite let through.
import { gzipSync } from 'node:zlib';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { chatCompletion, useFakeProviders } from './helpers/fake-provider.ts';
import { json, scripted, useScriptedGateway, type Seen } from './helpers/scripted-provider.ts';
import { configServedBy, useStacks } from './helpers/stack.ts';
import type { AttemptResult } from '../src/pipeline/attempt.ts';
import { errorAnswer, failureAnswer, inexpressibleAnswer, withRejectionNote } from '../src/pipeline/final-answer.ts';
import { GatewayError } from '../src/errors.ts';
import { classify, REGION_REFUSED_CODE, type AttemptOutcome } from '../src/policy/outcome.ts';

/** The gateway's own message for a request whose last attempt on `target` ended with `outcome`. */
function messageFor(outcome: AttemptOutcome, more: { attempts?: Array<[string, number]>; retryShed?: boolean; budgetMs?: number } = {}): string {
  const result: AttemptResult = { outcome };
  return failureAnswer({ result, cls: classify(outcome), retryAfterMs: undefined, attempts: more.attempts ?? [['p/m', 1]], target: 'p/m', budgetMs: more.budgetMs ?? 1_000, retryShed: more.retryShed })
    .body.error.message;
}

describe('final-answer: what the gateway says of its last attempt', () => {
  it("says a retry was not taken because the provider's pool had no slot for it before the deadline", () => {
    const timeout: AttemptOutcome = { kind: 'timeout', phase: 'response' };
    expect(messageFor(timeout, { retryShed: true })).toBe("upstream p/m timed out after 1 attempt (last: response timeout); not retried: the provider's pool had no slot for a retry before the deadline");
    expect(messageFor(timeout)).toBe('upstream p/m timed out after 1 attempt (last: response timeout)');
  });

  it('names the timer that fired in words: first token, not first-token', () => {
    expect(messageFor({ kind: 'timeout', phase: 'first-token' }, { attempts: [['p/m', 3]] })).toBe('upstream p/m timed out after 3 attempts (last: first token timeout)');
  });

  it("blames the gateway's deployment, not its configuration, for a location the provider does not serve", () => {
    const region: AttemptOutcome = { kind: 'http', status: 403, errorCode: REGION_REFUSED_CODE, hint: undefined };
    const message = messageFor(region);
    expect(message).toContain(`does not serve the location the gateway calls from (${REGION_REFUSED_CODE})`);
    expect(message).toContain('this is a gateway deployment problem');
    const key: AttemptOutcome = { kind: 'http', status: 401, errorCode: 'invalid_api_key', hint: undefined };
    expect(messageFor(key)).toContain('this is a gateway configuration problem');
  });

  it('lists the attempts per target at a deadline only when more than one target was tried', () => {
    const deadline: AttemptOutcome = { kind: 'aborted', by: 'deadline' };
    expect(messageFor(deadline, { attempts: [['p/m', 2]], budgetMs: 800 })).toBe("the request's deadline of 800 ms passed after 2 attempts (last target: p/m)");
    expect(messageFor(deadline, { attempts: [['q/m', 1], ['p/m', 2]], budgetMs: 800 })).toBe("the request's deadline of 800 ms passed after 3 attempts (last target: p/m; q/m 1, p/m 2)");
  });
});

describe('final-answer: notes added to an answer', () => {
  it("names the parameter of the skip that has one, though the first target's skip has none", () => {
    const answer = inexpressibleAnswer('chat', [
      { target: 'a/m', reason: 'its family cannot take messages that are not a list' },
      { target: 'b/m', reason: 'its family takes one choice only', param: 'n' },
    ]);
    expect(answer.status).toBe(400);
    expect(answer.body.error.param).toBe('n');
  });

  it("cuts the fallback's rejection to 300 characters, and joins it to a message without its period", () => {
    const outage = errorAnswer(new GatewayError('upstream_unavailable', 'upstream a/m could not be reached after 1 attempt (last: ECONNREFUSED).'));
    const rejected = { outcome: { kind: 'http' as const, status: 400, errorCode: null, hint: undefined }, body: Buffer.from(JSON.stringify({ error: { message: 'x'.repeat(1_000), type: 'invalid_request_error' } })) };
    const message = withRejectionNote(outage, { target: 'b/m', result: rejected }).body.error.message;
    expect(message).toBe(`upstream a/m could not be reached after 1 attempt (last: ECONNREFUSED); the fallback b/m rejected the request (400: ${'x'.repeat(299)}…)`);
  });
});

const startProvider = useFakeProviders();
const startStack = useStacks();
const startScripted = useScriptedGateway();
const hi = [{ role: 'user' as const, content: 'hi' }];

describe('attempt: an answer read whole', () => {
  it('passes on a gzip answer that decodes to more than an error may hold (64 KB): the cap is an answer\'s', async () => {
    const content = 'x'.repeat(200 * 1024);
    const p = await startProvider((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'application/json', 'content-encoding': 'gzip' });
        res.end(gzipSync(chatCompletion(content)));
      });
    });
    const s = await startStack({ config: (mockUrl) => configServedBy(mockUrl, 'zipped', `${p.origin}/v1`) });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    const answer = await client.chat.completions.create({ model: 'gpt-4o', messages: hi });
    expect(answer.choices[0]!.message.content).toBe(content);
    expect(p.hits()).toBe(1);
  });

  it("reads a stream request's JSON 200 whole: the gateway's own quota error in it is the billing problem it names", async () => {
    const { client, seen } = await startScripted(() => json(200, { error: { message: 'You exceeded your current quota', type: 'insufficient_quota', code: 'insufficient_quota', param: null } }));
    await expect(client.chat.completions.create({ model: 'gpt-4o', messages: hi, stream: true })).rejects.toMatchObject({ status: 502, code: 'upstream_auth_error' });
    expect(seen.length).toBe(1);
  });
});

describe('attempt: a stream that fails before its first output', () => {
  it('lets go of the upstream connection at once, though the provider holds the response open', async () => {
    const seen: Seen[] = [];
    let closed = 0;
    const answer = scripted(() => ({ steps: ['data: {"error":{"message":"overloaded","type":"server_error","code":"server_error"}}\n\n'], hold: true }), seen);
    const p = await startProvider((req, res) => {
      res.on('close', () => closed++);
      answer(req, res);
    });
    const s = await startStack({
      config: (mockUrl) => {
        const c = configServedBy(mockUrl, 'p', `${p.origin}/v1`);
        for (const r of c.routes) r.retry = { maxAttempts: 1 };
        return c;
      },
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    await expect(client.chat.completions.create({ model: 'gpt-4o', messages: hi, stream: true })).rejects.toMatchObject({ status: 502 });
    expect(seen.length).toBe(1);
    const end = Date.now() + 2_000;
    while (closed === 0 && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
    expect(closed).toBe(1);
  });
});

describe("attempt: an upstream error passed on", () => {
  it("takes the gateway's key out of the error body the client gets, though the provider quoted it", async () => {
    const p = await startProvider((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(400, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ error: { message: `model not found for ${String(req.headers.authorization)}`, type: 'invalid_request_error', param: 'model', code: 'model_not_found' } }));
      });
    });
    const s = await startStack({ config: (mockUrl) => configServedBy(mockUrl, 'echoing', `${p.origin}/v1`) });
    const res = await fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages: hi }) });
    expect(res.status).toBe(400);
    const text = await res.text();
    expect(text).toContain('model not found for Bearer');
    expect(text).not.toContain('echoing-key');
  });
});

describe('attempt: an answer on a path the gateway does not know', () => {
  it('passes on JSON without the byte order mark before it, which JSON.parse refuses', async () => {
    const moderation = { id: 'modr-1', model: 'omni-moderation-latest', results: [{ flagged: false }] };
    const p = await startProvider((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(JSON.stringify(moderation))]));
      });
    });
    const s = await startStack({
      config: () => ({
        server: { host: '127.0.0.1', port: 0 },
        providers: { mod: { family: 'openai', baseUrl: `${p.origin}/v1`, apiKey: 'mod-provider-key', breaker: false } },
        routes: [{ name: 'moderations', match: { path: '/v1/moderations' }, targets: [{ provider: 'mod' }] }],
      }),
    });
    // Read as bytes: fetch's own json() drops the mark, Python's json.loads and a JSON.parse of the raw text do not.
    const res = await fetch(`${s.baseURL}/moderations`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'omni-moderation-latest', input: 'hi' }) });
    expect(res.status).toBe(200);
    expect(JSON.parse(Buffer.from(await res.arrayBuffer()).toString('utf8'))).toEqual(moderation);
  });
});

describe('attempt: an error event before the first output that blames the request', () => {
  it("is passed on as its 400 without the gateway's key, though the provider quoted it", async () => {
    const p = await startProvider((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        const error = { message: `This model's maximum context length is 128000 tokens (key ${String(req.headers.authorization)})`, type: 'invalid_request_error', param: 'messages', code: 'context_length_exceeded' };
        res.end(`data: ${JSON.stringify({ error })}\n\n`);
      });
    });
    const s = await startStack({ config: (mockUrl) => configServedBy(mockUrl, 'echoing', `${p.origin}/v1`) });
    const res = await fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', stream: true, messages: hi }) });
    expect(res.status).toBe(400);
    const text = await res.text();
    expect(text).toContain('maximum context length');
    expect(text).not.toContain('echoing-key');
    expect(p.hits()).toBe(1);
  });
});

describe("attempt: an Anthropic target's error event before the first output, for an OpenAI client", () => {
  it('is passed on in the OpenAI shape the request was translated from, not as the Anthropic event', async () => {
    const p = await startProvider((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.end(`event: error\ndata: ${JSON.stringify({ type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } })}\n\n`);
      });
    });
    const s = await startStack({
      config: (mockUrl) => {
        const c = configServedBy(mockUrl, 'claude', `${p.origin}/v1`);
        c.providers.claude!.family = 'anthropic';
        c.routes = c.routes.filter((r) => r.name === 'chat').map((r) => ({ ...r, retry: { maxAttempts: 1 } }));
        return c;
      },
    });
    const res = await fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'claude-x', stream: true, messages: hi }) });
    expect(res.status).toBe(529);
    expect(await res.json()).toEqual({ error: { message: 'Overloaded', type: 'server_error', param: null, code: 'overloaded' } });
  });
});
