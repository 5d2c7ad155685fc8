// An Anthropic Messages answer -> an OpenAI chat.completion, and an Anthropic error -> an OpenAI error body.
// The status of an error is kept: the gateway's outcome table classifies by status and `error.code`.
import { randomUUID } from 'node:crypto';
import { errorBody, type OpenAIErrorBody } from '../../errors.ts';
import { stringifyExact } from '../exact-json.ts';
import type {
  AnthropicBlockLike,
  AnthropicMessage,
  AnthropicUsage,
  OpenAIChatCompletion,
  OpenAIFinishReason,
  OpenAIFunctionToolCall,
  OpenAIUsage,
} from './types.ts';

const FINISH: Record<string, OpenAIFinishReason> = {
  end_turn: 'stop',
  stop_sequence: 'stop',
  // A paused server-tool turn: the text so far is a complete answer for a client that cannot resume it.
  pause_turn: 'stop',
  max_tokens: 'length',
  model_context_window_exceeded: 'length',
  tool_use: 'tool_calls',
  refusal: 'content_filter',
};

/** Anthropic stop_reason -> OpenAI finish_reason; an unknown or missing reason reads as a normal stop. */
export function toFinishReason(stopReason: string | null | undefined): OpenAIFinishReason {
  // Own names only: a stop_reason such as `constructor` would otherwise find Object's and leave finish_reason out.
  return (stopReason && Object.hasOwn(FINISH, stopReason) && FINISH[stopReason]) || 'stop';
}

const count = (n: number | null | undefined) => (typeof n === 'number' ? n : 0);

const COUNTS = ['input_tokens', 'output_tokens', 'cache_creation_input_tokens', 'cache_read_input_tokens'] as const;

/**
 * Did the upstream report usage: an object with at least one token count? Anthropic's API always does (a message's
 * `usage`, a stream's message_start and message_delta); a proxy in front of it may leave it out, send `null` or `{}`.
 * Then the translation reports none: zeros would read as a real usage of 0 tokens, to the client and to the gateway
 * (its token metrics, a client's token rate), where no usage is settled from the prompt estimate and the output.
 */
export function reportsUsage(u: AnthropicUsage | null | undefined): u is AnthropicUsage {
  return typeof u === 'object' && u !== null && COUNTS.some((k) => typeof u[k] === 'number');
}

/** Anthropic usage -> OpenAI usage. OpenAI's prompt_tokens include cached tokens; Anthropic counts them apart. */
export function toOpenAIUsage(u: AnthropicUsage): OpenAIUsage {
  const cacheRead = count(u.cache_read_input_tokens);
  const prompt = count(u.input_tokens) + cacheRead + count(u.cache_creation_input_tokens);
  const completion = count(u.output_tokens);
  const usage: OpenAIUsage = {
    prompt_tokens: prompt,
    completion_tokens: completion,
    total_tokens: prompt + completion,
    prompt_tokens_details: { cached_tokens: cacheRead },
  };
  const thinking = u.output_tokens_details?.thinking_tokens;
  if (typeof thinking === 'number') usage.completion_tokens_details = { reasoning_tokens: thinking };
  return usage;
}

function isBlock<T extends string>(b: AnthropicBlockLike, type: T): b is AnthropicBlockLike & { type: T } & Record<string, unknown> {
  return b?.type === type;
}

/**
 * Translates a non-streamed Messages answer, its usage only if the upstream reported it (reportsUsage). `model` is
 * the answering model, else `opts.model`; `toolNames` gives tool names respelled for Anthropic back their client's
 * spelling (toAnthropicRequest's `toolNames`).
 */
export function toOpenAIResponse(msg: AnthropicMessage, opts: { model: string; created?: number; toolNames?: ReadonlyMap<string, string> }): OpenAIChatCompletion {
  const text: string[] = [];
  const thinking: string[] = [];
  const toolCalls: OpenAIFunctionToolCall[] = [];
  // Server-tool and redacted-thinking blocks have no chat.completions form; the gateway never asks for server tools.
  for (const block of msg.content ?? []) {
    if (isBlock(block, 'text') && typeof block['text'] === 'string') text.push(block['text']);
    else if (isBlock(block, 'thinking') && typeof block['thinking'] === 'string') thinking.push(block['thinking']);
    else if (isBlock(block, 'tool_use')) {
      toolCalls.push({
        id: String(block['id']),
        type: 'function',
        // The input as Anthropic wrote it, when read with parseExact: a 64-bit id keeps its digits.
        function: { name: clientToolName(block['name'], opts.toolNames), arguments: stringifyExact(block['input'] ?? {}) },
      });
    }
  }
  const message: OpenAIChatCompletion['choices'][number]['message'] = {
    role: 'assistant',
    // Text blocks are pieces of one answer (split at citations); streaming concatenates them the same way, and sends
    // no content for empty ones, which the SDKs read as null: an answer with no text has null here too.
    content: text.join('') || null,
    refusal: null,
  };
  if (toolCalls.length > 0) message.tool_calls = toolCalls;
  if (thinking.length > 0) message.reasoning_content = thinking.join('');
  return {
    id: completionId(msg.id),
    object: 'chat.completion',
    created: opts.created ?? Math.floor(Date.now() / 1000),
    model: msg.model || opts.model,
    choices: [{ index: 0, message, logprobs: null, finish_reason: toFinishReason(msg.stop_reason) }],
    // Left out when the upstream reported none, as OpenAI-compatible servers leave it out (reportsUsage).
    ...(reportsUsage(msg.usage) && { usage: toOpenAIUsage(msg.usage) }),
  };
}

/** A tool_use block's name in the client's spelling. */
export function clientToolName(name: unknown, toolNames: ReadonlyMap<string, string> | undefined): string {
  const given = String(name);
  return toolNames?.get(given) ?? given;
}

interface ErrorDef {
  status: number;
  type: string;
  code: string | null;
}

// Anthropic error type -> the OpenAI error a client expects for the same condition.
const ERRORS: Record<string, ErrorDef> = {
  invalid_request_error: { status: 400, type: 'invalid_request_error', code: null },
  authentication_error: { status: 401, type: 'authentication_error', code: 'invalid_api_key' },
  billing_error: { status: 402, type: 'insufficient_quota', code: 'insufficient_quota' },
  permission_error: { status: 403, type: 'permission_error', code: null },
  not_found_error: { status: 404, type: 'invalid_request_error', code: null },
  // A resource changed concurrently (Anthropic's errors page documents it); without it, a native client got it as an
  // invalid_request_error, and the gateway's own 409 on an Anthropic route had no Anthropic type of its status.
  conflict_error: { status: 409, type: 'invalid_request_error', code: null },
  request_too_large: { status: 413, type: 'invalid_request_error', code: 'request_too_large' },
  rate_limit_error: { status: 429, type: 'rate_limit_error', code: 'rate_limit_exceeded' },
  api_error: { status: 500, type: 'server_error', code: null },
  timeout_error: { status: 504, type: 'server_error', code: 'timeout' },
  overloaded_error: { status: 529, type: 'server_error', code: 'overloaded' },
};

// Anthropic reports an over-long prompt as a plain invalid_request_error; only the message tells. Wording seen:
// "prompt is too long: 215000 tokens > 200000 maximum", "input length and `max_tokens` exceed context limit: ...".
const CONTEXT_LENGTH = /prompt is too long|exceeds? (the )?context limit|context window/i;

/**
 * Problems of the gateway's own Anthropic account that arrive as a plain 400 invalid_request_error; only the message
 * tells. As a 400 they would read as the client's mistake, with the provider's body passed on and no failover; as the
 * 402 or 403 they are, they take the credentials path (the gateway's own error, a credential hold, the next target).
 */
const ACCOUNT_PROBLEMS: ReadonlyArray<readonly [RegExp, ErrorDef]> = [
  // "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase
  // credits."
  // Anchored at the start of the message: Anthropic's validation errors quote what the client sent (an unknown content
  // block type, an anthropic-beta value), and a client that put these words there took the target out for every
  // client for authHoldS, with one request (on /v1/messages the body is the client's, as it wrote it).
  [/^\s*(?:your )?credit balance is too low/i, { status: 402, type: 'insufficient_quota', code: 'insufficient_quota' }],
  // "This organization has been disabled."
  [/^\s*(?:this )?organization has been disabled/i, { status: 403, type: 'permission_error', code: null }],
];

/**
 * Maps an Anthropic error answer (status + body, parsed or raw) to an OpenAI error; keeps the upstream status, except
 * for an account problem Anthropic reports as a 400 (ACCOUNT_PROBLEMS).
 */
export function toOpenAIError(status: number, body: unknown): { status: number; body: OpenAIErrorBody } {
  const parsed = typeof body === 'string' ? tryJson(body) : body;
  const error = (parsed as { error?: { type?: unknown; message?: unknown; code?: unknown; details?: { error_code?: unknown } } } | null)?.error;
  const type = typeof error?.type === 'string' ? error.type : undefined;
  const message = typeof error?.message === 'string' ? error.message : `the Anthropic target answered HTTP ${status}`;
  const account = type === 'invalid_request_error' ? ACCOUNT_PROBLEMS.find(([pattern]) => pattern.test(message))?.[1] : undefined;
  if (account) return { status: account.status, body: errorBody(message, account.type, account.code) };
  const def = (type !== undefined ? ERRORS[type] : undefined) ?? byStatus(status);
  const finalStatus = status >= 400 ? status : def.status; // an error event inside a 200 stream has no status of its own
  const detailCode = typeof error?.details?.error_code === 'string' ? error.details.error_code : null;
  // Anthropic's API names no code, but what stands in front of it may (another stormgate: its loop_detected on a
  // native route); a code the upstream named is kept when the type maps to none, so the client gets it.
  const ownCode = typeof error?.code === 'string' && error.code !== '' ? error.code : null;
  const code = type === 'invalid_request_error' && CONTEXT_LENGTH.test(message) ? 'context_length_exceeded' : (def.code ?? detailCode ?? ownCode);
  return { status: finalStatus, body: errorBody(message, def.type, code) };
}

/** Is `type` one of the error types Anthropic documents (each stands for the status it answers it with)? */
export function isAnthropicErrorType(type: unknown): type is string {
  return typeof type === 'string' && Object.hasOwn(ERRORS, type);
}

/** An error as the Anthropic SDKs read it, which is the OpenAI shape too: `type: "error"` beside `error`. */
interface AnthropicShapedError extends OpenAIErrorBody {
  type: 'error';
}

/**
 * An error the gateway answers an Anthropic client with (a route on Anthropic's own API): the OpenAI error body it
 * would answer anyone else, `message`, `param` and `code` kept, given Anthropic's `type: "error"` and, in `error.type`,
 * the Anthropic error type its status stands for (else an Anthropic type it already has, else api_error for a 5xx).
 */
export function toAnthropicShape(status: number, body: OpenAIErrorBody): AnthropicShapedError {
  const given = body.error.type;
  const type = Object.entries(ERRORS).find(([, d]) => d.status === status)?.[0] ?? (Object.hasOwn(ERRORS, given) ? given : status >= 500 ? 'api_error' : 'invalid_request_error');
  return { ...body, type: 'error', error: { ...body.error, type } };
}

function byStatus(status: number): ErrorDef {
  const known = Object.values(ERRORS).find((d) => d.status === status);
  if (known) return known;
  if (status >= 400 && status < 500) return { status, type: 'invalid_request_error', code: null };
  return { status: 502, type: 'server_error', code: null };
}

function tryJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}

/**
 * The chat completion id of an Anthropic message: `chatcmpl-` and its id, or, from a compatible server that sends none,
 * one made for this answer (a fixed one would merge different answers in tools that key on the completion id).
 */
export function completionId(messageId: unknown): string {
  return typeof messageId === 'string' && messageId !== '' ? `chatcmpl-${messageId}` : `chatcmpl-${randomUUID().replaceAll('-', '')}`;
}
