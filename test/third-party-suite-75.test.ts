// Third-party failure-scenario suite 75: TOOL-CALLING AGENTS, the traffic the gateway exists for (README, "The
// incidents it exists to prevent": a tool call retried after the tool committed gave the user five coupons). Written
// from the README ("Retries" with "What a retry may repeat", "Failover and API families", "Deadlines and timeouts",
// "Streaming") and the providers' own documentation of the wire:
//  - OpenAI chat completions streaming: a tool call arrives as `delta.tool_calls[]` entries keyed by `index`; the first
//    entry of a call carries `id`, `type: "function"` and `function.name` (with `arguments: ""`), the later ones only
//    `function.arguments` fragments, which join into the call's JSON; parallel calls have their own `index`; the choice
//    ends with `finish_reason: "tool_calls"`, then `data: [DONE]`.
//  - Anthropic Messages streaming: a `content_block_start` whose block is `{"type": "tool_use", "id": "toolu_...",
//    "name": ..., "input": {}}`, then `content_block_delta` events of `input_json_delta` with `partial_json` fragments,
//    `content_block_stop`, a `message_delta` with `stop_reason: "tool_use"`, `message_stop`.
// Driven with the official `openai` 6.x SDK (its `stream()` / `finalChatCompletion()` and `runTools()` helpers, and raw
// `create({ stream: true })`) over real HTTP on 127.0.0.1, against node:http upstreams of the suite's own
// (test/helpers/scripted-upstreams.ts) that send exactly those bytes.
// What the earlier tool-call suites (anthropic-*, cross-family-agents, sdk-surfaces, chat-wire C1, sse-framing-wire,
// third-party-suite-39, -55, -68, -70 and others) leave out, and this suite checks:
//  1. a stream whose first output is a tool call's opening delta (no content at all): it releases the held status and
//     starts idleMs, so a model that names its tool at once and writes the arguments slowly (gaps under idleMs, the
//     whole past firstTokenMs) is neither retried nor timed out, on an OpenAI target and translated from Anthropic; and
//     a break right after that opening delta is the client's error, never a retry of a call the client has seen;
//  2. parallel calls whose fragments interleave by index, with the arguments split inside a UTF-8 character (between
//     TCP writes) and inside JSON escapes, after a 503 retry: every event reaches the client as the upstream wrote it;
//  3. a stream cut in the middle of the second call's arguments: `runTools()` runs no tool at all (not even the first,
//     whole, call), and the upstream is asked once; and an upstream that ends the stream with `[DONE]` in the middle of
//     the arguments, with no finish_reason: the SDK helper refuses it (the gateway invents no finish);
//  4. the second turn of a `runTools()` loop (the assistant's tool_calls and the tool results sent back) failing on the
//     OpenAI primary (503s, then broken streams) and failed over to an Anthropic target: the tool_use / tool_result ids
//     are the OpenAI call ids, and a call Claude makes (toolu_...) reaches the primary's next turn under its own id;
//  5. a turn carrying tool results whose first attempt timed out after it was sent (README "What a retry may repeat"):
//     sent again, byte for byte, where `retryOn` lists `timeout` (the model call only costs tokens: the tool already ran
//     at the agent); sent once and answered 504 with x-should-retry false where it does not, the SDK's own retries off.
//  6. an Anthropic stream translated for an OpenAI agent that ends with `message_stop` while a tool_use block is still
//     open (no content_block_stop, no stop_reason), and the same with the block closed (a compatible server that sends
//     no message_delta).
// Found here: (6) the translator made up `finish_reason: "stop"` and `[DONE]` for a message_stop with no stop_reason
// even with a tool_use block still open, so the agent got a clean answer whose call had half its input ({"city":
// "Kra): `finalChatCompletion()` resolved and runTools() went on to a second turn. Fixed in
// src/providers/anthropic/stream.ts (no made-up end while a tool_use block is open: the live stream ends it as a cut).
// An OpenAI-family upstream that sends `data: [DONE]` in the middle of a call's arguments (no finish_reason, no event
// dropped) was passed on as a clean end (the SDK helpers refused it for the missing finish, raw readers did not): now a
// cut (src/streaming/answer-progress.ts, cutByDone). Design question, not built: on /v1/messages a message_stop with a tool_use block open and no stop_reason is passed on as
// the provider sent it (the Anthropic SDK's finalMessage() resolves with that tool_use and stop_reason null).
// Bounds are generous: a loaded 2-core machine.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { sdkError } from './helpers/openai-error.ts';
import { cc, completion, delta, DONE, json, type Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams, type UpstreamsGateway } from './helpers/scripted-upstreams.ts';
import { recordingFetch } from './helpers/stack.ts';
import { aev, anthropicSse, args, FINISH_TOOLS, messageStart, opens, ROLE, runnableWeather, toolChunk } from './helpers/tool-stream.ts';

const gw = useScriptedUpstreams();
const messages = [{ role: 'user' as const, content: 'What is the weather in Zürich and in Kraków?' }];
const weatherParams = { type: 'object', properties: { city: { type: 'string' }, note: { type: 'string' } }, required: ['city'] };
const tools = [{ type: 'function' as const, function: { name: 'get_weather', description: 'Weather of a city', parameters: weatherParams } }];


/** An SDK client that records the headers of every answer it gets (runTools() hides them). */
function recordingClient(g: UpstreamsGateway, heads: Headers[], maxRetries = 0): OpenAI {
  return new OpenAI({
    baseURL: g.s.baseURL,
    apiKey: 'sk-client-not-a-provider-key',
    maxRetries,
    fetch: recordingFetch(heads),
  });
}


describe('a tool call as the first output of a stream (no content before it)', () => {
  it('on an OpenAI target: the opening delta releases the headers and starts idleMs; slow arguments past firstTokenMs are neither retried nor cut', async () => {
    const g = await gw(
      {
        a: () => ({
          steps: [ROLE, 250, toolChunk(opens(0, 'call_Zr1', 'get_weather')),
            450, toolChunk(args(0, '{"ci')), 450, toolChunk(args(0, 'ty": "Zü')), 450, toolChunk(args(0, 'rich"}')), 450, FINISH_TOOLS, DONE],
        }),
      },
      [{ provider: 'a' }],
      { provider: { timeouts: { connectMs: 1_000, firstTokenMs: 700, idleMs: 1_500 } }, route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } } },
    );
    const t0 = Date.now();
    const { data: stream, response } = await g.client.chat.completions.create({ model: 'gpt-4o', messages, tools, stream: true }).withResponse();
    const headersAfter = Date.now() - t0;
    // The headers came with the opening delta (~250 ms), not with the end of the stream (~2 s).
    expect(headersAfter).toBeLessThan(1_500);
    expect(response.headers.get('x-stormgate-attempts')).toBe('1');
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    const elapsed = Date.now() - t0;
    expect(elapsed).toBeGreaterThan(1_500); // well past firstTokenMs: only the opening delta was first
    const calls = chunks.flatMap((c) => c.choices[0]?.delta.tool_calls ?? []);
    expect(calls[0]).toMatchObject({ index: 0, id: 'call_Zr1', type: 'function', function: { name: 'get_weather', arguments: '' } });
    expect(JSON.parse(calls.map((c) => c.function?.arguments ?? '').join(''))).toEqual({ city: 'Zürich' });
    expect(chunks.at(-1)?.choices[0]?.finish_reason).toBe('tool_calls');
    expect(g.seen.a).toHaveLength(1);
  });

  it('translated from an Anthropic target: a tool_use block that opens the message is the first output; slow input_json_delta is not retried', async () => {
    const g = await gw(
      {
        c: {
          family: 'anthropic',
          answer: () =>
            anthropicSse([
              messageStart(), 200,
              aev('content_block_start', { index: 0, content_block: { type: 'tool_use', id: 'toolu_01Zr', name: 'get_weather', input: {} } }),
              aev('content_block_delta', { index: 0, delta: { type: 'input_json_delta', partial_json: '' } }), 450,
              aev('ping'), 450,
              aev('content_block_delta', { index: 0, delta: { type: 'input_json_delta', partial_json: '{"city": "Kra' } }), 450,
              aev('content_block_delta', { index: 0, delta: { type: 'input_json_delta', partial_json: 'ków"}' } }),
              aev('content_block_stop', { index: 0 }),
              aev('message_delta', { delta: { stop_reason: 'tool_use', stop_sequence: null }, usage: { output_tokens: 22 } }),
              aev('message_stop'),
            ]),
        },
      },
      [{ provider: 'c', model: 'claude-sonnet-4-6' }],
      { provider: { timeouts: { connectMs: 1_000, firstTokenMs: 700, idleMs: 1_500 } }, route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } } },
    );
    const final = await g.client.chat.completions.stream({ model: 'gpt-4o', messages, tools }).finalChatCompletion();
    const choice = final.choices[0]!;
    expect(choice.finish_reason).toBe('tool_calls');
    expect(choice.message.content).toBeNull();
    expect(choice.message.tool_calls).toHaveLength(1);
    const call = choice.message.tool_calls![0] as { id: string; function: { name: string; arguments: string } };
    expect(call.id).toBe('toolu_01Zr');
    expect(call.function.name).toBe('get_weather');
    expect(JSON.parse(call.function.arguments)).toEqual({ city: 'Kraków' });
    expect(g.seen.c).toHaveLength(1);
  });

  it('a break right after the opening delta (the call named, no arguments yet) is the client\'s error: never retried, never a clean end', async () => {
    const g = await gw(
      { a: () => ({ steps: [ROLE, toolChunk(opens(0, 'call_Cut1', 'get_weather')), 100, { destroy: true }] }) },
      [{ provider: 'a' }],
      { route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } } },
    );
    const stream = g.client.chat.completions.stream({ model: 'gpt-4o', messages, tools });
    const err = await sdkError(stream.finalChatCompletion());
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.code).toBe('stream_interrupted');
    expect(g.seen.a).toHaveLength(1);
  });
});

/** The events' bytes, written in pieces that end inside UTF-8 characters (and every 23 bytes besides), 1 ms apart. */
function splitWrites(events: string[]): Script['steps'] {
  const bytes = Buffer.from(events.join(''), 'utf8');
  const cuts = new Set<number>();
  for (let i = 23; i < bytes.length; i += 23) cuts.add(i);
  // One byte into each multi-byte character's encoding: the piece ends inside the character.
  for (let i = 0; i < bytes.length; i++) if (bytes[i]! >= 0xc0) cuts.add(i + 1);
  const sorted = [...cuts].sort((x, y) => x - y);
  const steps: Script['steps'] = [];
  let from = 0;
  for (const at of sorted) {
    steps.push(bytes.subarray(from, at), 1);
    from = at;
  }
  steps.push(bytes.subarray(from));
  return steps;
}

/** The data of each event of a raw SSE text, in order. */
const dataLines = (sse: string) => sse.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice('data: '.length));

describe('parallel calls interleaved by index, their arguments split at awkward places', () => {
  // Call 0's arguments hold an escaped quote, an escaped newline and an emoji; call 1's a \u escape and an escaped
  // backslash. Fragments end between a backslash and what it escapes, and inside a \u escape.
  const args0 = '{"city": "Zürich", "note": "say \\"grüezi\\"\\n🌧"}';
  const args1 = '{"city": "Krak\\u00f3w", "note": "50\\\\50 ☔"}';
  const frags0 = ['{"city": "Zü', 'rich", "note": "say \\', '"grüezi\\', '"\\', 'n🌧"}'];
  const frags1 = ['{"city": "Krak\\u0', '0f3w", "note": "50\\', '\\50 ☔', '"}'];
  expect(frags0.join('')).toBe(args0);
  expect(frags1.join('')).toBe(args1);
  const events = [
    ROLE,
    toolChunk(opens(0, 'call_Zrh', 'get_weather')),
    toolChunk(opens(1, 'call_Krk', 'get_weather')),
    ...frags0.flatMap((f, i) => (i < frags1.length ? [toolChunk(args(0, f)), toolChunk(args(1, frags1[i]!))] : [toolChunk(args(0, f))])),
    // One chunk may carry fragments of both calls: an empty tail for each, as some servers send.
    toolChunk(args(1, ''), args(0, '')),
    FINISH_TOOLS,
    DONE,
  ];
  const up = () => (_body: Record<string, unknown>, n: number): Script =>
    n % 2 === 1 ? json(503, { error: { message: 'The server is overloaded', type: 'server_error', code: null } }) : { steps: splitWrites(events) };

  it('after a 503 retry, the client gets every event as the upstream wrote it, byte for byte', async () => {
    const g = await gw({ a: up() }, [{ provider: 'a' }]);
    const r = await fetch(`${g.s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages, tools, stream: true }) });
    expect(r.status).toBe(200);
    expect(r.headers.get('x-stormgate-attempts')).toBe('2');
    const text = await r.text();
    expect(dataLines(text)).toEqual(dataLines(events.join('')));
    expect(g.seen.a).toHaveLength(2);
    expect(g.seen.a![1]!.headers['x-retry-reason']).toBe('status_503');
  });

  it('finalChatCompletion() assembles both calls: ids, names, and arguments that parse to what the model wrote', async () => {
    const g = await gw({ a: up() }, [{ provider: 'a' }]);
    const deltas: Array<{ index: number; args: string }> = [];
    const stream = g.client.chat.completions.stream({ model: 'gpt-4o', messages, tools });
    stream.on('tool_calls.function.arguments.delta', (e) => deltas.push({ index: e.index, args: e.arguments_delta }));
    const final = await stream.finalChatCompletion();
    const choice = final.choices[0]!;
    expect(choice.finish_reason).toBe('tool_calls');
    const calls = choice.message.tool_calls as Array<{ id: string; type: string; function: { name: string; arguments: string } }>;
    expect(calls.map((c) => [c.id, c.type, c.function.name])).toEqual([['call_Zrh', 'function', 'get_weather'], ['call_Krk', 'function', 'get_weather']]);
    expect(calls[0]!.function.arguments).toBe(args0);
    expect(calls[1]!.function.arguments).toBe(args1);
    expect(JSON.parse(calls[0]!.function.arguments)).toEqual({ city: 'Zürich', note: 'say "grüezi"\n🌧' });
    expect(JSON.parse(calls[1]!.function.arguments)).toEqual({ city: 'Kraków', note: '50\\50 ☔' });
    // The fragments interleaved as sent: 0, 1, 0, 1, ...
    expect(deltas.filter((d) => d.args !== '').map((d) => d.index)).toEqual([0, 1, 0, 1, 0, 1, 0, 1, 0]);
    expect(g.seen.a).toHaveLength(2);
  });
});


describe('a stream cut inside the tool-call arguments', () => {
  const wholeFirstHalfSecond = [
    ROLE,
    toolChunk(opens(0, 'call_One', 'get_weather')),
    toolChunk(args(0, '{"city": "Zürich"}')),
    toolChunk(opens(1, 'call_Two', 'get_weather')),
    toolChunk(args(1, '{"city": "Kra')),
  ];

  it('ended cleanly by the upstream with no finish and no [DONE]: runTools() runs no tool, not even the whole first call; asked upstream once', async () => {
    const g = await gw({ a: () => ({ steps: [...wholeFirstHalfSecond, 50] }) }, [{ provider: 'a' }], {
      route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } },
    });
    const ran: unknown[] = [];
    const runner = g.client.chat.completions.runTools({ model: 'gpt-4o', messages, stream: true, tools: [runnableWeather(ran, weatherParams)] });
    const err = await sdkError(runner.finalContent());
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.code).toBe('stream_interrupted');
    expect(ran).toEqual([]);
    expect(g.seen.a).toHaveLength(1);
  });

  it('reset mid-arguments: the raw iterator raises after the half call, its last chunk the fragment the upstream sent', async () => {
    const g = await gw({ a: () => ({ steps: [...wholeFirstHalfSecond, 50, { destroy: true }] }) }, [{ provider: 'a' }]);
    const stream = await g.client.chat.completions.create({ model: 'gpt-4o', messages, tools, stream: true });
    const seen: string[] = [];
    const err = await sdkError(
      (async () => {
        for await (const chunk of stream) for (const c of chunk.choices[0]?.delta.tool_calls ?? []) seen.push(`${c.index}:${c.id ?? ''}:${c.function?.arguments ?? ''}`);
      })(),
    );
    expect(err.code).toBe('stream_interrupted');
    expect(seen).toEqual(['0:call_One:', '0::{"city": "Zürich"}', '1:call_Two:', '1::{"city": "Kra']);
    expect(g.seen.a).toHaveLength(1);
  });

  it('[DONE] in the middle of the arguments, with no finish_reason: a cut, the error event in place of the [DONE]; no tool runs, raw readers are told too', async () => {
    const g = await gw({ a: () => ({ steps: [...wholeFirstHalfSecond, DONE] }) }, [{ provider: 'a' }]);
    const ran: unknown[] = [];
    const runner = g.client.chat.completions.runTools({ model: 'gpt-4o', messages, stream: true, tools: [runnableWeather(ran, weatherParams)] });
    const err = await sdkError(runner.finalContent());
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.code).toBe('stream_interrupted');
    expect(ran).toEqual([]);
    const r = await fetch(`${g.s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages, tools, stream: true }) });
    const text = await r.text();
    expect(text).not.toContain('"finish_reason":"tool_calls"');
    expect(text).not.toContain('data: [DONE]');
    expect(text).toContain('"code":"stream_interrupted"');
    expect(g.seen.a).toHaveLength(2);
  });

  it('[DONE] after whole arguments with no finish_reason (a server that never sends one) is the end it says, passed on', async () => {
    const g = await gw({ a: () => ({ steps: [ROLE, toolChunk(opens(0, 'call_One', 'get_weather')), toolChunk(args(0, '{"city": "Zürich"}')), DONE] }) }, [{ provider: 'a' }]);
    const r = await fetch(`${g.s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages, tools, stream: true }) });
    const text = await r.text();
    expect(text.trimEnd().endsWith('data: [DONE]')).toBe(true);
    expect(text).not.toContain('stream_interrupted');
  });
});

/** A whole chat completion whose answer is tool calls. */
const toolCompletion = (calls: Array<[id: string, argsJson: string]>): Script =>
  json(200, {
    id: 'chatcmpl-tools1',
    object: 'chat.completion',
    created: 1741290958,
    model: 'gpt-4o-2024-08-06',
    choices: [{ index: 0, message: { role: 'assistant', content: null, refusal: null, tool_calls: calls.map(([id, a]) => ({ id, type: 'function', function: { name: 'get_weather', arguments: a } })) }, logprobs: null, finish_reason: 'tool_calls' }],
    usage: { prompt_tokens: 60, completion_tokens: 30, total_tokens: 90 },
  });
const overloaded = () => json(503, { error: { message: 'The server is overloaded', type: 'server_error', code: null } });

/** The text of a tool_result block's content, a string or a list of text blocks. */
const resultText = (content: unknown): string =>
  typeof content === 'string' ? content : (content as Array<{ type: string; text?: string }>).map((b) => b.text ?? '').join('');

interface AnthropicBlock { type: string; id?: string; name?: string; input?: unknown; tool_use_id?: string; content?: unknown }
interface AnthropicTurn { role: string; content: string | AnthropicBlock[] }

describe('the second turn of a tool loop fails on the OpenAI primary and is failed over to Claude', () => {
  it('runTools(), whole: three 503s on turn 2, then Claude gets tool_use and tool_result blocks under the OpenAI call ids; each tool ran once', async () => {
    const g = await gw(
      {
        a: (_b, n) => (n === 1 ? toolCompletion([['call_Zrh', '{"city": "Zürich"}'], ['call_Krk', '{"city": "Kraków"}']]) : overloaded()),
        c: {
          family: 'anthropic',
          answer: () =>
            json(200, {
              id: 'msg_01Turn2', type: 'message', role: 'assistant', model: 'claude-sonnet-4-6',
              content: [{ type: 'text', text: 'Rain in both: Zürich 14 °C, Kraków 11 °C.' }],
              stop_reason: 'end_turn', stop_sequence: null, usage: { input_tokens: 120, output_tokens: 18 },
            }, { 'request-id': 'req_01Turn2' }),
        },
      },
      [{ provider: 'a' }, { provider: 'c', model: 'claude-sonnet-4-6' }],
      { route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } } },
    );
    const heads: Headers[] = [];
    const client = recordingClient(g, heads);
    const ran: Array<{ city: string }> = [];
    const runner = client.chat.completions.runTools({ model: 'gpt-4o', messages, tools: [runnableWeather(ran, weatherParams)] });
    expect(await runner.finalContent()).toBe('Rain in both: Zürich 14 °C, Kraków 11 °C.');
    expect(ran).toEqual([{ city: 'Zürich' }, { city: 'Kraków' }]);
    // Turn 1 on the primary; turn 2 three times on the primary, then once on Claude.
    expect(g.seen.a).toHaveLength(4);
    expect(g.seen.c).toHaveLength(1);
    expect(heads.map((h) => h.get('x-stormgate-attempts'))).toEqual(['1', '4']);
    expect(heads[1]!.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(heads[1]!.get('x-stormgate-target')).toBe('c/claude-sonnet-4-6');
    // Every attempt on the primary carried the same turn: the tool calls and both results.
    const turn2 = g.seen.a!.slice(1).map((s) => s.raw);
    expect(new Set(turn2).size).toBe(1);
    const sent = g.seen.a![1]!.body.messages as Array<Record<string, unknown>>;
    expect(sent.map((m) => m.role)).toEqual(['user', 'assistant', 'tool', 'tool']);
    expect(sent.slice(2).map((m) => m.tool_call_id)).toEqual(['call_Zrh', 'call_Krk']);
    // What Claude got: the call ids as tool_use ids and as the tool_results' tool_use_id, the inputs as objects.
    const claude = g.seen.c![0]!.body.messages as AnthropicTurn[];
    expect(claude.map((m) => m.role)).toEqual(['user', 'assistant', 'user']);
    const uses = (claude[1]!.content as AnthropicBlock[]).filter((b) => b.type === 'tool_use');
    expect(uses.map((b) => [b.id, b.name, b.input])).toEqual([['call_Zrh', 'get_weather', { city: 'Zürich' }], ['call_Krk', 'get_weather', { city: 'Kraków' }]]);
    const results = (claude[2]!.content as AnthropicBlock[]).filter((b) => b.type === 'tool_result');
    expect(results.map((b) => [b.tool_use_id, resultText(b.content)])).toEqual([['call_Zrh', 'Zürich: 14 °C, rain'], ['call_Krk', 'Kraków: 14 °C, rain']]);
    expect((g.seen.c![0]!.body.tools as Array<{ name: string }>).map((t) => t.name)).toEqual(['get_weather']);
  });

  it('runTools(), streamed: turn 2 breaks before its first output on the primary, Claude streams a call of its own, and turn 3 carries its toolu_ id back to the primary', async () => {
    const g = await gw(
      {
        a: (_b, n) => {
          if (n === 1) {
            return { steps: [ROLE, toolChunk(opens(0, 'call_Zrh', 'get_weather')), toolChunk(args(0, '{"city": "Zürich"}')), FINISH_TOOLS, DONE] };
          }
          if (n <= 3) return { steps: [ROLE, 20, { destroy: true }] };
          return { steps: [ROLE, cc([delta({ content: 'Zürich and Bern: rain.' })]), cc([delta({}, 'stop')]), DONE] };
        },
        c: {
          family: 'anthropic',
          answer: () =>
            anthropicSse([
              messageStart(),
              aev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
              aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Checking Bern too.' } }),
              aev('content_block_stop', { index: 0 }),
              aev('content_block_start', { index: 1, content_block: { type: 'tool_use', id: 'toolu_01Bern', name: 'get_weather', input: {} } }),
              aev('content_block_delta', { index: 1, delta: { type: 'input_json_delta', partial_json: '{"city": "B' } }),
              aev('content_block_delta', { index: 1, delta: { type: 'input_json_delta', partial_json: 'ern"}' } }),
              aev('content_block_stop', { index: 1 }),
              aev('message_delta', { delta: { stop_reason: 'tool_use', stop_sequence: null }, usage: { output_tokens: 30 } }),
              aev('message_stop'),
            ]),
        },
      },
      [{ provider: 'a' }, { provider: 'c', model: 'claude-sonnet-4-6' }],
    );
    const heads: Headers[] = [];
    const client = recordingClient(g, heads);
    const ran: Array<{ city: string }> = [];
    const runner = client.chat.completions.runTools({ model: 'gpt-4o', messages, stream: true, tools: [runnableWeather(ran, weatherParams)] });
    expect(await runner.finalContent()).toBe('Zürich and Bern: rain.');
    expect(ran).toEqual([{ city: 'Zürich' }, { city: 'Bern' }]);
    expect(g.seen.a).toHaveLength(4);
    expect(g.seen.c).toHaveLength(1);
    expect(heads.map((h) => h.get('x-stormgate-attempts'))).toEqual(['1', '3', '1']);
    expect(heads[1]!.get('x-stormgate-target')).toBe('c/claude-sonnet-4-6');
    // Claude was sent the primary's call id on both sides of the round trip.
    const claude = g.seen.c![0]!.body.messages as AnthropicTurn[];
    expect((claude[1]!.content as AnthropicBlock[]).find((b) => b.type === 'tool_use')).toMatchObject({ id: 'call_Zrh', input: { city: 'Zürich' } });
    expect((claude[2]!.content as AnthropicBlock[]).find((b) => b.type === 'tool_result')).toMatchObject({ tool_use_id: 'call_Zrh' });
    // Turn 3 on the primary: Claude's call under its own id, its text beside it, and the result answering that id.
    const turn3 = g.seen.a![3]!.body.messages as Array<{ role: string; content?: unknown; tool_calls?: Array<{ id: string; function: { name: string; arguments: string } }>; tool_call_id?: string }>;
    expect(turn3.map((m) => m.role)).toEqual(['user', 'assistant', 'tool', 'assistant', 'tool']);
    expect(turn3[3]!.content).toBe('Checking Bern too.');
    expect(turn3[3]!.tool_calls!.map((t) => [t.id, t.function.name, JSON.parse(t.function.arguments)])).toEqual([['toolu_01Bern', 'get_weather', { city: 'Bern' }]]);
    expect(turn3[4]!.tool_call_id).toBe('toolu_01Bern');
  });
});

describe('a turn carrying tool results whose first attempt timed out after it was sent (README "What a retry may repeat")', () => {
  // The agent ran the tool before this turn: what goes upstream is the model call with its result, a proposal at most.
  const history = [
    ...messages,
    { role: 'assistant' as const, content: null, tool_calls: [{ id: 'call_Cpn', type: 'function' as const, function: { name: 'issue_coupon', arguments: '{"user": "u-481", "amount": 5}' } }] },
    { role: 'tool' as const, tool_call_id: 'call_Cpn', content: '{"coupon": "CPN-7781", "status": "issued"}' },
  ];
  const couponTool = [{ type: 'function' as const, function: { name: 'issue_coupon', parameters: { type: 'object', properties: { user: { type: 'string' }, amount: { type: 'number' } } } } }];
  const answerAfterHang = (_b: Record<string, unknown>, n: number): Script | 'hang' => (n === 1 ? 'hang' : completion('Your coupon CPN-7781 is ready.', 'gpt-4o'));

  it('with timeout in retryOn (the default): sent again byte for byte, the tool result included, and the retry answers the agent', async () => {
    const g = await gw({ a: answerAfterHang as never }, [{ provider: 'a' }], {
      provider: { timeouts: { connectMs: 1_000, firstTokenMs: 5_000, idleMs: 5_000, responseMs: 600 } },
      route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } },
    });
    const { data, response } = await g.client.chat.completions.create({ model: 'gpt-4o', messages: history, tools: couponTool }).withResponse();
    expect(data.choices[0]!.message.content).toBe('Your coupon CPN-7781 is ready.');
    expect(data.choices[0]!.message.tool_calls ?? []).toEqual([]);
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(g.seen.a).toHaveLength(2);
    expect(g.seen.a![1]!.raw).toBe(g.seen.a![0]!.raw);
    expect((g.seen.a![1]!.body.messages as Array<{ tool_call_id?: string }>)[2]!.tool_call_id).toBe('call_Cpn');
    expect(g.seen.a![1]!.headers['x-retry-attempt']).toBe('1');
    expect(g.seen.a![1]!.headers['x-retry-reason']).toBe('timeout_response');
  });

  it('on a route whose retryOn leaves timeout out: sent once, 504 upstream_timeout with x-should-retry false, and the SDK (maxRetries 2) does not send it again', async () => {
    const g = await gw({ a: answerAfterHang as never }, [{ provider: 'a' }], {
      provider: { timeouts: { connectMs: 1_000, firstTokenMs: 5_000, idleMs: 5_000, responseMs: 600 } },
      route: { retry: { maxAttempts: 3, retryOn: [429, 503], backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } },
    });
    const heads: Headers[] = [];
    const client = recordingClient(g, heads, 2);
    const err = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages: history, tools: couponTool }));
    expect(err.status).toBe(504);
    expect(err.code).toBe('upstream_timeout');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(heads).toHaveLength(1);
    expect(g.seen.a).toHaveLength(1);
  });
});

describe('an Anthropic stream that ends inside a tool_use block, translated for an OpenAI agent', () => {
  const openCall = [
    messageStart(),
    aev('content_block_start', { index: 0, content_block: { type: 'tool_use', id: 'toolu_01Half', name: 'get_weather', input: {} } }),
    aev('content_block_delta', { index: 0, delta: { type: 'input_json_delta', partial_json: '{"city": "Kra' } }),
  ];

  it('message_stop with the block still open (no content_block_stop, no stop_reason): the SDK raises, never a call with half its input', async () => {
    const g = await gw(
      { c: { family: 'anthropic', answer: () => anthropicSse([...openCall, aev('message_stop')]) } },
      [{ provider: 'c', model: 'claude-sonnet-4-6' }],
    );
    const ran: unknown[] = [];
    const runner = g.client.chat.completions.runTools({ model: 'gpt-4o', messages, stream: true, tools: [runnableWeather(ran, weatherParams)] });
    const err = await sdkError(runner.finalChatCompletion());
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.code).toBe('stream_interrupted');
    expect(ran).toEqual([]);
    expect(g.seen.c).toHaveLength(1);
  });
});

describe('an Anthropic stream whose tool_use block closed, then message_stop without a message_delta (a compatible server)', () => {
  it('is a whole answer: the SDK gets the call with its whole input, and runTools() runs it once', async () => {
    const g = await gw(
      {
        c: {
          family: 'anthropic',
          answer: (_b, n) =>
            n === 1
              ? anthropicSse([
                  messageStart(),
                  aev('content_block_start', { index: 0, content_block: { type: 'tool_use', id: 'toolu_01Whole', name: 'get_weather', input: {} } }),
                  aev('content_block_delta', { index: 0, delta: { type: 'input_json_delta', partial_json: '{"city": "Kra' } }),
                  aev('content_block_delta', { index: 0, delta: { type: 'input_json_delta', partial_json: 'ków"}' } }),
                  aev('content_block_stop', { index: 0 }),
                  aev('message_stop'),
                ])
              : anthropicSse([
                  messageStart(),
                  aev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
                  aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Kraków: rain.' } }),
                  aev('content_block_stop', { index: 0 }),
                  aev('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 5 } }),
                  aev('message_stop'),
                ]),
        },
      },
      [{ provider: 'c', model: 'claude-sonnet-4-6' }],
    );
    const ran: unknown[] = [];
    const runner = g.client.chat.completions.runTools({ model: 'gpt-4o', messages, stream: true, tools: [runnableWeather(ran, weatherParams)] });
    expect(await runner.finalContent()).toBe('Kraków: rain.');
    expect(ran).toEqual([{ city: 'Kraków' }]);
    const turn2 = g.seen.c![1]!.body.messages as AnthropicTurn[];
    expect((turn2[1]!.content as AnthropicBlock[]).find((b) => b.type === 'tool_use')).toMatchObject({ id: 'toolu_01Whole', input: { city: 'Kraków' } });
    expect((turn2[2]!.content as AnthropicBlock[]).find((b) => b.type === 'tool_result')).toMatchObject({ tool_use_id: 'toolu_01Whole' });
  });
});
