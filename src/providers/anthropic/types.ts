// The slices of the two wire formats the translation reads and writes. The official SDKs are dev-only, so these are
// our own; the tests check them against the SDK types (`openai` v6, `@anthropic-ai/sdk` 1.x, API version 2026-10-21).
// Input shapes are loose on purpose: they come off the wire and every field is checked again at runtime.

// ---- OpenAI chat.completions: what clients send ----

export interface OpenAITextPart {
  type: 'text';
  text: string;
}
interface OpenAIRefusalPart {
  type: 'refusal';
  refusal: string;
}
interface OpenAIImagePart {
  type: 'image_url';
  image_url: { url: string; detail?: string };
}
interface OpenAIFilePart {
  type: 'file';
  file: { file_data?: string; file_id?: string; filename?: string };
}
interface OpenAIAudioPart {
  type: 'input_audio';
  input_audio: { data: string; format: string };
}
type OpenAIUserPart = OpenAITextPart | OpenAIImagePart | OpenAIFilePart | OpenAIAudioPart;

export interface OpenAIFunctionToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}
interface OpenAICustomToolCall {
  id: string;
  type: 'custom';
  custom: { name: string; input: string };
}

export type OpenAIMessage =
  | { role: 'system' | 'developer'; content: string | OpenAITextPart[]; name?: string }
  | { role: 'user'; content: string | OpenAIUserPart[]; name?: string }
  | {
      role: 'assistant';
      content?: string | Array<OpenAITextPart | OpenAIRefusalPart> | null;
      refusal?: string | null;
      tool_calls?: Array<OpenAIFunctionToolCall | OpenAICustomToolCall>;
      function_call?: unknown;
      audio?: unknown;
      name?: string;
    }
  | { role: 'tool'; content: string | OpenAITextPart[]; tool_call_id: string }
  | { role: 'function'; content: string | null; name: string };

type OpenAITool =
  | {
      type: 'function';
      function: { name: string; description?: string; parameters?: Record<string, unknown>; strict?: boolean | null };
    }
  | { type: 'custom'; custom: { name: string; description?: string; format?: unknown } };

type OpenAIToolChoice =
  | 'none'
  | 'auto'
  | 'required'
  | { type: 'function'; function: { name: string } }
  | { type: 'allowed_tools'; allowed_tools: { mode: 'auto' | 'required'; tools: Array<Record<string, unknown>> } }
  | { type: 'custom'; custom: { name: string } };

type OpenAIResponseFormat =
  | { type: 'text' }
  | { type: 'json_object' }
  | { type: 'json_schema'; json_schema: { name: string; description?: string; schema?: Record<string, unknown>; strict?: boolean | null } };

/** A chat.completions request body as clients send it; fields the translation does not know are ignored. */
export interface OpenAIChatRequest {
  model: string;
  messages: OpenAIMessage[];
  audio?: unknown;
  frequency_penalty?: number | null;
  function_call?: unknown;
  functions?: unknown[];
  logit_bias?: Record<string, number> | null;
  logprobs?: boolean | null;
  max_completion_tokens?: number | null;
  max_tokens?: number | null;
  metadata?: Record<string, string> | null;
  modalities?: string[] | null;
  n?: number | null;
  parallel_tool_calls?: boolean;
  prediction?: unknown;
  presence_penalty?: number | null;
  reasoning_effort?: string | null;
  response_format?: OpenAIResponseFormat;
  safety_identifier?: string;
  seed?: number | null;
  service_tier?: string | null;
  stop?: string | string[] | null;
  store?: boolean | null;
  stream?: boolean | null;
  stream_options?: { include_usage?: boolean; include_obfuscation?: boolean } | null;
  temperature?: number | null;
  tool_choice?: OpenAIToolChoice;
  tools?: OpenAITool[];
  top_logprobs?: number | null;
  top_p?: number | null;
  user?: string;
  verbosity?: string | null;
  web_search_options?: unknown;
}

// ---- OpenAI chat.completions: what the gateway answers ----

export type OpenAIFinishReason = 'stop' | 'length' | 'tool_calls' | 'content_filter';

export interface OpenAIUsage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details?: { cached_tokens: number };
  completion_tokens_details?: { reasoning_tokens: number };
}

/** A non-streamed chat.completion. `reasoning_content` carries Anthropic thinking, as OpenAI-compatible servers do. */
export interface OpenAIChatCompletion {
  id: string;
  object: 'chat.completion';
  created: number;
  model: string;
  choices: Array<{
    index: number;
    message: {
      role: 'assistant';
      content: string | null;
      refusal: null;
      tool_calls?: OpenAIFunctionToolCall[];
      reasoning_content?: string;
    };
    logprobs: null;
    finish_reason: OpenAIFinishReason;
  }>;
  /** Optional, as in OpenAI's own types: left out when the upstream reported none (never invented as zeros). */
  usage?: OpenAIUsage;
}

export interface OpenAIChunkDelta {
  role?: 'assistant';
  content?: string;
  reasoning_content?: string;
  tool_calls?: Array<{ index: number; id?: string; type?: 'function'; function: { name?: string; arguments: string } }>;
}

export interface OpenAIChatCompletionChunk {
  id: string;
  object: 'chat.completion.chunk';
  created: number;
  model: string;
  system_fingerprint: null;
  choices: Array<{ index: number; delta: OpenAIChunkDelta; logprobs: null; finish_reason: OpenAIFinishReason | null }>;
  usage?: OpenAIUsage | null;
}

// ---- Anthropic Messages: what the gateway sends ----

export interface AnthropicTextBlock {
  type: 'text';
  text: string;
}
export interface AnthropicImageBlock {
  type: 'image';
  source:
    | { type: 'base64'; media_type: AnthropicImageMediaType; data: string }
    | { type: 'url'; url: string };
}
export type AnthropicImageMediaType = 'image/jpeg' | 'image/png' | 'image/gif' | 'image/webp';
interface AnthropicDocumentBlock {
  type: 'document';
  source: { type: 'base64'; media_type: 'application/pdf'; data: string };
  title?: string;
}
interface AnthropicToolUseBlock {
  type: 'tool_use';
  id: string;
  name: string;
  input: unknown;
}
interface AnthropicToolResultBlock {
  type: 'tool_result';
  tool_use_id: string;
  content: string | AnthropicTextBlock[];
}
export type AnthropicUserBlock = AnthropicTextBlock | AnthropicImageBlock | AnthropicDocumentBlock | AnthropicToolResultBlock;
export type AnthropicAssistantBlock = AnthropicTextBlock | AnthropicToolUseBlock;

export type AnthropicMessageParam =
  | { role: 'user'; content: AnthropicUserBlock[] }
  | { role: 'assistant'; content: AnthropicAssistantBlock[] };

export interface AnthropicTool {
  name: string;
  description?: string;
  input_schema: { type: 'object'; properties?: unknown; required?: string[] | null; [k: string]: unknown };
  strict?: boolean;
}

export type AnthropicToolChoice =
  | { type: 'auto' | 'any'; disable_parallel_tool_use?: boolean }
  | { type: 'tool'; name: string; disable_parallel_tool_use?: boolean }
  | { type: 'none' };

/** A Messages API request body. `temperature`/`top_p` exist only for targets pinned to anthropic-version 2023-06-01. */
export interface AnthropicMessagesRequest {
  model: string;
  max_tokens: number;
  messages: AnthropicMessageParam[];
  system?: string;
  stop_sequences?: string[];
  stream?: boolean;
  temperature?: number;
  top_p?: number;
  tools?: AnthropicTool[];
  tool_choice?: AnthropicToolChoice;
  metadata?: { user_id: string };
  output_config?: { format?: { type: 'json_schema'; schema: Record<string, unknown> }; effort?: 'low' | 'medium' | 'high' };
  /** Extended thinking: a budget (Claude 3.7 to 4.6) or adaptive (Claude 4.7 and later); see thinking.ts. */
  thinking?: { type: 'enabled'; budget_tokens: number } | { type: 'adaptive'; display: 'summarized' };
}

// ---- Anthropic Messages: what the target answers ----

/** Any content block; the known ones are narrowed by `type` at runtime (the API adds new block types over time). */
export interface AnthropicBlockLike {
  type: string;
}

export interface AnthropicUsage {
  input_tokens?: number | null;
  output_tokens?: number | null;
  cache_creation_input_tokens?: number | null;
  cache_read_input_tokens?: number | null;
  output_tokens_details?: { thinking_tokens?: number } | null;
}

/** A Messages API response (`type: 'message'`), also the `message` of a stream's message_start. */
export interface AnthropicMessage {
  id: string;
  type: 'message';
  role: 'assistant';
  model: string;
  content: readonly AnthropicBlockLike[];
  stop_reason: string | null;
  stop_sequence?: string | null;
  /**
   * Anthropic's API always sends it (here, in message_start and in message_delta); a proxy in front of it may leave
   * it out, and the translation then reports none rather than zeros.
   */
  usage?: AnthropicUsage | null;
}
