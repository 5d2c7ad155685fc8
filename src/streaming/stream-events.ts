// What one SSE event means for the gateway, per API: does it carry output (so the first-token timer stops and
// headers may go to the client), does it end the answer, is it broken? And the events the gateway writes itself: an
// upstream error event in the shape the SDKs raise, the error that ends a broken stream, a missing end.
import type { ApiKind } from '../routing/router.ts';
import type { SseEvent } from './sse-parser.ts';
import { stringOrNull } from '../errors.ts';
import { promptCount } from '../policy/token-estimate.ts';

export type EventMeaning =
  /** A comment, a ping, a role-only chunk, a usage chunk: keeps the stream alive, carries no output. */
  | 'keepalive'
  | 'output'
  /** Output that also ends the answer (a finish_reason, or the Responses API's terminal event). */
  | 'finish'
  | 'done'
  | 'error'
  | 'malformed';

interface ChatChoice {
  delta?: { content?: unknown; tool_calls?: unknown[]; reasoning_content?: unknown; reasoning?: unknown; refusal?: unknown; function_call?: unknown; audio?: unknown };
  text?: unknown;
  finish_reason?: unknown;
}

export const nonEmpty = (v: unknown) => typeof v === 'string' && v.length > 0;
/**
 * Content sent as a list of parts, as Mistral's reasoning models stream their thinking (`[{"type":"thinking",...}]`):
 * output like a string. Held back as silence, a model thinking longer than firstTokenMs was timed out and run again
 * on every attempt.
 */
const contentParts = (v: unknown) => Array.isArray(v) && v.length > 0;
/** Set, not null: servers that serialise every field of the SDK's models send `"function_call": null` in each delta. */
export const present = (v: unknown) => v !== undefined && v !== null;
/**
 * An `error` field the OpenAI SDKs raise: they test `data.error` for truth, so `false`, `""` or 0 (a server that
 * serialises every field) is no error, where read as one it broke a stream the SDK alone would have read whole.
 */
const raised = (v: unknown) => Boolean(v);
/**
 * Whether a choice's finish_reason says it finished. Some compatible servers (Ollama before 0.1.39, SGLang before
 * 0.4.4) send `""` on every chunk until the last: read as a finish, the answer was over from its first chunk, and a
 * pause of a second mid-answer ended it with [DONE], truncated.
 */
const finishes = (reason: unknown) => present(reason) && reason !== '';
/**
 * finish_reasons with no OpenAI value that say the provider stopped the answer short, each a whole answer's end on its
 * server's wire (then `[DONE]`): vLLM's `abort` for a request its engine stopped (a replica shutting down or paused,
 * vLLM issue #57082); `error`, which OpenRouter ("if the model finishes the request with an error", its choice
 * carrying its own `error`, no top-level one), Mistral and Together send; DeepSeek's `insufficient_system_resource`
 * ("the request is interrupted due to insufficient resource of the inference system"). Read as a finish, the answer
 * cut short reached the client as complete, and one ended before any output was an empty answer. Each is an error
 * event before the first output (the attempt failed, and is retried); after it, the answer cut short (cutShort): the
 * provider stopped producing it, as when its connection drops.
 */
const STOPPED: ReadonlySet<string> = new Set(['abort', 'error', 'insufficient_system_resource']);
/** What ended an answer a STOPPED finish_reason ended, for the client's error and the log. */
export const stoppedMessage = (reason: string) => `the provider aborted the answer (finish_reason "${reason}")`;
/** The STOPPED finish_reason of a chunk's choices, if one has one. */
const stoppedBy = (chunk: { choices?: unknown }): string | undefined => {
  if (!Array.isArray(chunk.choices)) return undefined;
  for (const c of chunk.choices as ChatChoice[]) if (typeof c?.finish_reason === 'string' && STOPPED.has(c.finish_reason)) return c.finish_reason;
  return undefined;
};
const aborted = (chunk: { choices?: unknown }) => stoppedBy(chunk) !== undefined;
/** Whether an event's text may hold a STOPPED finish_reason, before it is parsed. */
const mayStop = (data: string) => data.includes('"abort"') || data.includes('"error"') || data.includes('"insufficient_system_resource"');
/** A whole answer's bytes with a STOPPED finish_reason (as bytes, not a string's content, whose quotes are escaped). */
export function stoppedInBytes(body: Buffer): string | undefined {
  for (const reason of STOPPED) if (body.indexOf(`"finish_reason":"${reason}"`) !== -1) return reason;
  return undefined;
}

/**
 * An event after the first output that ends the answer cut short though the upstream's stream goes on to its clean
 * end (vLLM's abort): for the LiveStream a cut, which streamRecovery may finish, not an error event of the provider's.
 * `left` is what the chunk still carries for the client (its last text, another choice's finish) with the abort taken
 * out, or undefined when it carries nothing else; `why` says what cut it. Undefined for any other event.
 */
export function cutShort(api: ApiKind, ev: SseEvent): { left: SseEvent | undefined; why: string } | undefined {
  if ((api !== 'chat' && api !== 'completions') || ev.data === null || !mayStop(ev.data)) return undefined;
  let chunk: { error?: unknown; choices?: unknown; usage?: unknown };
  try {
    chunk = JSON.parse(ev.data) as typeof chunk;
  } catch {
    return undefined;
  }
  // An error object makes the chunk the provider's error event, whatever its choices say (choicesMeaning).
  if (typeof chunk !== 'object' || chunk === null || raised(chunk.error)) return undefined;
  const reason = stoppedBy(chunk);
  if (reason === undefined) return undefined;
  // The choice's own `error` (OpenRouter's) goes too: the SDK's types have none, and the gateway's error event says it.
  const choices = (chunk.choices as Array<ChatChoice & { error?: unknown }>).map((c) => {
    if (typeof c?.finish_reason !== 'string' || !STOPPED.has(c.finish_reason)) return c;
    const { error: _error, ...rest } = c;
    return { ...rest, finish_reason: null };
  });
  const rest = { ...chunk, choices };
  const data = JSON.stringify(rest);
  const carries = choicesMeaning(rest) !== 'keepalive' || present(chunk.usage);
  return { left: carries ? { raw: framed(ev.event, data), data, event: ev.event } : undefined, why: stoppedMessage(reason) };
}

/**
 * Responses API events that carry output: every `*.delta` (text, refusal, reasoning, function and custom tool
 * arguments, audio and its transcript, code interpreter code, MCP arguments) and a generated image's partial images.
 * A list of names would miss each event type the API adds, and hold such a stream back until its first-token timeout.
 */
const RESPONSES_OUTPUT = /\.delta$|\.partial_image$/;
/**
 * A finished output item is output too, delta or not: a reasoning item whose summary was not asked for (the default),
 * a web or file search, a code run, an image generated without partial images. A reasoning model searching the web
 * streams such items for minutes before its first text delta: timed out as silence, the searches and the thinking
 * already done (and billed) were run again on every attempt, and the answer never came.
 */
const RESPONSES_ITEM_DONE = 'response.output_item.done';
const RESPONSES_FINISH = new Set(['response.completed', 'response.incomplete']);
const RESPONSES_ERROR = new Set(['error', 'response.failed']);

/**
 * What the output events read so far carried for the client: the characters of their text, reasoning and tool
 * arguments (outputChars), what a stream without usage is billed by (policy/client-rate.ts settlement).
 */
export interface OutputTally {
  chars: number;
}

/**
 * What an event means. With a `tally`, an output event's characters (outputChars) are added to it, from the same parse:
 * a stream's every event is read here, and a second JSON.parse of each would double what reading a stream costs.
 */
export function eventMeaning(api: ApiKind, ev: SseEvent, tally?: OutputTally): EventMeaning {
  return readEvent(api, ev, tally).meaning;
}

/** What an event means, and its data as parsed for that (none for an event without a JSON object), to read further. */
export function readEvent(api: ApiKind, ev: SseEvent, tally?: OutputTally): { meaning: EventMeaning; parsed?: object } {
  // `event: error` is an error whatever its data holds (some OpenAI-compatible servers send a bare {message}).
  if (ev.event === 'error') return { meaning: 'error' };
  if (ev.data === null) return { meaning: 'keepalive' };
  // A path the gateway has no API for: any data is output, whatever its format; the upstream's end is the answer's.
  if (api === 'other') return { meaning: 'output' };
  if (api !== 'responses' && api !== 'messages' && ev.data === '[DONE]') return { meaning: 'done' };
  const parsed = parsedData(ev);
  if (parsed === undefined) return { meaning: 'malformed' };
  const meaning = api === 'responses'
    ? responsesMeaning(parsed as { type?: unknown }, ev.event)
    : api === 'messages' ? messagesMeaning(parsed as AnthropicEvent, ev.event) : choicesMeaning(parsed);
  if (tally !== undefined && (meaning === 'output' || meaning === 'finish')) tally.chars += outputChars(api, parsed, ev.event);
  return { meaning, parsed };
}

/** An event's data parsed, when it is a JSON object. */
export function parsedData(ev: SseEvent): object | undefined {
  if (ev.data === null) return undefined;
  try {
    const parsed: unknown = JSON.parse(ev.data);
    return typeof parsed === 'object' && parsed !== null ? parsed : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The characters of output an event of `api` carries, parsed: every choice's text, reasoning, refusal and tool call
 * (name and arguments), a Responses API text or arguments delta, an Anthropic text, thinking or tool input delta. Not
 * counted: audio and images (their tokens are not their base64's characters), and a Responses API item's done event,
 * whose content its deltas have already carried.
 */
export function outputChars(api: ApiKind, parsed: object, eventField: string | null = null): number {
  if (api === 'responses') {
    const ev = parsed as { type?: unknown; delta?: unknown };
    const type = typeof ev.type === 'string' ? ev.type : eventField ?? '';
    return type.endsWith('.delta') && !type.includes('audio.delta') ? charsOf(ev.delta) : 0;
  }
  if (api === 'messages') {
    const { content_block: block, delta: d } = parsed as AnthropicEvent & { delta?: { type?: unknown } };
    return charsOf(d?.text) + charsOf(d?.thinking) + charsOf(d?.partial_json) + charsOf(block?.text) + charsOf(block?.thinking);
  }
  return choicesChars((parsed as { choices?: unknown }).choices, 'delta');
}

/**
 * The characters of output a whole (non-stream) answer of `api` carries, by the rule outputChars counts a stream's
 * events by: every choice's text and message (its text, reasoning, refusal and tool calls), a Responses API answer's
 * output items (text, refusal, reasoning, tool arguments and input, code), an Anthropic answer's content blocks (text,
 * thinking, a tool's input as JSON, as its stream sends it). What a whole answer without usage is billed by (policy/
 * client-rate.ts settlement): its body is parsed, a second time, only for that (0 when it cannot be).
 */
export function outputCharsOfAnswer(api: ApiKind, body: Buffer): number {
  if (api === 'other' || api === 'embeddings') return 0;
  let parsed: unknown;
  try {
    parsed = JSON.parse(body.toString('utf8'));
  } catch {
    return 0;
  }
  if (typeof parsed !== 'object' || parsed === null) return 0;
  if (api === 'responses') return responsesOutputChars((parsed as { output?: unknown }).output);
  if (api === 'messages') return messagesOutputChars((parsed as { content?: unknown }).content);
  return choicesChars((parsed as { choices?: unknown }).choices, 'message');
}

/** The characters of every choice's text and its `delta` (a stream's chunk) or `message` (a whole answer). */
function choicesChars(choices: unknown, part: 'delta' | 'message'): number {
  if (!Array.isArray(choices)) return 0;
  let chars = 0;
  for (const choice of choices as Array<(ChatChoice & { message?: ChatChoice['delta'] }) | null>) {
    chars += charsOf(choice?.text);
    const d = choice?.[part] as (ChatChoice['delta'] & { function_call?: ToolFunction; audio?: { transcript?: unknown } }) | undefined;
    if (d === undefined || d === null) continue;
    // One of the reasoning's two names: vLLM sends its text under both (reasoning_content a copy, kept for old clients).
    chars += charsOf(d.content) + Math.max(charsOf(d.reasoning_content), charsOf(d.reasoning)) + charsOf(d.refusal) + charsOf(d.audio?.transcript);
    chars += charsOf(d.function_call?.name) + charsOf(d.function_call?.arguments);
    if (Array.isArray(d.tool_calls)) for (const call of d.tool_calls as Array<{ function?: ToolFunction } | null>) chars += charsOf(call?.function?.name) + charsOf(call?.function?.arguments);
  }
  return chars;
}

interface ResponsesItem {
  content?: unknown;
  summary?: unknown;
  arguments?: unknown;
  input?: unknown;
  code?: unknown;
}

/**
 * A Responses API answer's output items, as its stream's deltas carry them: a message's text and refusal parts, a
 * reasoning item's summary and text, a function or MCP call's arguments, a custom tool call's input, a code
 * interpreter's code. A search or an image generated is no text (its stream sends no delta for it either).
 */
function responsesOutputChars(output: unknown): number {
  if (!Array.isArray(output)) return 0;
  let chars = 0;
  for (const item of output as Array<ResponsesItem | null>) {
    if (typeof item !== 'object' || item === null) continue;
    chars += partsChars(item.content) + partsChars(item.summary) + charsOf(item.arguments) + charsOf(item.input) + charsOf(item.code);
  }
  return chars;
}

/** Text and refusal parts (`output_text`, `refusal`, `summary_text`, `reasoning_text`). */
function partsChars(parts: unknown): number {
  if (!Array.isArray(parts)) return 0;
  let chars = 0;
  for (const part of parts as Array<{ text?: unknown; refusal?: unknown } | null>) chars += charsOf(part?.text) + charsOf(part?.refusal);
  return chars;
}

/** An Anthropic answer's content blocks: text, thinking, and a tool's input as the JSON its stream's deltas send. */
function messagesOutputChars(content: unknown): number {
  if (!Array.isArray(content)) return 0;
  let chars = 0;
  for (const block of content as Array<{ text?: unknown; thinking?: unknown; input?: unknown } | null>) {
    if (typeof block !== 'object' || block === null) continue;
    chars += charsOf(block.text) + charsOf(block.thinking);
    if (typeof block.input === 'object' && block.input !== null) chars += JSON.stringify(block.input).length;
  }
  return chars;
}

interface ToolFunction {
  name?: unknown;
  arguments?: unknown;
}

/**
 * A string's length; a list of content parts' (`text`, or `thinking` as Mistral nests it: a list of text parts), a few
 * levels deep at most (an upstream's data, not the gateway's).
 */
function charsOf(v: unknown, depth = 0): number {
  if (typeof v === 'string') return v.length;
  if (!Array.isArray(v) || depth > 2) return 0;
  let chars = 0;
  for (const part of v) {
    if (typeof part === 'string') chars += part.length;
    else if (typeof part === 'object' && part !== null) {
      const p = part as { text?: unknown; thinking?: unknown };
      chars += charsOf(p.text, depth + 1) + charsOf(p.thinking, depth + 1);
    }
  }
  return chars;
}

interface AnthropicEvent {
  type?: unknown;
  error?: unknown;
  content_block?: { type?: unknown; text?: unknown; thinking?: unknown };
  delta?: { type?: unknown; text?: unknown; thinking?: unknown; partial_json?: unknown; stop_reason?: unknown };
}

/**
 * Anthropic Messages events. Output: a content block's delta with something in it, or a block that opens with its
 * content (a tool call's name, a server tool's result); a text or thinking block opens empty, and is not. The answer
 * finishes with the message_delta that carries its stop_reason, and ends with message_stop. Types the API adds
 * later keep the stream alive, as pings do. An error object in data without a type is an error: a proxy may
 * write its error as data alone (`{"error": {...}}`, no `event:` line, no `type`). Read as a keepalive, it held the
 * stream until its first-token or idle timeout, and the client got a 504 or a stall for what was an overload.
 */
function messagesMeaning(ev: AnthropicEvent, eventField: string | null): EventMeaning {
  const type = typeof ev.type === 'string' ? ev.type : eventField ?? '';
  switch (type) {
    case 'error':
      return 'error';
    case 'message_stop':
      return 'done';
    case 'message_delta':
      return present(ev.delta?.stop_reason) ? 'finish' : 'keepalive';
    case 'content_block_start': {
      const block = ev.content_block;
      if (block?.type === 'text') return nonEmpty(block.text) ? 'output' : 'keepalive';
      if (block?.type === 'thinking') return nonEmpty(block.thinking) ? 'output' : 'keepalive';
      return block === undefined ? 'keepalive' : 'output';
    }
    case 'content_block_delta': {
      const d = ev.delta;
      if (d === undefined) return 'keepalive';
      if (d.type === 'text_delta') return nonEmpty(d.text) ? 'output' : 'keepalive';
      if (d.type === 'thinking_delta') return nonEmpty(d.thinking) ? 'output' : 'keepalive';
      if (d.type === 'input_json_delta') return nonEmpty(d.partial_json) ? 'output' : 'keepalive';
      return 'output';
    }
    default:
      // Only without a type of its own: an event type Anthropic adds may carry an error of a part (a tool's), not the stream's.
      return typeof ev.type !== 'string' && present(ev.error) ? 'error' : 'keepalive';
  }
}

function choicesMeaning(chunk: { error?: unknown; choices?: unknown }): EventMeaning {
  if (raised(chunk.error)) return 'error';
  if (!Array.isArray(chunk.choices)) return 'keepalive';
  if (aborted(chunk)) return 'error';
  let meaning: EventMeaning = 'keepalive';
  for (const choice of chunk.choices as ChatChoice[]) {
    if (finishes(choice.finish_reason)) return 'finish';
    const d = choice.delta;
    if (
      nonEmpty(choice.text) ||
      (d && (nonEmpty(d.content) || contentParts(d.content) || nonEmpty(d.reasoning_content) || nonEmpty(d.reasoning) || nonEmpty(d.refusal) ||
        (Array.isArray(d.tool_calls) && d.tool_calls.length > 0) || present(d.function_call) || present(d.audio)))
    ) {
      meaning = 'output';
    }
  }
  return meaning;
}

function responsesMeaning(ev: { type?: unknown }, eventField: string | null): EventMeaning {
  const type = typeof ev.type === 'string' ? ev.type : eventField ?? '';
  if (RESPONSES_ERROR.has(type)) return 'error';
  if (RESPONSES_FINISH.has(type)) return 'finish';
  if (RESPONSES_OUTPUT.test(type) || type === RESPONSES_ITEM_DONE) return 'output';
  return 'keepalive';
}

/**
 * What a whole streamed answer holds: a finish_reason for each of `choices` choices (the request's `n`, for each of a
 * legacy completion's prompts), and, when the client asked for it (stream_options.include_usage), a usage chunk after
 * them. The Responses API ends with one terminal event, whatever the request.
 */
export interface StreamShape {
  choices: number;
  usage: boolean;
  /**
   * A Responses API stream whose answer starts at its `response.created` (startsAnswer), not its first output, and why:
   * a `background` response lives on at the provider once created, whatever becomes of the connection, and is resumed
   * by its id; a response in a `conversation` has its turn appended to that stored conversation. Either way a second
   * request would start a second response beside the first.
   */
  startsAtCreated?: 'background' | 'conversation';
}

export function streamShapeOf(api: ApiKind, json: Record<string, unknown>): StreamShape {
  if (api === 'responses') {
    const startsAtCreated = json.background === true ? 'background' : addsToConversation(api, json) ? 'conversation' : undefined;
    return { choices: 1, usage: false, ...(startsAtCreated && { startsAtCreated }) };
  }
  if (api === 'messages') return { choices: 1, usage: false };
  const n = json.n;
  const perPrompt = typeof n === 'number' && Number.isInteger(n) && n > 1 ? n : 1;
  return { choices: perPrompt * (api === 'completions' ? promptCount(json.prompt) : 1), usage: asksUsage(json) };
}

/**
 * Does a Responses API request add to a stored conversation (the Conversations API's `conversation`, an id or {id})?
 * The provider appends the request's input, and the response's output, to it as it takes the request: sent twice,
 * the agent's history has the turn twice.
 */
export function addsToConversation(api: ApiKind, json: Record<string, unknown>): boolean {
  return api === 'responses' && Boolean(json.conversation);
}

/** The client asked for a chat or completions stream's usage chunk (stream_options.include_usage). */
export function asksUsage(json: Record<string, unknown>): boolean {
  return (json.stream_options as { include_usage?: unknown } | null | undefined)?.include_usage === true;
}

/**
 * Does this event start the client's answer before any output? The `response.created` of a response that a second
 * request would duplicate does (StreamShape.startsAtCreated). A background job runs on at the provider after its
 * connection is gone, and a conversation has the turn appended to it: a retry before the first output (a reasoning
 * model thinking past firstTokenMs, a queue) started another that ran and billed beside it, or added the turn to the
 * conversation twice; and the client, held until the first output, never learnt the id it would poll, cancel or resume
 * (`starting_after`) a background one by.
 */
export function startsAnswer(api: ApiKind, shape: StreamShape, ev: SseEvent): boolean {
  if (api !== 'responses' || shape.startsAtCreated === undefined || ev.data === null) return false;
  try {
    return (JSON.parse(ev.data) as { type?: unknown } | null)?.type === 'response.created';
  } catch {
    return false;
  }
}

/**
 * A chat or completions chunk's choices (its data parsed: readEvent's, parsedData's), each with its index (its place
 * in the list when it has none); none of a malformed event, and no choice that is not an object.
 */
function indexedChoices(chunk: object | undefined): Array<[index: number, choice: ChatChoice]> {
  const choices = (chunk as { choices?: unknown } | undefined)?.choices;
  if (!Array.isArray(choices)) return [];
  return (choices as unknown[]).flatMap((c, i): Array<[number, ChatChoice]> => {
    if (typeof c !== 'object' || c === null) return [];
    const { index } = c as { index?: unknown };
    return [[typeof index === 'number' ? index : i, c as ChatChoice]];
  });
}

/** The indexes of the choices a chat or completions chunk carries, and of those it finishes (with a finish_reason). */
export function choiceIndexes(chunk: object | undefined): { seen: number[]; finished: number[] } {
  const out = { seen: [] as number[], finished: [] as number[] };
  for (const [index, c] of indexedChoices(chunk)) {
    out.seen.push(index);
    if (finishes(c.finish_reason)) out.finished.push(index);
  }
  return out;
}

/**
 * The indexes of the choices a chat or completions chunk carries a tool call for (a non-empty `tool_calls` list, or a
 * legacy `function_call` object): with n > 1, each choice's call is open until its own finish.
 */
export function choicesCalling(chunk: object | undefined): number[] {
  return indexedChoices(chunk)
    .filter(([, { delta: d }]) => d !== undefined && d !== null && ((Array.isArray(d.tool_calls) && d.tool_calls.length > 0) || (typeof d.function_call === 'object' && d.function_call !== null)))
    .map(([index]) => index);
}

/** A piece of a tool call's arguments, keyed by choice and call; `opens` when it came with the call's id. */
interface ArgumentPiece {
  key: string;
  piece: string;
  opens: boolean;
}

/**
 * The pieces of tool call arguments a chat completion chunk carries, keyed by choice and call (a legacy function_call
 * by its choice alone). Arguments sent as anything but a string (some servers send an object) are not pieces.
 */
export function argumentPieces(chunk: object | undefined): ArgumentPiece[] {
  const out: ArgumentPiece[] = [];
  for (const [choice, { delta: d }] of indexedChoices(chunk)) {
    if (d === undefined || d === null) continue;
    if (Array.isArray(d.tool_calls)) {
      d.tool_calls.forEach((call, j) => {
        const { index, id, function: fn } = (call ?? {}) as { index?: unknown; id?: unknown; function?: { arguments?: unknown } };
        if (typeof fn?.arguments === 'string') out.push({ key: `${choice}:${typeof index === 'number' ? index : j}`, piece: fn.arguments, opens: nonEmpty(id) });
      });
    }
    const legacy = (d.function_call ?? undefined) as { arguments?: unknown } | undefined;
    if (typeof legacy?.arguments === 'string') out.push({ key: `${choice}:function_call`, piece: legacy.arguments, opens: false });
  }
  return out;
}

/**
 * An upstream error event as the SDKs read it: chat and completions streams need `{"error": {...}}` in the data for
 * the SDK to raise it (an `event: error` with a bare `{message}` would be handed to the user as a chunk).
 */
export function errorEventForClient(api: ApiKind, ev: SseEvent, nextSequence?: number): string {
  let parsed: { error?: unknown; message?: unknown; choices?: unknown } | undefined;
  try {
    parsed = ev.data === null ? undefined : (JSON.parse(ev.data) as typeof parsed);
  } catch {
    parsed = undefined;
  }
  if (parsed && typeof parsed === 'object' && raised(parsed.error)) {
    // A bare string (`{"error": "model crashed"}`, as some compatible servers send it): the SDKs would raise it with
    // no code nor type, and its JSON-quoted text as the message.
    if (typeof parsed.error !== 'object') return streamErrorEvent(api, `the upstream stream failed: ${String(parsed.error)}`, 'upstream_error', nextSequence);
    // The Anthropic SDKs raise only an `event: error` and skip an event without a name: an error sent as data alone
    // (`{"type": "error", ...}`, as Anthropic-compatible servers may write it) ended the stream cleanly for them, the
    // answer cut short with nothing raised.
    // An `event:` line's last value is the event's name, so one appended names it whatever the event said before.
    if (api === 'messages' && ev.event !== 'error') return typedErrorEvent({ ...ev, event: 'error', raw: `${ev.raw}\nevent: error` }, parsed);
    return typedErrorEvent(ev, parsed);
  }
  if (api === 'responses') {
    // The Responses API's own `error` event ({type, code, message, param}) and `response.failed` (its error inside
    // `response`) have no top-level `error`: the SDK yields them as ordinary events, its stream then ends cleanly and
    // `responses.stream().finalResponse()` resolves with the partial snapshot. The event goes on as sent (for clients
    // that read it), followed by, or merged into, one the SDK raises.
    const err = upstreamErrorOf(ev);
    const message = err?.message ?? 'the upstream sent an error event';
    const code = err?.code ?? 'upstream_error';
    const error = { message, type: err?.type ?? 'server_error', param: err?.param ?? null, code };
    if (!parsed || typeof parsed !== 'object') return streamErrorEvent(api, `the upstream stream failed: ${message}`, code, nextSequence);
    if ((parsed as { type?: unknown }).type === 'error') return `event: error\ndata: ${JSON.stringify({ ...parsed, error })}\n\n`;
    // The event added after this one (a response.failed) numbers on from it.
    const sequence = nextSequenceNumber(parsed) ?? nextSequence;
    return `${ev.raw}\n\nevent: error\ndata: ${JSON.stringify({ type: 'error', ...numbered(sequence), code, message, param: error.param, error })}\n\n`;
  }
  const message = typeof parsed?.message === 'string' ? parsed.message : parsed && aborted(parsed) ? stoppedMessage(stoppedBy(parsed)!) : 'the upstream sent an error event';
  return streamErrorEvent(api, `the upstream stream failed: ${message}`, 'upstream_error', nextSequence);
}

/**
 * The `sequence_number` an event the gateway writes after this Responses API event takes: every event of that API
 * carries one, counting up, and clients validate it (the Vercel AI SDK's parser refuses an `error` event without one:
 * a cut stream surfaced as "Type validation failed" instead of its stream_interrupted error). Undefined when the
 * upstream numbers nothing (a compatible server): the gateway does not make numbers up.
 */
export function nextSequenceNumber(event: string | Record<string, unknown> | null): number | undefined {
  let parsed: unknown = event;
  if (typeof event === 'string') {
    try {
      parsed = JSON.parse(event);
    } catch {
      return undefined;
    }
  }
  const n = (parsed as { sequence_number?: unknown } | null)?.sequence_number;
  return typeof n === 'number' && Number.isInteger(n) && n >= 0 ? n + 1 : undefined;
}

const numbered = (sequence: number | undefined) => (sequence === undefined ? {} : { sequence_number: sequence });

/**
 * An error event the SDKs already raise goes on as sent, unless its `code` or `param` is not what the OpenAI shape
 * types it as (a compatible server's `"code": 500`): then it goes on with them as errors.ts gives them, string or null.
 */
function typedErrorEvent(ev: SseEvent, parsed: { error?: unknown }): string {
  const e = parsed.error as { code?: unknown; param?: unknown };
  const mistyped = (v: unknown) => present(v) && typeof v !== 'string';
  if (typeof e !== 'object' || !(mistyped(e.code) || mistyped(e.param))) return `${ev.raw}\n\n`;
  const data = JSON.stringify({ ...parsed, error: { ...e, code: stringOrNull(e.code), param: stringOrNull(e.param) } });
  return `${framed(ev.event, data)}\n\n`;
}

/** An event's `event:` line (when it has a name) and its `data:` line, as an SseEvent's `raw` holds them. */
function framed(event: string | null, data: string): string {
  return `${event === null ? '' : `event: ${event}\n`}data: ${data}`;
}

export interface UpstreamStreamError {
  message: string | undefined;
  code: string | undefined;
  type: string | undefined;
  param: string | null;
  /** The HTTP status the provider says the error stands for, beside it (Groq's `"status_code": 400`). */
  status?: number;
}

/**
 * The error an upstream error event carries, whatever its shape: `{"error": {...}}` (chat, completions, most
 * compatible servers), the Responses API's `error` event (`{type: "error", code, message, param}`) or its
 * `response.failed` (`{response: {error: {code, message}}}`).
 */
export function upstreamErrorOf(ev: SseEvent): UpstreamStreamError | undefined {
  return ev.data === null ? undefined : upstreamErrorInText(ev.data);
}

/** The error a JSON text carries (an event's data, a whole answer's body), as upstreamErrorIn reads it. */
export function upstreamErrorInText(text: string): UpstreamStreamError | undefined {
  let parsed: Record<string, unknown> | undefined;
  try {
    parsed = JSON.parse(text) as Record<string, unknown>;
  } catch {
    return undefined;
  }
  if (!parsed || typeof parsed !== 'object') return undefined;
  return upstreamErrorIn(parsed);
}

/** The error a parsed upstream object carries (an error event's data, or a whole Response whose status is failed). */
export function upstreamErrorIn(parsed: Record<string, unknown>): UpstreamStreamError | undefined {
  const response = parsed.response as { error?: unknown } | undefined;
  const candidates = [parsed.error, response && typeof response === 'object' ? response.error : undefined, parsed];
  for (const c of candidates) {
    if (!c || typeof c !== 'object') continue;
    const e = c as Record<string, unknown>;
    if (typeof e.message !== 'string' && typeof e.code !== 'string') continue;
    const str = (v: unknown) => (typeof v === 'string' ? v : undefined);
    const type = str(e.type);
    // A number (`"code": 500` from some compatible servers) is read as its digits, as errors.ts passes it on.
    const status = typeof e.status_code === 'number' && Number.isInteger(e.status_code) ? { status: e.status_code } : {};
    return { message: str(e.message), code: stringOrNull(e.code) ?? undefined, type: type === 'error' ? undefined : type, param: stringOrNull(e.param), ...status };
  }
  return undefined;
}

/**
 * The event that ends an answer after its finish, appended when the upstream's does not come: chat's and completions'
 * `data: [DONE]`, Anthropic's message_stop. The Responses API has none (its terminal event is the finish).
 */
export function doneEvent(api: ApiKind): string | undefined {
  if (api === 'responses') return undefined;
  return api === 'messages' ? 'event: message_stop\ndata: {"type":"message_stop"}\n\n' : 'data: [DONE]\n\n';
}

/**
 * The event that ends a broken stream so that the SDKs raise it instead of treating the answer as complete;
 * `sequence` is the Responses API's next `sequence_number` (nextSequenceNumber), when known.
 */
export function streamErrorEvent(api: ApiKind, message: string, code: string, sequence?: number): string {
  const error = { message, type: 'server_error', param: null, code };
  if (api === 'responses') {
    return `event: error\ndata: ${JSON.stringify({ type: 'error', ...numbered(sequence), code, message, param: null, error })}\n\n`;
  }
  // The Anthropic SDKs raise an `event: error`; its error is in their shape and in the OpenAI one at once.
  if (api === 'messages') return `event: error\ndata: ${JSON.stringify({ type: 'error', error: { ...error, type: 'api_error' } })}\n\n`;
  return `data: ${JSON.stringify({ error })}\n\n`;
}
