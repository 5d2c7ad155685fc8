// A route's degraded answer: when every target failed or is unavailable and nothing could be parked, a normal-looking
// completion with the route's text (streamed if the client asked for a stream), marked x-stormgate-degraded: true.
// Never for the client's own mistakes, a disconnect, or a draining instance (another one can serve the request).
import { randomUUID } from 'node:crypto';
import { Readable } from 'node:stream';
import type { ManagedRequest, PipelineAnswer } from './handle-request.ts';
import type { Served } from './serve-targets.ts';

const CLIENTS_OWN = new Set(['client-error', 'context-length', 'content-policy']);

/** Why a request gets the degraded answer (stormgate_degraded_total's reason label). */
export const DEGRADED_REASONS = ['failed', 'unavailable', 'deadline', 'shed', 'park_full'] as const;

/** Why the request gets the degraded answer, or undefined when it must get its error. */
export function degradedReason(served: Exclude<Served, { kind: 'ok' }>): (typeof DEGRADED_REASONS)[number] | undefined {
  switch (served.kind) {
    case 'failed': {
      const { outcome } = served.failure.result;
      if (outcome.kind === 'aborted') return outcome.by === 'deadline' ? 'deadline' : undefined;
      return CLIENTS_OWN.has(served.failure.cls.cls) ? undefined : 'failed';
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

export function degradedAnswer(req: ManagedRequest, message: string, reason: string): Omit<PipelineAnswer, 'summary'> {
  const id = `chatcmpl-degraded-${randomUUID()}`;
  const created = Math.floor(Date.now() / 1000);
  const model = typeof req.json.model === 'string' ? req.json.model : 'stormgate-degraded';
  const headers = { 'x-stormgate-degraded': 'true', 'x-stormgate-degraded-reason': reason };
  const usage = { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 };
  if (req.json.stream === true) {
    const chunk = (delta: Record<string, unknown>, finish: string | null) =>
      `data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created, model, system_fingerprint: null, choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }] })}\n\n`;
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
    choices: [{ index: 0, message: { role: 'assistant', content: message, refusal: null }, logprobs: null, finish_reason: 'stop' }],
    usage,
  };
  return { status: 200, headers: { ...headers, 'content-type': 'application/json' }, body: Buffer.from(JSON.stringify(completion)) };
}
