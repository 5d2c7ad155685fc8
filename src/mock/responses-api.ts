// OpenAI Responses API (`POST /v1/responses`): the Response object and its real event sequence.
import { answerText, capText, contentText, countTokens, lastText, promptChars, schemaExample, splitText } from './content.ts';
import { requireModel, type AnswerContext, type Body } from './openai-responses.ts';
import { namedEvent, type StreamPlan } from './sse.ts';

function promptOf(body: Body): string {
  const input = body['input'];
  return typeof input === 'string' ? input : lastText(input, 'user');
}

function promptTokens(body: Body): number {
  const input = body['input'];
  const chars = (typeof input === 'string' ? input.length : promptChars(input)) + contentText(body['instructions']).length;
  return Math.max(1, Math.ceil(chars / 4));
}

interface Parts {
  model: string;
  respId: string;
  msgId: string;
  createdAt: number;
  text: string;
  /** max_output_tokens cut the text: the Response ends `incomplete`, as the real API's does. */
  cut: boolean;
  inputTokens: number;
}

/** How a finished Response ends: completed, or incomplete when max_output_tokens cut its text. */
type Finished = 'completed' | 'incomplete';

function parts(body: Body, ctx: AnswerContext): Parts {
  const model = requireModel(body);
  // Structured outputs (text.format json_schema): JSON that fits the schema, as responses.parse() expects.
  const format = (body['text'] as { format?: { type?: unknown; schema?: unknown } } | undefined)?.format;
  const whole = format?.type === 'json_schema' ? JSON.stringify(schemaExample(format.schema)) : answerText(promptOf(body));
  const cut = capText(whole, body['max_output_tokens']);
  return { model, respId: ctx.id('resp_'), msgId: ctx.id('msg_'), createdAt: ctx.created, text: cut ?? whole, cut: cut !== undefined, inputTokens: promptTokens(body) };
}

/** The status a finished Response and its message item take. */
function finished(p: Parts): Finished {
  return p.cut ? 'incomplete' : 'completed';
}

function message(p: Parts, status: 'in_progress' | Finished, text: string | undefined) {
  return {
    id: p.msgId,
    type: 'message',
    status,
    role: 'assistant',
    content: text === undefined ? [] : [{ type: 'output_text', text, annotations: [], logprobs: [] }],
  };
}

/** The Response object; fields the SDK types declare non-optional are all present. */
function response(p: Parts, body: Body, status: 'in_progress' | Finished) {
  const done = status !== 'in_progress';
  const outputTokens = countTokens(p.text);
  return {
    id: p.respId,
    object: 'response',
    created_at: p.createdAt,
    status,
    background: false,
    error: null,
    incomplete_details: status === 'incomplete' ? { reason: 'max_output_tokens' } : null,
    instructions: typeof body['instructions'] === 'string' ? body['instructions'] : null,
    max_output_tokens: typeof body['max_output_tokens'] === 'number' ? body['max_output_tokens'] : null,
    model: p.model,
    output: done ? [message(p, status, p.text)] : [],
    parallel_tool_calls: true,
    previous_response_id: null,
    reasoning: { effort: null, summary: null },
    service_tier: 'default',
    store: body['store'] !== false,
    temperature: typeof body['temperature'] === 'number' ? body['temperature'] : 1,
    text: { format: { type: 'text' } },
    tool_choice: 'auto',
    tools: [],
    top_p: 1,
    truncation: 'disabled',
    usage: done
      ? {
          input_tokens: p.inputTokens,
          input_tokens_details: { cached_tokens: 0 },
          output_tokens: outputTokens,
          output_tokens_details: { reasoning_tokens: 0 },
          total_tokens: p.inputTokens + outputTokens,
        }
      : null,
    user: null,
    metadata: {},
  };
}

/** Non-stream Response. */
export function responseObject(body: Body, ctx: AnswerContext): unknown {
  const p = parts(body, ctx);
  return response(p, body, finished(p));
}

/** created, in_progress, output_item.added, content_part.added, deltas, *.done, completed (or incomplete, when cut). */
export function responseStream(body: Body, ctx: AnswerContext): StreamPlan {
  const p = parts(body, ctx);
  let seq = 0;
  const ev = (type: string, fields: Record<string, unknown>) => namedEvent(type, { type, sequence_number: seq++, ...fields });
  const where = { item_id: p.msgId, output_index: 0, content_index: 0 };

  const head =
    ev('response.created', { response: response(p, body, 'in_progress') }) +
    ev('response.in_progress', { response: response(p, body, 'in_progress') }) +
    ev('response.output_item.added', { output_index: 0, item: message(p, 'in_progress', undefined) }) +
    ev('response.content_part.added', { ...where, part: { type: 'output_text', text: '', annotations: [], logprobs: [] } });
  // An error event after k chunks takes the sequence_number the (k+1)-th chunk would have had.
  const firstChunkSeq = seq;
  const chunks = splitText(p.text, ctx.chunks).map((delta) => ev('response.output_text.delta', { ...where, delta, logprobs: [] }));
  const tail =
    ev('response.output_text.done', { ...where, text: p.text, logprobs: [] }) +
    ev('response.content_part.done', { ...where, part: { type: 'output_text', text: p.text, annotations: [], logprobs: [] } }) +
    ev('response.output_item.done', { output_index: 0, item: message(p, finished(p), p.text) });
  const done = ev(`response.${finished(p)}`, { response: response(p, body, finished(p)) });
  const error = (sent: number) =>
    namedEvent('error', { type: 'error', sequence_number: firstChunkSeq + sent, code: 'server_error', message: 'The server had an error while processing your request (mock).', param: null });
  return { head, chunks, tail, done, malformed: 'event: response.output_text.delta\ndata: {not json\n\n', error };
}
