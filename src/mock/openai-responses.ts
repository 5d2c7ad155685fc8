// OpenAI answers of the mock: chat completions, legacy completions, embeddings and the model list,
// shaped as the official SDK parses them. Builders are pure: (request body, context) -> JSON / StreamPlan.
import {
  answerText,
  capText,
  countTokens,
  embeddingOf,
  float32Base64,
  lastText,
  logprobsOf,
  promptChars,
  schemaExample,
  splitText,
  TOOL_ARGUMENTS,
} from './content.ts';
import { errorDetails, MockRequestError, openaiErrorBody } from './errors.ts';
import { dataEvent, DONE_EVENT, type StreamPlan } from './sse.ts';
import { promptsOf } from '../policy/token-estimate.ts';

/** What every builder needs besides the request body. */
export interface AnswerContext {
  id(prefix: string): string;
  /** Unix seconds. */
  created: number;
  /** Content chunks of a streamed answer. */
  chunks: number;
  /** The mock's message threads (Anthropic's `thread` field), by the id of each thread's last reply. */
  threads?: Map<string, ThreadState>;
}

/** What a message thread holds after a reply: the whole conversation and the fields a `continue` leaves out. */
export interface ThreadState {
  messages: unknown[];
  system: unknown;
  tools: unknown;
}

const SYSTEM_FINGERPRINT = 'fp_mock0001';
const MALFORMED = 'data: {not json\n\n';
/** OpenAI's mid-stream error: a data line with an `error` object and no choices, then the response ends (no [DONE]). */
const STREAM_ERROR = `data: ${openaiErrorBody(errorDetails(500))}\n\n`;
const streamError = () => STREAM_ERROR;

/** A loosely typed JSON request body; builders check the fields they use. */
export type Body = Record<string, unknown>;

export function requireModel(body: Body): string {
  const model = body['model'];
  if (typeof model !== 'string' || model === '') throw new MockRequestError(400, 'you must provide a model parameter');
  return model;
}

function requireField(body: Body, name: string): unknown {
  const v = body[name];
  if (v === undefined || v === null) {
    throw new MockRequestError(400, `Missing required parameter: '${name}'.`, { code: 'missing_required_parameter', param: name });
  }
  return v;
}

function includeUsage(body: Body): boolean {
  return (body['stream_options'] as { include_usage?: unknown } | undefined)?.include_usage === true;
}

// ---------- chat completions ----------

/** A text answer finishes with "length" when max_completion_tokens (or max_tokens) cut it short. */
type ChatAnswer = { kind: 'text'; text: string; finish: 'stop' | 'length' } | { kind: 'tool'; names: string[] };

function toolName(tool: unknown): string {
  const name = (tool as { function?: { name?: unknown } } | null)?.function?.name;
  return typeof name === 'string' ? name : 'tool';
}

function chatAnswer(body: Body): ChatAnswer {
  const messages = requireField(body, 'messages');
  if (!Array.isArray(messages)) {
    // OpenAI's own words and code for a JSON type it did not expect.
    const got = typeof messages === 'object' ? 'an object' : `a ${typeof messages}`;
    throw new MockRequestError(400, `Invalid type for 'messages': expected an array of objects, but got ${got} instead.`, { code: 'invalid_type', param: 'messages' });
  }
  const tools = body['tools'];
  const last = messages[messages.length - 1] as { role?: unknown } | undefined;
  const choice = body['tool_choice'] as { type?: unknown; function?: { name?: unknown } } | string | undefined;
  // Like a model that calls a tool once and then answers from its result.
  if (Array.isArray(tools) && tools.length > 0 && last?.role !== 'tool' && choice !== 'none') {
    // A named tool_choice is that tool; otherwise every tool at once (parallel tool calls, as OpenAI's models make
    // them when they need several), or the first alone when the client turned parallel calls off.
    if (typeof choice === 'object' && typeof choice?.function?.name === 'string') return { kind: 'tool', names: [choice.function.name] };
    const names = body['parallel_tool_calls'] === false ? [toolName(tools[0])] : tools.map(toolName);
    return { kind: 'tool', names };
  }
  const text = structuredText(body['response_format']) ?? answerText(lastText(messages, 'user'));
  const cut = capText(text, body['max_completion_tokens'] ?? body['max_tokens']);
  return cut === undefined ? { kind: 'text', text, finish: 'stop' } : { kind: 'text', text: cut, finish: 'length' };
}

/** JSON that fits a `json_schema` response format (structured outputs), else undefined. */
function structuredText(format: unknown): string | undefined {
  const f = format as { type?: unknown; json_schema?: { schema?: unknown } } | null | undefined;
  if (f?.type !== 'json_schema') return undefined;
  return JSON.stringify(schemaExample(f.json_schema?.schema));
}

/** `top_logprobs` alternatives asked for, or undefined when the request asked for no logprobs. */
function logprobsTop(body: Body): number | undefined {
  if (body['logprobs'] !== true) return undefined;
  const top = body['top_logprobs'];
  return typeof top === 'number' && top > 0 ? Math.min(Math.floor(top), 20) : 0;
}

function choiceCount(body: Body): number {
  const n = body['n'];
  return typeof n === 'number' && n > 1 ? Math.min(Math.floor(n), 128) : 1;
}

function completionText(answer: ChatAnswer): string {
  return answer.kind === 'text' ? answer.text : TOOL_ARGUMENTS.repeat(answer.names.length);
}

function chatUsage(body: Body, completionText: string, n: number) {
  const prompt = Math.max(1, Math.ceil(promptChars(body['messages']) / 4));
  const completion = countTokens(completionText) * n;
  return { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion };
}

/** Non-stream `chat.completion`. */
export function chatCompletion(body: Body, ctx: AnswerContext): unknown {
  const model = requireModel(body);
  const answer = chatAnswer(body);
  const n = choiceCount(body);
  const top = logprobsTop(body);
  const choices = [];
  for (let index = 0; index < n; index++) {
    const message =
      answer.kind === 'text'
        ? { role: 'assistant', content: answer.text, refusal: null, annotations: [] }
        : {
            role: 'assistant',
            content: null,
            refusal: null,
            annotations: [],
            tool_calls: answer.names.map((name) => ({ id: ctx.id('call_'), type: 'function', function: { name, arguments: TOOL_ARGUMENTS } })),
          };
    const logprobs = top === undefined ? null : { content: answer.kind === 'text' ? logprobsOf(answer.text, top) : [], refusal: null };
    choices.push({ index, message, logprobs, finish_reason: answer.kind === 'text' ? answer.finish : 'tool_calls' });
  }
  return {
    id: ctx.id('chatcmpl-'),
    object: 'chat.completion',
    created: ctx.created,
    model,
    choices,
    usage: chatUsage(body, completionText(answer), n),
    service_tier: 'default',
    system_fingerprint: SYSTEM_FINGERPRINT,
  };
}

/** Streamed `chat.completion.chunk` events, one event per choice at each step as the real API sends. */
export function chatStream(body: Body, ctx: AnswerContext): StreamPlan {
  const model = requireModel(body);
  const answer = chatAnswer(body);
  const n = choiceCount(body);
  const usage = includeUsage(body);
  const top = logprobsTop(body);
  const base = { id: ctx.id('chatcmpl-'), object: 'chat.completion.chunk', created: ctx.created, model, service_tier: 'default', system_fingerprint: SYSTEM_FINGERPRINT };
  const event = (index: number, delta: unknown, finish: string | null, logprobs: unknown = null) =>
    dataEvent({ ...base, choices: [{ index, delta, logprobs, finish_reason: finish }], ...(usage ? { usage: null } : {}) });
  const perChoice = (make: (index: number) => string) => {
    let s = '';
    for (let i = 0; i < n; i++) s += make(i);
    return s;
  };

  const finish = answer.kind === 'text' ? answer.finish : 'tool_calls';
  let head: string;
  let chunks: string[];
  if (answer.kind === 'text') {
    head = perChoice((i) => event(i, { role: 'assistant', content: '', refusal: null }, null));
    const lp = (piece: string) => (top === undefined ? null : { content: logprobsOf(piece, top), refusal: null });
    chunks = splitText(answer.text, ctx.chunks).map((piece) => perChoice((i) => event(i, { content: piece }, null, lp(piece))));
  } else {
    // Each call opens with its id and name (the first with the role), then its arguments in pieces, as OpenAI streams
    // parallel tool calls one after the other.
    const ids = Array.from({ length: n }, () => answer.names.map(() => ctx.id('call_')));
    const opening = (i: number, k: number) => ({ index: k, id: ids[i]![k], type: 'function', function: { name: answer.names[k], arguments: '' } });
    head = perChoice((i) => event(i, { role: 'assistant', content: null, refusal: null, tool_calls: [opening(i, 0)] }, null));
    chunks = answer.names.flatMap((_, k) =>
      splitText(TOOL_ARGUMENTS, ctx.chunks).map((piece, j) =>
        perChoice((i) => (k > 0 && j === 0 ? event(i, { tool_calls: [opening(i, k)] }, null) : '') + event(i, { tool_calls: [{ index: k, function: { arguments: piece } }] }, null)),
      ),
    );
  }
  let tail = perChoice((i) => event(i, {}, finish));
  if (usage) {
    tail += dataEvent({ ...base, choices: [], usage: chatUsage(body, completionText(answer), n) });
  }
  return { head, chunks, tail, done: DONE_EVENT, malformed: MALFORMED, error: streamError };
}

// ---------- legacy completions ----------

/** Each prompt's text (promptsOf: a batch of strings or of token lists, else one prompt), a token list as its JSON. */
function promptTexts(body: Body): string[] {
  return promptsOf(requireField(body, 'prompt')).map((p) => (typeof p === 'string' ? p : JSON.stringify(p)));
}

/** The completion's text, cut at max_tokens ("length") as chat's is. */
function completionAnswer(body: Body, prompt: string): { text: string; finish: 'stop' | 'length' } {
  const text = answerText(prompt);
  const cut = capText(text, body['max_tokens']);
  return cut === undefined ? { text, finish: 'stop' } : { text: cut, finish: 'length' };
}

/** As OpenAI answers a batch: `n` choices for each prompt, choice prompt × n + k answering prompt `prompt`. */
function completionChoices(body: Body, prompts: string[]): Array<{ text: string; finish: 'stop' | 'length' }> {
  const n = choiceCount(body);
  return prompts.flatMap((prompt) => {
    const answer = completionAnswer(body, prompt);
    return Array.from({ length: n }, () => answer);
  });
}

/** Every prompt counted once, every choice's text. */
function completionUsage(prompts: string[], choices: Array<{ text: string }>) {
  const p = prompts.reduce((sum, prompt) => sum + countTokens(prompt), 0);
  const c = choices.reduce((sum, choice) => sum + countTokens(choice.text), 0);
  return { prompt_tokens: p, completion_tokens: c, total_tokens: p + c };
}

/** Non-stream `text_completion`. */
export function textCompletion(body: Body, ctx: AnswerContext): unknown {
  const model = requireModel(body);
  const prompts = promptTexts(body);
  const choices = completionChoices(body, prompts);
  return {
    id: ctx.id('cmpl-'),
    object: 'text_completion',
    created: ctx.created,
    model,
    choices: choices.map(({ text, finish }, index) => ({ text, index, logprobs: null, finish_reason: finish })),
    usage: completionUsage(prompts, choices),
    system_fingerprint: SYSTEM_FINGERPRINT,
  };
}

/** Streamed `text_completion` events: at each step one event per choice, by its index, as chat's are. */
export function textCompletionStream(body: Body, ctx: AnswerContext): StreamPlan {
  const model = requireModel(body);
  const prompts = promptTexts(body);
  const choices = completionChoices(body, prompts);
  const base = { id: ctx.id('cmpl-'), object: 'text_completion', created: ctx.created, model, system_fingerprint: SYSTEM_FINGERPRINT };
  const event = (index: number, piece: string, finish: string | null) =>
    dataEvent({ ...base, choices: [{ text: piece, index, logprobs: null, finish_reason: finish }] });
  const pieces = choices.map((c) => splitText(c.text, ctx.chunks));
  const chunks = pieces[0]!.map((_, j) => pieces.map((p, i) => event(i, p[j]!, null)).join(''));
  let tail = choices.map((c, i) => event(i, '', c.finish)).join('');
  if (includeUsage(body)) tail += dataEvent({ ...base, choices: [], usage: completionUsage(prompts, choices) });
  return { head: '', chunks, tail, done: DONE_EVENT, malformed: MALFORMED, error: streamError };
}

// ---------- embeddings ----------

function embeddingInputs(body: Body): string[] {
  const input = requireField(body, 'input');
  if (typeof input === 'string') return [input];
  if (!Array.isArray(input) || input.length === 0) {
    throw new MockRequestError(400, "Invalid 'input': expected a string or a non-empty array.", { param: 'input' });
  }
  // An array of numbers is one pre-tokenised input; anything else is one input per element.
  if (input.every((x) => typeof x === 'number')) return [JSON.stringify(input)];
  return input.map((x) => (typeof x === 'string' ? x : JSON.stringify(x)));
}

/** Largest `dimensions` the mock honours (text-embedding-3-large's). */
const MAX_EMBEDDING_DIMENSIONS = 3072;

/**
 * The `dimensions` asked for (text-embedding-3 models shorten their vectors to it), or undefined for the mock's default:
 * a client that stores vectors of a fixed size must get that size back.
 */
function embeddingDimensions(body: Body): number | undefined {
  const d = body['dimensions'];
  if (d === undefined || d === null) return undefined;
  if (typeof d !== 'number' || !Number.isInteger(d) || d < 1 || d > MAX_EMBEDDING_DIMENSIONS) {
    throw new MockRequestError(400, `Invalid value for 'dimensions': expected an integer from 1 to ${MAX_EMBEDDING_DIMENSIONS}.`, { code: 'invalid_value', param: 'dimensions' });
  }
  return d;
}

/** `{ object: 'list', data: [embedding...] }`, base64 when asked (the openai SDK asks by default). */
export function embeddings(body: Body): unknown {
  const model = requireModel(body);
  const inputs = embeddingInputs(body);
  const dimensions = embeddingDimensions(body);
  const base64 = body['encoding_format'] === 'base64';
  let tokens = 0;
  const data = inputs.map((text, index) => {
    tokens += countTokens(text);
    const v = embeddingOf(text, dimensions);
    return { object: 'embedding', index, embedding: base64 ? float32Base64(v) : v };
  });
  return { object: 'list', data, model, usage: { prompt_tokens: tokens, total_tokens: tokens } };
}

// ---------- models ----------

const MODELS: ReadonlyArray<[id: string, ownedBy: string]> = [
  ['gpt-4o', 'system'],
  ['gpt-4o-mini', 'system'],
  ['gpt-4.1', 'system'],
  ['text-embedding-3-small', 'system'],
  ['claude-sonnet-4-5', 'anthropic'],
];

const MODEL_OBJECTS = MODELS.map(([id, owned_by]) => ({ id, object: 'model', created: 1_715_367_049, owned_by }));

/** Built once: the model list never changes. */
export const MODELS_BODY = JSON.stringify({ object: 'list', data: MODEL_OBJECTS });

/** GET /v1/models/{model}: one model of the list, or OpenAI's 404 for a model it does not have. */
export function modelObject(id: string): unknown {
  const model = MODEL_OBJECTS.find((m) => m.id === id);
  if (model === undefined) throw new MockRequestError(404, `The model '${id}' does not exist`, { code: 'model_not_found', param: 'model' });
  return model;
}
