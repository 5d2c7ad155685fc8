// An OpenAI chat.completions request -> an Anthropic Messages request, or a reason why the target cannot serve it.
// The rule: translate what has a faithful Anthropic form; refuse (never silently drop) what changes the answer's
// shape or content; ignore only hints about OpenAI's own storage, billing or latency. Choices, field by field:
//   refused  n > 1, logprobs / top_logprobs, logit_bias, non-zero presence/frequency_penalty, audio and
//            modalities with audio, functions / function_call (legacy), response_format json_object (Anthropic has
//            no schema-less JSON mode), web_search_options, custom tools and custom tool choices, input_audio parts,
//            files other than inline PDFs
//   mapped   response_format json_schema -> output_config.format (and strict tools' schemas) in the subset Anthropic
//            takes, other constraints written into descriptions (json-schema.ts); safety_identifier (else user) -> metadata.user_id
//            (a uuid or hash as it is, anything else as its SHA-256);
//            parallel_tool_calls false -> disable_parallel_tool_use; allowed_tools -> the listed tools only;
//            no tools but tool calls in the history -> those tools defined by name, tool_choice none;
//            tool names Anthropic's pattern refuses (`fs.read_file`) -> respelled, and back in the answer (tool-names.ts)
//   sampling temperature / top_p: see SamplingMode
//   thinking reasoning_effort low / medium / high / xhigh -> thinking, where the target takes it (thinking.ts)
//   ignored  metadata, store, seed, service_tier, prediction, prompt_cache_key / _retention, reasoning_effort
//            none / minimal, verbosity, stream_options.include_obfuscation, message `name`, image `detail`
//   malformed  what OpenAI itself would answer 400 to (messages not a list, content: 5, a non-object tool schema,
//            an unknown tool_choice, tool_choice "required" without tools, max_tokens "x", n "2", logprobs "true",
//            modalities "audio") is refused too, with the field as `param`: when no target can take the request, the
//            client gets a 400 naming it, not a 503.
import { createHash } from 'node:crypto';
import { toAnthropicSchema } from './json-schema.ts';
import { Inexpressible, toAnthropicConversation } from './messages.ts';
import { thinkingFields, type ThinkingBudgets } from './thinking.ts';
import { requestToolNames, ToolNames } from './tool-names.ts';
import type { AnthropicMessagesRequest, AnthropicTool, AnthropicToolChoice, OpenAIChatRequest } from './types.ts';

/**
 * What to do with temperature and top_p. Anthropic API version 2026-10-21 (what @anthropic-ai/sdk 1.x sends) answers
 * 400 to either, even at default values, and recent models reject them on 2023-06-01 too. So by default they are
 * left out ('drop'): a failover that refused every request carrying a habitual `temperature: 0.7` would be no failover.
 * 'refuse' answers `{ ok: false }` instead; 'forward' sends them (targets pinned to 2023-06-01), with temperature
 * clamped to Anthropic's 0..1 (OpenAI allows up to 2; clamping keeps the value's meaning at the low end, where most are),
 * and top_p only without a temperature.
 */
type SamplingMode = 'drop' | 'refuse' | 'forward';

export interface AnthropicRequestOptions {
  /** The upstream model name; the client's `model` is not sent. */
  model: string;
  /** max_tokens when the client sets none: Anthropic requires one, OpenAI does not. */
  defaultMaxTokens: number;
  /** temperature / top_p handling. Default: 'drop'. */
  sampling?: SamplingMode;
  /** Thinking budgets for reasoning_effort, or false to ignore it. Default: false. */
  thinking?: ThinkingBudgets | false;
}

type AnthropicRequestResult =
  /**
   * `includeUsage`: the client asked for a usage chunk (stream_options.include_usage); `toolNames`: Anthropic's name ->
   * the client's for tool names respelled for Anthropic (tool-names.ts). Give both to the answer's translator.
   */
  | { ok: true; body: AnthropicMessagesRequest; includeUsage: boolean; toolNames?: ReadonlyMap<string, string> }
  /** `param`: the request field at fault, when one is (OpenAI's error `param`). */
  | { ok: false; reason: string; param?: string };

/**
 * Translates a chat.completions request into a Messages request; `{ ok: false }` when the target cannot express it.
 * Write `body` with stringifyExact (../exact-json.ts): a tool call's long numbers are held in it as tagged strings.
 */
export function toAnthropicRequest(body: OpenAIChatRequest, opts: AnthropicRequestOptions): AnthropicRequestResult {
  try {
    refuseInexpressible(body, opts.sampling ?? 'drop');
    const names = new ToolNames(requestToolNames(body));
    const { system, messages } = toAnthropicConversation(body.messages, names);
    const out: AnthropicMessagesRequest = { model: opts.model, max_tokens: maxTokens(body, opts.defaultMaxTokens), messages };
    if (system !== undefined) out.system = system;
    const stop = stopSequences(body.stop);
    if (stop.length > 0) out.stop_sequences = stop;
    if (opts.sampling === 'forward') {
      if (typeof body.temperature === 'number') out.temperature = Math.min(1, Math.max(0, body.temperature));
      // Claude models from Sonnet 4.5 on refuse the two together (400, "temperature and top_p cannot both be
      // specified"); temperature, the one clients set habitually, goes.
      if (typeof body.top_p === 'number' && out.temperature === undefined) out.top_p = body.top_p;
    }
    Object.assign(out, toolFields(body, names) ?? historyToolFields(messages));
    const format = body.response_format;
    if (format?.type === 'json_schema') {
      const schema = format.json_schema?.schema;
      if (typeof schema !== 'object' || schema === null) {
        throw new Inexpressible('response_format.json_schema.schema is required for an Anthropic target', 'response_format.json_schema.schema');
      }
      out.output_config = { format: { type: 'json_schema', schema: toAnthropicSchema(schema as Record<string, unknown>, 'response_format.json_schema.schema') } };
    }
    // An empty safety_identifier names no one: the `user` beside it still does.
    const userId = body.safety_identifier || body.user;
    if (typeof userId === 'string' && userId !== '') out.metadata = { user_id: opaqueUserId(userId) };
    if (opts.thinking) {
      const clientMaxTokens = body.max_completion_tokens != null || body.max_tokens != null;
      Object.assign(out, thinkingFields({ effort: body.reasoning_effort, request: out, clientMaxTokens, budgets: opts.thinking }));
    }
    const stream = body.stream === true;
    if (stream) out.stream = true;
    const toolNames = names.respelled;
    return { ok: true, body: out, includeUsage: stream && body.stream_options?.include_usage === true, ...(toolNames && { toolNames }) };
  } catch (err) {
    if (err instanceof Inexpressible) return { ok: false, reason: err.message, ...(err.param !== undefined && { param: err.param }) };
    throw err;
  }
}

function refuseInexpressible(body: OpenAIChatRequest, sampling: SamplingMode): void {
  const refuse = (why: string, param: string) => {
    throw new Inexpressible(`${why} is not supported by an Anthropic target`, param);
  };
  if (typeof body !== 'object' || body === null) throw new Inexpressible('the request body must be a JSON object');
  refuseMistyped(body);
  if (typeof body.n === 'number' && body.n > 1) refuse('n > 1', 'n');
  if (body.logprobs === true || (typeof body.top_logprobs === 'number' && body.top_logprobs > 0)) refuse('logprobs', 'logprobs');
  if (body.logit_bias != null && Object.keys(body.logit_bias).length > 0) refuse('logit_bias', 'logit_bias');
  // A zero penalty is the default and changes nothing, so only a real one is refused.
  if (typeof body.presence_penalty === 'number' && body.presence_penalty !== 0) refuse('presence_penalty', 'presence_penalty');
  if (typeof body.frequency_penalty === 'number' && body.frequency_penalty !== 0) refuse('frequency_penalty', 'frequency_penalty');
  if (body.audio != null || (Array.isArray(body.modalities) && body.modalities.includes('audio'))) refuse('audio output', body.audio != null ? 'audio' : 'modalities');
  const legacyFunctions = (Array.isArray(body.functions) && body.functions.length > 0) || body.function_call != null;
  if (legacyFunctions) refuse('functions / function_call (legacy; use tools)', body.function_call != null ? 'function_call' : 'functions');
  if (body.response_format?.type === 'json_object') refuse('response_format json_object (use json_schema)', 'response_format');
  if (body.web_search_options != null) refuse('web_search_options', 'web_search_options');
  if (sampling === 'refuse' && (body.temperature != null || body.top_p != null)) refuse('temperature / top_p', body.temperature != null ? 'temperature' : 'top_p');
}

/**
 * The fields below are read by type (`n > 1`, `logprobs === true`, ...): one of another type (`n: "2"`, `logprobs:
 * "true"`, `modalities: "audio"`), which OpenAI answers 400, would pass unseen and be answered with one choice, no
 * logprobs, text. Refused as malformed instead, as `max_tokens: "x"` is.
 */
function refuseMistyped(body: OpenAIChatRequest): void {
  const fields = body as unknown as Record<string, unknown>;
  const malformed = (param: string, what: string) => {
    throw new Inexpressible(`${param} must be ${what}`, param);
  };
  const n = fields['n'];
  if (n != null && !(typeof n === 'number' && Number.isInteger(n) && n >= 1)) malformed('n', 'a positive integer');
  if (fields['logprobs'] != null && typeof fields['logprobs'] !== 'boolean') malformed('logprobs', 'a boolean');
  const top = fields['top_logprobs'];
  if (top != null && !(typeof top === 'number' && Number.isInteger(top) && top >= 0)) malformed('top_logprobs', 'a non-negative integer');
  if (fields['modalities'] != null && !Array.isArray(fields['modalities'])) malformed('modalities', 'an array');
  for (const param of ['presence_penalty', 'frequency_penalty']) {
    if (fields[param] != null && typeof fields[param] !== 'number') malformed(param, 'a number');
  }
}

// A uuid, or a hex digest (MD5 to SHA-512): what Anthropic asks metadata.user_id to be.
const OPAQUE_ID = /^(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32,128})$/i;

/**
 * The end-user id as Anthropic takes it. OpenAI takes any string as `user` (an email address is common); Anthropic
 * answers 400 to a user_id that looks like an email address or a phone number, or is over 256 characters, and asks
 * for a uuid or a hash. So anything else goes as its SHA-256: still one stable id per user for Anthropic's abuse
 * detection, and the operator can compute it from their own id.
 */
function opaqueUserId(id: string): string {
  return OPAQUE_ID.test(id) ? id : createHash('sha256').update(id).digest('hex');
}

function maxTokens(body: OpenAIChatRequest, fallback: number): number {
  // max_completion_tokens replaced max_tokens in OpenAI's API; a client sending both means the newer one.
  const param = body.max_completion_tokens != null ? 'max_completion_tokens' : 'max_tokens';
  const n = body[param];
  if (n == null) return fallback;
  // A wrong type would silently become defaultMaxTokens here, while OpenAI answers 400: say so instead.
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 1) throw new Inexpressible(`${param} must be a positive integer`, param);
  return n;
}

function stopSequences(stop: unknown): string[] {
  if (stop == null) return [];
  const list = typeof stop === 'string' ? [stop] : Array.isArray(stop) ? stop : undefined;
  if (list === undefined || !list.every((s) => typeof s === 'string')) throw new Inexpressible('stop must be a string or an array of strings', 'stop');
  const sequences = (list as string[]).filter((s) => s !== '');
  // Anthropic refuses them (400), and dropping one would let the answer run past where the client wants it to stop.
  if (sequences.some((s) => s.trim() === '')) throw new Inexpressible('an Anthropic target cannot stop at a whitespace-only stop sequence', 'stop');
  return sequences;
}

/** tool_choice values that ask for a tool call, and so need tools to call. */
const NEEDS_TOOLS = new Set(['required', 'function', 'allowed_tools']);

type ToolFields = Pick<AnthropicMessagesRequest, 'tools' | 'tool_choice'>;

/** The request's tools and tool_choice; undefined when it has no tools (tool_choice auto or none is then dropped). */
function toolFields(body: OpenAIChatRequest, names: ToolNames): ToolFields | undefined {
  const choice = body.tool_choice;
  if (typeof choice === 'object' && choice?.type === 'custom') {
    throw new Inexpressible('a custom tool_choice is not supported by an Anthropic target', 'tool_choice');
  }
  checkToolChoiceShape(choice);
  if (body.tools != null && !Array.isArray(body.tools)) throw new Inexpressible('tools must be an array', 'tools');
  if (!Array.isArray(body.tools) || body.tools.length === 0) {
    // Dropping a choice that forces a call would answer with text where the client waits for a tool call.
    const kind = typeof choice === 'string' ? choice : choice?.type;
    if (kind !== undefined && NEEDS_TOOLS.has(kind)) throw new Inexpressible(`tool_choice ${JSON.stringify(kind)} needs tools, and the request has none`, 'tool_choice');
    return undefined;
  }
  let tools = body.tools.map((tool, i): AnthropicTool => {
    if (tool?.type !== 'function') throw new Inexpressible(`tools[${i}]: only function tools are supported by an Anthropic target`, `tools[${i}].type`);
    const fn = tool.function;
    if (typeof fn?.name !== 'string') throw new Inexpressible(`tools[${i}].function.name must be a string`, `tools[${i}].function.name`);
    const params: unknown = fn.parameters ?? {};
    // Spread into input_schema, a string or an array would become {"0": ...}: only a JSON Schema object can cross.
    const schemaType = typeof params === 'object' && !Array.isArray(params) ? (params as Record<string, unknown>)['type'] : 'not an object';
    if (schemaType !== undefined && schemaType !== 'object') {
      throw new Inexpressible(`tools[${i}].function.parameters must be an object schema`, `tools[${i}].function.parameters`);
    }
    const schema = { ...(params as Record<string, unknown>), type: 'object' as const };
    return {
      name: names.of(fn.name),
      ...(typeof fn.description === 'string' ? { description: fn.description } : {}),
      // A strict tool's input is decoded under the schema, as structured outputs are: the same subset applies.
      input_schema: fn.strict === true ? { ...toAnthropicSchema(schema, `tools[${i}].function.parameters`), type: 'object' } : schema,
      ...(fn.strict === true ? { strict: true } : {}),
    };
  });
  // Anthropic answers 400 to a repeated name, and a tool call could not say which of the two it means.
  const seen = new Set<string>();
  for (const [i, t] of tools.entries()) {
    if (seen.has(t.name)) throw new Inexpressible(`tools[${i}].function.name ${JSON.stringify((body.tools[i] as { function: { name: string } }).function.name)} is already the name of another tool`, `tools[${i}].function.name`);
    seen.add(t.name);
  }
  let mapped: AnthropicToolChoice | undefined;
  if (choice === 'auto') mapped = { type: 'auto' };
  else if (choice === 'required') mapped = { type: 'any' };
  else if (choice === 'none') mapped = { type: 'none' }; // tools stay: earlier tool_use blocks need their definitions
  else if (choice?.type === 'function') {
    if (typeof choice.function?.name !== 'string') throw new Inexpressible('tool_choice.function.name must be a string', 'tool_choice.function.name');
    mapped = { type: 'tool', name: names.of(choice.function.name) };
  } else if (choice?.type === 'allowed_tools') {
    const listed = Array.isArray(choice.allowed_tools?.tools) ? choice.allowed_tools.tools : [];
    const allowed = new Set(listed.map((t) => (t?.['function'] as { name?: unknown } | undefined)?.name).filter((n) => typeof n === 'string').map((n) => names.of(n as string)));
    tools = tools.filter((t) => allowed.has(t.name));
    if (tools.length === 0) throw new Inexpressible('tool_choice.allowed_tools names none of the function tools', 'tool_choice.allowed_tools');
    mapped = { type: choice.allowed_tools?.mode === 'required' ? 'any' : 'auto' };
  }
  if (body.parallel_tool_calls === false && mapped?.type !== 'none') {
    mapped = { ...(mapped ?? { type: 'auto' }), disable_parallel_tool_use: true };
  }
  return mapped ? { tools, tool_choice: mapped } : { tools };
}

/**
 * Tools for a request that sends none but holds tool calls in its history: the last turn of an agent loop that asks
 * for a summary or a final answer, or a compacted conversation. OpenAI takes that; Anthropic answers 400 ("Requests
 * which include `tool_use` or `tool_result` blocks must define tools"). Each tool the history calls is defined by
 * name, with an input schema that takes any object, under tool_choice none: the model can call no tool, as it could
 * not at OpenAI, and the history reads as it was written.
 */
function historyToolFields(messages: AnthropicMessagesRequest['messages']): ToolFields {
  const names = new Set<string>();
  for (const m of messages) {
    if (m.role !== 'assistant') continue;
    for (const block of m.content) if (block.type === 'tool_use') names.add(block.name);
  }
  if (names.size === 0) return {};
  return { tools: [...names].map((name) => ({ name, input_schema: { type: 'object' } })), tool_choice: { type: 'none' } };
}

/** A tool_choice OpenAI would reject (an unknown mode, an object of no known type) is refused, never ignored. */
function checkToolChoiceShape(choice: unknown): void {
  if (choice == null) return;
  if (typeof choice === 'string') {
    if (choice !== 'auto' && choice !== 'none' && choice !== 'required') throw new Inexpressible(`tool_choice ${JSON.stringify(choice)} is not one of auto, none, required`, 'tool_choice');
    return;
  }
  const type = typeof choice === 'object' && !Array.isArray(choice) ? (choice as { type?: unknown }).type : undefined;
  if (type !== 'function' && type !== 'allowed_tools') throw new Inexpressible('tool_choice must be auto, none, required, or an object of type function or allowed_tools', 'tool_choice');
}
