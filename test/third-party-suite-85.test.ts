// Third-party failure-scenario suite 85: stormgate in front of OpenAI-COMPATIBLE servers that stream TOOL CALLS each
// in their own way. Checks that the [DONE] rule of e9fe5c6 (README "Streaming": a `data: [DONE]` before every choice's
// finish_reason is a cut when a tool call's arguments so far are not JSON, or when another choice has had its
// finish_reason) and the older tool-call rules (a malformed event inside a tool call is a cut) never turn a real
// server's good answer into an error, and do catch the truncations real servers produce. Each upstream below plays one
// server's stream shape as found in public reports (cited at each), and every good answer is read twice with the
// official `openai` 6.x SDK: through the gateway, and straight from the same scripted server, which must agree.
// Shapes played (sources):
//  - vLLM tool parsers: the call's name first (no arguments key), arguments in pieces, the rest of the arguments in
//    the finish chunk with id, type and name again (vllm-project/vllm#44098; the remaining-args delta of serving_chat),
//    finish_reason "tool_calls"; the hermes parser's garbled, duplicated arguments with a finish (vllm#10395); an
//    intermittent null finish_reason after a whole call (vllm#27572), as vllm-mlx sends (waybarrios/vllm-mlx#672,
//    tool_calls chunk then [DONE]) and NVIDIA NIM for GLM-5.1 (earendil-works/pi#6225).
//  - NVIDIA Dynamo: tool_calls with finish_reason null, a usage-only chunk, [DONE] (ai-dynamo/dynamo#10513).
//  - Ollama /v1: each call whole in one chunk, a separate finish chunk "stop" (ollama/ollama#7963, #11633), every
//    parallel call under index 0 (ollama#15457, cited in LibreChat-AI/agents#260).
//  - Mistral: the whole call in one chunk, finish_reason in the same chunk (microsoft/semantic-kernel#6316; 9-char ids).
//  - Groq: the whole call in one chunk (ogx-ai/ogx#630), then the finish with `x_groq.usage`.
//  - OpenRouter: `: OPENROUTER PROCESSING` comments, `provider` and `native_finish_reason` fields, the opening delta
//    carrying role and the call (openrouter.ai cassettes, e.g. charmbracelet/fantasy providertests multi_tool_streaming).
//  - llama.cpp server: `choices` first, a `timings` object on every chunk (openai-php/client#780).
//  - SGLang: the call's id and type on every chunk (InternLM/lmdeploy#3412), finish "stop" with a call before
//    sgl-project/sglang#7708; `"finish_reason": ""` on the chunks before the last (README; older SGLang and Ollama).
//  - LiteLLM proxy: no finish_reason key at all on chunks whose finish is None (BerriAI/liteLLM-proxy#19).
//  - Bedrock through an OpenAI-compatible layer: `{}` first, then the real arguments (openai/openai-agents-js#712).
//  - llm-d-inference-sim before llm-d/llm-d-inference-sim#545: no finish chunk at all for `length` (a max_tokens cut).
// Found: no misfire of the rule on these shapes; every good answer reaches the agent as it does directly, and the
// truncations (a max_tokens cut with no finish, an n: 2 stream ended between choices, SGLang-style "" finishes then
// [DONE] mid-arguments) end in `stream_interrupted`. Found and mended: the arguments were judged by (choice, index)
// alone, as the SDK assembles them, so parallel calls a server sends under one index with a new id each (Ollama, vLLM
// before its fix, Dynamo before ai-dynamo/dynamo#4723) read as `{...}{...}`, and from a server that also sends no
// finish_reason, that [DONE] was a cut, where an id-keyed client (LibreChat's repair) had two whole calls. A new id
// after whole arguments now starts a call of its own (src/streaming/answer-progress.ts).
// Bounds are generous: a loaded 2-core machine.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { sdkError } from './helpers/openai-error.ts';
import { DONE, scripted, type Answer, type Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams, type UpstreamsGateway, type UpstreamsOptions } from './helpers/scripted-upstreams.ts';
import { scrapeMetrics } from './helpers/stack.ts';
import { runnableWeather } from './helpers/tool-stream.ts';

const gw = useScriptedUpstreams();
const startDirect = useFakeProviders();
const messages = [{ role: 'user' as const, content: 'What is the weather in Zürich?' }];
const weatherParams = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] };
const tools = [{ type: 'function' as const, function: { name: 'get_weather', description: 'Weather of a city', parameters: weatherParams } }];

/** One SSE event of `data` as a server writes it (its own fields, not OpenAI's). */
const ev = (data: unknown) => `data: ${JSON.stringify(data)}\n\n`;
const sse = (steps: Script['steps']): Script => ({ steps });

interface Pair {
  g: UpstreamsGateway;
  /** An SDK client of the same scripted server, not through the gateway. */
  direct: OpenAI;
}

/** The gateway in front of `answer` (as provider `a`), and a client that reads the same server directly. */
async function pair(answer: Answer, opts?: UpstreamsOptions): Promise<Pair> {
  const g = await gw({ a: answer }, [{ provider: 'a' }], opts);
  const up = await startDirect(scripted(answer));
  return { g, direct: new OpenAI({ baseURL: `${up.origin}/v1`, apiKey: 'direct-key', maxRetries: 0 }) };
}

interface RawRead {
  /** Every tool call fragment, as `index:id:name:arguments`. */
  calls: string[];
  /** The calls' arguments joined by index, as an agent that reads raw chunks assembles them. */
  args: Record<number, string>;
  finishes: Array<string | null>;
  usage: unknown;
  error?: string;
}

/** Reads a stream with a raw `create({ stream: true })` iterator, as agents that assemble calls themselves do. */
async function rawRead(client: OpenAI, extra: Record<string, unknown> = {}): Promise<RawRead> {
  const out: RawRead = { calls: [], args: {}, finishes: [], usage: undefined };
  try {
    const stream = await client.chat.completions.create({ model: 'm', messages, tools, stream: true, ...extra } as OpenAI.ChatCompletionCreateParamsStreaming);
    for await (const chunk of stream) {
      if (chunk.usage) out.usage = chunk.usage;
      for (const c of chunk.choices) {
        if (c.finish_reason !== null && c.finish_reason !== undefined && (c.finish_reason as string) !== '') out.finishes.push(c.finish_reason);
        for (const t of c.delta?.tool_calls ?? []) {
          out.calls.push(`${t.index}:${t.id ?? ''}:${t.function?.name ?? ''}:${t.function?.arguments ?? ''}`);
          out.args[t.index] = (out.args[t.index] ?? '') + (t.function?.arguments ?? '');
        }
      }
    }
  } catch (e) {
    out.error = (e as { code?: string }).code ?? (e as Error).message;
  }
  return out;
}

/** What `stream()` + `finalChatCompletion()` gives: the first choice's finish and calls, or the error's code/message. */
async function finalOf(client: OpenAI): Promise<{ finish?: string; calls?: Array<[string, string, string]>; error?: string }> {
  try {
    const final = await client.chat.completions.stream({ model: 'm', messages, tools }).finalChatCompletion();
    const choice = final.choices[0]!;
    const calls = (choice.message.tool_calls ?? []) as Array<{ id: string; function: { name: string; arguments: string } }>;
    return { finish: choice.finish_reason, calls: calls.map((c) => [c.id, c.function.name, c.function.arguments]) };
  } catch (e) {
    return { error: (e as { code?: string }).code ?? (e as Error).message };
  }
}

/** Runs the weather tool through `runTools()` (streamed), answering turn 2 with the model's text. */
async function runToolsOn(client: OpenAI): Promise<{ ran: unknown[]; content?: string | null; error?: string }> {
  const ran: unknown[] = [];
  try {
    const content = await client.chat.completions.runTools({ model: 'm', messages, stream: true, tools: [runnableWeather(ran, weatherParams)] }).finalContent();
    return { ran, content };
  } catch (e) {
    return { ran, error: (e as { code?: string }).code ?? (e as Error).message };
  }
}

/** A turn that carries a tool's result: the second of a runTools() loop, answered with text. */
const hasToolResult = (body: Record<string, unknown>) => (body.messages as Array<{ role: string }>).some((m) => m.role === 'tool');

/** A second turn's text answer, in the same server's framing as `chunk` builds it. */
const textTurn = (chunk: (d: Record<string, unknown>, finish: string | null) => string): Script =>
  sse([chunk({ role: 'assistant', content: '' }, null), chunk({ content: 'Zürich: 14 °C, rain.' }, null), chunk({}, 'stop'), DONE]);

// ---- vLLM ----------------------------------------------------------------------------------------------------------
const vllm = (d: Record<string, unknown>, finish: string | null, extra: Record<string, unknown> = {}) =>
  ev({ id: 'chatcmpl-a0e8d16d47a64de5', object: 'chat.completion.chunk', created: 1749994809, model: 'Qwen/Qwen3-8B', choices: [{ index: 0, delta: d, logprobs: null, finish_reason: finish, ...extra }] });
const VLLM_ID = 'chatcmpl-tool-040af537f3e14bd6986646facde02ce3';

describe('vLLM (tool parsers)', () => {
  // The name alone first (no arguments key: exclude_none), pieces, then the remaining arguments in the finish chunk
  // with id, type and name again (vllm#44098).
  const whole: Answer = (b) =>
    !hasToolResult(b)
      ? sse([
          vllm({ role: 'assistant', content: '' }, null),
          vllm({ tool_calls: [{ id: VLLM_ID, type: 'function', index: 0, function: { name: 'get_weather' } }] }, null),
          vllm({ tool_calls: [{ index: 0, function: { arguments: '{"city": "' } }] }, null),
          vllm({ tool_calls: [{ index: 0, function: { arguments: 'Zürich"' } }] }, null),
          vllm({ tool_calls: [{ id: VLLM_ID, type: 'function', index: 0, function: { name: 'get_weather', arguments: '}' } }] }, 'tool_calls', { stop_reason: null }),
          DONE,
        ])
      : textTurn((d, f) => vllm(d, f));

  it('remaining arguments in the finish chunk: finalChatCompletion() and runTools() get the call as directly, the tool runs once', async () => {
    const { g, direct } = await pair(whole);
    const via = await finalOf(g.client);
    expect(via).toEqual({ finish: 'tool_calls', calls: [[VLLM_ID, 'get_weather', '{"city": "Zürich"}']] });
    expect(via).toEqual(await finalOf(direct));
    const run = await runToolsOn(g.client);
    expect(run).toEqual({ ran: [{ city: 'Zürich' }], content: 'Zürich: 14 °C, rain.' });
  });

  it('garbled, duplicated arguments with finish_reason tool_calls (hermes, vllm#10395): passed as the server sent them, never judged', async () => {
    // The finish is the server's word on a finished answer: the gateway does not repair or refuse its arguments.
    const garbled = '{"wd": 23, "injection": ""ZSJB39"}{"wd": 23, "injection": "ZSJB39"}';
    const answer: Answer = () =>
      sse([
        vllm({ role: 'assistant', content: '' }, null),
        vllm({ tool_calls: [{ id: VLLM_ID, type: 'function', index: 0, function: { name: 'predict_x' } }] }, null),
        vllm({ tool_calls: [{ index: 0, function: { arguments: '{"wd": 23, "injection": ""' } }] }, null),
        vllm({ tool_calls: [{ index: 0, function: { arguments: 'ZSJB39"}' } }] }, null),
        vllm({ tool_calls: [{ index: 0, function: { arguments: '{"wd": 23, "injection": "ZSJB39"}' } }] }, null),
        vllm({}, 'tool_calls'),
        DONE,
      ]);
    const { g, direct } = await pair(answer);
    const via = await rawRead(g.client);
    expect(via.error).toBeUndefined();
    expect(via.args[0]).toBe(garbled);
    expect(via.finishes).toEqual(['tool_calls']);
    expect(via).toEqual(await rawRead(direct));
  });

  it('a whole call, then finish_reason null and [DONE] (vllm#27572, vllm-mlx#672, NIM): passed on; the SDK helper refuses it as it does directly', async () => {
    const answer: Answer = () =>
      sse([
        vllm({ role: 'assistant', content: '' }, null),
        vllm({ tool_calls: [{ id: VLLM_ID, type: 'function', index: 0, function: { name: 'get_weather' } }] }, null),
        vllm({ tool_calls: [{ index: 0, function: { arguments: '{"city": "Zürich"}' } }] }, null),
        DONE,
      ]);
    const { g, direct } = await pair(answer);
    const via = await rawRead(g.client);
    expect(via.error).toBeUndefined();
    expect(JSON.parse(via.args[0]!)).toEqual({ city: 'Zürich' });
    expect(via).toEqual(await rawRead(direct));
    // No finish_reason: the SDK's own refusal (an OpenAIError, not the gateway's stream_interrupted), same both ways.
    const helper = await finalOf(g.client);
    expect(helper.error).toBe('missing finish_reason for choice 0');
    expect(helper).toEqual(await finalOf(direct));
  });

  it('finish_reason "length" inside the arguments (max_tokens): the server said so, passed on with its finish; no error', async () => {
    const answer: Answer = () =>
      sse([
        vllm({ role: 'assistant', content: '' }, null),
        vllm({ tool_calls: [{ id: VLLM_ID, type: 'function', index: 0, function: { name: 'get_weather' } }] }, null),
        vllm({ tool_calls: [{ index: 0, function: { arguments: '{"city": "Zür' } }] }, 'length'),
        DONE,
      ]);
    const { g, direct } = await pair(answer);
    const via = await finalOf(g.client);
    expect(via).toEqual({ finish: 'length', calls: [[VLLM_ID, 'get_weather', '{"city": "Zür']] });
    expect(via).toEqual(await finalOf(direct));
  });

  it('n: 2, choice 0 finished its call and [DONE] comes with choice 1 mid-arguments: stream_interrupted (raw readers are told); both finished: whole', async () => {
    const head = [0, 1].map((i) => ev({ id: 'chatcmpl-n2', object: 'chat.completion.chunk', created: 1, model: 'Qwen/Qwen3-8B', choices: [{ index: i, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }] }));
    const c = (i: number, d: Record<string, unknown>, finish: string | null = null) =>
      ev({ id: 'chatcmpl-n2', object: 'chat.completion.chunk', created: 1, model: 'Qwen/Qwen3-8B', choices: [{ index: i, delta: d, logprobs: null, finish_reason: finish }] });
    const calls = [
      c(0, { tool_calls: [{ id: 'chatcmpl-tool-a', type: 'function', index: 0, function: { name: 'get_weather', arguments: '' } }] }),
      c(1, { tool_calls: [{ id: 'chatcmpl-tool-b', type: 'function', index: 0, function: { name: 'get_weather', arguments: '' } }] }),
      c(0, { tool_calls: [{ index: 0, function: { arguments: '{"city": "Zürich"}' } }] }),
      c(1, { tool_calls: [{ index: 0, function: { arguments: '{"city": "Zü' } }] }),
      c(0, {}, 'tool_calls'),
    ];
    const cut = await pair(() => sse([...head, ...calls, DONE]));
    const via = await rawRead(cut.g.client, { n: 2 });
    expect(via.error).toBe('stream_interrupted');
    expect(via.finishes).toEqual(['tool_calls']);
    // Directly, a raw reader took one and a half answers as whole.
    expect((await rawRead(cut.direct, { n: 2 })).error).toBeUndefined();
    const whole = await pair(() => sse([...head, ...calls, c(1, { tool_calls: [{ index: 0, function: { arguments: 'rich"}' } }] }), c(1, {}, 'tool_calls'), DONE]));
    const both = await rawRead(whole.g.client, { n: 2 });
    expect(both.error).toBeUndefined();
    expect(both.finishes).toEqual(['tool_calls', 'tool_calls']);
    expect(both).toEqual(await rawRead(whole.direct, { n: 2 }));
  });
});

// ---- NVIDIA Dynamo -------------------------------------------------------------------------------------------------
describe('NVIDIA Dynamo (a jailed tool-call stream that lost its finish)', () => {
  it('tool_calls with finish_reason null, a usage-only chunk, [DONE] (dynamo#10513): passed on, the usage the client asked for included', async () => {
    const dyn = (choices: unknown[], usage: unknown = null) => ev({ id: 'chatcmpl-dyn1', object: 'chat.completion.chunk', created: 1781000000, model: 'Qwen/Qwen3-0.6B', choices, usage });
    const answer: Answer = () =>
      sse([
        dyn([{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }]),
        dyn([{ index: 0, delta: { tool_calls: [{ index: 0, id: 'call-7f1e', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Zürich"}' } }] }, finish_reason: null }]),
        dyn([], { prompt_tokens: 140, completion_tokens: 22, total_tokens: 162 }),
        DONE,
      ]);
    const { g, direct } = await pair(answer);
    const via = await rawRead(g.client, { stream_options: { include_usage: true } });
    expect(via.error).toBeUndefined();
    expect(via.args).toEqual({ 0: '{"city": "Zürich"}' });
    expect(via.usage).toEqual({ prompt_tokens: 140, completion_tokens: 22, total_tokens: 162 });
    expect(via).toEqual(await rawRead(direct, { stream_options: { include_usage: true } }));
  });
});

// ---- Ollama --------------------------------------------------------------------------------------------------------
const ollama = (d: Record<string, unknown>, finish: string | null) =>
  ev({ id: 'chatcmpl-693', object: 'chat.completion.chunk', created: 1715427619, model: 'qwen3:1.7b', system_fingerprint: 'fp_ollama', choices: [{ index: 0, delta: { role: 'assistant', ...d }, finish_reason: finish }] });

describe('Ollama /v1 (each call whole in one chunk)', () => {
  it('the call in one chunk with finish_reason null, then a finish chunk "stop": runTools() runs it once, as directly', async () => {
    const answer: Answer = (b) =>
      !hasToolResult(b)
        ? sse([
            ollama({ content: '', tool_calls: [{ id: 'call_n3k2v0x1', index: 0, type: 'function', function: { name: 'get_weather', arguments: '{"city":"Zürich"}' } }] }, null),
            ollama({ content: '' }, 'stop'),
            DONE,
          ])
        : textTurn(ollama);
    const { g, direct } = await pair(answer);
    const via = await finalOf(g.client);
    expect(via).toEqual({ finish: 'stop', calls: [['call_n3k2v0x1', 'get_weather', '{"city":"Zürich"}']] });
    expect(via).toEqual(await finalOf(direct));
    expect(await runToolsOn(g.client)).toEqual({ ran: [{ city: 'Zürich' }], content: 'Zürich: 14 °C, rain.' });
  });

  it('parallel calls all under index 0 (ollama#15457), then finish "tool_calls": passed as sent; the agent gets what it gets directly', async () => {
    // The finish says the answer is whole: the gateway passes the server's framing on, even one index-keyed readers
    // merge into one call.
    const answer: Answer = () =>
      sse([
        ollama({ content: '', tool_calls: [{ id: 'call_zrh', index: 0, type: 'function', function: { name: 'get_weather', arguments: '{"city":"Zürich"}' } }] }, null),
        ollama({ content: '', tool_calls: [{ id: 'call_krk', index: 0, type: 'function', function: { name: 'get_weather', arguments: '{"city":"Kraków"}' } }] }, null),
        ollama({ content: '' }, 'tool_calls'),
        DONE,
      ]);
    const { g, direct } = await pair(answer);
    const via = await rawRead(g.client);
    expect(via.error).toBeUndefined();
    expect(via.calls).toEqual(['0:call_zrh:get_weather:{"city":"Zürich"}', '0:call_krk:get_weather:{"city":"Kraków"}']);
    expect(via).toEqual(await rawRead(direct));
    expect(await finalOf(g.client)).toEqual(await finalOf(direct));
  });

  it('the same parallel calls under index 0 with no finish_reason, then [DONE]: two whole calls, passed on as the end', async () => {
    const answer: Answer = () =>
      sse([
        ollama({ content: '', tool_calls: [{ id: 'call_zrh', index: 0, type: 'function', function: { name: 'get_weather', arguments: '{"city":"Zürich"}' } }] }, null),
        ollama({ content: '', tool_calls: [{ id: 'call_krk', index: 0, type: 'function', function: { name: 'get_weather', arguments: '{"city":"Kraków"}' } }] }, null),
        DONE,
      ]);
    const { g, direct } = await pair(answer);
    const via = await rawRead(g.client);
    expect(via.error).toBeUndefined();
    expect(via).toEqual(await rawRead(direct));
  });
});

// ---- Mistral, Groq -------------------------------------------------------------------------------------------------
describe('Mistral and Groq (the whole call in one chunk)', () => {
  it('Mistral: the call and finish_reason "tool_calls" in one chunk, the first output: finalChatCompletion() gets it as directly', async () => {
    const mistral = (d: Record<string, unknown>, finish: string | null) =>
      ev({ id: 'cmpl-82b4ad8d22b44757a7a2d3e3ae6fb6a0', object: 'chat.completion.chunk', created: 1702637377, model: 'mistral-large-latest', choices: [{ index: 0, delta: d, finish_reason: finish }] });
    const answer: Answer = () =>
      sse([
        mistral({ role: 'assistant', content: '' }, null),
        mistral({ content: '', tool_calls: [{ id: 'D681PevKs', function: { name: 'get_weather', arguments: '{"city": "Zürich"}' }, index: 0 }] }, 'tool_calls'),
        DONE,
      ]);
    const { g, direct } = await pair(answer);
    const via = await rawRead(g.client);
    expect(via).toEqual({ calls: ['0:D681PevKs:get_weather:{"city": "Zürich"}'], args: { 0: '{"city": "Zürich"}' }, finishes: ['tool_calls'], usage: undefined });
    expect(via).toEqual(await rawRead(direct));
  });

  it('Groq: the whole call in one chunk, then the finish chunk with x_groq usage: runTools() runs it once', async () => {
    const groq = (d: Record<string, unknown>, finish: string | null, extra: Record<string, unknown> = {}) =>
      ev({ id: 'chatcmpl-5c3e0a7b', object: 'chat.completion.chunk', created: 1733000000, model: 'llama-3.3-70b-versatile', system_fingerprint: 'fp_c1a4bcec29', choices: [{ index: 0, delta: d, logprobs: null, finish_reason: finish }], ...extra });
    const answer: Answer = (b) =>
      !hasToolResult(b)
        ? sse([
            groq({ role: 'assistant', content: null }, null, { x_groq: { id: 'req_01jd' } }),
            groq({ tool_calls: [{ id: 'call_6w7k', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Zürich"}' }, index: 0 }] }, null),
            groq({}, 'tool_calls', { x_groq: { id: 'req_01jd', usage: { queue_time: 0.02, prompt_tokens: 220, completion_tokens: 18, total_tokens: 238 } } }),
            DONE,
          ])
        : textTurn((d, f) => groq(d, f));
    const { g, direct } = await pair(answer);
    expect(await finalOf(g.client)).toEqual(await finalOf(direct));
    expect(await runToolsOn(g.client)).toEqual({ ran: [{ city: 'Zürich' }], content: 'Zürich: 14 °C, rain.' });
  });
});

// ---- OpenRouter, llama.cpp, SGLang, LiteLLM, Bedrock-style -----------------------------------------------------------
describe('OpenRouter, llama.cpp, SGLang, LiteLLM and a Bedrock layer', () => {
  it('OpenRouter: ": OPENROUTER PROCESSING" comments before and inside the arguments, native_finish_reason: the call whole, the tool runs once', async () => {
    const or = (d: Record<string, unknown>, finish: string | null) =>
      ev({ id: 'gen-1758885012-2qVPBxGHZxOgYWKthK4E', provider: 'OpenAI', model: 'openai/gpt-4o-mini', object: 'chat.completion.chunk', created: 1758885012, choices: [{ index: 0, delta: d, finish_reason: finish, native_finish_reason: finish, logprobs: null }] });
    const KEEP = ': OPENROUTER PROCESSING\n\n';
    const answer: Answer = (b) =>
      !hasToolResult(b)
        ? sse([
            KEEP, 50, KEEP,
            or({ content: null, role: 'assistant', tool_calls: [{ index: 0, id: 'call_L7mHMq49ZSUTBHjLJfBIP2eT', type: 'function', function: { name: 'get_weather', arguments: '' } }] }, null),
            or({ content: null, role: 'assistant', tool_calls: [{ index: 0, type: 'function', function: { arguments: '{"city":' } }] }, null),
            KEEP, 30,
            or({ content: null, role: 'assistant', tool_calls: [{ index: 0, type: 'function', function: { arguments: '"Zürich"}' } }] }, null),
            or({ content: '', role: 'assistant' }, 'tool_calls'),
            DONE,
          ])
        : sse([KEEP, ...textTurn(or).steps]);
    const { g, direct } = await pair(answer);
    const via = await finalOf(g.client);
    expect(via).toEqual({ finish: 'tool_calls', calls: [['call_L7mHMq49ZSUTBHjLJfBIP2eT', 'get_weather', '{"city":"Zürich"}']] });
    expect(via).toEqual(await finalOf(direct));
    expect(await runToolsOn(g.client)).toEqual({ ran: [{ city: 'Zürich' }], content: 'Zürich: 14 °C, rain.' });
  });

  it('llama.cpp server: choices first, timings on every chunk, the arguments in small diffs: as directly', async () => {
    let t = 0;
    const lcpp = (d: Record<string, unknown>, finish: string | null) =>
      ev({ choices: [{ finish_reason: finish, index: 0, delta: d }], created: 1781492231, id: 'chatcmpl-qC6laQHbZ2CmxNvJ4NoB1L93LcVF7nfe', model: 'Qwen3-8B-Q8_0.gguf', system_fingerprint: 'b9554-d403f00ec', object: 'chat.completion.chunk', timings: { prompt_n: 10, predicted_n: ++t, predicted_ms: 14.3 * t } });
    const pieces = ['{"', 'city', '":"', 'Z', 'ür', 'ich', '"}'];
    const answer: Answer = () =>
      sse([
        lcpp({ role: 'assistant', content: null }, null),
        lcpp({ tool_calls: [{ index: 0, id: 'zN8rJbQ3vT1mWq5L', type: 'function', function: { name: 'get_weather', arguments: '' } }] }, null),
        ...pieces.map((p) => lcpp({ tool_calls: [{ index: 0, function: { arguments: p } }] }, null)),
        lcpp({}, 'tool_calls'),
        DONE,
      ]);
    const { g, direct } = await pair(answer);
    const via = await finalOf(g.client);
    expect(via).toEqual({ finish: 'tool_calls', calls: [['zN8rJbQ3vT1mWq5L', 'get_weather', '{"city":"Zürich"}']] });
    t = 0;
    expect(via).toEqual(await finalOf(direct));
  });

  const sglang = (d: Record<string, unknown>, finish: string | null, extra: Record<string, unknown> = {}) =>
    ev({ id: '5b7f3c1e9d2a4f60', object: 'chat.completion.chunk', created: 1751429477, model: 'Qwen/Qwen2.5-7B-Instruct', choices: [{ index: 0, delta: d, logprobs: null, finish_reason: finish, matched_stop: null, ...extra }], usage: null });
  const sgCall = (args: string, name: string | null = null) => ({ tool_calls: [{ id: '0', index: 0, type: 'function', function: { name, arguments: args } }] });

  it('SGLang: id and type on every chunk, "" finishes before the last, finish "stop" with a call (before sglang#7708): as directly, runTools() runs it', async () => {
    const answer: Answer = (b) =>
      !hasToolResult(b)
        ? sse([
            sglang({ role: 'assistant', content: '' }, ''),
            sglang(sgCall('', 'get_weather'), ''),
            sglang(sgCall('{"city": "Zü'), ''),
            sglang(sgCall('rich"}'), ''),
            sglang({}, 'stop', { matched_stop: 151645 }),
            DONE,
          ])
        : textTurn((d, f) => sglang(d, f));
    const { g, direct } = await pair(answer);
    const via = await finalOf(g.client);
    expect(via).toEqual({ finish: 'stop', calls: [['0', 'get_weather', '{"city": "Zürich"}']] });
    expect(via).toEqual(await finalOf(direct));
    expect(await runToolsOn(g.client)).toEqual({ ran: [{ city: 'Zürich' }], content: 'Zürich: 14 °C, rain.' });
  });

  it('SGLang framing cut: "" finishes (none), then [DONE] in the middle of the arguments: stream_interrupted; runTools() runs nothing', async () => {
    const answer: Answer = () => sse([sglang({ role: 'assistant', content: '' }, ''), sglang(sgCall('', 'get_weather'), ''), sglang(sgCall('{"city": "Zü'), ''), DONE]);
    const { g, direct } = await pair(answer);
    expect((await rawRead(g.client)).error).toBe('stream_interrupted');
    // Directly, the raw reader ended cleanly with {"city": "Zü as the arguments.
    const straight = await rawRead(direct);
    expect(straight.error).toBeUndefined();
    expect(straight.args[0]).toBe('{"city": "Zü');
    const run = await runToolsOn(g.client);
    expect(run).toEqual({ ran: [], error: 'stream_interrupted' });
  });

  it('LiteLLM proxy: no finish_reason key while None, the call in pieces, then the finish chunk: as directly', async () => {
    const lite = (choice: Record<string, unknown>) =>
      ev({ id: 'chatcmpl-B1z1HwsKbjazcsxVWxtBgG1FEOFEJ', created: 1739812588, model: 'claude-sonnet-4-6', object: 'chat.completion.chunk', choices: [{ index: 0, ...choice }] });
    const answer: Answer = () =>
      sse([
        lite({ delta: { role: 'assistant', content: '' } }),
        lite({ delta: { tool_calls: [{ id: 'toolu_01A09q90qw90lq917835lq9', function: { arguments: '', name: 'get_weather' }, type: 'function', index: 0 }] } }),
        lite({ delta: { tool_calls: [{ function: { arguments: '{"city": ' }, type: 'function', index: 0 }] } }),
        lite({ delta: { tool_calls: [{ function: { arguments: '"Zürich"}' }, type: 'function', index: 0 }] } }),
        lite({ finish_reason: 'tool_calls', delta: {} }),
        DONE,
      ]);
    const { g, direct } = await pair(answer);
    const via = await finalOf(g.client);
    expect(via).toEqual({ finish: 'tool_calls', calls: [['toolu_01A09q90qw90lq917835lq9', 'get_weather', '{"city": "Zürich"}']] });
    expect(via).toEqual(await finalOf(direct));
  });

  it('a Bedrock layer\'s "{}" then the real arguments (openai-agents-js#712), finish "tool_calls": passed as sent, as directly', async () => {
    const bed = (d: Record<string, unknown>, finish: string | null) =>
      ev({ id: 'chatcmpl-bedrock-1', object: 'chat.completion.chunk', created: 1764547200, model: 'anthropic.claude-sonnet-4', choices: [{ index: 0, delta: d, finish_reason: finish }] });
    const answer: Answer = () =>
      sse([
        bed({ role: 'assistant' }, null),
        bed({ tool_calls: [{ index: 0, id: 'tooluse_kZJMlvQmRJ6eAyJE5GIl7Q', type: 'function', function: { name: 'get_weather', arguments: '{}' } }] }, null),
        bed({ tool_calls: [{ index: 0, function: { arguments: '{"city": "Zürich"}' } }] }, null),
        bed({}, 'tool_calls'),
        DONE,
      ]);
    const { g, direct } = await pair(answer);
    const via = await rawRead(g.client);
    expect(via.error).toBeUndefined();
    expect(via.args[0]).toBe('{}{"city": "Zürich"}');
    expect(via).toEqual(await rawRead(direct));
  });
});

// ---- truncations -----------------------------------------------------------------------------------------------------
describe('truncations real servers produce', () => {
  // llm-d-inference-sim before #545 wrote no finish chunk for `length`: a max_tokens cut ends with [DONE] alone.
  const sim = (d: Record<string, unknown>) =>
    ev({ id: 'chatcmpl-3f9ee602', object: 'chat.completion.chunk', created: 1788688081, model: 'Qwen/Qwen2.5-1.5B-Instruct', choices: [{ index: 0, delta: d, finish_reason: null }] });
  const maxTokensCut = [
    sim({ role: 'assistant', content: '' }),
    sim({ tool_calls: [{ index: 0, id: 'chatcmpl-tool-a165800d4d7789c7', type: 'function', function: { name: 'get_weather', arguments: '' } }] }),
    sim({ tool_calls: [{ index: 0, function: { arguments: '{"city": "' } }] }),
    sim({ tool_calls: [{ index: 0, function: { arguments: 'Zür' } }] }),
  ];

  it('a max_tokens cut with no finish, then [DONE] (llm-d-inference-sim before #545): stream_interrupted for raw readers, the helper and runTools(); no tool runs', async () => {
    const { g, direct } = await pair(() => sse([...maxTokensCut, DONE]), { route: { retry: { maxAttempts: 1 } } });
    const via = await rawRead(g.client);
    expect(via.error).toBe('stream_interrupted');
    expect(via.calls).toEqual(['0:chatcmpl-tool-a165800d4d7789c7:get_weather:', '0:::{"city": "', '0:::Zür']);
    // Directly, the raw reader took the half call as the end.
    expect((await rawRead(direct)).error).toBeUndefined();
    const helper = await sdkError(g.client.chat.completions.stream({ model: 'm', messages, tools }).finalChatCompletion());
    expect(helper.code).toBe('stream_interrupted');
    expect(await runToolsOn(g.client)).toEqual({ ran: [], error: 'stream_interrupted' });
    expect(g.seen.a).toHaveLength(3);
  });

  it('on a route with streamRecovery: continue, the same cut tool call ends with the error event: the backup is never asked', async () => {
    const backup: Answer = () => sse([sim({ role: 'assistant', content: '' }), sim({ content: 'should never be asked' }), DONE]);
    const g = await gw({ a: () => sse([...maxTokensCut, DONE]), b: backup }, [{ provider: 'a' }, { provider: 'b' }], { route: { streamRecovery: 'continue', retry: { maxAttempts: 1 } } });
    const via = await rawRead(g.client);
    expect(via.error).toBe('stream_interrupted');
    expect(via.args[0]).toBe('{"city": "Zür');
    expect(g.seen.a).toHaveLength(1);
    expect(g.seen.b).toHaveLength(0);
    const ends = (await scrapeMetrics(g.s.url)).filter((m) => m.name === 'stormgate_stream_ends_total' && m.value > 0);
    expect(ends.map((m) => m.labels.end)).toEqual(['cut']);
  });
});
