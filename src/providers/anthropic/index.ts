// Translation between the OpenAI chat.completions API (what clients speak) and the Anthropic Messages API (a
// failover target). Pure functions and one stateful stream translator; no I/O, no SDK at runtime.
//   request:  toAnthropicRequest  chat.completions request -> Messages request, or why the target cannot serve it
//   response: toOpenAIResponse    Messages answer -> chat.completion
//             toOpenAIError       Anthropic error (status + body) -> OpenAI error body, status kept
//             toAnthropicShape    the gateway's OpenAI error body -> one the Anthropic SDKs read too (native routes)
//   thinking: thinkingFields      reasoning_effort -> thinking, where the target takes it (part of toAnthropicRequest)
//   stream:   AnthropicStreamTranslator  Messages SSE events -> chat.completion.chunk SSE events and [DONE]
export { toAnthropicRequest, type AnthropicRequestOptions } from './request.ts';
export { isAnthropicErrorType, toAnthropicShape, toOpenAIError, toOpenAIResponse } from './response.ts';
export { AnthropicStreamError, AnthropicStreamTranslator } from './stream.ts';
export { thinkingFields, thinkingForm, type ThinkingBudgets } from './thinking.ts';
export type * from './types.ts';
