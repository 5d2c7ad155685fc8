// streamRecovery: continue (experimental): a text answer that broke after its first byte is finished by the next
// target. A target that continues an assistant prefill (Claude before 4.6, or `prefill: true`) is sent the text
// already delivered and streams the rest (never for structured output, whose grammar starts the object again); an
// OpenAI-compatible one that does not is sent the original request, and its answer is spliced on only if it begins
// with exactly the delivered text. A stream cut before any text (after its
// reasoning alone) has nothing to prefill or match: any next target is sent the original request, as a failover would
// be. Anything else leaves the client with the original failure. The continuation is a retry taken from the budget,
// and counted and recorded as one; it goes through the next target's pool as any attempt on it does (slot-attempt.ts).
import { SseParser, type SseEvent } from '../streaming/sse-parser.ts';
import type { StreamShape } from '../streaming/stream-events.ts';
import { prepareUpstream } from '../providers/families.ts';
import { attemptInSlot, type SlotContext } from './slot-attempt.ts';
import type { RecoveryRefusal, StreamEnd, StreamRecovery } from './live-stream.ts';
import type { ManagedRequest } from './handle-request.ts';
import { stillThere, type AttemptRecord, type TargetDeps, type TargetPlan } from './target-attempts.ts';
import { failureCode, judgeStreamEnd, recordOutcome } from './record-outcome.ts';
import { takesPrefill } from '../providers/prefill.ts';
import { RequestAbort, type RequestSignal } from './request-abort.ts';
import { estimatedTokens } from '../policy/token-estimate.ts';
import { DeliveredText, type DeliveredChunk } from './delivered-text.ts';

export function streamRecovery(
  req: ManagedRequest,
  shape: StreamShape,
  next: TargetPlan | undefined,
  signal: RequestSignal,
  deps: Pick<TargetDeps, 'guards' | 'now' | 'onAttempt' | 'onRetry' | 'onBudgetExhausted'>,
  attempts: AttemptRecord[],
): StreamRecovery | RecoveryRefusal | undefined {
  if (req.route.config.streamRecovery !== 'continue' || req.route.api !== 'chat') return undefined;
  if (!next) return 'no_next_target';
  // The delivered text is one choice's: with n > 1 there is no one text to continue.
  if (shape.choices > 1) return 'several_choices';
  const { now } = deps;
  return async (delivered, brokeBy, shutdown, idleMs) => {
    // A second upstream request, so the guards of any retry: when a provider's streams break by the hundred, their
    // recoveries must not storm the next target. Only a target free to take requests, and a retry the budget grants.
    const { board, holdOffs, budget } = deps.guards;
    // Nothing goes once the shutdown has begun or the client has gone: nor is a retry taken from the (fleet's) budget
    // for it, which the instances staying up through a rolling deploy share.
    if (signal.aborted || shutdown.aborted) return undefined;
    if (board.availability(next.key, next.breaker, false).kind !== 'closed') return 'breaker_not_closed';
    if (holdOffs.until(next.holdOffKey) !== undefined || holdOffs.credentialsHeldUntil(next.key) !== undefined) return 'held_off';
    const provider = next.client.config;
    // No text of the answer went out (the client had its reasoning alone, perhaps a paragraph break): nothing to
    // prefill or to match, so the next target is asked the request as the client sent it, as a failover would ask it,
    // tools and all (with no answer begun, a tool call is as good an answer as text). Its stream goes to the client
    // whole, its own reasoning included: the thoughts behind the answer the client gets, where dropped they left it
    // silent for as long as the next model thought.
    const fresh = delivered.trim() === '';
    // Structured output (response_format json_schema or json_object) is decoded against its grammar from the
    // answer's start: a model continuing a prefill under it writes a whole object again after the half the client has
    // (or its provider refuses the pair), and the client's JSON no longer parses. Such an answer is only spliced on:
    // the next target's own answer, whole, when it begins with what the client has.
    const prefill = !fresh && !structuredOutput(req.json) && takesPrefill(provider, next.model);
    // Another family's model, asked again, is not going to begin with the very words the first one wrote: splicing
    // would spend a retry and an upstream request on nothing.
    if (!fresh && !prefill && provider.family === 'anthropic') return 'other_family';
    // Anthropic refuses a prefill that ends in whitespace (400), and cuts often land after a space or a paragraph
    // break: the prefill goes without it, and the continuation without the whitespace the client already has.
    const prefillText = delivered.trimEnd();
    const messages = Array.isArray(req.json.messages) ? req.json.messages : [];
    const asked = fresh ? req.json : textOnly(req.json);
    const json = prefill ? { ...asked, messages: [...messages, { role: 'assistant', content: prefillText }] } : asked;
    const prepared = json !== req.json ? prepareUpstream(provider, { api: 'chat', clientPath: req.path, query: req.query, json, rawBody: Buffer.from(JSON.stringify(json)), model: next.model }) : next.upstream();
    const planned = next.upstream();
    if (!prepared.ok || !planned.ok) return 'not_expressible';
    // Taken from the budget only for a request that can go: one the target cannot take spends no retry. A refusal is
    // counted as any retry's (stormgate_retry_budget_exhausted_total).
    if (!(await budget.tryRetry(next.budgetKey, req.route.config.budget))) {
      deps.onBudgetExhausted?.(req.route.name, next.key);
      return 'budget';
    }
    if (signal.aborted || shutdown.aborted) return undefined;
    // The instance's shutdown ends the continuation as it ends any stream: until the continuation's first output its
    // request is given up (the broken stream then tells the client), after it its own stream is interrupted, which
    // writes the error event. Its request signal hears the shutdown only until then: a stream whose request signal has
    // fired reads it as its client gone, and ends without a word.
    const attemptSignal = new RequestAbort();
    const stop = () => attemptSignal.abort(shutdown.reason);
    signal.addEventListener('abort', () => attemptSignal.abort(signal.reason), { once: true });
    shutdown.addEventListener('abort', stop, { once: true });
    // Marked as the retry it is, as every retry is: the request ran once already, at the target whose stream broke.
    const upstream = { ...prepared.request, headers: { ...planned.request.headers, ...prepared.request.headers, 'x-retry-attempt': '1', 'x-retry-reason': brokeBy } };
    // It goes through the next target's pool as its first attempt there would: a slot of the request's class (not
    // under the retry cap, which bounds a target's retries of its own requests), waited for by the one wait rule. Past
    // the pool, a primary that cut many streams at once sent every continuation to the backup at once, beyond its
    // maxConcurrent and its adaptive limit, unseen by its in-use gauge. The wait has no request deadline to keep to
    // (it ended at the first output): the client's stream waits as long as its idle limit lets it go silent (less
    // minAttemptMs), from the break; once sent, the continuation's own timers bound it as before.
    const bodyBytes = Buffer.byteLength(upstream.body);
    const slotCtx: SlotContext = { route: req.route, api: 'chat', stream: true, shape, signal: attemptSignal, deadlineAtMs: now() + idleMs, bodyBytes, client: req.client, ...(next.pool.settings.rates?.tokens && { tokens: estimatedTokens('chat', bodyBytes, json) }) };
    const attempt = await attemptInSlot(slotCtx, next, upstream, { retry: false, released: false }, now, stillThere(deps.guards, next, false, now));
    shutdown.removeEventListener('abort', stop);
    // Shed (its class queue full, no slot within the wait), the target gone meanwhile, or the client or the shutdown
    // gone before it was sent: nothing went upstream, and the client has the original failure (or the shutdown's).
    if (attempt.kind !== 'done') return signal.aborted || shutdown.aborted ? undefined : 'not_sent';
    const { result, cls, durationMs, slotWaitMs } = attempt;
    const live = result.stream;
    if (live) shutdown.addEventListener('abort', () => live.interrupt(), { once: true });
    // A second upstream request: in the request's log line (`attempts`) and stormgate_upstream_attempts_total, as
    // any other, or the amplification the operator watches misses every recovery; and a retry the budget paid for,
    // in stormgate_retry_count_total (with the break as its reason) as the budget's other retries are.
    const code = failureCode(result);
    attempts.push({ target: next.label, attempt: 0, reason: cls.reason, ...(result.status !== undefined && { status: result.status }), waitMs: 0, ...(slotWaitMs > 0 && { slotWaitMs: Math.round(slotWaitMs) }), durationMs, ...(code !== undefined && { code }) });
    deps.onRetry?.(req.route.name, next.key, brokeBy, 0);
    deps.onAttempt?.(req.route.name, next.key, result, durationMs);
    // And in the target's guards, as any attempt on it: unrecorded, a backup that failed every continuation (a 503, a
    // refused connection) never opened its breaker, and kept being sent the recoveries of every broken stream; and
    // a 429 it answered one with never reached its adaptive limit, which paced its own requests as if it had room.
    // Recorded while the slot is held, as the attempt loop records: the limit hears how many were in flight. A stream's
    // slot goes back when its upstream is let go of (slot-attempt.ts), however the continuation ends; any other's now.
    const judgedIn = result.stream && { generation: board.current(next.key).generation, atMs: now() };
    try {
      await recordOutcome(deps.guards, next, result, cls, durationMs, undefined);
    } finally {
      attempt.release();
    }
    if (!live) return 'failed';
    judgeStreamEnd(deps.guards, next, live, judgedIn);
    const body = live.body();
    const ended = () => live.ended;
    const whenEnded = (fn: (end: StreamEnd) => void) => (live.onEnd = fn);
    const abandon = () => live.abandon();
    const target = next.key;
    if (fresh) return { text: delivered === '' ? body : withoutWhitespaceHad(body, delivered), ended, whenEnded, abandon, target };
    if (!prefill) {
      const text = await splice(body, delivered, abandon);
      return text ? { text, ended, whenEnded, abandon, target } : 'no_match';
    }
    return { text: prefillText.length < delivered.length ? withoutWhitespaceHad(body, delivered.slice(prefillText.length)) : body, ended, whenEnded, abandon, target };
  };
}

/** The request asks for JSON output (response_format json_schema or json_object), which a prefill cannot carry on. */
function structuredOutput(json: Record<string, unknown>): boolean {
  const type = (json.response_format as { type?: unknown } | null | undefined)?.type;
  return type === 'json_schema' || type === 'json_object';
}

/**
 * The request with its tools kept (a history of tool calls needs their definitions: Anthropic refuses it otherwise)
 * but not to be called: a text answer's rest is text, never a tool call stitched onto another model's words.
 */
function textOnly(json: Record<string, unknown>): Record<string, unknown> {
  if (json.tools === undefined && json.functions === undefined) return json;
  const { parallel_tool_calls: _parallel, ...rest } = json;
  return { ...rest, ...(json.tools !== undefined && { tool_choice: 'none' }), ...(json.functions !== undefined && { function_call: 'none' }) };
}

/**
 * The continuation with the whitespace the client already has (`had`: the delivered text's trailing whitespace, which
 * the prefill went without) taken off its start. Only that: a model that writes "\n    return 1" after a prefill cut
 * at "def f():\n" keeps its indentation, and "\n\n" after "Title\n" keeps its paragraph break (all of the
 * continuation's leading whitespace taken off, the code lost its indentation and the paragraph its break). A
 * continuation whose whitespace does not begin with what the client has (a space after a line break) loses all of it.
 */
async function* withoutWhitespaceHad(body: AsyncGenerator<string>, had: string): AsyncGenerator<string> {
  const parser = new SseParser();
  /** What of `had` the continuation has not written yet; undefined once its whitespace differs from it. */
  let left: string | undefined = had;
  let trimming = true;
  for await (const text of body) {
    const out: string[] = [];
    for (const ev of parser.push(Buffer.from(text))) {
      const chunk: ContentChunk | undefined = trimming ? contentChunk(ev) : undefined;
      if (chunk === undefined) {
        out.push(`${ev.raw}\n\n`);
        continue;
      }
      const delta: { content?: unknown } = chunk.choices![0]!.delta!;
      const content = delta.content as string;
      let i = 0;
      while (trimming && i < content.length && /\s/.test(content[i]!)) {
        if (left !== undefined && content[i] !== left[0]) left = undefined;
        i++;
        if (left !== undefined) {
          left = left.slice(1);
          // All the client had is matched: the rest of the continuation's whitespace is its own.
          if (left === '') trimming = false;
        }
      }
      if (i < content.length) trimming = false;
      delta.content = content.slice(i);
      out.push(`data: ${JSON.stringify(chunk)}\n\n`);
    }
    if (out.length > 0) yield out.join('');
  }
}

type ContentChunk = DeliveredChunk & { choices?: Array<{ delta?: { content?: unknown } }> };

/** A chunk of the continuation, parsed once; undefined for [DONE], a keep-alive or a malformed event. */
function parsedChunk(ev: SseEvent): ContentChunk | undefined {
  if (ev.data === null || ev.data === '[DONE]') return undefined;
  let chunk: unknown;
  try {
    chunk = JSON.parse(ev.data);
  } catch {
    return undefined;
  }
  return typeof chunk === 'object' && chunk !== null ? (chunk as ContentChunk) : undefined;
}

/** A chat chunk whose first choice carries text content, parsed; undefined for any other event. */
function contentChunk(ev: SseEvent): ContentChunk | undefined {
  const chunk = parsedChunk(ev);
  return typeof chunk?.choices?.[0]?.delta?.content === 'string' ? chunk : undefined;
}

/**
 * Reads the new answer until it is as long as what was delivered; splices it on only if it starts with exactly that,
 * and with nothing but text: a tool call (or a refusal, audio) begun before the seam is not the rest of the client's
 * text, and spliced, its opening (id, type, name) was dropped while its argument fragments after the seam went on.
 */
async function splice(body: AsyncGenerator<string>, delivered: string, abandon: () => void): Promise<AsyncIterable<string> | undefined> {
  const parser = new SseParser();
  /** The continuation up to the seam: its text, and whether it was text alone. */
  const beforeSeam = new DeliveredText();
  const after: string[] = [];
  /**
   * The chunk that reached the delivered text's length, the template of the remainder's: an answer's last chunk may
   * carry text, its finish and (some compatible servers') its usage, which the client asked for, all at once.
   */
  let boundary: Record<string, unknown> | undefined;
  let finish: unknown = null;
  /** The boundary chunk's logprobs for its tokens past the seam, which the remainder carries (null when it has none). */
  let logprobs: unknown = null;
  for (;;) {
    const { value, done } = await body.next();
    if (done) break;
    for (const ev of parser.push(Buffer.from(value))) {
      if (beforeSeam.text.length >= delivered.length) {
        after.push(`${ev.raw}\n\n`);
        continue;
      }
      // One parse per event: what it delivers, the template of the remainder's chunk, and its finish.
      const chunk = parsedChunk(ev);
      if (chunk === undefined) continue;
      const startsAt = beforeSeam.text.length;
      beforeSeam.noteChunk(chunk);
      if (typeof chunk.choices?.[0]?.delta?.content !== 'string') continue;
      const choice = chunk.choices[0] as { finish_reason?: unknown; logprobs?: unknown };
      if (beforeSeam.text.length >= delivered.length) {
        boundary = chunk as Record<string, unknown>;
        finish = choice.finish_reason ?? null;
        logprobs = logprobsFrom(choice.logprobs, delivered.length - startsAt);
      }
    }
    if (beforeSeam.text.length >= delivered.length || beforeSeam.notPlainText) break;
  }
  const text = beforeSeam.text;
  if (text.length < delivered.length || !text.startsWith(delivered) || beforeSeam.notPlainText) {
    await body.return(undefined);
    abandon();
    return undefined;
  }
  const remainder = text.slice(delivered.length);
  const carries = remainder !== '' || finish !== null || (boundary?.usage ?? null) !== null;
  const first = carries && boundary ? `data: ${JSON.stringify({ ...boundary, choices: [{ index: 0, delta: remainder ? { content: remainder } : {}, logprobs: remainder ? logprobs : null, finish_reason: finish }] })}\n\n` : '';
  return (async function* () {
    if (first) yield first;
    if (after.length > 0) yield after.join('');
    yield* body;
  })();
}

/**
 * A chunk's logprobs from `offset` (characters into its text) on: the tokens that begin at or after it, which the
 * remainder spliced on carries; a token the seam splits went out with the client's text and is left out. Dropped, the
 * client's logprobs missed every token of the remainder and no longer spelled its text. Null when the chunk has none.
 */
function logprobsFrom(logprobs: unknown, offset: number): unknown {
  const content = (logprobs as { content?: unknown } | null | undefined)?.content;
  if (!Array.isArray(content)) return null;
  let at = 0;
  const kept = content.filter((t: { token?: unknown }) => {
    const from = at;
    at += typeof t?.token === 'string' ? t.token.length : 0;
    return from >= offset;
  });
  return { ...(logprobs as object), content: kept };
}
