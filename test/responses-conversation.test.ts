// A Responses API request with `conversation` (the Conversations API): the provider appends the request's input, and
// then the response's output, to that stored conversation as it takes the request. Sent again after it may have been
// taken, the agent's history gets the turn twice. So a stream with one starts at its response.created, as a background
// one does (no retry after it), and a request with one that timed out once sent is not sent again; a status the
// provider answered (a 503: it took nothing) is still retried. The official `openai` SDK against scripted upstreams.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { classify, maySendAgain, type AttemptOutcome } from '../src/policy/outcome.ts';
import { addsToConversation, streamShapeOf } from '../src/streaming/stream-events.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { baseResponse, fastRetries, json, responsesHead, responsesTail, rev, scripted, textDelta, type Script, type Seen } from './helpers/scripted-provider.ts';
import { configServedBy, requestLine, useStacks } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();

/**
 * A gateway whose routes go to one scripted provider (three quick attempts, default retryOn, which lists `timeout`),
 * and an SDK client of it with the SDK's own retries on (it reads x-should-retry): what the agent's code would use.
 */
async function gateway(fn: (body: Record<string, unknown>, n: number) => Script | 'hang', timeouts: Record<string, number>) {
  const seen: Seen[] = [];
  const p = await startProvider(scripted(fn, seen));
  const s = await startStack({
    config: (mockUrl) => {
      const c = configServedBy(mockUrl, 'p', `${p.origin}/v1`);
      (c.providers.p as Record<string, unknown>).timeouts = { connectMs: 2_000, firstTokenMs: 30_000, idleMs: 30_000, ...timeouts };
      fastRetries(c, p.origin);
      return c;
    },
  });
  const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 2 });
  return { client, seen, s };
}

const SSE = { 'content-type': 'text/event-stream' };
const TEXT = 'Noted.';
/** A whole Responses stream that answers TEXT. */
const answered: Script = { headers: SSE, steps: [...responsesHead(), textDelta(TEXT, 4), ...responsesTail(TEXT, 5)] };
/** response.created, then a model thinking in silence for longer than any timer here. */
const createdThenSilent: Script = { headers: SSE, steps: [rev('response.created', { response: baseResponse('in_progress') }, 0)], hold: true };
const unavailable = json(503, { error: { message: 'overloaded', type: 'server_error', code: null } });
const whole = json(200, baseResponse('completed', [{ id: 'msg_1', type: 'message', status: 'completed', role: 'assistant', content: [{ type: 'output_text', text: TEXT, annotations: [] }] }]));

/** Reads a stream to its end: the event types it gave, and what the SDK raised, if anything. */
async function drain(stream: AsyncIterable<{ type: string }>): Promise<{ types: string[]; err: Error | undefined }> {
  const types: string[] = [];
  try {
    for await (const e of stream) types.push(e.type);
    return { types, err: undefined };
  } catch (e) {
    return { types, err: e as Error };
  }
}

const CONVERSATIONS = [
  ['an id', 'conv_123'],
  ['an object', { id: 'conv_123' }],
] as const;

describe('a Responses stream that adds to a conversation', () => {
  it.each(CONVERSATIONS)('starts at its response.created (conversation as %s): a model silent past firstTokenMs is not asked again, the SDK raises', async (_form, conversation) => {
    const g = await gateway(() => createdThenSilent, { firstTokenMs: 600, idleMs: 300 });
    const started = Date.now();
    const { types, err } = await drain(await g.client.responses.create({ model: 'gpt-4.1', input: 'remember: the meeting is at 3', conversation, stream: true }));
    expect(types[0]).toBe('response.created');
    expect(err).toBeInstanceOf(Error);
    expect(err!.message).toMatch(/stalled/);
    // The silence is bounded from response.created by firstTokenMs (longer than idleMs here), not cut at idleMs.
    expect(Date.now() - started).toBeGreaterThanOrEqual(550);
    expect(g.seen).toHaveLength(1);
    const line = await requestLine(g.s, 'responses');
    expect(line.attempts).toHaveLength(1);
  });

  it('is retried on a 503 before its response.created: the provider took nothing', async () => {
    const g = await gateway((_b, n) => (n === 1 ? unavailable : answered), { firstTokenMs: 2_000 });
    const { types, err } = await drain(await g.client.responses.create({ model: 'gpt-4.1', input: 'and then?', conversation: 'conv_123', stream: true }));
    expect(err).toBeUndefined();
    expect(types).toContain('response.completed');
    expect(g.seen).toHaveLength(2);
    expect(g.seen[1]!.headers['x-retry-attempt']).toBe('1');
  });

  it('without a conversation is held until its first output and retried past firstTokenMs, as before', async () => {
    const g = await gateway((_b, n) => (n === 1 ? createdThenSilent : answered), { firstTokenMs: 500, idleMs: 300 });
    const { types, err } = await drain(await g.client.responses.create({ model: 'gpt-4.1', input: 'hi', stream: true }));
    expect(err).toBeUndefined();
    expect(types.filter((t) => t === 'response.created')).toHaveLength(1);
    expect(types).toContain('response.completed');
    expect(g.seen).toHaveLength(2);
  });
});

describe('a whole Responses request that adds to a conversation', () => {
  it.each(CONVERSATIONS)('is not sent again once it timed out after it was sent (conversation as %s): 504, x-should-retry false, one upstream request', async (_form, conversation) => {
    const g = await gateway(() => 'hang', { responseMs: 500 });
    const err = await g.client.responses.create({ model: 'gpt-4.1', input: 'remember: the meeting is at 3', conversation }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    const api = err as InstanceType<typeof OpenAI.APIError>;
    expect(api.status).toBe(504);
    expect(api.headers?.get('x-should-retry')).toBe('false');
    // Neither the gateway nor the SDK (maxRetries: 2) sent it again.
    expect(g.seen).toHaveLength(1);
  });

  it('with background: true is not sent again once it timed out after it was sent either: a second job would run beside the first', async () => {
    const g = await gateway(() => 'hang', { responseMs: 500 });
    const err = await g.client.responses.create({ model: 'o3-deep-research', input: 'a report on the market', background: true }).catch((e: unknown) => e);
    expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(504);
    expect(g.seen).toHaveLength(1);
  });

  it('is retried on a 503: the provider answered, and took nothing', async () => {
    const g = await gateway((_b, n) => (n === 1 ? unavailable : whole), { responseMs: 2_000 });
    const r = await g.client.responses.create({ model: 'gpt-4.1', input: 'and then?', conversation: 'conv_123' });
    expect(r.output_text).toBe(TEXT);
    expect(g.seen).toHaveLength(2);
  });

  it('without a conversation is retried after a timeout, as before', async () => {
    const g = await gateway((_b, n) => (n === 1 ? 'hang' : whole), { responseMs: 500 });
    const r = await g.client.responses.create({ model: 'gpt-4.1', input: 'hi' });
    expect(r.output_text).toBe(TEXT);
    expect(g.seen).toHaveLength(2);
  });
});

describe('what a conversation changes, as policy', () => {
  it('gives a Responses request with a conversation, and only that API, a stream that starts at response.created', () => {
    expect(streamShapeOf('responses', { conversation: 'conv_123' })).toEqual({ choices: 1, usage: false, startsAtCreated: 'conversation' });
    expect(streamShapeOf('responses', { conversation: { id: 'conv_123' }, background: true }).startsAtCreated).toBe('background');
    expect(streamShapeOf('responses', { previous_response_id: 'resp_1' }).startsAtCreated).toBeUndefined();
    expect(streamShapeOf('responses', { conversation: null }).startsAtCreated).toBeUndefined();
    expect(addsToConversation('chat', { conversation: 'conv_123' })).toBe(false);
  });

  it('never sends a committing request again after an outcome it may have been taken by unanswered; a status answered still goes by retryOn', () => {
    const retryOn = [429, 500, 503, 'network', 'timeout'] as const;
    const again = (outcome: AttemptOutcome, commits: boolean) => maySendAgain(classify(outcome), outcome, retryOn, commits);
    for (const phase of ['headers', 'first-token', 'response'] as const) {
      expect(again({ kind: 'timeout', phase }, true)).toBe(false);
      expect(again({ kind: 'timeout', phase }, false)).toBe(true);
    }
    expect(again({ kind: 'network', code: 'ECONNRESET' }, true)).toBe(false);
    expect(again({ kind: 'bad-stream', detail: 'cut', ran: true }, true)).toBe(false);
    // Nothing reached the provider: sent again as any request is.
    expect(again({ kind: 'timeout', phase: 'connect' }, true)).toBe(true);
    expect(again({ kind: 'network', code: 'ECONNREFUSED' }, true)).toBe(true);
    expect(again({ kind: 'bad-stream', detail: 'an HTML page', ran: false }, true)).toBe(true);
    for (const status of [429, 500, 503]) expect(again({ kind: 'http', status, errorCode: null, hint: undefined }, true)).toBe(true);
  });
});
