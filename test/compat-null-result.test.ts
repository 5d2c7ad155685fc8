// OpenAI-compatible routers (one-api and its forks, some aggregators) answer an upstream failure with a 200 whose
// result field is null beside the error: `{"choices": null, "error": {...}}`, `{"data": null, ...}`. The key is there,
// so the check for a missing or empty field let it through: the SDK returned it as a completion, `choices[0]` threw
// in the user's code, nothing was retried or failed over, and the log counted a success.
import { describe, expect, it } from 'vitest';
import { notAnAnswer } from '../src/providers/answer-shape.ts';
import { useScriptedGateway } from './helpers/scripted-provider.ts';

const gw = useScriptedGateway((c) => {
  for (const r of c.routes as Array<Record<string, unknown>>) r.retry = { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 10, capMs: 10 } };
});
const messages = [{ role: 'user' as const, content: 'hi' }];
const json = (o: unknown) => ({ headers: { 'content-type': 'application/json' }, steps: [JSON.stringify(o)] });
const ctx = (api: 'chat' | 'embeddings') => ({ api, stream: false, contentType: 'application/json', ownFamily: true });
const routerError = { message: 'upstream error: do request failed', type: 'new_api_error', code: 'do_request_failed' };

describe('a 200 whose result field is null', () => {
  it('is not an answer: choices or data must be a list', () => {
    expect(notAnAnswer(ctx('chat'), Buffer.from(JSON.stringify({ id: '', choices: null, error: routerError })))?.detail).toBe(
      'the upstream answered 2xx with an error, not an answer',
    );
    expect(notAnAnswer(ctx('chat'), Buffer.from('{"id":"x","choices" : null}'))?.detail).toBe("the upstream answer's choices are not a list");
    expect(notAnAnswer(ctx('embeddings'), Buffer.from('{"object":"list","data":null,"model":"e"}'))?.detail).toBe("the upstream answer's data are not a list");
    // Answers still pass, spaced or not.
    expect(notAnAnswer(ctx('chat'), Buffer.from('{"choices" : [ {"index":0} ]}'))).toBeUndefined();
    expect(notAnAnswer(ctx('embeddings'), Buffer.from('{"object":"list","data":[],"model":"e"}'))).toBeUndefined();
  });

  it('is retried over HTTP, and the SDK gets the real completion', async () => {
    const { client, seen } = await gw((_, n) =>
      n === 1
        ? json({ id: '', object: 'chat.completion', created: 0, model: '', choices: null, usage: null, error: routerError })
        : json({ id: 'x', object: 'chat.completion', created: 1, model: 'm', choices: [{ index: 0, message: { role: 'assistant', content: 'hey' }, finish_reason: 'stop' }] }),
    );
    const r = await client.chat.completions.create({ model: 'gpt-4o', messages });
    expect(r.choices[0]!.message.content).toBe('hey');
    expect(seen).toHaveLength(2);
  });

  it('ends in 502 upstream_bad_response for embeddings when every attempt gets one', async () => {
    const { client, seen } = await gw(() => json({ object: 'list', data: null, model: 'e', usage: null }));
    const err = (await client.embeddings.create({ model: 'text-embedding-3-small', input: 'x', encoding_format: 'float' }).catch((e: unknown) => e)) as {
      status?: number;
      code?: string;
    };
    expect(err.status).toBe(502);
    expect(err.code).toBe('upstream_bad_response');
    expect(seen).toHaveLength(2);
  });
});

describe('an answer whose list key is preceded by the same word as a value', () => {
  it('is judged by the key, not by a model named "data" or "choices"', () => {
    const embeddings = Buffer.from('{"object":"list","model":"data","data":[{"object":"embedding","index":0,"embedding":[0.1]}],"usage":{"prompt_tokens":1,"total_tokens":1}}');
    expect(notAnAnswer({ api: 'embeddings', stream: false, contentType: 'application/json', ownFamily: true }, embeddings)).toBeUndefined();
    const chat = Buffer.from('{"id":"c","object":"chat.completion","model":"choices","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}');
    expect(notAnAnswer({ api: 'chat', stream: false, contentType: 'application/json', ownFamily: true }, chat)).toBeUndefined();
    // The router's null list is still refused.
    expect(notAnAnswer({ api: 'chat', stream: false, contentType: 'application/json', ownFamily: true }, Buffer.from('{"choices":null,"error":{"message":"x"}}'))).toBeDefined();
  });
});
