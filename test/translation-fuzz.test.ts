// Generated cases for the OpenAI <-> Anthropic translation, from a seeded PRNG so that every failure names a seed that
// replays it. Anthropic answers (streams and whole) are generated with their content known, and what a client reads
// back is checked against that content: by the translator directly, and through a running gateway with the openai SDK
// as the client. OpenAI requests are generated valid (plus the features the README documents as refused), and the
// translation must be a request Anthropic takes, carrying the same conversation, or a documented refusal.
// For a deeper run: XLATE_N (seeds per direct property) and XLATE_GW (seeds through the gateway), e.g. XLATE_N=20000.
import OpenAI from 'openai';
import { ChatCompletionStream } from 'openai/lib/ChatCompletionStream';
import { Stream } from 'openai/streaming';
import { describe, expect, it } from 'vitest';
import {
  AnthropicStreamTranslator,
  toAnthropicRequest,
  toOpenAIResponse,
  type AnthropicMessage,
  type AnthropicMessagesRequest,
  type OpenAIChatRequest,
} from '../src/providers/anthropic/index.ts';
import { SseParser } from '../src/streaming/sse-parser.ts';
import { fastRetries, useScriptedGateway, type Step } from './helpers/scripted-provider.ts';
import { chance, int, pick, prng, type Rng } from './helpers/seeded-draws.ts';


// Characters that stress JSON and SSE: quotes, backslashes, line breaks (an SSE event ends at a blank line), control
// characters, multi-byte UTF-8 and astral characters (two UTF-16 units), the JS line separators.
const ALPHABET = ['a', 'b', 'Z', '0', ' ', ' ', '\n', '\n\n', '\r\n', '\t', '"', '\\', '/', '{', '}', ':', 'data: ', 'é', 'ß', '中文', '😀', '🦀', '\u2028', '\u0001', '<', '&'];
function str(r: Rng, max = 12): string {
  let s = '';
  for (let n = int(r, 0, max); n > 0; n--) s += pick(r, ALPHABET);
  return s;
}
const word = (r: Rng) => pick(r, ['alpha', 'beta', 'city', 'x', 'q_1', 'name', 'constructor', 'toString', 'unit']);
const ident = (r: Rng, n = 10) => Array.from({ length: n }, () => pick(r, [...'ABCDEFGHabcdefgh0123456789'])).join('');

function jsonValue(r: Rng, depth: number): unknown {
  switch (int(r, 0, depth > 0 ? 7 : 4)) {
    case 0: return int(r, -1000, 1000);
    case 1: return pick(r, [0.5, -3.25, 1e21, 123456789.125, 2e-7]);
    case 2: return pick(r, [true, false, null]);
    case 3:
    case 4: return str(r);
    case 5:
    case 6: return jsonObject(r, depth - 1);
    default: return Array.from({ length: int(r, 0, 3) }, () => jsonValue(r, depth - 1));
  }
}
function jsonObject(r: Rng, depth = 2): Record<string, unknown> {
  const o: Record<string, unknown> = {};
  for (let n = int(r, 0, 4); n > 0; n--) o[chance(r, 0.7) ? word(r) : str(r, 4)] = jsonValue(r, depth);
  return o;
}

/** Cuts a string into pieces at random UTF-16 positions: `cut` says whether a surrogate pair may be split. */
function splits(r: Rng, s: string, max: number, cut: boolean): string[] {
  const units = cut ? s.split('') : Array.from(s);
  if (units.length === 0) return [];
  const at = new Set<number>();
  for (let n = int(r, 0, max); n > 0; n--) at.add(int(r, 1, units.length - 1));
  const points = [0, ...[...at].filter((p) => p > 0 && p < units.length).sort((a, b) => a - b), units.length];
  return points.slice(1).map((end, i) => units.slice(points[i], end).join(''));
}

/** JSON text of a tool input as a model writes it: spaced or not, non-ASCII raw or as \u escapes, `/` maybe escaped. */
function inputJson(r: Rng, input: unknown): string {
  let json = JSON.stringify(input, null, chance(r, 0.3) ? 1 : undefined);
  if (chance(r, 0.4)) json = json.replace(/[\u0080-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
  if (chance(r, 0.3)) json = json.replace(/\//g, '\\/');
  return json;
}

// ---- generated Anthropic answers ----

type Block =
  | { type: 'text'; text: string }
  | { type: 'thinking'; thinking: string; signature: string }
  | { type: 'redacted_thinking'; data: string }
  | { type: 'tool_use'; id: string; name: string; input: Record<string, unknown> }
  | { type: 'server_tool_use'; id: string; name: 'web_search'; input: Record<string, unknown> }
  | { type: 'web_search_tool_result'; tool_use_id: string; content: unknown[] };

interface Usage {
  input_tokens: number;
  output_tokens: number;
  cache_creation_input_tokens?: number | null;
  cache_read_input_tokens?: number | null;
}

interface Answer {
  blocks: Block[];
  stopReason: string;
  /** message_start's usage, and message_delta's (cumulative; null fields mean unchanged). */
  startUsage: Usage;
  deltaUsage: Record<string, number | null>;
}

const STOP_REASONS = ['end_turn', 'max_tokens', 'tool_use', 'stop_sequence', 'pause_turn', 'refusal', 'model_context_window_exceeded'];
const FINISH: Record<string, string> = { end_turn: 'stop', max_tokens: 'length', tool_use: 'tool_calls', stop_sequence: 'stop', pause_turn: 'stop', refusal: 'content_filter', model_context_window_exceeded: 'length' };

function answer(r: Rng): Answer {
  const blocks: Block[] = [];
  for (let n = int(r, 0, 6); n > 0; n--) {
    switch (pick(r, ['text', 'text', 'thinking', 'redacted', 'tool', 'tool', 'server'])) {
      case 'text': blocks.push({ type: 'text', text: str(r, 30) }); break;
      case 'thinking': blocks.push({ type: 'thinking', thinking: str(r, 20), signature: `Eq${ident(r, 16)}==` }); break;
      case 'redacted': blocks.push({ type: 'redacted_thinking', data: `EmwK${ident(r, 24)}` }); break;
      case 'tool': blocks.push({ type: 'tool_use', id: `toolu_${ident(r, 12)}`, name: pick(r, ['get_weather', 'get_time', 'search', 'calc']), input: jsonObject(r) }); break;
      default: {
        const id = `srvtoolu_${ident(r, 12)}`;
        blocks.push({ type: 'server_tool_use', id, name: 'web_search', input: { query: str(r, 8) } });
        blocks.push({ type: 'web_search_tool_result', tool_use_id: id, content: [{ type: 'web_search_result', url: 'https://example.com/a', title: str(r, 6), encrypted_content: ident(r, 20), page_age: null }] });
      }
    }
  }
  const cache = () => pick(r, [undefined, null, 0, int(r, 1, 5000)]);
  const startUsage: Usage = { input_tokens: int(r, 1, 20000), output_tokens: int(r, 0, 3) };
  const cc = cache();
  const cr = cache();
  if (cc !== undefined) startUsage.cache_creation_input_tokens = cc;
  if (cr !== undefined) startUsage.cache_read_input_tokens = cr;
  const deltaUsage: Record<string, number | null> = { output_tokens: int(r, 1, 4000) };
  // Newer API versions repeat the input counts in message_delta, null or (after server tools) grown.
  if (chance(r, 0.5)) deltaUsage['input_tokens'] = pick(r, [null, startUsage.input_tokens, startUsage.input_tokens + int(r, 1, 900)]);
  if (chance(r, 0.3)) deltaUsage['cache_read_input_tokens'] = pick(r, [null, int(r, 0, 800)]);
  return { blocks, stopReason: pick(r, STOP_REASONS), startUsage, deltaUsage };
}

/**
 * The usage the answer ends with: message_start's, each field updated by a non-null message_delta one. The counts are
 * cumulative, so they only grow: a lower one (a compatible server's `input_tokens: 0`) leaves the count as it was.
 */
function finalUsage(a: Answer): Usage {
  const u: Record<string, unknown> = { ...a.startUsage };
  for (const [k, v] of Object.entries(a.deltaUsage)) if (v !== null) u[k] = typeof u[k] === 'number' ? Math.max(u[k] as number, v) : v;
  return u as unknown as Usage;
}

/** What an OpenAI client should read, worked out from the answer's content on its own (not by the translator). */
function expected(a: Answer) {
  const u = finalUsage(a);
  const n = (x: number | null | undefined) => x ?? 0;
  const prompt = u.input_tokens + n(u.cache_read_input_tokens) + n(u.cache_creation_input_tokens);
  const text = a.blocks.flatMap((b) => (b.type === 'text' ? [b.text] : [])).join('');
  const reasoning = a.blocks.flatMap((b) => (b.type === 'thinking' ? [b.thinking] : [])).join('');
  return {
    content: text === '' ? null : text,
    reasoning,
    toolCalls: a.blocks.flatMap((b) => (b.type === 'tool_use' ? [{ id: b.id, name: b.name, input: b.input }] : [])),
    finish: FINISH[a.stopReason]!,
    usage: { prompt_tokens: prompt, completion_tokens: u.output_tokens, total_tokens: prompt + u.output_tokens, prompt_tokens_details: { cached_tokens: n(u.cache_read_input_tokens) } },
  };
}

interface WireEvent { event: string; data: string }
const ev = (type: string, fields: Record<string, unknown> = {}): WireEvent => ({ event: type, data: JSON.stringify({ type, ...fields }) });
const delta = (index: number, d: Record<string, unknown>) => ev('content_block_delta', { index, delta: d });

/** The answer as the Messages API streams it, with pings anywhere after message_start. */
function streamOf(r: Rng, a: Answer): WireEvent[] {
  const events: WireEvent[] = [
    ev('message_start', { message: { id: `msg_${ident(r, 20)}`, type: 'message', role: 'assistant', model: 'claude-sonnet-4-5', content: [], stop_reason: null, stop_sequence: null, usage: a.startUsage } }),
  ];
  for (const [index, b] of a.blocks.entries()) {
    switch (b.type) {
      case 'text':
        events.push(ev('content_block_start', { index, content_block: { type: 'text', text: '' } }));
        for (const text of splits(r, b.text, 5, false)) events.push(delta(index, { type: 'text_delta', text }));
        // A cited answer: the citation comes as a delta of its own, which chat.completions has no place for.
        if (chance(r, 0.2)) events.splice(int(r, events.length - 1, events.length), 0, delta(index, { type: 'citations_delta', citation: { type: 'web_search_result_location', url: 'https://example.com/a', title: 'A', cited_text: str(r, 6), encrypted_index: 'Eo8B' } }));
        break;
      case 'thinking':
        events.push(ev('content_block_start', { index, content_block: { type: 'thinking', thinking: '', signature: '' } }));
        for (const thinking of splits(r, b.thinking, 4, false)) events.push(delta(index, { type: 'thinking_delta', thinking }));
        events.push(delta(index, { type: 'signature_delta', signature: b.signature }));
        break;
      case 'redacted_thinking':
        events.push(ev('content_block_start', { index, content_block: b }));
        break;
      case 'tool_use':
      case 'server_tool_use': {
        events.push(ev('content_block_start', { index, content_block: { ...b, input: {} } }));
        // The API opens with an empty partial_json, and streams no input at all for an empty object (or `{}`).
        if (chance(r, 0.5)) events.push(delta(index, { type: 'input_json_delta', partial_json: '' }));
        const empty = Object.keys(b.input).length === 0 && chance(r, 0.5);
        // Split anywhere: inside an escape, between the halves of a surrogate pair.
        if (!empty) for (const partial_json of splits(r, inputJson(r, b.input), 8, true)) events.push(delta(index, { type: 'input_json_delta', partial_json }));
        break;
      }
      case 'web_search_tool_result':
        events.push(ev('content_block_start', { index, content_block: b }));
        break;
    }
    events.push(ev('content_block_stop', { index }));
  }
  events.push(ev('message_delta', { delta: { stop_reason: a.stopReason, stop_sequence: a.stopReason === 'stop_sequence' ? 'END' : null }, usage: a.deltaUsage }));
  // A stream may end after its stop_reason without message_stop: the answer is whole, and its end is made up for.
  if (chance(r, 0.9)) events.push(ev('message_stop'));
  for (let n = int(r, 0, 4); n > 0; n--) events.splice(int(r, 1, events.length), 0, ev('ping'));
  return events;
}

/** The same answer as one Messages API response. */
function messageOf(a: Answer): AnthropicMessage {
  const content = a.blocks.map((b) => (b.type === 'text' ? { ...b, citations: null } : b.type === 'tool_use' || b.type === 'server_tool_use' ? { ...b, caller: { type: 'direct' } } : b));
  return { id: 'msg_whole', type: 'message', role: 'assistant', model: 'claude-sonnet-4-5', content, stop_reason: a.stopReason, stop_sequence: null, usage: finalUsage(a) };
}

// ---- what a client reads ----

interface Read {
  content: string | null;
  reasoning: string;
  toolCalls: Array<{ id: string; name: string; input: unknown }>;
  finish: string;
  usage: unknown;
}

/**
 * Checks the chunk sequence a client gets is one OpenAI could have sent (role first, one finish_reason, tool calls
 * opened once with id and name then only arguments, usage as asked, [DONE] last) and returns what it adds up to.
 */
function readChunks(datas: string[], includeUsage: boolean): Read {
  expect(datas.at(-1)).toBe('[DONE]');
  expect(datas.filter((d) => d === '[DONE]')).toHaveLength(1);
  const chunks = datas.slice(0, -1).map((d) => JSON.parse(d) as OpenAI.ChatCompletionChunk);
  expect(chunks.length).toBeGreaterThan(0);
  for (const c of chunks) {
    expect(c).toMatchObject({ object: 'chat.completion.chunk', id: chunks[0]!.id, created: chunks[0]!.created, model: chunks[0]!.model });
    if (includeUsage) expect(c).toHaveProperty('usage');
    else expect(c.usage).toBeUndefined();
  }
  const usageChunk = includeUsage ? chunks.pop()! : undefined;
  if (usageChunk) expect(usageChunk.choices).toEqual([]);
  expect(chunks[0]!.choices[0]!.delta.role).toBe('assistant');
  const finishes = chunks.map((c) => c.choices[0]?.finish_reason ?? null);
  expect(finishes.filter((f) => f !== null)).toHaveLength(1);
  expect(finishes.at(-1)).not.toBeNull(); // nothing after the finish but the usage chunk
  let content: string | null = null;
  let reasoning = '';
  const calls: Array<{ id: string; name: string; args: string }> = [];
  for (const c of chunks) {
    expect(c.choices).toHaveLength(1);
    expect(c.choices[0]!.index).toBe(0);
    if (includeUsage) expect(c.usage).toBeNull();
    const d = c.choices[0]!.delta as OpenAI.ChatCompletionChunk.Choice.Delta & { reasoning_content?: string };
    if (d.content) content = (content ?? '') + d.content;
    if (d.reasoning_content !== undefined) reasoning += d.reasoning_content;
    for (const t of d.tool_calls ?? []) {
      if (t.id !== undefined) {
        expect(t.index).toBe(calls.length); // a new call takes the next index
        expect(t).toMatchObject({ type: 'function', function: { name: expect.any(String) } });
        calls.push({ id: t.id, name: t.function!.name!, args: t.function!.arguments ?? '' });
      } else {
        expect(Object.keys(t).sort()).toEqual(['function', 'index']);
        expect(Object.keys(t.function!)).toEqual(['arguments']);
        calls[t.index]!.args += t.function!.arguments;
      }
    }
  }
  return {
    content,
    reasoning,
    toolCalls: calls.map((c) => ({ id: c.id, name: c.name, input: JSON.parse(c.args) as unknown })),
    finish: finishes.at(-1)!,
    usage: usageChunk?.usage,
  };
}

function translate(events: WireEvent[], includeUsage: boolean): string[] {
  const t = new AnthropicStreamTranslator({ includeUsage, model: 'claude-sonnet-4-5', created: 1_700_000_000 });
  return [...events.flatMap((e) => t.push(e)), ...t.end()];
}
const dataOf = (out: string[]) => new SseParser().push(Buffer.from(out.join(''))).flatMap((e) => (e.data === null ? [] : [e.data]));

/** What the openai SDK's stream helper assembles from SSE text; it throws on a sequence it cannot assemble. */
async function sdkAssembles(sse: string): Promise<OpenAI.ChatCompletion> {
  const stream = Stream.fromSSEResponse<OpenAI.ChatCompletionChunk>(new Response(sse, { headers: { 'content-type': 'text/event-stream' } }), new AbortController());
  return ChatCompletionStream.fromReadableStream(stream.toReadableStream()).finalChatCompletion();
}
const sdkToolCalls = (c: OpenAI.ChatCompletion) =>
  (c.choices[0]!.message.tool_calls ?? []).map((t) => (t.type === 'function' ? { id: t.id, name: t.function.name, input: JSON.parse(t.function.arguments) as unknown } : t));

function checkWhole(completion: OpenAI.ChatCompletion, want: ReturnType<typeof expected>): void {
  const msg = completion.choices[0]!.message as OpenAI.ChatCompletionMessage & { reasoning_content?: string };
  expect(msg.content).toBe(want.content);
  expect(msg.reasoning_content ?? '').toBe(want.reasoning);
  expect(sdkToolCalls(completion)).toEqual(want.toolCalls);
  expect(msg.tool_calls === undefined).toBe(want.toolCalls.length === 0); // no empty tool_calls list
  expect(completion.choices[0]!.finish_reason).toBe(want.finish);
  expect(completion.usage).toEqual(want.usage);
}

// ---- generated OpenAI requests ----

const JPEG = '/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAgGBgcGBQgHBwcJCQgKDA';
const PNG = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==';
const GIF = Buffer.from('GIF89a\x01\x00\x01\x00\x80\x00\x00', 'latin1').toString('base64');
const WEBP = Buffer.concat([Buffer.from('RIFF'), Buffer.from([0x24, 0, 0, 0]), Buffer.from('WEBPVP8 ')]).toString('base64');
const IMAGES = [[JPEG, 'image/jpeg'], [PNG, 'image/png'], [GIF, 'image/gif'], [WEBP, 'image/webp']] as const;
const TOOL_NAMES = ['get_weather', 'get_time', 'search', 'calc'];

/** A request OpenAI takes, and what it should become: `refused` lists the documented reasons it may not. */
interface GeneratedRequest {
  body: OpenAIChatRequest;
  refused: RegExp[];
  /** Per message: the Anthropic blocks its content should become, in order (tool calls and results apart). */
  userItems: unknown[];
  assistantTexts: string[];
  toolUses: Array<{ name: string; input: unknown }>;
  toolResults: Array<{ content: unknown; call: number }>;
  system: string | undefined;
  firstRole: 'user' | 'assistant' | undefined;
}

const textBlock = (t: string) => (t.trim() === '' ? [] : [{ type: 'text', text: t }]);
const spaceOrText = (r: Rng) => (chance(r, 0.15) ? pick(r, ['', ' ', '\n\n', ' \t ']) : `${str(r, 10)}x`);

function request(r: Rng): GeneratedRequest {
  const messages: Array<Record<string, unknown>> = [];
  const g: GeneratedRequest = { body: { model: 'gpt-4o', messages: [] }, refused: [], userItems: [], assistantTexts: [], toolUses: [], toolResults: [], system: undefined, firstRole: undefined };
  const systems: string[] = [];
  const contributed: Array<'user' | 'assistant'> = [];
  const usesTools = chance(r, 0.6);
  const tools = usesTools ? TOOL_NAMES.slice(0, int(r, 1, TOOL_NAMES.length)) : [];
  const historyNames = tools.length > 0 ? tools : TOOL_NAMES;
  let callNo = 0;
  const system = () => {
    const t = spaceOrText(r);
    const content = chance(r, 0.5) ? t : [{ type: 'text', text: t }, ...(chance(r, 0.3) ? [{ type: 'text', text: 'more' }] : [])];
    const joined = typeof content === 'string' ? content : content.map((p) => p.text).join('\n');
    // Anthropic refuses a blank system prompt: a whitespace-only system message is left out (third-party-suite-78).
    if (joined.trim() !== '') systems.push(joined);
    messages.push({ role: pick(r, ['system', 'developer']), content });
  };
  const user = () => {
    const items: unknown[] = [];
    let content: unknown;
    if (chance(r, 0.4)) {
      content = spaceOrText(r);
      items.push(...textBlock(content as string));
    } else {
      const parts: unknown[] = [];
      for (let n = int(r, 1, 3); n > 0; n--) {
        if (chance(r, 0.7)) {
          const t = spaceOrText(r);
          parts.push({ type: 'text', text: t });
          items.push(...textBlock(t));
        } else if (chance(r, 0.4)) {
          const url = `https://example.com/${ident(r, 6)}.png`;
          parts.push({ type: 'image_url', image_url: { url, ...(chance(r, 0.5) && { detail: pick(r, ['low', 'high', 'auto']) }) } });
          items.push({ type: 'image', source: { type: 'url', url } });
        } else {
          // The type the URL names may be wrong (a hard-coded one): the bytes decide, as at OpenAI.
          const [data, type] = pick(r, IMAGES);
          parts.push({ type: 'image_url', image_url: { url: `data:${pick(r, ['image/png', 'image/jpeg', 'image/jpg', type])};base64,${data}` } });
          items.push({ type: 'image', source: { type: 'base64', media_type: type, data } });
        }
      }
      content = parts;
    }
    messages.push({ role: 'user', content, ...(chance(r, 0.1) && { name: 'alice' }) });
    g.userItems.push(...items);
    if (items.length > 0) contributed.push('user');
    return items.length > 0;
  };
  const assistant = (withCalls: boolean) => {
    const msg: Record<string, unknown> = { role: 'assistant' };
    const texts: string[] = [];
    const kind = int(r, 0, 3);
    if (kind === 0) msg.content = withCalls ? null : `${str(r, 8)}x${pick(r, ['', ' ', '\n'])}`;
    else if (kind === 1) msg.content = spaceOrText(r);
    else if (kind === 2) {
      const parts = Array.from({ length: int(r, 1, 2) }, () => (chance(r, 0.8) ? { type: 'text', text: spaceOrText(r) } : { type: 'refusal', refusal: spaceOrText(r) }));
      msg.content = parts;
    } else {
      msg.content = withCalls ? '' : 'ok';
    }
    if (typeof msg.content === 'string') texts.push(...textBlock(msg.content).map((b) => b.text));
    else if (Array.isArray(msg.content)) for (const p of msg.content as Array<{ text?: string; refusal?: string }>) texts.push(...textBlock(p.text ?? p.refusal!).map((b) => b.text));
    if (!withCalls && texts.length === 0) {
      msg.content = 'ok';
      texts.push('ok');
    }
    g.assistantTexts.push(...texts);
    const calls: Array<{ id: string; first: number }> = [];
    if (withCalls) {
      const n = int(r, 1, 3);
      const toolCalls = [];
      for (let i = 0; i < n; i++) {
        // Ids as other servers write them: numbered per answer (repeated across turns), with characters Anthropic refuses
        // (`call.0` becomes `call_0`, which another call may have), or like the suffix a repeated one is given.
        const id = pick(r, [`call_${ident(r, 8)}`, `call_${i}`, `call.${i}`, `call_${i}_2`, `functions.${pick(r, historyNames)}:${i}`, `toolu_${ident(r, 6)}`]);
        if (calls.some((c) => c.id === id)) continue; // ids are unique within one message, as OpenAI's are
        const input = jsonObject(r);
        const args = Object.keys(input).length === 0 && chance(r, 0.3) ? '' : JSON.stringify(input);
        const name = pick(r, historyNames);
        toolCalls.push({ id, type: 'function', function: { name, arguments: args } });
        g.toolUses.push({ name, input });
        calls.push({ id, first: callNo++ });
      }
      msg.tool_calls = toolCalls;
    }
    messages.push(msg);
    if (texts.length > 0 || withCalls) contributed.push('assistant');
    if (withCalls) {
      // Every call answered, in any order, as OpenAI requires.
      const order = [...calls].sort(() => r() - 0.5);
      for (const c of order) {
        const t = chance(r, 0.8) ? str(r, 10) : pick(r, ['', ' ']);
        const asParts = chance(r, 0.3);
        messages.push({ role: 'tool', tool_call_id: c.id, content: asParts ? [{ type: 'text', text: t }] : t });
        g.toolResults.push({ content: asParts ? (t.trim() === '' ? '' : [{ type: 'text', text: t }]) : t, call: c.first });
        contributed.push('user');
      }
    }
  };

  for (let n = int(r, 0, 2); n > 0; n--) system();
  let turns = int(r, 1, 6);
  if (chance(r, 0.1)) assistant(false); // a chat UI's greeting first
  while (turns-- > 0) {
    user();
    if (chance(r, 0.1)) system();
    if (turns > 0 || chance(r, 0.2)) {
      for (let k = int(r, 0, 2); k > 0; k--) assistant(true);
      if (turns > 0 || chance(r, 0.5)) assistant(false); // the last one, when there, is a prefill
    }
  }
  g.system = systems.length > 0 ? systems.join('\n\n') : undefined;
  g.firstRole = contributed[0];
  const body = g.body;
  body.messages = messages as unknown as OpenAIChatRequest['messages'];

  // A last user message with no text left, after an assistant turn: Anthropic would continue that turn instead.
  const last = messages.at(-1)!;
  if (contributed.length === 0) g.refused.push(/needs at least one user or assistant message/);
  else if (last.role === 'user' && contributed.at(-1) === 'assistant') g.refused.push(/refuses a last message with no text/);
  // A last system message after the assistant's turn: Anthropic would continue that turn too.
  else if ((last.role === 'system' || last.role === 'developer') && contributed.at(-1) === 'assistant') g.refused.push(/cannot answer a (system|developer) message that follows the assistant's last turn/);

  if (tools.length > 0 && chance(r, 0.9)) {
    body.tools = tools.map((name) => ({ type: 'function', function: { name, description: `${name} tool`, parameters: { type: 'object', properties: { a: { type: 'string' } } } } }));
    const choice = pick(r, [undefined, 'auto', 'none', 'required', 'function', 'allowed']);
    if (choice === 'function') body.tool_choice = { type: 'function', function: { name: pick(r, tools) } };
    else if (choice === 'allowed') body.tool_choice = { type: 'allowed_tools', allowed_tools: { mode: pick(r, ['auto', 'required'] as const), tools: [{ type: 'function', function: { name: pick(r, tools) } }] } };
    else if (choice !== undefined) body.tool_choice = choice as 'auto' | 'none' | 'required';
    if (chance(r, 0.3)) body.parallel_tool_calls = chance(r, 0.5);
  }
  switch (int(r, 0, 4)) {
    case 0: body.stop = pick(r, ['END', '###', 'x', '']); break;
    case 1: body.stop = Array.from({ length: int(r, 1, 4) }, () => pick(r, ['END', 'Observation:', '</answer>', '\n\n', ' ']));
      if ((body.stop as string[]).some((s) => s.trim() === '')) g.refused.push(/whitespace-only stop sequence/);
      break;
    default:
  }
  const tokens = int(r, 1, 8000);
  switch (int(r, 0, 3)) {
    case 0: body.max_tokens = tokens; break;
    case 1: body.max_completion_tokens = tokens; break;
    case 2: body.max_tokens = int(r, 1, 8000); body.max_completion_tokens = tokens; break;
    default:
  }
  if (chance(r, 0.4)) body.temperature = pick(r, [0, 0.2, 0.7, 1, 1.5, 2]);
  if (chance(r, 0.3)) body.top_p = pick(r, [0.1, 0.9, 1]);
  if (chance(r, 0.5)) {
    body.stream = true;
    if (chance(r, 0.6)) body.stream_options = { include_usage: chance(r, 0.7) };
  }
  const format = int(r, 0, 9);
  if (format === 0) {
    body.response_format = { type: 'json_object' };
    g.refused.push(/response_format json_object/);
  } else if (format === 1) {
    body.response_format = { type: 'json_schema', json_schema: { name: 'answer', strict: true, schema: { type: 'object', properties: { n: { type: 'integer', minimum: 1 } }, required: ['n'], additionalProperties: false } } };
  } else if (format === 2) body.response_format = { type: 'text' };
  if (chance(r, 0.2)) body.user = pick(r, ['alice@example.com', '3f2b8c1e-9d4a-4e7b-8f6c-2a1d0e9b7c5a']);
  if (chance(r, 0.1)) body.seed = 7;
  if (chance(r, 0.1)) body.n = 1;
  return g;
}

const ID = /^[A-Za-z0-9_-]+$/;
type Turn = AnthropicMessagesRequest['messages'][number];
type AnyBlock = { type: string; text?: string; id?: string; tool_use_id?: string; name?: string; input?: unknown; content?: unknown; source?: unknown };

/** A translated request as the Messages API takes it, and carrying the conversation it was given. */
function checkTranslated(g: GeneratedRequest, out: AnthropicMessagesRequest, defaultMaxTokens: number): void {
  const body = g.body;
  const turns = out.messages as Array<Turn & { content: AnyBlock[] }>;
  // Turns alternate, from the user; none is empty; no text block is whitespace only.
  expect(turns.length).toBeGreaterThan(0);
  turns.forEach((t, i) => {
    expect(t.role).toBe(i % 2 === 0 ? 'user' : 'assistant');
    expect(t.content.length).toBeGreaterThan(0);
  });
  const allText = turns.flatMap((t) => t.content.flatMap((b) => (b.type === 'tool_result' && Array.isArray(b.content) ? (b.content as AnyBlock[]) : [b])));
  for (const b of allText) if (b.type === 'text') expect(b.text!.trim()).not.toBe('');
  // Nor is the system prompt (Anthropic: "system: text content blocks must contain non-whitespace text").
  if (out.system !== undefined) expect(String(out.system).trim()).not.toBe('');
  // Tool uses: valid and unique ids; every one answered in the very next turn, which opens with its results only.
  const ids = turns.flatMap((t) => t.content.filter((b) => b.type === 'tool_use').map((b) => b.id!));
  for (const id of ids) expect(id).toMatch(ID);
  expect(new Set(ids).size).toBe(ids.length);
  turns.forEach((t, i) => {
    if (t.role === 'assistant') {
      expect(t.content.every((b) => b.type === 'text' || b.type === 'tool_use')).toBe(true);
      const uses = t.content.filter((b) => b.type === 'tool_use').map((b) => b.id!);
      const results = (turns[i + 1]?.content ?? []).filter((b) => b.type === 'tool_result').map((b) => b.tool_use_id!);
      expect(results.sort()).toEqual(uses.sort());
    } else {
      const kinds = t.content.map((b) => b.type === 'tool_result');
      expect(kinds).toEqual([...kinds].sort((a, b) => Number(b) - Number(a))); // tool_result blocks first
      if (i === 0) expect(kinds.includes(true)).toBe(false);
    }
  });
  if (ids.length > 0) expect(out.tools?.length).toBeGreaterThan(0);
  const names = (out.tools ?? []).map((t) => t.name);
  expect(new Set(names).size).toBe(names.length);
  for (const t of turns) for (const b of t.content) if (b.type === 'tool_use' && body.tools === undefined) expect(names).toContain(b.name);
  if (out.tool_choice?.type === 'tool') expect(names).toContain(out.tool_choice.name);
  if (out.tools !== undefined && body.tools === undefined) expect(out.tool_choice).toEqual({ type: 'none' });

  // The conversation itself: system hoisted, each kind of content in its order.
  expect(out.system).toBe(g.system);
  expect(JSON.stringify(turns)).not.toContain('"role":"system"');
  let rest = turns;
  if (g.firstRole === 'assistant') {
    expect(turns[0]).toEqual({ role: 'user', content: [{ type: 'text', text: '.' }] });
    rest = turns.slice(1);
  }
  const of = (role: string, f: (b: AnyBlock) => boolean) => rest.filter((t) => t.role === role).flatMap((t) => t.content.filter(f));
  expect(of('user', (b) => b.type === 'text' || b.type === 'image')).toEqual(g.userItems);
  const texts = [...g.assistantTexts];
  const tail = turns.at(-1)!;
  // A prefill goes without its trailing whitespace.
  if (tail.role === 'assistant' && tail.content.at(-1)?.type === 'text') texts[texts.length - 1] = texts.at(-1)!.trimEnd();
  expect(of('assistant', (b) => b.type === 'text').map((b) => b.text)).toEqual(texts);
  const uses = of('assistant', (b) => b.type === 'tool_use');
  expect(uses.map((b) => ({ name: b.name, input: b.input }))).toEqual(g.toolUses);
  const results = of('user', (b) => b.type === 'tool_result');
  expect(results.map((b) => b.content)).toEqual(g.toolResults.map((t) => t.content));
  // Each result pairs with the call it answered at OpenAI, whatever ids the calls were given.
  expect(results.map((b) => b.tool_use_id)).toEqual(g.toolResults.map((t) => uses[t.call]!.id));

  // Tools and tool_choice in Anthropic's terms; without tools, the ones the history calls, callable no more.
  const choice = body.tool_choice as { type?: string; function?: { name: string }; allowed_tools?: { mode: string; tools: Array<{ function: { name: string } }> } } | string | undefined;
  if (body.tools === undefined) {
    expect(out.tool_choice).toEqual(g.toolUses.length > 0 ? { type: 'none' } : undefined);
  } else {
    const allowed = typeof choice === 'object' && choice.type === 'allowed_tools' ? choice.allowed_tools!.tools.map((t) => t.function.name) : undefined;
    const defined = body.tools.flatMap((t) => (t.type === 'function' && (allowed ?? [t.function.name]).includes(t.function.name) ? [{ name: t.function.name, description: t.function.description, input_schema: t.function.parameters }] : []));
    expect(out.tools).toEqual(defined);
    const named = typeof choice === 'object' ? choice : undefined;
    let want: Record<string, unknown> | undefined =
      choice === 'auto' ? { type: 'auto' } : choice === 'required' ? { type: 'any' } : choice === 'none' ? { type: 'none' }
      : named?.type === 'function' ? { type: 'tool', name: named.function!.name }
      : named?.type === 'allowed_tools' ? { type: named.allowed_tools!.mode === 'required' ? 'any' : 'auto' } : undefined;
    if (body.parallel_tool_calls === false && want?.['type'] !== 'none') want = { ...(want ?? { type: 'auto' }), disable_parallel_tool_use: true };
    expect(out.tool_choice).toEqual(want);
  }
  expect(out.output_config !== undefined).toBe(body.response_format?.type === 'json_schema');
  const user = body.safety_identifier ?? body.user;
  expect(out.metadata?.user_id).toEqual(user === undefined ? undefined : user.includes('@') ? expect.stringMatching(/^[0-9a-f]{64}$/) : user);
  expect(out.max_tokens).toBe(body.max_completion_tokens ?? body.max_tokens ?? defaultMaxTokens);
  const stops = (typeof body.stop === 'string' ? [body.stop] : body.stop ?? []).filter((s) => s !== '');
  expect(out.stop_sequences).toEqual(stops.length > 0 ? stops : undefined);
  expect(out.temperature).toBeUndefined(); // dropped by default (sampling: drop)
  expect(out.top_p).toBeUndefined();
  expect(out.stream).toBe(body.stream === true ? true : undefined);
}

/** Every message of a refusal is one the README documents (or says by example: "a request ... cannot express"). */
function checkRefused(g: GeneratedRequest, reason: string): void {
  expect(g.refused.length, `refused a request it should take: ${reason}`).toBeGreaterThan(0);
  expect(g.refused.some((re) => re.test(reason)), reason).toBe(true);
}

// ---- the tests ----

describe('cases the generators found', () => {
  it('a server_tool_use block streams its input as input_json_delta, which is passed over as the block is, not a broken stream', () => {
    const events = [
      ev('message_start', { message: { id: 'msg_1', type: 'message', role: 'assistant', model: 'claude-sonnet-4-5', content: [], stop_reason: null, usage: { input_tokens: 5, output_tokens: 1 } } }),
      ev('content_block_start', { index: 0, content_block: { type: 'server_tool_use', id: 'srvtoolu_01', name: 'web_search', input: {} } }),
      delta(0, { type: 'input_json_delta', partial_json: '' }),
      delta(0, { type: 'input_json_delta', partial_json: '{"query": "weather' }),
      delta(0, { type: 'input_json_delta', partial_json: ' Paris"}' }),
      ev('content_block_stop', { index: 0 }),
      ev('content_block_start', { index: 1, content_block: { type: 'web_search_tool_result', tool_use_id: 'srvtoolu_01', content: [] } }),
      ev('content_block_stop', { index: 1 }),
      ev('content_block_start', { index: 2, content_block: { type: 'text', text: '' } }),
      delta(2, { type: 'text_delta', text: 'Sunny.' }),
      ev('content_block_stop', { index: 2 }),
      ev('message_delta', { delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 9 } }),
      ev('message_stop'),
    ];
    const read = readChunks(dataOf(translate(events, false)), false);
    expect(read).toMatchObject({ content: 'Sunny.', toolCalls: [], finish: 'stop' });
    // Arguments for a block never opened still have nowhere to go: that stays a broken stream.
    expect(() => translate([events[0]!, delta(7, { type: 'input_json_delta', partial_json: '{}' })], false)).toThrow('not a tool_use block');
  });

  it('a whole answer whose text blocks are empty has content null, as its stream reads (seed 33)', () => {
    const msg = messageOf({ blocks: [{ type: 'text', text: '' }, { type: 'tool_use', id: 'toolu_1', name: 'calc', input: {} }], stopReason: 'tool_use', startUsage: { input_tokens: 1, output_tokens: 1 }, deltaUsage: {} });
    expect(toOpenAIResponse(msg, { model: 'claude-sonnet-4-5' }).choices[0]!.message.content).toBeNull();
  });
});


const SEEDS = (n: number, from = 1) => Array.from({ length: n }, (_, i) => from + i);

describe('generated Anthropic answers, translated for an OpenAI client', () => {
  it('a generated stream translates into chunks the openai SDK assembles into exactly its text, tool calls, finish and usage', async () => {
    for (const seed of SEEDS(Number(process.env.XLATE_N ?? 300))) {
      const r = prng(seed);
      const a = answer(r);
      const want = expected(a);
      const includeUsage = chance(r, 0.7);
      const out = translate(streamOf(r, a), includeUsage);
      const read = readChunks(dataOf(out), includeUsage);
      expect({ seed, ...read }).toEqual({ seed, content: want.content, reasoning: want.reasoning, toolCalls: want.toolCalls, finish: want.finish, usage: includeUsage ? want.usage : undefined });
      const sdk = await sdkAssembles(out.join(''));
      expect({ seed, content: sdk.choices[0]!.message.content, calls: sdkToolCalls(sdk), finish: sdk.choices[0]!.finish_reason })
        .toEqual({ seed, content: want.content, calls: want.toolCalls, finish: want.finish });
    }
  });

  it('a generated whole answer translates into the completion its stream adds up to', () => {
    for (const seed of SEEDS(Number(process.env.XLATE_N ?? 300))) {
      const r = prng(seed);
      const a = answer(r);
      const whole = toOpenAIResponse(messageOf(a), { model: 'claude-sonnet-4-5' }) as unknown as OpenAI.ChatCompletion;
      try {
        checkWhole(whole, expected(a));
      } catch (err) {
        throw new Error(`seed ${seed}: ${(err as Error).message}`);
      }
    }
  });
});

describe('generated OpenAI requests, translated for an Anthropic target', () => {
  it('a generated request becomes one the Messages API takes, with the same conversation, or a documented refusal', () => {
    let taken = 0;
    for (const seed of SEEDS(Number(process.env.XLATE_N ?? 1500))) {
      const g = request(prng(seed));
      const sampling = pick(prng(seed * 7919), ['drop', 'drop', 'forward', 'refuse'] as const);
      const sampled = g.body.temperature != null || g.body.top_p != null;
      if (sampling === 'refuse' && sampled) g.refused.push(/temperature \/ top_p/);
      const result = toAnthropicRequest(structuredClone(g.body), { model: 'claude-sonnet-4-5', defaultMaxTokens: 4096, sampling });
      try {
        if (result.ok) {
          expect(g.refused, 'took a request it should refuse').toEqual([]);
          const { temperature, top_p, ...rest } = result.body;
          checkTranslated(g, rest, 4096);
          // forward: temperature clamped to Anthropic's 0..1, top_p only without it (the two together are refused).
          const t = g.body.temperature;
          expect({ temperature, top_p }).toEqual(sampling !== 'forward' ? {} : {
            temperature: t != null ? Math.min(1, t) : undefined,
            top_p: t == null ? (g.body.top_p ?? undefined) : undefined,
          });
          expect(result.includeUsage).toBe(g.body.stream === true && g.body.stream_options?.include_usage === true);
          taken++;
        } else checkRefused(g, result.reason);
      } catch (err) {
        throw new Error(`seed ${seed}: ${(err as Error).message}\n${JSON.stringify(g.body)}`);
      }
    }
    expect(taken).toBeGreaterThan(900); // the generator mostly makes requests the target takes
  });
});

// ---- through a running gateway, the openai SDK as its client ----

const gw = useScriptedGateway((c, origin) => {
  fastRetries(c, origin);
  c.providers.p = { family: 'anthropic', baseUrl: origin, apiKey: 'anthropic-key', breaker: false };
  c.routes = c.routes.filter((r) => r.match.path === '/v1/chat/completions').map((r) => ({ ...r, targets: [{ provider: 'p', model: 'claude-sonnet-4-5' }] }));
});

/** The stream's bytes cut at random points (inside UTF-8 sequences too), some pieces a moment apart. */
function wireSteps(r: Rng, events: WireEvent[]): Step[] {
  const eol = chance(r, 0.2) ? '\r\n' : '\n';
  const bytes = Buffer.from(events.map((e) => `event: ${e.event}${eol}data: ${e.data}${eol}${eol}`).join(''));
  const cuts = [...new Set(Array.from({ length: int(r, 0, 12) }, () => int(r, 1, bytes.length - 1)))].sort((a, b) => a - b);
  const steps: Step[] = [];
  let from = 0;
  for (const at of [...cuts, bytes.length]) {
    steps.push(bytes.subarray(from, at));
    if (chance(r, 0.3)) steps.push(1);
    from = at;
  }
  return steps;
}

describe('generated answers through a running gateway', () => {
  it('a generated stream, its bytes cut anywhere, reaches the openai SDK as exactly the text, tool calls, finish and usage it carried', async () => {
    const plays = new Map<number, Step[]>();
    const { client } = await gw((_body, n) => ({ steps: plays.get(n)! }));
    let n = 0;
    for (const seed of SEEDS(Number(process.env.XLATE_GW ?? 16), 1000)) {
      const r = prng(seed);
      const a = answer(r);
      const want = expected(a);
      plays.set(++n, wireSteps(r, streamOf(r, a)));
      const chunks: OpenAI.ChatCompletionChunk[] = [];
      const includeUsage = chance(r, 0.7);
      const stream = client.chat.completions.stream({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], ...(includeUsage && { stream_options: { include_usage: true } }) });
      stream.on('chunk', (c) => chunks.push(c));
      const final = await stream.finalChatCompletion();
      const read = readChunks([...chunks.map((c) => JSON.stringify(c)), '[DONE]'], includeUsage);
      expect({ seed, ...read }).toEqual({ seed, content: want.content, reasoning: want.reasoning, toolCalls: want.toolCalls, finish: want.finish, usage: includeUsage ? want.usage : undefined });
      expect({ seed, content: final.choices[0]!.message.content, calls: sdkToolCalls(final), finish: final.choices[0]!.finish_reason })
        .toEqual({ seed, content: want.content, calls: want.toolCalls, finish: want.finish });
    }
  });

  it('a generated whole answer reaches the openai SDK as the completion its stream adds up to', async () => {
    const plays = new Map<number, Step[]>();
    const { client } = await gw((_body, n) => ({ headers: { 'content-type': 'application/json' }, steps: plays.get(n)! }));
    let n = 0;
    for (const seed of SEEDS(Number(process.env.XLATE_GW ?? 8), 2000)) {
      const a = answer(prng(seed));
      plays.set(++n, [JSON.stringify(messageOf(a))]);
      const completion = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
      try {
        checkWhole(completion, expected(a));
      } catch (err) {
        throw new Error(`seed ${seed}: ${(err as Error).message}`);
      }
    }
  });

  it('a generated request reaches the target translated as the translator alone does it, or is refused with 400 invalid_body', async () => {
    const { client, seen } = await gw((body) => ({
      headers: { 'content-type': body.stream ? 'text/event-stream' : 'application/json' },
      steps: body.stream
        ? translateFree('ok')
        : [JSON.stringify(messageOf({ blocks: [{ type: 'text', text: 'ok' }], stopReason: 'end_turn', startUsage: { input_tokens: 3, output_tokens: 1 }, deltaUsage: {} }))],
    }));
    let refusals = 0;
    for (const seed of SEEDS(Number(process.env.XLATE_GW ?? 14), 3000)) {
      const g = request(prng(seed));
      const direct = toAnthropicRequest(structuredClone(g.body), { model: 'claude-sonnet-4-5', defaultMaxTokens: 4096 });
      const before = seen.length;
      const call = g.body.stream
        ? client.chat.completions.create(g.body as OpenAI.ChatCompletionCreateParamsStreaming).then(async (s) => {
            for await (const _ of s) void _;
          })
        : client.chat.completions.create(g.body as OpenAI.ChatCompletionCreateParamsNonStreaming);
      const err = await call.then(() => undefined, (e: unknown) => e);
      if (direct.ok) {
        expect(err, `seed ${seed}`).toBeUndefined();
        expect(seen.at(-1)!.body, `seed ${seed}`).toEqual(JSON.parse(JSON.stringify(direct.body)));
      } else {
        refusals++;
        expect(err, `seed ${seed}`).toBeInstanceOf(OpenAI.BadRequestError);
        expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('invalid_body');
        expect((err as Error).message).toContain(direct.reason);
        expect(seen.length).toBe(before);
      }
    }
    expect(refusals).toBeGreaterThan(0);
  });
});

/** A plain text stream, for a target whose answer does not matter. */
function translateFree(text: string): string[] {
  const a: Answer = { blocks: [{ type: 'text', text }], stopReason: 'end_turn', startUsage: { input_tokens: 3, output_tokens: 1 }, deltaUsage: { output_tokens: 2 } };
  return streamOf(prng(1), a).map((e) => `event: ${e.event}\ndata: ${e.data}\n\n`);
}
