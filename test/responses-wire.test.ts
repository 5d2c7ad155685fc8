// The Responses API through the gateway, replayed with OpenAI's event framing: the SDK's responses.stream() resolves
// only a response that reached response.completed, and raises on a cut, a response.failed or an error event after
// output (which the SDK alone would yield as an ordinary event and then resolve the partial snapshot).
import { describe, expect, it } from 'vitest';
import { baseResponse, fastRetries, msgItem, responsesHead, responsesTail, rev, textDelta, useScriptedGateway, type Script } from './helpers/scripted-provider.ts';

const gw = useScriptedGateway(fastRetries);


const textOf = (r: { output: unknown[] }) => (r.output as Array<{ type: string; content?: Array<{ type: string; text?: string }> }>).flatMap((o) => (o.type === 'message' ? o.content ?? [] : [])).map((c) => c.text ?? '').join('');
const full = (): string[] => [...responsesHead(), textDelta('Hel', 4), textDelta('lo', 5), ...responsesTail('Hello', 6)];

describe('Responses API on the wire', () => {
  it('R1 streams a whole response via responses.stream', async () => {
    const { client, seen } = await gw(() => ({ steps: full() }));
    const stream = client.responses.stream({ model: 'gpt-4.1', input: 'hi' });
    const types: string[] = [];
    stream.on('event', (e) => types.push(e.type));
    const final = await stream.finalResponse();
    expect(textOf(final)).toBe('Hello');
    expect(final.status).toBe('completed');
    expect(types[0]).toBe('response.created');
    expect(types.at(-1)).toBe('response.completed');
    expect(seen.length).toBe(1);
  });

  it('R2 a stream cut before response.completed rejects finalResponse', async () => {
    const { client } = await gw(() => ({ steps: [...responsesHead(), textDelta('Hel', 4), textDelta('lo', 5), ...responsesTail('Hello', 6).slice(0, 3)] }));
    await expect(client.responses.stream({ model: 'gpt-4.1', input: 'hi' }).finalResponse()).rejects.toThrow();
  });

  it('R2b a stream reset before response.completed rejects finalResponse', async () => {
    const { client } = await gw(() => ({ steps: [...responsesHead(), textDelta('Hel', 4), 20, { destroy: true }] }));
    await expect(client.responses.stream({ model: 'gpt-4.1', input: 'hi' }).finalResponse()).rejects.toThrow();
  });

  it('R3 response.failed before output is retried', async () => {
    const { client, seen } = await gw((_b, n) =>
      n === 1
        ? { steps: [rev('response.created', { response: baseResponse('in_progress') }, 0), rev('response.failed', { response: { ...baseResponse('failed'), error: { code: 'server_error', message: 'The model failed' } } }, 1)] }
        : { steps: full() },
    );
    const final = await client.responses.stream({ model: 'gpt-4.1', input: 'hi' }).finalResponse();
    expect(textOf(final)).toBe('Hello');
    expect(seen.length).toBe(2);
  });

  it('R4 error event before output is retried', async () => {
    const { client, seen } = await gw((_b, n) =>
      n === 1 ? { steps: [rev('response.created', { response: baseResponse('in_progress') }, 0), rev('error', { code: 'server_error', message: 'An error occurred', param: null }, 1)] } : { steps: full() },
    );
    const final = await client.responses.stream({ model: 'gpt-4.1', input: 'hi' }).finalResponse();
    expect(textOf(final)).toBe('Hello');
    expect(seen.length).toBe(2);
  });

  it('R5 response.failed after output: not retried, and the SDK must not resolve a partial response', async () => {
    const { client, seen } = await gw(() => ({
      steps: [...responsesHead(), textDelta('Hel', 4), rev('response.failed', { response: { ...baseResponse('failed'), error: { code: 'server_error', message: 'The model failed' } } }, 5)],
    }));
    const stream = client.responses.stream({ model: 'gpt-4.1', input: 'hi' });
    const res = await stream.finalResponse().then((r) => ({ ok: r.status }), (e: Error) => ({ err: String(e?.message ?? e) }));
    expect(seen.length).toBe(1);
    expect(res).toHaveProperty('err');
  });

  it('R6 error event after output: the raw create() iterator raises', async () => {
    const { client, seen } = await gw(() => ({
      steps: [...responsesHead(), textDelta('Hel', 4), rev('error', { code: 'server_error', message: 'An error occurred while processing your request.', param: null }, 5)],
    }));
    const stream = await client.responses.create({ model: 'gpt-4.1', input: 'hi', stream: true });
    const got: string[] = [];
    const res = await (async () => {
      for await (const e of stream) got.push(e.type);
      return 'ended';
    })().catch((e: Error) => `threw ${e.message}`);
    expect(seen.length).toBe(1);
    expect(res).toMatch(/^threw/);
  });

  /** A response's opening events up to its reasoning item's start (sequence numbers 0 to 2). */
  const reasoningOpens = (item: object): string[] => [
    rev('response.created', { response: baseResponse('in_progress') }, 0),
    rev('response.in_progress', { response: baseResponse('in_progress') }, 1),
    rev('response.output_item.added', { output_index: 0, item }, 2),
  ];

  it('R7 reasoning summary deltas count as first output', async () => {
    const reasoningItem = { id: 'rs_1', type: 'reasoning', summary: [] };
    const { client, seen } = await gw(
      () => ({
        steps: [
          ...reasoningOpens(reasoningItem),
          rev('response.reasoning_summary_part.added', { item_id: 'rs_1', output_index: 0, summary_index: 0, part: { type: 'summary_text', text: '' } }, 3),
          300,
          rev('response.reasoning_summary_text.delta', { item_id: 'rs_1', output_index: 0, summary_index: 0, delta: '**Thinking**' }, 4),
          1200,
          rev('response.reasoning_summary_text.done', { item_id: 'rs_1', output_index: 0, summary_index: 0, text: '**Thinking**' }, 5),
          rev('response.reasoning_summary_part.done', { item_id: 'rs_1', output_index: 0, summary_index: 0, part: { type: 'summary_text', text: '**Thinking**' } }, 6),
          rev('response.output_item.done', { output_index: 0, item: { ...reasoningItem, summary: [{ type: 'summary_text', text: '**Thinking**' }] } }, 7),
          rev('response.completed', { response: baseResponse('completed', [{ ...reasoningItem, summary: [{ type: 'summary_text', text: '**Thinking**' }] }], { input_tokens: 1, output_tokens: 1, total_tokens: 2 }) }, 8),
        ],
      }),
      { firstTokenMs: 800 },
    );
    const final = await client.responses.stream({ model: 'o4-mini', input: 'hi', reasoning: { effort: 'high', summary: 'auto' } }).finalResponse();
    expect(final.status).toBe('completed');
    expect(seen.length).toBe(1);
  });

  it('R7b a finished reasoning item or web search counts as first output, without a summary delta', async () => {
    // A reasoning model with its summary off (the default) searching the web: no delta for well past firstTokenMs,
    // while whole output items come. Timed out, each attempt ran the thinking and the searches again.
    const reasoningItem = { id: 'rs_1', type: 'reasoning', summary: [] };
    const search = { id: 'ws_1', type: 'web_search_call', status: 'completed', action: { type: 'search', query: 'weather' } };
    const message = { ...msgItem('Hello'), id: 'msg_1' };
    const where = { item_id: 'msg_1', output_index: 2, content_index: 0 };
    const { client, seen } = await gw(
      () => ({
        steps: [
          ...reasoningOpens(reasoningItem),
          500,
          rev('response.output_item.done', { output_index: 0, item: reasoningItem }, 3),
          rev('response.output_item.added', { output_index: 1, item: { ...search, status: 'in_progress' } }, 4),
          rev('response.web_search_call.in_progress', { item_id: 'ws_1', output_index: 1 }, 5),
          rev('response.web_search_call.searching', { item_id: 'ws_1', output_index: 1 }, 6),
          500,
          rev('response.web_search_call.completed', { item_id: 'ws_1', output_index: 1 }, 7),
          rev('response.output_item.done', { output_index: 1, item: search }, 8),
          500,
          rev('response.output_item.added', { output_index: 2, item: msgItem('', 'in_progress') }, 9),
          rev('response.content_part.added', { ...where, part: { type: 'output_text', text: '', annotations: [] } }, 10),
          rev('response.output_text.delta', { ...where, delta: 'Hello', logprobs: [] }, 11),
          rev('response.output_text.done', { ...where, text: 'Hello', logprobs: [] }, 12),
          rev('response.content_part.done', { ...where, part: { type: 'output_text', text: 'Hello', annotations: [] } }, 13),
          rev('response.output_item.done', { output_index: 2, item: message }, 14),
          rev('response.completed', { response: baseResponse('completed', [reasoningItem, search, message], { input_tokens: 1, output_tokens: 1, total_tokens: 2 }) }, 15),
        ],
      }),
      { firstTokenMs: 800 },
    );
    const final = await client.responses.stream({ model: 'o4-mini', input: 'weather?', tools: [{ type: 'web_search' }] }).finalResponse();
    expect(final.status).toBe('completed');
    expect(textOf(final)).toBe('Hello');
    expect(seen.length).toBe(1);
  });

  it('R8 function call arguments stream and parse', async () => {
    const fc = { id: 'fc_1', type: 'function_call', status: 'in_progress', arguments: '', call_id: 'call_1', name: 'get_weather' };
    const args = '{"location":"Paris, France"}';
    const steps = [
      rev('response.created', { response: baseResponse('in_progress') }, 0),
      rev('response.in_progress', { response: baseResponse('in_progress') }, 1),
      rev('response.output_item.added', { output_index: 0, item: fc }, 2),
      ...args.match(/.{1,3}/g)!.map((d, i) => rev('response.function_call_arguments.delta', { item_id: 'fc_1', output_index: 0, delta: d }, 3 + i)),
      rev('response.function_call_arguments.done', { item_id: 'fc_1', output_index: 0, arguments: args }, 40),
      rev('response.output_item.done', { output_index: 0, item: { ...fc, status: 'completed', arguments: args } }, 41),
      rev('response.completed', { response: baseResponse('completed', [{ ...fc, status: 'completed', arguments: args }], { input_tokens: 1, output_tokens: 1, total_tokens: 2 }) }, 42),
    ];
    const { client } = await gw(() => ({ steps }));
    const stream = client.responses.stream({ model: 'gpt-4.1', input: 'hi', tools: [{ type: 'function', name: 'get_weather', parameters: { type: 'object', properties: { location: { type: 'string' } }, required: ['location'], additionalProperties: false }, strict: true }] });
    let argText = '';
    stream.on('response.function_call_arguments.delta', (e) => (argText += e.delta));
    const final = await stream.finalResponse();
    expect(argText).toBe(args);
    expect((final.output[0] as { arguments: string }).arguments).toBe(args);
  });

  it('R9 non-stream, background and idempotency key', async () => {
    const { client, seen } = await gw((b, n): Script => {
      if (n === 1) return { status: 500, headers: { 'content-type': 'application/json' }, steps: ['{"error":{"message":"boom","type":"server_error","param":null,"code":null}}'] };
      const r = b.background ? { ...baseResponse('queued'), background: true } : baseResponse('completed', [msgItem('Hello')], { input_tokens: 1, output_tokens: 1, total_tokens: 2 });
      return { headers: { 'content-type': 'application/json', 'x-request-id': 'req_123' }, steps: [JSON.stringify(r)] };
    });
    const r = await client.responses.create({ model: 'gpt-4.1', input: 'hi', background: true, store: true }, { headers: { 'Idempotency-Key': 'idem-1' } });
    expect(r.status).toBe('queued');
    expect(seen.length).toBe(2);
    expect(seen.map((x) => x.headers['idempotency-key'])).toEqual(['idem-1', 'idem-1']);
    const r2 = await client.responses.create({ model: 'gpt-4.1', input: 'hi', previous_response_id: 'resp_prev' });
    expect(textOf(r2)).toBe('Hello');
    expect(seen.at(-1)!.body.previous_response_id).toBe('resp_prev');
  });

  it('R10 response.incomplete ends the stream cleanly', async () => {
    const inc = { ...baseResponse('incomplete', [msgItem('Hel', 'incomplete')], { input_tokens: 1, output_tokens: 1, total_tokens: 2 }), incomplete_details: { reason: 'max_output_tokens' } };
    const { client } = await gw(() => ({ steps: [...responsesHead(), textDelta('Hel', 4), rev('response.incomplete', { response: inc }, 5)] }));
    const stream = await client.responses.create({ model: 'gpt-4.1', input: 'hi', stream: true, max_output_tokens: 16 });
    const types: string[] = [];
    for await (const e of stream) types.push(e.type);
    expect(types.at(-1)).toBe('response.incomplete');
  });

  it('R11b a background stream starts at response.created: queued past firstTokenMs, it is neither retried nor failed', async () => {
    // The job runs on at the provider whatever becomes of the connection: a retry would start a second one beside it,
    // and the client, held until the first output, would never learn the id to resume, poll or cancel the first by.
    const created = rev('response.created', { response: { ...baseResponse('queued'), background: true } }, 0);
    const { client, seen } = await gw(
      () => ({ steps: [created, rev('response.queued', { response: { ...baseResponse('queued'), background: true } }, 1), 1_500, ...responsesHead().slice(1), textDelta('Hel', 4), textDelta('lo', 5), ...responsesTail('Hello', 6)] }),
      { firstTokenMs: 800 },
    );
    const stream = client.responses.stream({ model: 'o3', input: 'hi', background: true });
    const firstEvent = new Promise<{ type: string; at: number }>((resolve) => stream.on('event', (e) => resolve({ type: e.type, at: Date.now() })));
    const started = Date.now();
    const final = await stream.finalResponse();
    expect(textOf(final)).toBe('Hello');
    expect(seen.length).toBe(1);
    const first = await firstEvent;
    expect(first.type).toBe('response.created');
    expect(first.at - started).toBeLessThan(1_000);
  });

  it('R11d a background stream that thinks silently after response.created is bounded by firstTokenMs, not cut at idleMs', async () => {
    // A reasoning model with no summary sends nothing between its response.created and its first output: firstTokenMs
    // is the operator's bound on that silence (longer than the longest thinking), idleMs the one on gaps within an answer.
    const created = rev('response.created', { response: { ...baseResponse('in_progress'), background: true } }, 0);
    const { client, seen } = await gw(() => ({ steps: [created, 1_500, ...responsesHead().slice(1), textDelta('Hel', 4), textDelta('lo', 5), ...responsesTail('Hello', 6)] }), {
      firstTokenMs: 5_000,
      idleMs: 600,
    });
    const final = await client.responses.stream({ model: 'o3-pro', input: 'hi', background: true }).finalResponse();
    expect(textOf(final)).toBe('Hello');
    expect(seen.length).toBe(1);
  });

  it('R11e a background stream is bounded by idleMs again once its first output has come', async () => {
    const created = rev('response.created', { response: { ...baseResponse('in_progress'), background: true } }, 0);
    const { client, seen } = await gw(() => ({ steps: [created, ...responsesHead().slice(1), textDelta('Hel', 4), 1_500, textDelta('lo', 5), ...responsesTail('Hello', 6)] }), {
      firstTokenMs: 5_000,
      idleMs: 600,
    });
    const err = await client.responses.stream({ model: 'o3-pro', input: 'hi', background: true }).finalResponse().catch((e: unknown) => e);
    expect(String(err)).toMatch(/stalled/);
    expect(seen.length).toBe(1);
  });

  it('R11f a background stream that sends only pings after response.created is still cut at firstTokenMs: pings are no output', async () => {
    // A ping every 200 ms for 3 s: each resets idleMs, none the bound on the wait for the first output.
    const created = rev('response.created', { response: { ...baseResponse('in_progress'), background: true } }, 0);
    const pings = Array.from({ length: 15 }, () => [200, ': ping\n\n']).flat();
    const { client, seen } = await gw(() => ({ steps: [created, ...pings, ...responsesHead().slice(1), textDelta('Hel', 4), textDelta('lo', 5), ...responsesTail('Hello', 6)] }), {
      firstTokenMs: 1_000,
      idleMs: 600,
    });
    const started = Date.now();
    const err = await client.responses.stream({ model: 'o3-pro', input: 'hi', background: true }).finalResponse().catch((e: unknown) => e);
    expect(String(err)).toMatch(/stalled: no first token within 1000 ms/);
    expect(Date.now() - started).toBeLessThan(2_500);
    expect(seen.length).toBe(1);
  });

  it('R11c a stream that is not background is still held until its first output, and retried when it is late', async () => {
    const created = rev('response.created', { response: baseResponse('in_progress') }, 0);
    const { client, seen } = await gw((_b, n) => ({ steps: n === 1 ? [created, 1_500] : full() }), { firstTokenMs: 800 });
    const final = await client.responses.stream({ model: 'gpt-4.1', input: 'hi' }).finalResponse();
    expect(textOf(final)).toBe('Hello');
    expect(seen.length).toBe(2);
  });

  it('R11 background stream with response.queued then output', async () => {
    const { client } = await gw(() => ({
      steps: [rev('response.created', { response: { ...baseResponse('queued'), background: true } }, 0), rev('response.queued', { response: { ...baseResponse('queued'), background: true } }, 1), 200, ...responsesHead().slice(1).map((x) => x), textDelta('Hel', 4), textDelta('lo', 5), ...responsesTail('Hello', 6)],
    }));
    const final = await client.responses.stream({ model: 'gpt-4.1', input: 'hi', background: true }).finalResponse();
    expect(textOf(final)).toBe('Hello');
  });
});
