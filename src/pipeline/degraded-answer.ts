// A route's degraded answer: when every target failed or is unavailable and nothing could be parked, a normal-looking
// completion with the route's text (streamed if the client asked for a stream), marked x-stormgate-degraded: true.
// Never for the client's own mistakes, a disconnect, or a draining instance (another one can serve the request).
import { randomUUID } from 'node:crypto';
import { Readable } from 'node:stream';
import type { ManagedRequest, PipelineAnswer } from './handle-request.ts';
import type { Served } from './serve-targets.ts';
import { shortModel } from './plan-targets.ts';
import { OUTCOME_TABLE } from '../policy/outcome.ts';

/** Why a request gets the degraded answer (stormgate_degraded_total's reason label). */
export const DEGRADED_REASONS = ['failed', 'unavailable', 'deadline', 'shed', 'park_full'] as const;

/** Why the request gets the degraded answer, or undefined when it must get its error. */
export function degradedReason(served: Exclude<Served, { kind: 'ok' }>): (typeof DEGRADED_REASONS)[number] | undefined {
  switch (served.kind) {
    case 'failed': {
      const { outcome } = served.failure.result;
      if (outcome.kind === 'aborted') return outcome.by === 'deadline' ? 'deadline' : undefined;
      return OUTCOME_TABLE[served.failure.cls.cls].verdict ? undefined : 'failed';
    }
    case 'unavailable':
      return 'unavailable';
    case 'shed':
      return 'shed';
    case 'park-full':
      return 'park_full';
    case 'auth-held':
      return 'failed';
    case 'closing':
      return undefined;
  }
}

/**
 * Whether a fixed text can answer this request as OpenAI would. Not when it asks for structured output
 * (`response_format` json_schema or json_object: the SDKs' `parse()` helpers would throw a JSON SyntaxError on the text,
 * not an APIError), forces a tool call (`tool_choice` required, a named function or custom tool, allowed_tools in
 * required mode: an agent waits for a call), or asks for what a text has not got: token log probabilities (`logprobs`,
 * `top_logprobs`: a classifier reading `choices[0].logprobs.content` would crash on the null) or audio output
 * (`audio`, `modalities` with audio: `message.audio` would be missing). Such a request gets its error instead, as if
 * the route had no degraded answer.
 */
export function degradedFits(json: Record<string, unknown>): boolean {
  const format = (json.response_format as { type?: unknown } | null | undefined)?.type;
  if (format === 'json_schema' || format === 'json_object') return false;
  if (json.logprobs === true || (typeof json.top_logprobs === 'number' && json.top_logprobs > 0)) return false;
  if (json.audio != null || (Array.isArray(json.modalities) && json.modalities.includes('audio'))) return false;
  const choice = json.tool_choice as { type?: unknown; allowed_tools?: { mode?: unknown } } | string | null | undefined;
  if (choice === 'required') return false;
  if (typeof choice === 'object' && choice !== null) {
    if (choice.type === 'allowed_tools') return choice.allowed_tools?.mode !== 'required';
    return false; // a named function or custom tool
  }
  return true;
}

export function degradedAnswer(req: ManagedRequest, message: string, reason: string): Omit<PipelineAnswer, 'summary'> {
  const id = `chatcmpl-degraded-${randomUUID()}`;
  const created = Math.floor(Date.now() / 1000);
  // Cut as in labels: the name is repeated in every chunk of every choice (3 x n of them), and the body limit is its
  // only other bound (a 1 MB name made a 384 MB answer, a 4 MB one several GB of strings and then a 500).
  const model = typeof req.json.model === 'string' ? shortModel(req.json.model) : 'stormgate-degraded';
  const headers = { 'x-stormgate-degraded': 'true', 'x-stormgate-degraded-reason': reason };
  const usage = { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 };
  // One choice for each of the `n` asked for, as OpenAI answers: a client reading choices[1] must find one.
  const n = typeof req.json.n === 'number' && Number.isInteger(req.json.n) && req.json.n > 1 ? Math.min(req.json.n, 128) : 1;
  const indexes = Array.from({ length: n }, (_, i) => i);
  if (req.json.stream === true) {
    const chunk = (delta: Record<string, unknown>, finish: string | null) =>
      indexes
        .map((index) => `data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created, model, system_fingerprint: null, choices: [{ index, delta, logprobs: null, finish_reason: finish }] })}\n\n`)
        .join('');
    const events = [chunk({ role: 'assistant', content: '' }, null), chunk({ content: message }, null), chunk({}, 'stop')];
    const includeUsage = (req.json.stream_options as { include_usage?: boolean } | undefined)?.include_usage === true;
    if (includeUsage) events.push(`data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created, model, choices: [], usage })}\n\n`);
    events.push('data: [DONE]\n\n');
    return { status: 200, headers: { ...headers, 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' }, body: Readable.from([events.join('')]) };
  }
  const completion = {
    id,
    object: 'chat.completion',
    created,
    model,
    system_fingerprint: null,
    choices: indexes.map((index) => ({ index, message: { role: 'assistant', content: message, refusal: null }, logprobs: null, finish_reason: 'stop' })),
    usage,
  };
  return { status: 200, headers: { ...headers, 'content-type': 'application/json' }, body: Buffer.from(JSON.stringify(completion)) };
}
