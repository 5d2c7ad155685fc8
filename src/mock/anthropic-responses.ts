// Anthropic Messages answers (`POST /v1/messages`): the message object and its real event sequence.
import { answerText, contentText, continuationText, countTokens, lastText, promptChars, splitText, TOOL_ARGUMENTS } from './content.ts';
import { MockRequestError } from './errors.ts';
import type { AnswerContext, Body } from './openai-responses.ts';
import { namedEvent, type StreamPlan } from './sse.ts';

type MessagesAnswer = { kind: 'text'; text: string } | { kind: 'tool'; name: string };

interface Parsed {
  model: string;
  answer: MessagesAnswer;
  inputTokens: number;
}

function isToolResult(content: unknown): boolean {
  return Array.isArray(content) && content.some((b) => (b as { type?: unknown } | null)?.type === 'tool_result');
}

function parse(body: Body): Parsed {
  const model = body['model'];
  if (typeof model !== 'string' || model === '') throw new MockRequestError(400, 'model: Field required');
  if (typeof body['max_tokens'] !== 'number') throw new MockRequestError(400, 'max_tokens: Field required');
  const messages = body['messages'];
  if (!Array.isArray(messages) || messages.length === 0) throw new MockRequestError(400, 'messages: Field required');

  const last = messages[messages.length - 1] as { role?: unknown; content?: unknown };
  const tools = body['tools'];
  const choice = (body['tool_choice'] as { type?: unknown } | undefined)?.type;
  let answer: MessagesAnswer;
  if (last.role === 'assistant') {
    // As Anthropic does: a prefill that ends in whitespace is refused.
    if (/\s$/.test(contentText(last.content))) throw new MockRequestError(400, 'messages: final assistant content cannot end with trailing whitespace');
    // A prefill: the answer continues the assistant's text instead of starting over.
    answer = { kind: 'text', text: continuationText(contentText(last.content)) };
  } else if (Array.isArray(tools) && tools.length > 0 && !isToolResult(last.content) && choice !== 'none') {
    const name = (tools[0] as { name?: unknown }).name;
    answer = { kind: 'tool', name: typeof name === 'string' ? name : 'tool' };
  } else {
    answer = { kind: 'text', text: answerText(lastText(messages, 'user')) };
  }
  const chars = promptChars(messages) + contentText(body['system']).length;
  return { model, answer, inputTokens: Math.max(1, Math.ceil(chars / 4)) };
}

function outputTokens(answer: MessagesAnswer): number {
  return countTokens(answer.kind === 'text' ? answer.text : TOOL_ARGUMENTS);
}

function usage(inputTokens: number, output: number) {
  return { input_tokens: inputTokens, cache_creation_input_tokens: 0, cache_read_input_tokens: 0, output_tokens: output, service_tier: 'standard' };
}

/** Non-stream message. */
export function message(body: Body, ctx: AnswerContext): unknown {
  const { model, answer, inputTokens } = parse(body);
  const content =
    answer.kind === 'text'
      ? [{ type: 'text', text: answer.text }]
      : [{ type: 'tool_use', id: ctx.id('toolu_'), name: answer.name, input: { x: 1 } }];
  return {
    id: ctx.id('msg_'),
    type: 'message',
    role: 'assistant',
    model,
    content,
    stop_reason: answer.kind === 'text' ? 'end_turn' : 'tool_use',
    stop_sequence: null,
    usage: usage(inputTokens, outputTokens(answer)),
  };
}

/** message_start, content_block_start, ping, content_block_delta..., content_block_stop, message_delta, message_stop. */
export function messageStream(body: Body, ctx: AnswerContext): StreamPlan {
  const { model, answer, inputTokens } = parse(body);
  const ev = (type: string, fields: Record<string, unknown>) => namedEvent(type, { type, ...fields });
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
  const block =
    answer.kind === 'text'
      ? { type: 'text', text: '' }
      : { type: 'tool_use', id: ctx.id('toolu_'), name: answer.name, input: {} };
  const head =
    ev('message_start', { message: start }) +
    ev('content_block_start', { index: 0, content_block: block }) +
    ev('ping', {});
  const pieces = splitText(answer.kind === 'text' ? answer.text : TOOL_ARGUMENTS, ctx.chunks);
  const chunks = pieces.map((piece) =>
    ev('content_block_delta', {
      index: 0,
      delta: answer.kind === 'text' ? { type: 'text_delta', text: piece } : { type: 'input_json_delta', partial_json: piece },
    }),
  );
  const tail =
    ev('content_block_stop', { index: 0 }) +
    ev('message_delta', {
      delta: { stop_reason: answer.kind === 'text' ? 'end_turn' : 'tool_use', stop_sequence: null },
      usage: { output_tokens: outputTokens(answer) },
    });
  return { head, chunks, tail, done: ev('message_stop', {}), malformed: 'event: content_block_delta\ndata: {not json\n\n' };
}
