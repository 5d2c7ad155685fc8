// Anthropic Messages answers (`POST /v1/messages`): the message object and its real event sequence.
import { answerText, capText, contentText, continuationText, countTokens, lastText, promptChars, schemaExample, splitText, TOOL_ARGUMENTS } from './content.ts';
import { checkMessagesRequest } from './anthropic-strict.ts';
import { MockRequestError } from './errors.ts';
import type { AnswerContext, Body } from './openai-responses.ts';
import { namedEvent, type StreamPlan } from './sse.ts';

type MessagesAnswer = { kind: 'text'; text: string } | { kind: 'tool'; names: string[] };

interface Parsed {
  model: string;
  answer: MessagesAnswer;
  inputTokens: number;
  /** The thinking block's text when the request asked for thinking (and for its text), which opens the answer. */
  thinking: string | undefined;
  /** end_turn, tool_use, or max_tokens when the text answer was cut at max_tokens (thinking counted in). */
  stopReason: 'end_turn' | 'tool_use' | 'max_tokens';
}

/**
 * What the answer thinks, when the request turned thinking on: it names the budget or effort asked for, so a test
 * reads from the client's reasoning_content what the translation sent. A display of `omitted` gets the block with
 * its text left out, as Claude 4.7 sends it.
 */
function thinkingText(body: Body): string | undefined {
  const thinking = body['thinking'] as { type?: unknown; budget_tokens?: unknown; display?: unknown } | undefined;
  if (thinking?.type === 'enabled') return `Thinking it over (budget_tokens ${String(thinking.budget_tokens)}).`;
  if (thinking?.type !== 'adaptive') return undefined;
  if (thinking.display === 'omitted') return '';
  const effort = (body['output_config'] as { effort?: unknown } | undefined)?.effort ?? 'high';
  return `Thinking it over (adaptive, effort ${String(effort)}).`;
}

/** Anthropic's mid-stream overload, as the API sends it inside a 200 stream (its last event). */
const OVERLOADED_EVENT = namedEvent('error', { type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } });

// Anthropic signs each thinking block so that it can check one sent back; the mock's is a fixed placeholder.
const SIGNATURE = 'EqMBCkYIBxgCKkBtZXRob2Qtbm90LWEtcmVhbC1zaWduYXR1cmU=';

function isToolResult(content: unknown): boolean {
  return Array.isArray(content) && content.some((b) => (b as { type?: unknown } | null)?.type === 'tool_result');
}

function parse(body: Body): Parsed {
  const model = body['model'];
  if (typeof model !== 'string' || model === '') throw new MockRequestError(400, 'model: Field required');
  if (typeof body['max_tokens'] !== 'number') throw new MockRequestError(400, 'max_tokens: Field required');
  const messages = body['messages'];
  if (!Array.isArray(messages) || messages.length === 0) throw new MockRequestError(400, 'messages: Field required');
  // What the real API refuses, the mock refuses too: a translation that breaks its rules must fail here, not in production.
  checkMessagesRequest(body);

  const last = messages[messages.length - 1] as { role?: unknown; content?: unknown };
  const tools = body['tools'];
  const toolChoice = body['tool_choice'] as { type?: unknown; name?: unknown; disable_parallel_tool_use?: unknown } | undefined;
  const choice = toolChoice?.type;
  let answer: MessagesAnswer;
  if (last.role === 'assistant') {
    // As Anthropic does: a prefill that ends in whitespace is refused.
    if (/\s$/.test(contentText(last.content))) throw new MockRequestError(400, 'messages: final assistant content cannot end with trailing whitespace');
    // A prefill: the answer continues the assistant's text instead of starting over.
    answer = { kind: 'text', text: continuationText(contentText(last.content)) };
  } else if (Array.isArray(tools) && tools.length > 0 && !isToolResult(last.content) && choice !== 'none') {
    // A named tool is that tool; otherwise every tool at once (parallel tool use), or the first alone when the
    // client disabled parallel tool use.
    const nameOf = (t: unknown) => {
      const name = (t as { name?: unknown } | null)?.name;
      return typeof name === 'string' ? name : 'tool';
    };
    const names =
      choice === 'tool' && typeof toolChoice?.name === 'string'
        ? [toolChoice.name]
        : toolChoice?.disable_parallel_tool_use === true
          ? [nameOf(tools[0])]
          : tools.map(nameOf);
    answer = { kind: 'tool', names };
  } else {
    // Structured outputs: JSON that fits output_config.format's schema, as the SDKs' parse helpers expect.
    const format = (body['output_config'] as { format?: { type?: unknown; schema?: unknown } } | undefined)?.format;
    const text = format?.type === 'json_schema' ? JSON.stringify(schemaExample(format.schema)) : answerText(lastText(messages, 'user'));
    answer = { kind: 'text', text };
  }
  const chars = promptChars(messages) + contentText(body['system']).length;
  const thinking = thinkingText(body);
  let stopReason: Parsed['stopReason'] = answer.kind === 'text' ? 'end_turn' : 'tool_use';
  if (answer.kind === 'text') {
    const cut = capText(answer.text, body['max_tokens'] - (thinking ? countTokens(thinking) : 0));
    if (cut !== undefined) {
      answer = { kind: 'text', text: cut };
      stopReason = 'max_tokens';
    }
  }
  return { model, answer, inputTokens: Math.max(1, Math.ceil(chars / 4)), thinking, stopReason };
}

function outputTokens(answer: MessagesAnswer, thinking: string | undefined): number {
  return countTokens(answer.kind === 'text' ? answer.text : TOOL_ARGUMENTS.repeat(answer.names.length)) + (thinking ? countTokens(thinking) : 0);
}

function usage(inputTokens: number, output: number) {
  return { input_tokens: inputTokens, cache_creation_input_tokens: 0, cache_read_input_tokens: 0, output_tokens: output, service_tier: 'standard' };
}

/** `POST /v1/messages/count_tokens`: the input a message request would bill, without running it. */
export function tokenCount(body: Body): unknown {
  const messages = body['messages'];
  if (typeof body['model'] !== 'string' || body['model'] === '') throw new MockRequestError(400, 'model: Field required');
  if (!Array.isArray(messages) || messages.length === 0) throw new MockRequestError(400, 'messages: Field required');
  checkMessagesRequest(body);
  const chars = promptChars(messages) + contentText(body['system']).length;
  return { input_tokens: Math.max(1, Math.ceil(chars / 4)) };
}

/** The most message threads a mock holds. */
const MAX_THREADS = 10_000;

/**
 * A request on a message thread (the `thread` field, beta message-threads-2026-08-12) as the whole request it stands
 * for: a `continue` gets the conversation, `system` and `tools` its thread holds put back, and a `previous_message_id`
 * this mock holds no thread for is Anthropic's 404 `thread_not_found` (so a thread started at one account and
 * continued at another fails as it would there, and the SDK replays the whole conversation). Also returns where to
 * record the reply: a request with a `thread` field starts or extends one.
 */
function unthread(body: Body, ctx: AnswerContext): { body: Body; record: ((id: string, content: unknown[]) => void) | undefined } {
  const thread = body['thread'] as { type?: unknown; previous_message_id?: unknown } | null | undefined;
  if (thread == null || ctx.threads === undefined) return { body, record: undefined };
  const { thread: _thread, ...rest } = body;
  let full: Body = rest;
  if (thread.type === 'continue') {
    const held = typeof thread.previous_message_id === 'string' ? ctx.threads.get(thread.previous_message_id) : undefined;
    if (held === undefined) {
      throw new MockRequestError(404, `No thread state found for previous_message_id ${String(thread.previous_message_id)}.`, { anthropicErrorCode: 'thread_not_found' });
    }
    const messages = Array.isArray(rest['messages']) ? rest['messages'] : [];
    full = { ...rest, system: held.system, tools: held.tools, messages: [...held.messages, ...messages] };
  }
  const threads = ctx.threads;
  return {
    body: full,
    record: (id, content) => {
      threads.set(id, { messages: [...(full['messages'] as unknown[]), { role: 'assistant', content }], system: full['system'], tools: full['tools'] });
      // A mock left running for days keeps the latest threads, not every one: the oldest goes (a continue of it: 404).
      if (threads.size > MAX_THREADS) threads.delete(threads.keys().next().value!);
    },
  };
}

/** Non-stream message. */
export function message(request: Body, ctx: AnswerContext): unknown {
  const { body, record } = unthread(request, ctx);
  const { model, answer, inputTokens, thinking, stopReason } = parse(body);
  const content: unknown[] =
    answer.kind === 'text'
      ? [{ type: 'text', text: answer.text }]
      : answer.names.map((name) => ({ type: 'tool_use', id: ctx.id('toolu_'), name, input: { x: 1 } }));
  if (thinking !== undefined) content.unshift({ type: 'thinking', thinking, signature: SIGNATURE });
  const id = ctx.id('msg_');
  record?.(id, content);
  return {
    id,
    type: 'message',
    role: 'assistant',
    model,
    content,
    stop_reason: stopReason,
    stop_sequence: null,
    usage: usage(inputTokens, outputTokens(answer, thinking)),
  };
}

/**
 * message_start, content_block_start, ping, content_block_delta..., content_block_stop, message_delta, message_stop.
 * With thinking, a thinking block (its text, then its signature) comes first, whole in the head, and the answer's
 * blocks number on from 1.
 */
export function messageStream(request: Body, ctx: AnswerContext): StreamPlan {
  const { body, record } = unthread(request, ctx);
  const { model, answer, inputTokens, thinking, stopReason } = parse(body);
  const ev = (type: string, fields: Record<string, unknown>) => namedEvent(type, { type, ...fields });
  // The tool calls' ids, drawn before the message's own, as the non-stream answer draws them.
  const toolIds = answer.kind === 'tool' ? answer.names.map(() => ctx.id('toolu_')) : [];
  const start = {
    id: ctx.id('msg_'),
    type: 'message',
    role: 'assistant',
    model,
    content: [],
    stop_reason: null,
    stop_sequence: null,
    usage: usage(inputTokens, 1),
  };
  const first = thinking === undefined ? 0 : 1; // the index of the answer's first block
  // One content block per tool call (indexes first, first + 1, ...), each opened, streamed and closed in turn.
  const block = (k: number) =>
    answer.kind === 'text' ? { type: 'text', text: '' } : { type: 'tool_use', id: toolIds[k], name: answer.names[k], input: {} };
  const thought =
    thinking === undefined
      ? ''
      : ev('content_block_start', { index: 0, content_block: { type: 'thinking', thinking: '', signature: '' } }) +
        (thinking === '' ? '' : ev('content_block_delta', { index: 0, delta: { type: 'thinking_delta', thinking } })) +
        ev('content_block_delta', { index: 0, delta: { type: 'signature_delta', signature: SIGNATURE } }) +
        ev('content_block_stop', { index: 0 });
  const head =
    ev('message_start', { message: start }) +
    thought +
    ev('content_block_start', { index: first, content_block: block(0) }) +
    ev('ping', {});
  const blocks = answer.kind === 'text' ? 1 : answer.names.length;
  const pieces = splitText(answer.kind === 'text' ? answer.text : TOOL_ARGUMENTS, ctx.chunks);
  const chunks = Array.from({ length: blocks }, (_, k) =>
    pieces.map(
      (piece, j) =>
        (k > 0 && j === 0 ? ev('content_block_stop', { index: first + k - 1 }) + ev('content_block_start', { index: first + k, content_block: block(k) }) : '') +
        ev('content_block_delta', {
          index: first + k,
          delta: answer.kind === 'text' ? { type: 'text_delta', text: piece } : { type: 'input_json_delta', partial_json: piece },
        }),
    ),
  ).flat();
  const tail =
    ev('content_block_stop', { index: first + blocks - 1 }) +
    ev('message_delta', {
      delta: { stop_reason: stopReason, stop_sequence: null },
      usage: { output_tokens: outputTokens(answer, thinking) },
    });
  if (record) {
    const content: unknown[] = answer.kind === 'text' ? [{ type: 'text', text: answer.text }] : answer.names.map((name, k) => ({ type: 'tool_use', id: toolIds[k], name, input: { x: 1 } }));
    if (thinking !== undefined) content.unshift({ type: 'thinking', thinking, signature: SIGNATURE });
    record(start.id, content);
  }
  return { head, chunks, tail, done: ev('message_stop', {}), malformed: 'event: content_block_delta\ndata: {not json\n\n', error: () => OVERLOADED_EVENT };
}

/**
 * GET /v1/models as Anthropic's API answers it (asked with `anthropic-version`): its own page shape, newest first, and
 * only its own models, so the Anthropic SDK's models.list() reads what it would from Anthropic.
 */
const ANTHROPIC_MODELS: ReadonlyArray<[id: string, displayName: string, createdAt: string]> = [
  ['claude-haiku-4-5', 'Claude Haiku 4.5', '2025-10-15T00:00:00Z'],
  ['claude-sonnet-4-5', 'Claude Sonnet 4.5', '2025-09-29T00:00:00Z'],
  ['claude-opus-4-1', 'Claude Opus 4.1', '2025-08-05T00:00:00Z'],
];

const ANTHROPIC_MODEL_OBJECTS = ANTHROPIC_MODELS.map(([id, display_name, created_at]) => ({ type: 'model', id, display_name, created_at }));

/** GET /v1/models/{model_id} as Anthropic answers it: the model, or its 404 not_found_error. */
export function anthropicModelObject(id: string): unknown {
  const model = ANTHROPIC_MODEL_OBJECTS.find((m) => m.id === id);
  if (model === undefined) throw new MockRequestError(404, `model: ${id}`);
  return model;
}

/** Built once: the model list never changes. */
export const ANTHROPIC_MODELS_BODY = JSON.stringify({
  data: ANTHROPIC_MODEL_OBJECTS,
  has_more: false,
  first_id: ANTHROPIC_MODELS[0]![0],
  last_id: ANTHROPIC_MODELS[ANTHROPIC_MODELS.length - 1]![0],
});
