// A scripted provider for wire QA: each request gets a script of steps (text, pauses, end or reset), so a test can
// replay a real API's stream with its exact framing, splits and failures.
import type { IncomingMessage, RequestListener, ServerResponse } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import type { ConfigInput } from '../../src/config/schema.ts';
import { useFakeProviders } from './fake-provider.ts';
import { configServedBy, useStacks } from './stack.ts';

export type Step = string | Buffer | number | { destroy: true };
export interface Script {
  status?: number;
  headers?: Record<string, string>;
  steps: Step[];
  /** Leave the response open after the steps (no end). */
  hold?: boolean;
}
export interface Seen {
  body: Record<string, unknown>;
  /** The body as it came, for what JSON.parse would change (a number past 2^53). */
  raw?: string;
  headers: IncomingMessage['headers'];
  url: string;
  /** When the request's body had come (Date.now()), for the waits between attempts. */
  at: number;
}

/** An upstream that answers its `n`th request (from 1) with a script, or `hang`: no status, no body, ever. */
export function scripted(fn: (body: Record<string, unknown>, n: number) => Script | 'hang', seen: Seen[] = []): RequestListener {
  return (req, res) => {
    let raw = '';
    req.on('data', (d: Buffer) => (raw += d.toString()));
    req.on('end', () => {
      const body = JSON.parse(raw) as Record<string, unknown>;
      seen.push({ body, raw, headers: req.headers, url: req.url ?? '', at: Date.now() });
      const reply = fn(body, seen.length);
      if (reply !== 'hang') void play(res, reply);
    });
  };
}

/** Plays a script on one response: its status and headers at once, then each step (a wait, bytes, a reset). */
export async function play(res: ServerResponse, script: Script): Promise<void> {
  res.writeHead(script.status ?? 200, script.headers ?? { 'content-type': 'text/event-stream' });
  res.flushHeaders();
  for (const step of script.steps) {
    if (res.destroyed) return;
    if (typeof step === 'number') await sleep(step);
    else if (typeof step === 'object' && 'destroy' in step) {
      res.socket?.destroy();
      return;
    } else res.write(step);
  }
  if (!script.hold) res.end();
}

/** A Responses API event framed as OpenAI sends it (event line, then data). */
export const rev = (type: string, fields: Record<string, unknown>, seq: number): string =>
  `event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: seq, ...fields })}\n\n`;

export const baseResponse = (status: string, output: unknown[] = [], usage: unknown = null) => ({
  id: 'resp_abc123',
  object: 'response',
  created_at: 1741290958,
  status,
  background: false,
  error: null,
  incomplete_details: null,
  instructions: null,
  max_output_tokens: null,
  model: 'gpt-4.1-2025-04-14',
  output,
  parallel_tool_calls: true,
  previous_response_id: null,
  reasoning: { effort: null, summary: null },
  store: true,
  temperature: 1,
  text: { format: { type: 'text' } },
  tool_choice: 'auto',
  tools: [],
  top_p: 1,
  truncation: 'disabled',
  usage,
  user: null,
  metadata: {},
});

export const msgItem = (text: string, status = 'completed') => ({
  id: 'msg_1',
  type: 'message',
  status,
  role: 'assistant',
  content: text === '' && status === 'in_progress' ? [] : [{ type: 'output_text', text, annotations: [] }],
});

/** The head of a Responses text stream: created, in_progress, item and part added. */
export function responsesHead(): string[] {
  return [
    rev('response.created', { response: baseResponse('in_progress') }, 0),
    rev('response.in_progress', { response: baseResponse('in_progress') }, 1),
    rev('response.output_item.added', { output_index: 0, item: msgItem('', 'in_progress') }, 2),
    rev('response.content_part.added', { item_id: 'msg_1', output_index: 0, content_index: 0, part: { type: 'output_text', text: '', annotations: [] } }, 3),
  ];
}
export const textDelta = (delta: string, seq: number) =>
  rev('response.output_text.delta', { item_id: 'msg_1', output_index: 0, content_index: 0, delta, logprobs: [] }, seq);
/** The tail of a Responses text stream, from text done to response.completed. */
export function responsesTail(text: string, seq: number): string[] {
  const usage = { input_tokens: 12, input_tokens_details: { cached_tokens: 0 }, output_tokens: 2, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 14 };
  return [
    rev('response.output_text.done', { item_id: 'msg_1', output_index: 0, content_index: 0, text, logprobs: [] }, seq),
    rev('response.content_part.done', { item_id: 'msg_1', output_index: 0, content_index: 0, part: { type: 'output_text', text, annotations: [] } }, seq + 1),
    rev('response.output_item.done', { output_index: 0, item: msgItem(text) }, seq + 2),
    rev('response.completed', { response: baseResponse('completed', [msgItem(text)], usage) }, seq + 3),
  ];
}

export const cc = (choices: unknown[], extra: Record<string, unknown> = {}) =>
  `data: ${JSON.stringify({ id: 'chatcmpl-9', object: 'chat.completion.chunk', created: 1741290958, model: 'gpt-4o-2024-08-06', system_fingerprint: 'fp_1', choices, ...extra })}\n\n`;
export const delta = (d: Record<string, unknown>, finish: string | null = null, index = 0, extra: Record<string, unknown> = {}) => ({ index, delta: d, logprobs: null, finish_reason: finish, ...extra });

/** A config change for one file's tests, given the scripted provider's origin. */
export type ConfigShape = (c: ConfigInput, origin: string) => void;

/** Three quick attempts per target: a retry before the first output is seen at once. */
export const fastRetries: ConfigShape = (c) => {
  for (const r of c.routes as Array<Record<string, unknown>>) r.retry = { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 10 } };
};

/**
 * The chat route goes to `p`, then to `q` (the same scripted server under a second name, with `breaker` as its breaker),
 * with stream recovery on and one attempt per target.
 */
export function recoveringToNext(breaker: ConfigInput['providers'][string]['breaker'] = false): ConfigShape {
  return (c, origin) => {
    c.providers.q = { family: 'openai', baseUrl: `${origin}/v1`, apiKey: 'q-key', breaker };
    for (const r of c.routes) {
      if (r.name !== 'chat') continue;
      r.targets = [{ provider: 'p' }, { provider: 'q' }];
      r.streamRecovery = 'continue';
      r.retry = { maxAttempts: 1 };
    }
  };
}

/**
 * A gateway whose every route goes to one scripted provider `p` (see scripted()), and an `openai` SDK client of it
 * that never retries by itself. Call at the top of a test file: it registers the servers' clean-up.
 */
export function useScriptedGateway(shape?: ConfigShape) {
  const startProvider = useFakeProviders();
  const startStack = useStacks();
  return async (fn: (body: Record<string, unknown>, n: number) => Script, timeouts: Record<string, number> = {}) => {
    const seen: Seen[] = [];
    const p = await startProvider(scripted(fn, seen));
    const s = await startStack({
      config: (mockUrl) => {
        const c = configServedBy(mockUrl, 'p', `${p.origin}/v1`);
        (c.providers.p as Record<string, unknown>).timeouts = { connectMs: 2000, firstTokenMs: 30000, idleMs: 30000, ...timeouts };
        shape?.(c, p.origin);
        return c;
      },
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    return { client, seen, s };
  };
}

/** A scripted provider's answer to its `n`th request (from 1), given the request's JSON body. */
export type Answer = (body: Record<string, unknown>, n: number) => Script;

export const DONE = 'data: [DONE]\n\n';

/** A whole JSON answer with `status` (a string body is sent as it is). */
export const json = (status: number, body: unknown, headers: Record<string, string> = {}): Script => ({
  status,
  headers: { 'content-type': 'application/json', ...headers },
  steps: [typeof body === 'string' ? body : JSON.stringify(body)],
});

/** A whole chat completion, as any OpenAI-compatible provider answers one. */
export const completion = (content: string | null, model: string, finish = 'stop'): Script =>
  json(200, {
    id: 'chatcmpl-7f3a',
    object: 'chat.completion',
    created: 1741290958,
    model,
    choices: [{ index: 0, message: { role: 'assistant', content }, logprobs: null, finish_reason: finish }],
    usage: { prompt_tokens: 12, completion_tokens: 4, total_tokens: 16 },
  });

/** A whole Anthropic Messages answer of one text block, as the Messages API sends it. */
export const anthropicMessage = (text: string, model = 'claude-sonnet-4-6'): Script =>
  json(200, {
    id: 'msg_01XFDUDYJgAACzvnptvVoYEL',
    type: 'message',
    role: 'assistant',
    model,
    content: [{ type: 'text', text }],
    stop_reason: 'end_turn',
    stop_sequence: null,
    usage: { input_tokens: 10, output_tokens: 2 },
  });

/** A streamed answer: role chunk, text, finish, [DONE]. */
export const streamed = (text: string): Script => ({
  steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: text })]), cc([delta({}, 'stop')]), DONE],
});

/** A provider that answers every request well, with `text`. */
export const healthy =
  (text: string, model = 'gpt-4o'): Answer =>
  (body) =>
    body.stream === true ? streamed(text) : completion(text, model);

/** A provider that plays `first` for its first `times` requests, then answers well with `text`. */
export const failsThen =
  (times: number, first: Answer, text = 'recovered'): Answer =>
  (body, n) =>
    n <= times ? first(body, n) : healthy(text)(body, n);
