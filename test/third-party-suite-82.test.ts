// Third-party failure-scenario suite 82: USAGE ACCOUNTING on the OpenAI-family side (OpenAI, Azure OpenAI, compatible
// servers) and in the gateway's own additions. Teams bill each client key from these numbers, so every place the
// gateway reports a usage must agree: the answer's `usage`, a stream's usage chunk, the log line's `usage`,
// `stormgate_tokens_total{kind}` and the settlement of a client's `tokensPerMinute` (auth.limits).
// Written from the README ("Streaming": `streamUsage` asks a chat or completions stream's usage and keeps it out of
// the stream of a client that did not ask; "Client keys": settlement with usage, and without it the prompt's estimate
// plus the output delivered / 4, and a stream whose usage came in part charged its reported prompt plus its completion
// or the output delivered, whichever is more; "Logs and metrics": a failed attempt counts nothing) and OpenAI's API
// reference: `prompt_tokens` includes `prompt_tokens_details.cached_tokens` (and audio_tokens), `completion_tokens`
// includes `completion_tokens_details.reasoning_tokens` and the rejected prediction tokens ("still counted in the total
// completion tokens for purposes of billing"); the Responses API's `input_tokens` includes
// `input_tokens_details.cached_tokens` and `output_tokens` includes `output_tokens_details.reasoning_tokens`, reported
// in `response.completed` (and `response.incomplete`) of a stream; embeddings report `prompt_tokens` and `total_tokens`.
// test/third-party-suite-79.test.ts did the Anthropic side; stream-usage and review-usage-probes the filter itself.
// Covered here, which they leave out: the client's bytes with and without `streamUsage` compared from the same
// upstream (OpenAI's real chunk shape: obfuscation, service_tier, usage details, a tool call); a retry after an
// attempt that had reported usage (a stream broken before its first output, a 200 carrying an error and a usage): only
// the answering attempt's counts anywhere; cut streams with and without cumulative usage (vLLM's
// continuous_usage_stats), with `streamUsage` hiding it; a client that asked while the server sent `usage: null` and
// no usage chunk; embeddings of a batch; the Responses API whole, streamed, and ended `incomplete`; every detail field
// at once, so a detail added in (cached on top of prompt, reasoning on top of completion) would show; usage counts a
// counter cannot take (negative, "NaN", 1e20), whole and streamed.
// Found here (fixed in src/streaming/usage.ts): a whole answer's usage was read by a regex of digits, so a count the
// stream path refuses was half read: `"prompt_tokens": -5` or `"NaN"` left the prompt out (billed 0 and the client's
// prompt estimate given back: charged the completion alone), and `1e20` was read as 1; and a count past 2^53 (1e20,
// streamed) went into the tokens counter, where no later increment of a few tokens changes its value again.
// Bounds are generous: a loaded 2-core machine.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { baseResponse, cc, delta, DONE, json, msgItem, responsesHead, rev, textDelta, type Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams, type UpstreamsGateway } from './helpers/scripted-upstreams.ts';
import { promptEstimate, requestLines, tokenRated, tokens, type Line } from './helpers/usage-readers.ts';

const start = useScriptedUpstreams();

const MODEL = 'gpt-4o-2024-08-06';
const messages = [{ role: 'user' as const, content: 'What is the March total?' }];

// ---- OpenAI's answers, as it sends them --------------------------------------------------------------------------------

/** Every field of a chat usage at once: 2,048 of the 9,000 prompt tokens read from the cache, 640 of the 1,100 completion tokens reasoning, 30 rejected prediction tokens. */
const FULL = {
  prompt_tokens: 9_000,
  completion_tokens: 1_100,
  total_tokens: 10_100,
  prompt_tokens_details: { cached_tokens: 2_048, audio_tokens: 12 },
  completion_tokens_details: { reasoning_tokens: 640, audio_tokens: 0, accepted_prediction_tokens: 70, rejected_prediction_tokens: 30 },
};

const sse = (steps: Script['steps'], hold = false): Script => ({ headers: { 'content-type': 'text/event-stream', 'x-request-id': 'req_stream' }, steps, hold });
const asked = (body: Record<string, unknown>) => (body.stream_options as { include_usage?: boolean } | undefined)?.include_usage === true;

/** A chunk as OpenAI writes it: service_tier and obfuscation on each, `usage: null` on each when the usage was asked. */
const chunk = (body: Record<string, unknown>, choices: unknown[], obfuscation: string) =>
  cc(choices, { service_tier: 'default', ...(asked(body) && { usage: null }), obfuscation });

/**
 * OpenAI's stream of a text answer and a tool call, with its usage chunk (choices: [], the usage, its own
 * obfuscation) only when the request asked for it.
 */
function openaiStream(body: Record<string, unknown>, usage: object = FULL): Script {
  const call = { index: 0, id: 'call_Mar', type: 'function', function: { name: 'lookup', arguments: '' } };
  return sse([
    chunk(body, [delta({ role: 'assistant', content: '', refusal: null })], 'a1'),
    chunk(body, [delta({ content: 'The March ' })], 'b22'),
    chunk(body, [delta({ content: 'total is 42.' })], 'c333'),
    chunk(body, [delta({ tool_calls: [call] })], 'd'),
    chunk(body, [delta({ tool_calls: [{ index: 0, function: { arguments: '{"month":"03"}' } }] })], 'e5'),
    chunk(body, [delta({}, 'tool_calls')], 'f66'),
    ...(asked(body) ? [cc([], { service_tier: 'default', usage, obfuscation: 'gX9' })] : []),
    DONE,
  ]);
}

const down503: Script = json(503, { error: { message: 'The server is overloaded', type: 'server_error', param: null, code: null } });

const wholeChat = (content: string, usage: unknown): Record<string, unknown> => ({
  id: 'chatcmpl-whole',
  object: 'chat.completion',
  created: 1741290958,
  model: MODEL,
  choices: [{ index: 0, message: { role: 'assistant', content, refusal: null, annotations: [] }, logprobs: null, finish_reason: 'stop' }],
  usage,
  service_tier: 'default',
  system_fingerprint: 'fp_1',
});

// ---- Reading what the gateway reports ----------------------------------------------------------------------------------


/** The raw SSE a client gets for a streamed chat completion (fetch, no SDK: every byte). */
async function rawStream(g: UpstreamsGateway, extra: Record<string, unknown> = {}, key?: string): Promise<string> {
  const res = await fetch(`${g.s.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(key && { authorization: `Bearer ${key}` }) },
    body: JSON.stringify({ model: 'gpt-4o', messages, stream: true, ...extra }),
  });
  expect(res.status).toBe(200);
  return res.text();
}

interface Drained {
  chunks: OpenAI.ChatCompletionChunk[];
  text: string;
  usages: OpenAI.CompletionUsage[];
  error: unknown;
}

async function drain(s: AsyncIterable<OpenAI.ChatCompletionChunk>): Promise<Drained> {
  const out: Drained = { chunks: [], text: '', usages: [], error: undefined };
  try {
    for await (const c of s) {
      out.chunks.push(c);
      out.text += c.choices[0]?.delta?.content ?? '';
      if (c.usage) out.usages.push(c.usage);
    }
  } catch (err) {
    out.error = err;
  }
  return out;
}

// ---- A client's token rate, and what it was charged (as suite 79 reads it) -------------------------------------------

const { rated, agents, charged } = tokenRated(start, 'sk-agents-key-suite82-0123456789');

const TARGET = 'openai/gpt-4o';

// =====================================================================================================================

describe('streamUsage: the client of a stream it did not ask the usage of gets the bytes it would have had without the setting', () => {
  it("OpenAI's real chunk shape (service_tier, obfuscation, a tool call): byte for byte the stream of a gateway without streamUsage, and the usage billed in full once", async () => {
    const plain = await start({ openai: (b) => openaiStream(b) }, [{ provider: 'openai' }]);
    const hiding = await start({ openai: (b) => openaiStream(b) }, [{ provider: 'openai' }], { provider: { streamUsage: true } });
    const before = await rawStream(plain);
    const after = await rawStream(hiding);
    expect(after).toBe(before);
    expect(after).not.toContain('usage');
    expect(hiding.seen.openai![0]!.body.stream_options).toEqual({ include_usage: true });
    expect(plain.seen.openai![0]!.body).not.toHaveProperty('stream_options');

    // An explicit include_usage: false is a client that did not ask: asked upstream, hidden from it all the same.
    const refused = await rawStream(hiding, { stream_options: { include_usage: false } });
    expect(refused).toBe(before);
    expect(hiding.seen.openai![1]!.body.stream_options).toEqual({ include_usage: true });

    const lines = await requestLines(hiding, 2);
    expect(lines.map((l) => [l.outcome, l.streamEnd, l.usage])).toEqual([
      ['success', 'complete', { prompt: 9_000, completion: 1_100 }],
      ['success', 'complete', { prompt: 9_000, completion: 1_100 }],
    ]);
    // Cached and reasoning tokens are parts of prompt and completion, not added on top of them.
    expect(await tokens(hiding)).toEqual({ [`${TARGET} prompt`]: 18_000, [`${TARGET} completion`]: 2_200 });
    // Without the setting nothing was billed: the client did not ask.
    await requestLines(plain, 1);
    expect(await tokens(plain)).toEqual({});
  });

  it('a client that asked gets the usage chunk once, with every detail field as OpenAI sent it, and `usage: null` on the other chunks; billed once', async () => {
    const g = await start({ openai: (b) => openaiStream(b) }, [{ provider: 'openai' }], { provider: { streamUsage: true } });
    const got = await drain(await g.client.chat.completions.create({ model: 'gpt-4o', messages, stream: true, stream_options: { include_usage: true } }));
    expect(got.error).toBeUndefined();
    expect(got.text).toBe('The March total is 42.');
    expect(got.usages).toEqual([FULL]);
    expect(got.chunks.at(-1)!.choices).toEqual([]);
    expect(got.chunks.filter((c) => c.usage === null)).toHaveLength(got.chunks.length - 1);
    const [line] = await requestLines(g, 1);
    expect(line!.usage).toEqual({ prompt: 9_000, completion: 1_100 });
    expect(await tokens(g)).toEqual({ [`${TARGET} prompt`]: 9_000, [`${TARGET} completion`]: 1_100 });
  });

  it('a client that asked and a server that sends `usage: null` on every chunk and never a usage chunk: a whole answer, no usage anywhere, charged the prompt estimate and the output delivered', async () => {
    const answer = () => sse([cc([delta({ role: 'assistant', content: '' })], { usage: null }), cc([delta({ content: 'x'.repeat(40) })], { usage: null }), cc([delta({}, 'stop')], { usage: null }), DONE]);
    const g = await rated({ openai: answer }, [{ provider: 'openai' }], { provider: { streamUsage: true } });
    const params = { model: 'gpt-4o', messages, max_tokens: 100, stream: true as const, stream_options: { include_usage: true } };
    const got = await drain(await agents(g).chat.completions.create(params));
    expect(got).toMatchObject({ error: undefined, text: 'x'.repeat(40), usages: [] });
    const [line] = await requestLines(g, 1);
    expect(line).toMatchObject({ outcome: 'success', streamEnd: 'complete' });
    expect(line!.usage).toBeUndefined();
    expect(await tokens(g)).toEqual({});
    expect(await charged(g)).toBe(promptEstimate(params) + 10);
  });
});

describe('retries: only the answering attempt is counted', () => {
  it('streamed, streamUsage: an attempt that reported 90,000 tokens on its role chunk then reset before any output, then a whole stream: its usage alone, hidden from the client, logged, counted and charged', async () => {
    const early = { prompt_tokens: 90_000, completion_tokens: 0, total_tokens: 90_000 };
    const answer = (body: Record<string, unknown>, n: number): Script =>
      n === 1 ? sse([cc([delta({ role: 'assistant', content: '' })], { usage: early }), 30, { destroy: true }]) : openaiStream(body, { prompt_tokens: 700, completion_tokens: 21, total_tokens: 721 });
    const g = await rated({ openai: answer }, [{ provider: 'openai' }], { provider: { streamUsage: true } });
    const { data, response } = await agents(g).chat.completions.create({ model: 'gpt-4o', messages, max_tokens: 100, stream: true }).withResponse();
    const got = await drain(data);
    expect(got).toMatchObject({ error: undefined, text: 'The March total is 42.', usages: [] });
    expect(got.chunks.filter((c) => 'usage' in c)).toEqual([]);
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(g.seen.openai!.map((s) => s.body.stream_options)).toEqual([{ include_usage: true }, { include_usage: true }]);
    const [line] = await requestLines(g, 1);
    expect(line!.attempts.map((a: Line) => a.reason)).toEqual(['bad_stream', 'ok']);
    expect(line!.usage).toEqual({ prompt: 700, completion: 21 });
    expect(await tokens(g)).toEqual({ [`${TARGET} prompt`]: 700, [`${TARGET} completion`]: 21 });
    expect(await charged(g)).toBe(721);
  });

  it('whole: a 200 that carries an error beside a usage, then a 503, then the answer: the answer\'s usage alone', async () => {
    const errorIn200 = json(200, { error: { message: 'upstream model crashed', type: 'server_error', code: null }, usage: { prompt_tokens: 77_777, completion_tokens: 7, total_tokens: 77_784 } });
    const answer = (_b: Record<string, unknown>, n: number): Script => (n === 1 ? errorIn200 : n === 2 ? down503 : json(200, wholeChat('The March total is 42.', FULL)));
    const g = await rated({ openai: answer }, [{ provider: 'openai' }], { route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } } });
    const { data, response } = await agents(g).chat.completions.create({ model: 'gpt-4o', messages, max_tokens: 2_000 }).withResponse();
    expect(data.usage).toEqual(FULL);
    expect(response.headers.get('x-stormgate-attempts')).toBe('3');
    const [line] = await requestLines(g, 1);
    expect(line!.attempts.map((a: Line) => a.reason)).toEqual(['bad_stream', 'status_503', 'ok']);
    expect(line!.usage).toEqual({ prompt: 9_000, completion: 1_100 });
    expect(await tokens(g)).toEqual({ [`${TARGET} prompt`]: 9_000, [`${TARGET} completion`]: 1_100 });
    expect(await charged(g)).toBe(10_100);
  });
});

describe('streams cut after their first output', () => {
  it('streamUsage, no usage before the cut: an error for the client, no usage logged or counted, charged the prompt estimate and the output delivered', async () => {
    const answer = () => sse([cc([delta({ role: 'assistant', content: '' })], { usage: null }), cc([delta({ content: 'y'.repeat(44) })], { usage: null }), 50, { destroy: true }]);
    const g = await rated({ openai: answer }, [{ provider: 'openai' }], { provider: { streamUsage: true }, route: { retry: { maxAttempts: 1 } } });
    const params = { model: 'gpt-4o', messages, max_tokens: 100, stream: true as const };
    const got = await drain(await agents(g).chat.completions.create(params));
    expect(got.error).toBeInstanceOf(OpenAI.APIError);
    expect(got.text).toBe('y'.repeat(44));
    expect(got.chunks.filter((c) => 'usage' in c)).toEqual([]);
    const [line] = await requestLines(g, 1);
    expect(line).toMatchObject({ outcome: 'stream_error', streamEnd: 'cut' });
    expect(line!.usage).toBeUndefined();
    expect(await tokens(g)).toEqual({});
    expect(await charged(g)).toBe(promptEstimate(params) + 11);
  });

  it('streamUsage and a server that reports cumulative usage on every chunk (continuous_usage_stats): the last counts before the cut logged and counted once, charged their prompt and the output delivered when it is more', async () => {
    const at = (completion: number) => ({ usage: { prompt_tokens: 500, completion_tokens: completion, total_tokens: 500 + completion } });
    const answer = () => sse([cc([delta({ role: 'assistant', content: '' })], at(0)), cc([delta({ content: 'z'.repeat(20) })], at(2)), cc([delta({ content: 'z'.repeat(20) })], at(3)), 50, { destroy: true }]);
    const g = await rated({ openai: answer }, [{ provider: 'openai' }], { provider: { streamUsage: true }, route: { retry: { maxAttempts: 1 } } });
    const got = await drain(await agents(g).chat.completions.create({ model: 'gpt-4o', messages, max_tokens: 100, stream: true, stream_options: { continuous_usage_stats: true } } as OpenAI.ChatCompletionCreateParamsStreaming));
    expect(got.error).toBeInstanceOf(OpenAI.APIError);
    expect(got.text).toBe('z'.repeat(40));
    expect(got.chunks.filter((c) => 'usage' in c)).toEqual([]);
    const [line] = await requestLines(g, 1);
    expect(line).toMatchObject({ outcome: 'stream_error', streamEnd: 'cut', usage: { prompt: 500, completion: 3 } });
    // Counted once (500, not 1,500 summed over three chunks), as reported.
    expect(await tokens(g)).toEqual({ [`${TARGET} prompt`]: 500, [`${TARGET} completion`]: 3 });
    // 40 characters delivered are 10 tokens, more than the 3 reported.
    expect(await charged(g)).toBe(510);
  });
});

describe('embeddings and the Responses API', () => {
  it('embeddings of a batch of four inputs: prompt_tokens counted as prompt, no completion, and charged total_tokens', async () => {
    const usage = { prompt_tokens: 37, total_tokens: 37 };
    const answer = (): Script =>
      json(200, { object: 'list', data: [0, 1, 2, 3].map((index) => ({ object: 'embedding', index, embedding: [0.0023, -0.0093, 0.0158] })), model: 'text-embedding-3-small', usage });
    const g = await rated({ openai: answer }, [{ provider: 'openai' }], { path: '/v1/embeddings' });
    const res = await agents(g).embeddings.create({ model: 'text-embedding-3-small', input: ['March', 'April', 'May', 'the June total'], encoding_format: 'float' });
    expect(res.data).toHaveLength(4);
    expect(res.usage).toEqual(usage);
    const [line] = await requestLines(g, 1);
    expect(line).toMatchObject({ route: 'chat', outcome: 'success', usage: { prompt: 37, completion: 0 } });
    expect(await tokens(g)).toEqual({ 'openai/text-embedding-3-small prompt': 37 });
    expect(await charged(g)).toBe(37);
  });

  const RUSAGE = { input_tokens: 5_000, input_tokens_details: { cached_tokens: 4_096 }, output_tokens: 900, output_tokens_details: { reasoning_tokens: 768 }, total_tokens: 5_900 };

  it('Responses API, whole: input_tokens and output_tokens (cached and reasoning inside them), passed on as sent, logged, counted and charged', async () => {
    // The client's metadata echoed after the usage names a "usage" of its own: not the answer's.
    const answer = (): Script => json(200, { ...baseResponse('completed', [msgItem('The March total is 42.')], RUSAGE), metadata: { usage: 'nightly-eval' } });
    const g = await rated({ openai: answer }, [{ provider: 'openai' }], { path: '/v1/responses' });
    const res = await agents(g).responses.create({ model: 'gpt-4.1', input: 'What is the March total?', max_output_tokens: 1_000, metadata: { usage: 'nightly-eval' } });
    expect(res.output_text).toBe('The March total is 42.');
    expect(res.usage).toEqual(RUSAGE);
    const [line] = await requestLines(g, 1);
    expect(line!.usage).toEqual({ prompt: 5_000, completion: 900 });
    expect(await tokens(g)).toEqual({ 'openai/gpt-4.1 prompt': 5_000, 'openai/gpt-4.1 completion': 900 });
    expect(await charged(g)).toBe(5_900);
  });

  it('Responses API, streamed: response.completed\'s usage (and none of the null usages before it), logged, counted and charged once', async () => {
    const text = 'The March total is 42.';
    const done = (status: 'completed' | 'incomplete', usage: object) => [
      rev('response.output_text.done', { item_id: 'msg_1', output_index: 0, content_index: 0, text, logprobs: [] }, 5),
      rev('response.content_part.done', { item_id: 'msg_1', output_index: 0, content_index: 0, part: { type: 'output_text', text, annotations: [] } }, 6),
      rev('response.output_item.done', { output_index: 0, item: msgItem(text, status) }, 7),
      rev(`response.${status}`, { response: { ...baseResponse(status, [msgItem(text, status)], usage), ...(status === 'incomplete' && { incomplete_details: { reason: 'max_output_tokens' } }) } }, 8),
    ];
    const answer = (): Script => sse([...responsesHead(), textDelta('The March total is 42.', 4), ...done('completed', RUSAGE)]);
    const g = await rated({ openai: answer }, [{ provider: 'openai' }], { path: '/v1/responses' });
    const finals: Array<{ type: string; usage: unknown }> = [];
    for await (const ev of await agents(g).responses.create({ model: 'gpt-4.1', input: 'What is the March total?', max_output_tokens: 1_000, stream: true })) {
      if (ev.type === 'response.completed' || ev.type === 'response.incomplete') finals.push({ type: ev.type, usage: ev.response.usage });
    }
    expect(finals).toEqual([{ type: 'response.completed', usage: RUSAGE }]);
    const [line] = await requestLines(g, 1);
    expect(line).toMatchObject({ outcome: 'success', usage: { prompt: 5_000, completion: 900 } });
    expect(await tokens(g)).toEqual({ 'openai/gpt-4.1 prompt': 5_000, 'openai/gpt-4.1 completion': 900 });
    expect(await charged(g)).toBe(5_900);
  });

  it('Responses API, streamed and ended by response.incomplete (max_output_tokens): billed by that event\'s usage', async () => {
    const text = 'The March';
    const usage = { input_tokens: 3_000, input_tokens_details: { cached_tokens: 0 }, output_tokens: 64, output_tokens_details: { reasoning_tokens: 60 }, total_tokens: 3_064 };
    const answer = (): Script =>
      sse([
        ...responsesHead(),
        textDelta(text, 4),
        rev('response.output_text.done', { item_id: 'msg_1', output_index: 0, content_index: 0, text, logprobs: [] }, 5),
        rev('response.content_part.done', { item_id: 'msg_1', output_index: 0, content_index: 0, part: { type: 'output_text', text, annotations: [] } }, 6),
        rev('response.output_item.done', { output_index: 0, item: msgItem(text, 'incomplete') }, 7),
        rev('response.incomplete', { response: { ...baseResponse('incomplete', [msgItem(text, 'incomplete')], usage), incomplete_details: { reason: 'max_output_tokens' } } }, 8),
      ]);
    const g = await rated({ openai: answer }, [{ provider: 'openai' }], { path: '/v1/responses' });
    const types: string[] = [];
    for await (const ev of await agents(g).responses.create({ model: 'gpt-4.1', input: 'What is the March total?', max_output_tokens: 64, stream: true })) types.push(ev.type);
    expect(types.at(-1)).toBe('response.incomplete');
    const [line] = await requestLines(g, 1);
    expect(line!.usage).toEqual({ prompt: 3_000, completion: 64 });
    expect(await tokens(g)).toEqual({ 'openai/gpt-4.1 prompt': 3_000, 'openai/gpt-4.1 completion': 64 });
    expect(await charged(g)).toBe(3_064);
  });
});

describe('usage counts no counter can take: no crash, no corrupted metric, no refund of a client\'s prompt', () => {
  // The chat body the SDK sends, for its prompt estimate; the answer's 40 characters are 10 tokens delivered.
  const params = { model: 'gpt-4o', messages, max_tokens: 100 };
  const TEXT = 'w'.repeat(40);
  const withUsage = (usage: string) => json(200, JSON.stringify(wholeChat(TEXT, '__USAGE__')).replace('"__USAGE__"', usage));
  const BAD = {
    negative: '{"prompt_tokens":-5,"completion_tokens":7,"total_tokens":2}',
    'NaN as a string': '{"prompt_tokens":"NaN","completion_tokens":7,"total_tokens":"NaN"}',
    '1e20': '{"prompt_tokens":1e20,"completion_tokens":7,"total_tokens":1e20}',
  };

  for (const [name, usage] of Object.entries(BAD)) {
    it(`whole answer, ${name}: passed on as sent, logged without usage, counted nowhere, charged the prompt estimate and the output delivered`, async () => {
      const g = await rated({ openai: () => withUsage(usage) }, [{ provider: 'openai' }]);
      const response = await agents(g).chat.completions.create(params).asResponse();
      expect(await response.text()).toContain(`"usage":${usage}`);
      const [line] = await requestLines(g, 1);
      expect(line).toMatchObject({ outcome: 'success', status: 200 });
      expect(line!.usage).toBeUndefined();
      expect(await tokens(g)).toEqual({});
      expect(await charged(g)).toBe(promptEstimate(params) + 10);
    });

    it(`stream with streamUsage, ${name} in its usage chunk: the client's stream untouched, logged without usage, counted nowhere, charged the prompt estimate and the output delivered`, async () => {
      const answer = () => sse([cc([delta({ role: 'assistant', content: '' })], { usage: null }), cc([delta({ content: TEXT })], { usage: null }), cc([delta({}, 'stop')], { usage: null }), `data: ${JSON.stringify({ id: 'chatcmpl-9', object: 'chat.completion.chunk', created: 1741290958, model: MODEL, choices: [], usage: '__USAGE__' }).replace('"__USAGE__"', usage)}\n\n`, DONE]);
      const g = await rated({ openai: answer }, [{ provider: 'openai' }], { provider: { streamUsage: true } });
      const got = await drain(await agents(g).chat.completions.create({ ...params, stream: true }));
      expect(got).toMatchObject({ error: undefined, text: TEXT });
      expect(got.chunks.filter((c) => 'usage' in c)).toEqual([]);
      const [line] = await requestLines(g, 1);
      expect(line).toMatchObject({ outcome: 'success', streamEnd: 'complete' });
      expect(line!.usage).toBeUndefined();
      expect(await tokens(g)).toEqual({});
      expect(await charged(g)).toBe(promptEstimate({ ...params, stream: true }) + 10);
    });
  }

  it('after a streamed count of 1e20, the target\'s counter still counts the next answer\'s tokens exactly', async () => {
    const huge = `data: ${JSON.stringify({ id: 'chatcmpl-9', object: 'chat.completion.chunk', created: 1741290958, model: MODEL, choices: [{ index: 0, delta: { content: 'ok' }, finish_reason: 'stop' }] }).slice(0, -1)},"usage":${BAD['1e20']}}\n\n`;
    const answer = (_b: Record<string, unknown>, n: number) => (n === 1 ? sse([cc([delta({ role: 'assistant', content: '' })]), huge, DONE]) : json(200, wholeChat('ok', { prompt_tokens: 11, completion_tokens: 2, total_tokens: 13 })));
    const g = await start({ openai: answer }, [{ provider: 'openai' }]);
    const got = await drain(await g.client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } }));
    expect(got).toMatchObject({ error: undefined, text: 'ok' });
    await g.client.chat.completions.create(params);
    const lines = await requestLines(g, 2);
    expect(lines.map((l) => l.usage)).toEqual([undefined, { prompt: 11, completion: 2 }]);
    expect(await tokens(g)).toEqual({ [`${TARGET} prompt`]: 11, [`${TARGET} completion`]: 2 });
  });
});
