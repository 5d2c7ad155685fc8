// The request pipeline, top to bottom: deadline -> plans for each target -> serve the targets (attempt loops,
// failover, parking) -> answer (whole body, or a stream whose first output has arrived) or the final error.
import { Readable } from 'node:stream';
import type { ProviderClient } from '../providers/provider-client.ts';
import { forwardedResponseHeaders } from '../providers/headers.ts';
import { withoutKey } from '../providers/key-echo.ts';
import { computeDeadline } from '../policy/deadline.ts';
import { toldPastHoldOff } from '../policy/hold-off-wait.ts';
import type { Random } from '../policy/random.ts';
import type { CompiledRoute } from '../routing/router.ts';
import { sharedKey, type TargetKeys } from '../routing/target-keys.ts';
import type { Pools } from '../pools/pools.ts';
import { drainingCutError, drainingError, GatewayError, type OpenAIErrorBody } from '../errors.ts';
import { ClientGone, DeadlineReached, GatewayShutdown } from './abort-reasons.ts';
import type { AttemptResult } from './attempt.ts';
import { attemptsByTarget, authHeldAnswer, errorAnswer, failureAnswer, inexpressibleAnswer, unavailableAnswer, withRejectionNote, withSkipNote, type ErrorAnswer } from './final-answer.ts';
import { clientStallMs, type LiveStream, type StreamEnd } from './live-stream.ts';
import { endedBroken } from './stream-ends.ts';
import { endedWithClientVerdict, endedWithVerdict, serveTargets, type FallbackReason, type ServeDeps, type Served } from './serve-targets.ts';
import { planTargets } from './plan-targets.ts';
import { streamRecovery } from './stream-recovery.ts';
import { usageOfBody, type Usage } from '../streaming/usage.ts';
import { StreamBody } from '../streaming/stream-body.ts';
import { outputCharsOfAnswer, streamShapeOf } from '../streaming/stream-events.ts';
import { degradedAnswer, degradedFits, degradedReason } from './degraded-answer.ts';
import type { WeightedPicker } from '../routing/weighted.ts';
import type { AttemptRecord, RetriesStopped, SkippedTarget, TargetPlan } from './target-attempts.ts';
import { RequestAbort } from './request-abort.ts';
import type { HoldOffs } from '../state/hold-offs.ts';
import { EarlyStart } from './early-start.ts';
import { firstHeader, type HeaderBag } from '../header-bag.ts';
import { estimatedTokens } from '../policy/token-estimate.ts';

export interface ManagedRequest {
  route: CompiledRoute;
  /** The client's path, e.g. /v1/chat/completions, and its query string ("" or "?a=b"). */
  path: string;
  query: string;
  rawBody: Buffer;
  json: Record<string, unknown>;
  headers: HeaderBag;
  requestId: string;
  /** The client's key's name (auth.keys), when the gateway has keys: a class's slots are shared fairly by client. */
  client?: string;
  /** The class the client's key caps its requests at (auth.priority), when it has one. */
  clientPriority?: string;
  /** The same body from the same client failed here a moment ago (state/client-repeats.ts): the client is retrying. */
  repeat?: boolean;
  /**
   * The client's declared retry is of a 429 client_rate_limited this instance told it to come back from
   * (http/client-limits.ts retriesRefusal): still its retry in the log and metrics, a request to the retry budget.
   */
  retriesRefusal?: boolean;
  /**
   * How long the request had been arriving when it reached the pipeline: the upload of its body after its head. The
   * client's own timeout (x-stainless-timeout, x-stormgate-timeout-ms) has been running since it began to send.
   */
  receivedMs?: number;
  /** Registers a call for when the client goes away (at once if it already has); returns its removal. */
  onClientGone: (listener: () => void) => () => void;
  /** Registers a call for when the instance's drain grace period is over (at once if it is); returns its removal. */
  onShutdown?: (listener: () => void) => () => void;
  /** While the instance drains, the time left before its grace period is over (a retry's wait past it is not taken). */
  graceLeftMs?: () => number | undefined;
  /** Registers a call for when the instance's drain begins (at once if it has); returns its removal. */
  onDrainStart?: (listener: () => void) => () => void;
  /**
   * The request runs under an idempotency key (pipeline/idempotent-request.ts), detached from its client, which may
   * come back under the key for the answer: its deadline is the route's, not the client's timeout, and a client that
   * leaves does not stop it. A stream still starts at the client's deadline (early-start.ts).
   */
  idempotent?: boolean;
  /** A keyed request's wait for an earlier run under its key, before it ran the request itself: its client's time too. */
  waitedForRunMs?: number;
  /**
   * Its client's token rate reserved tokens for it (auth.limits): a whole answer without usage has its output counted
   * (RequestSummary.outputChars) for the settlement. Other requests never pay to parse their answer for it.
   */
  countOutput?: boolean;
}

export interface PipelineDeps extends ServeDeps {
  providers: ReadonlyMap<string, ProviderClient>;
  weighted: WeightedPicker<TargetPlan>;
  onDegraded?: (route: string, reason: string) => void;
  pools: Pools;
  targetKeys: TargetKeys;
  onStreamEnd?: (route: string, end: StreamEnd) => void;
  /** A learned target key was given back (its model does not exist): drop what is kept under it. */
  onTargetForgotten?: (key: string) => void;
  /** The `via` header this instance sends upstream (http/loop-guard.ts). */
  via?: string;
}

/** What the server writes back, plus the facts the request log line needs. */
export interface PipelineAnswer {
  status: number;
  headers: Record<string, string>;
  body: Buffer | OpenAIErrorBody | Readable;
  summary: RequestSummary;
  /** The upstream stream behind a streamed body, so a shutting-down instance can end it with an error event. */
  live?: LiveStream;
  /**
   * For a whole answer from upstream: how long its client may take nothing of it before its connection is closed. The
   * answer is held in memory until it is taken (an embeddings batch is tens of MB), and a hung consumer that keeps its
   * connection open would otherwise pin it for as long as it stays; a stream's client is given up on the same way.
   */
  clientStallMs?: number;
}

export const CLIENT_RETRY_KINDS = ['declared', 'repeat'] as const;
type ClientRetryKind = (typeof CLIENT_RETRY_KINDS)[number];

/**
 * `invalid_request`: the answer is a verdict on the client's own request (the provider's 400, 404, 422, context length,
 * content policy, ...; the gateway's 400 for a request no target can express), which the service gave correctly and
 * the client has to fix; `upstream_error`: the provider's failure passed on (the edges: upstreamStatusOutcome).
 */
export const REQUEST_OUTCOMES = ['success', 'degraded', 'invalid_request', 'upstream_error', 'gateway_error', 'unavailable', 'shed', 'deadline', 'client_gone', 'stream_error', 'replayed'] as const;
type RequestOutcome = (typeof REQUEST_OUTCOMES)[number];

export interface RequestSummary {
  route: string;
  /** The target that answered (or failed last), as `<provider>/<model or other>`. */
  target: string | undefined;
  /** `stream_error`: a stream that started but broke (cut, stalled, an upstream error event, the instance's shutdown). */
  outcome: RequestOutcome;
  /** The request's priority class in the first target's pool. */
  priority?: string;
  /** An x-stormgate-priority no class of that pool is called (a typo in a batch job would otherwise go unseen). */
  unknownPriority?: string;
  attempts: AttemptRecord[];
  budgetMs: number;
  deadlineSource: string;
  /** The request is the client's own retry: it said so (x-stainless-retry-count), or its body repeats a failed one. */
  clientRetry?: ClientRetryKind;
  /** Time the request spent parked, all its parks together (a released one's also shows as its attempt's wait). */
  parkedMs?: number;
  /** Time it spent in backoffs before retries (wait hints included), all together; a wait cut short counts as far as it went. */
  backoffMs?: number;
  /** A stream's time from the request's arrival to its first output event (a stream started early included). */
  ttftMs?: number;
  /** The client's deadline started the stream before its first output (early-start.ts). */
  startedEarly?: true;
  upstreamRequestId?: string;
  /** For streams, filled in when the stream ends. */
  streamEnd?: StreamEnd;
  /** A whole answer's client took nothing of it for clientStallMs, and its connection was closed (a stream's says client-stalled). */
  clientStalled?: true;
  /** Why a fallback target answered, when one did. */
  fallback?: FallbackReason;
  /** A failed request: what stopped its retries on the last target when it was not the outcome itself (the budget, say). */
  retriesStopped?: RetriesStopped;
  /** Targets left out for this request, with the reason. */
  skipped: SkippedTarget[];
  /** Tokens of the answer, for the cost metrics (a recovered stream's: of its broken part, billed to `target`). */
  usage?: Usage;
  /** A streamRecovery continuation's tokens, billed to the target it went to. */
  continuationUsage?: { target: string; usage: Usage };
  /**
   * A whole answer's characters of output (outputCharsOfAnswer), counted when it carried no usage and the request has
   * countOutput: its client's token rate is settled by them, as by a stream's StreamEnd.outputChars.
   */
  outputChars?: number;
  /** Under an idempotency key: `run` (this request ran under it) or `replayed` (it got the run's answer again). */
  idempotency?: 'run' | 'replayed';
}

export async function handleManagedRequest(req: ManagedRequest, deps: PipelineDeps): Promise<PipelineAnswer> {
  const { route } = req;
  const deadlineOf = (headers: HeaderBag) => computeDeadline({ routeTimeoutMs: route.config.timeoutMs, marginMs: route.config.deadlineMarginMs, headers });
  const deadline = deadlineOf(req.idempotent ? {} : req.headers);
  // The deadline counts from the request's head, not from the end of its body: a large body sent over a slow link
  // spends seconds of the client's timeout before the pipeline sees it, and counted from here the answer came after
  // the client had given up (and its SDK had sent the request again).
  const receivedMs = Math.max(0, req.receivedMs ?? 0);
  const arrivedAtMs = deps.now() - receivedMs;
  const deadlineAtMs = arrivedAtMs + deadline.budgetMs;
  const controller = new RequestAbort();
  const stream = req.json.stream === true;
  // A keyed run is bounded by the route's timeout, not its client's (the repeats wait for its answer), but its stream
  // still starts at the client's deadline: held to its first token, the SDK gave up first, its retries found the run
  // still going (409 after 409), and the thinking model's answer was kept for no one.
  const keyedStream = stream && req.idempotent === true;
  const clientDeadline = keyedStream ? deadlineOf(req.headers) : deadline;
  const earlyStart = stream && clientDeadline.source !== 'route' ? new EarlyStart() : undefined;
  const deadlineTimer = setTimeout(() => {
    if (keyedStream || !earlyStart?.take()) controller.abort(new DeadlineReached(deadline.budgetMs));
  }, Math.max(0, deadline.budgetMs - receivedMs));
  const earlyStartTimer = keyedStream && earlyStart ? setTimeout(() => earlyStart.take(), Math.max(0, clientDeadline.budgetMs - receivedMs - (req.waitedForRunMs ?? 0))) : undefined;
  const clearDeadlineTimers = () => {
    clearTimeout(deadlineTimer);
    clearTimeout(earlyStartTimer);
  };
  const stopWatchingClient = req.idempotent ? () => {} : req.onClientGone(() => controller.abort(new ClientGone()));
  // Past the drain's grace period nothing new goes upstream: the request is answered 503 gateway_draining.
  const stopWatchingShutdown = req.onShutdown?.(() => controller.abort(new GatewayShutdown()));
  const summary: RequestSummary = {
    route: route.name,
    target: undefined,
    outcome: 'gateway_error',
    attempts: [],
    skipped: [],
    budgetMs: deadline.budgetMs,
    deadlineSource: deadline.source,
  };
  const declaredRetries = clientRetryCount(req.headers);
  if (declaredRetries > 0) summary.clientRetry = 'declared';
  else if (req.repeat) summary.clientRetry = 'repeat';
  let handedToStream = false;
  const { plans, contextFallback, skipped, disabled, unknownPriority } = planTargets(req, deps);
  const shape = streamShapeOf(route.api, req.json);
  // What a second request would run beside the first (a background job, a conversation's turn): sent once.
  const commitsOnSend = shape.startsAtCreated !== undefined;
  summary.priority = plans[0]?.className;
  if (unknownPriority !== undefined) summary.unknownPriority = unknownPriority;
  summary.skipped = skipped;
  try {
    if (plans.length === 0) {
      summary.outcome = 'unavailable';
      return { ...errorAnswer(noTargetError(summary)), summary };
    }
    const served = await serveTargets(
      {
        route,
        api: route.api,
        stream,
        shape,
        commitsOnSend,
        signal: controller.signal,
        deadlineAtMs,
        earlyStart,
        onStreamStarted: clearDeadlineTimers,
        attempts: summary.attempts,
        skipped: summary.skipped,
        parkable: route.config.park !== false,
        onWaited: (kind, ms) => {
          const field = kind === 'parked' ? 'parkedMs' : 'backoffMs';
          summary[field] = Math.round((summary[field] ?? 0) + ms);
        },
        clientRetries: declaredRetries > 0 ? (req.retriesRefusal ? 0 : declaredRetries) : req.repeat && route.config.budget.repeats.countAsRetries ? 1 : 0,
        bodyBytes: req.rawBody.length,
        client: req.client,
        // Read from the body only for a token rate: a large body's estimate walks it for inline images.
        ...(deps.pools.countTokens && { tokens: estimatedTokens(route.api, req.rawBody.length, req.json) }),
        graceLeftMs: req.graceLeftMs,
        onDrainStart: req.onDrainStart,
      },
      plans,
      contextFallback,
      route.config.park,
      deps,
    );
    summary.target = served.plan.key;
    // A key given back is counted under the provider's shared one from now on, this request's own count included.
    if (forgetUnknownModels(summary.attempts, contextFallback ? [...plans, contextFallback] : plans, deps).includes(served.plan.key)) summary.target = sharedKey(served.plan.client.name);
    if (served.kind === 'ok') {
      summary.outcome = 'success';
      if (served.fallback) summary.fallback = served.fallback;
      const servedAt = plans.indexOf(served.plan);
      const next = servedAt === -1 ? undefined : plans[servedAt + 1];
      served.result.stream?.recoverWith(streamRecovery(req, shape, next, controller.signal, deps, summary.attempts));
      const answer = successAnswer(req, served.plan, served.result, summary, deps, arrivedAtMs);
      handedToStream = answer.body instanceof Readable;
      return answer;
    }
    // A credential hold is a failure like the credential rejection that started it.
    const degraded = route.config.degraded && degradedFits(req.json) && degradedReason(served);
    if (degraded) {
      summary.outcome = 'degraded';
      // A failed request answered in its stead: its line says what stopped the retries, as a failed one's does.
      if (served.kind === 'failed' && served.failure.why) summary.retriesStopped = served.failure.why;
      deps.onDegraded?.(route.name, degraded);
      const answer = degradedAnswer(req, route.config.degraded!.message, degraded);
      return { ...answer, headers: withStormgateHeaders({ ...answer.headers }, summary, served.plan.label), summary };
    }
    const answer = errorFor(served, summary, deadline.budgetMs, deps.now(), disabled > 0, deps.guards.holdOffs, deps.random, commitsOnSend);
    // An upstream error passed on carries the provider's id, which the SDK shows as err.requestID: the log line names
    // it too, or the id a developer quotes leads nowhere in the gateway's logs.
    // An error the gateway writes itself (a refused key's 502, say) names the provider's id of the answer it failed on:
    // the provider's support asks for it.
    // That id is read from the provider's own headers, not from the ones passed on: a server that echoes the key it was
    // sent (in its request id, as on a 401) must not put it in the log line through it.
    const upstreamId = answer.headers['x-request-id'] ?? (served.kind === 'failed' ? requestIdOf(served.failure.result.headers, served.plan.client.config.apiKey) : undefined);
    if (upstreamId !== undefined) summary.upstreamRequestId = upstreamId;
    return { ...answer, headers: withStormgateHeaders({ ...answer.headers }, summary, served.plan.label), summary };
  } catch (err) {
    const answer = errorAnswer(new GatewayError('internal_error', `the gateway failed: ${(err as Error).message}`));
    return { ...answer, summary };
  } finally {
    // The deadline bounds the time until the answer starts; a stream that has started is bounded by its idle timer.
    clearDeadlineTimers();
    stopWatchingShutdown?.();
    if (!handedToStream) stopWatchingClient();
  }
}

/**
 * A target that answered 404 has no such model: its learned key is given back (see routing/target-keys.ts). Not a 404
 * that names another field of the request (a previous_response_id the provider does not have): the model exists.
 */
function forgetUnknownModels(attempts: AttemptRecord[], plans: TargetPlan[], deps: PipelineDeps): string[] {
  const forgotten: string[] = [];
  const drop = (key: string): void => {
    // Made-up names must not leave a metric series or a pool entry each behind either.
    deps.onTargetForgotten?.(key);
    forgotten.push(key);
  };
  let unknownModel = false;
  for (const a of attempts) {
    if (a.status !== 404 || a.param !== undefined) continue;
    const plan = plans.find((p) => p.label === a.target);
    // A target's own model (the operator's, a retired one) says nothing of the client's name, and the next target was
    // tried: the name's places at the others are not only planned. Counted, a route whose first target sends a retired
    // model gave back a real model's place at the backup with every request the second target served.
    if (plan !== undefined && !plan.ownModel) unknownModel = true;
    const key = plan?.model === undefined ? undefined : deps.targetKeys.forget(plan.client.name, plan.model);
    // Only a request counted under the model's own key has something to drop (a later one is under `other` already).
    if (key !== undefined && key === plan!.key && !forgotten.includes(key)) drop(key);
  }
  // The 404 ended the request (the primary's rejection has the last word) before its fallbacks were tried: the places
  // the name took at them when it was planned go back too, unless some request has tried it there (a real model the
  // primary serves keeps its place at the backup for failover). Not refused: the backup may serve the name. Else 40
  // made-up names took all 32 places of a backup, and real models failing over there shared one breaker for an hour.
  if (unknownModel) {
    for (const plan of plans) {
      if (plan.model === undefined || plan.key === sharedKey(plan.client.name) || forgotten.includes(plan.key)) continue;
      if (deps.targetKeys.release(plan.client.name, plan.model) === plan.key) drop(plan.key);
    }
  }
  // Another request may have given a key back while this one was in flight under it (a 404, a release) and ended
  // otherwise (its client left, its deadline passed, it went on to the fallback): what this one counted under the key
  // since (its attempt's series, the route's zeroed series, a pool entry) goes too, or each made-up name sent twice at
  // once could leave its series behind.
  for (const plan of plans) {
    if (plan.model === undefined || forgotten.includes(plan.key)) continue;
    if (deps.targetKeys.givenBack(plan.client.name, plan.model, plan.key)) drop(plan.key);
  }
  return forgotten;
}

/** The provider's request id (OpenAI's `x-request-id`, Anthropic's `request-id`), without the key it was sent. */
function requestIdOf(headers: HeaderBag | undefined, apiKey: string): string | undefined {
  const v = headers?.['x-request-id'] ?? headers?.['request-id'];
  return typeof v === 'string' ? withoutKey(v, apiKey) : undefined;
}

/** The retry the client says a request is (x-stainless-retry-count): 0 for its first try. */
export function clientRetryCount(headers: HeaderBag): number {
  const n = Number(firstHeader(headers, 'x-stainless-retry-count'));
  return Number.isInteger(n) && n > 0 ? n : 0;
}

/**
 * `disabled`: a target of the route was left out because its provider is disabled (configuration, not the request).
 * `commitsOnSend`: the request commits at the provider as it is taken (a background job, a conversation's turn).
 */
function errorFor(served: Exclude<Served, { kind: 'ok' }>, summary: RequestSummary, budgetMs: number, nowMs: number, disabled: boolean, holdOffs: HoldOffs, random: Random, commitsOnSend: boolean): ErrorAnswer {
  const answer = errorOf(served, summary, budgetMs, nowMs, disabled, holdOffs, random, commitsOnSend);
  // no-target's message lists every skip already; a verdict on the request is the client's to fix wherever it goes.
  const noted = served.kind === 'no-target' || endedWithVerdict(served) ? answer : withSkipNote(answer, served.plan.label, summary.skipped);
  return served.rejected ? withRejectionNote(noted, { target: served.rejected.plan.label, result: served.rejected.failure.result }) : noted;
}

function errorOf(served: Exclude<Served, { kind: 'ok' }>, summary: RequestSummary, budgetMs: number, nowMs: number, disabled: boolean, holdOffs: HoldOffs, random: Random, commitsOnSend: boolean): ErrorAnswer {
  switch (served.kind) {
    case 'failed': {
      const outcome = served.failure.result.outcome;
      if (outcome.kind === 'aborted' && outcome.by === 'shutdown') {
        summary.outcome = 'unavailable';
        // Cut in flight (its attempt is the last one recorded, the shutdown's; a cut wait or a queue sent nothing): such
        // a request may have been taken, and is not sent again, as after a timeout once sent (policy/outcome.ts maySendAgain).
        if (commitsOnSend && summary.attempts.at(-1)?.reason === 'shutdown') return errorAnswer(drainingCutError());
        return errorAnswer(drainingError(served.failure.retryAfterMs));
      }
      summary.outcome = outcome.kind === 'aborted' ? (outcome.by === 'client' ? 'client_gone' : 'deadline') : outcome.kind === 'http' ? upstreamStatusOutcome(served) : 'gateway_error';
      if (served.failure.why) summary.retriesStopped = served.failure.why;
      return failureAnswer({
        result: served.failure.result,
        cls: served.failure.cls,
        retryAfterMs: served.failure.retryAfterMs,
        budgetSpent: served.failure.why === 'budget',
        retryShed: served.failure.why === 'shed',
        // Sent once: an SDK retry after the hint multiplies nothing the gateway did.
        invite: served.failure.why === 'wait_hint' && summary.attempts.length === 1,
        attempts: attemptsByTarget(summary.attempts),
        target: served.plan.label,
        budgetMs,
        apiKey: served.plan.client.config.apiKey,
        proxy: served.plan.client.config.proxy,
      });
    }
    case 'unavailable': {
      summary.outcome = 'unavailable';
      const retryAfterMs = Math.max(0, served.availableAtMs - nowMs);
      if (served.reason === 'breaker') return unavailableAnswer({ reason: 'breaker', target: served.plan.key, retryAfterMs });
      // A hold-off capped at a minute: the client is told the end the provider asked for, as the first request was.
      const { key, holdOffKey } = served.plan;
      const askedUntil = Math.max(served.availableAtMs, holdOffs.askedUntil(holdOffKey) ?? 0);
      // The hold-off in force now: a request parked to its deadline saw the end of one that a newer 429 has renewed
      // since, and told against that stale end it read "for another 1 s (the gateway asks it again in 0 s)".
      const heldUntil = Math.max(served.availableAtMs, holdOffs.until(holdOffKey) ?? 0);
      // Held off by the flex tier alone: the client learns that its default-tier requests still go.
      const target = holdOffKey !== key && holdOffs.until(key) === undefined ? `${key} (its flex service tier)` : key;
      const askedMs = Math.max(0, askedUntil - nowMs);
      return unavailableAnswer({ reason: 'hold-off', target, retryAfterMs: askedMs, holdOffMs: Math.max(0, heldUntil - nowMs), toldMs: toldPastHoldOff(askedMs, random) });
    }
    case 'park-full':
      summary.outcome = 'unavailable';
      return errorAnswer(
        new GatewayError('park_queue_full', `target ${served.plan.key} is unavailable and the queue of waiting requests is full`, {
          shouldRetry: true,
          retryAfterMs: Math.max(1_000, served.availableAtMs - nowMs),
        }),
      );
    case 'shed': {
      summary.outcome = 'shed';
      const { className, lowestClass, retryAfterMs, reason } = served.shed;
      const why =
        reason === 'queue_full'
          ? `its queue for class ${className} is full`
          : reason === 'body_bytes'
            ? `the requests waiting in this gateway hold as many bytes of request bodies as server.maxWaitingBodyBytes allows${lowestClass ? ` for class ${className}` : ''}`
            : reason === 'max_wait'
              ? `no slot for class ${className} came within the route's park.maxWaitMs`
              : `no slot for class ${className} can be expected before the request's deadline`;
      return errorAnswer(
        new GatewayError('load_shed', `${served.plan.pool.rateShedWhy(reason, className) ?? `provider ${served.plan.client.name} is at capacity and ${why}`}; retry later`, {
          status: lowestClass ? 429 : 503,
          shouldRetry: true,
          retryAfterMs: Math.max(100, retryAfterMs),
        }),
      );
    }
    case 'closing':
      summary.outcome = 'unavailable';
      return errorAnswer(drainingError());
    case 'auth-held':
      summary.outcome = 'unavailable';
      return authHeldAnswer({ target: served.plan.label, remainingMs: Math.max(0, served.untilMs - nowMs), reason: holdOffs.credentialsHeldFor(served.plan.key) });
    case 'no-target':
      // A disabled target might have taken the request: the gateway's configuration is short, not the request.
      if (disabled) {
        summary.outcome = 'unavailable';
        return errorAnswer(noTargetError(summary));
      }
      // The client's to fix, as an upstream's 400 would be, and recorded like one.
      summary.outcome = 'invalid_request';
      return inexpressibleAnswer(summary.route, served.skips);
  }
}

/**
 * The outcome of a request that ended with an upstream's status. `invalid_request` when the status is the provider's
 * verdict on the request itself (OUTCOME_TABLE's verdict column): a 400, 404, 409, 413 or 422 (a 409 the route retried
 * included: what its retries left is the provider's word on the request), a context too long, a content policy
 * refusal, a conversation the target cannot continue, a request larger than the provider's whole token limit per minute
 * (no wait lets it through; the client is told to make it smaller). The service answered it correctly: no error of the
 * service's, so no page for a client's flood of bad prompts. `upstream_error` for everything else: the provider's
 * failure passed on (a 5xx; a 408 or 424, its own timeout or a model that failed while generating; a 429 or 529 after
 * retries; Groq's 498), the gateway's own credentials, billing or location (401, 402, 403, a 429 insufficient_quota:
 * answered 502 upstream_auth_error, whose fix is the operator's), a redirect (the gateway's baseUrl), and a 404 for a
 * target's own model (the operator's model name, not the client's: every request of the route gets it).
 */
function upstreamStatusOutcome(served: Served & { kind: 'failed' }): RequestOutcome {
  return endedWithClientVerdict(served) ? 'invalid_request' : 'upstream_error';
}

function noTargetError(summary: RequestSummary): GatewayError {
  const why = summary.skipped.map((s) => `${s.target}: ${s.reason}`).join('; ');
  return new GatewayError('no_target', `no target of route ${summary.route} can serve this request: ${why}`);
}

/** Adds the gateway's own answer headers to `headers` (an object of the answer's own, written in place). */
function withStormgateHeaders(headers: Record<string, string>, summary: RequestSummary, label: string): Record<string, string> {
  headers['x-stormgate-attempts'] = String(summary.attempts.length);
  headers['x-stormgate-target'] = label;
  headers['x-stormgate-route'] = summary.route;
  if (summary.fallback) headers['x-stormgate-fallback'] = summary.fallback;
  return headers;
}

function successAnswer(req: ManagedRequest, plan: TargetPlan, result: AttemptResult, summary: RequestSummary, deps: PipelineDeps, arrivedAtMs: number): PipelineAnswer {
  const upstream = result.headers ?? {};
  // The provider's key never reaches the client or the log, even from a server that echoes it in a header.
  const headers = forwardedResponseHeaders(upstream, plan.client.config.apiKey);
  const upstreamId = headers['x-request-id'];
  if (upstreamId !== undefined) summary.upstreamRequestId = upstreamId;
  // One object, written in place: the first token waits for everything done here.
  withStormgateHeaders(headers, summary, plan.label);
  if (result.stream) {
    if (result.startedEarly) summary.startedEarly = true;
    const live = result.stream;
    // Time to first token as the client sees it: from the request's arrival (retries, backoff, pool and park waits
    // included, like the duration histogram), and taken when the first output passes, so a stream started early at the
    // client's deadline is counted too, once its first output comes.
    live.onFirstOutput = () => {
      summary.ttftMs = deps.now() - arrivedAtMs;
    };
    headers['content-type'] = 'text/event-stream; charset=utf-8';
    headers['cache-control'] = 'no-cache';
    headers['x-accel-buffering'] = 'no';
    const { first, rest } = live.open();
    const body = new StreamBody(first, rest);
    live.onEnd = (end) => {
      summary.streamEnd = end;
      // The client got an error event, not an answer: counted as such, not among the successes.
      if (endedBroken(end.kind)) summary.outcome = 'stream_error';
      if (end.usage) summary.usage = end.usage;
      if (end.continuation) summary.continuationUsage = end.continuation;
      deps.onStreamEnd?.(req.route.name, end);
      // A client that stopped reading long ago: its connection goes too, which ends the request (logged, counted).
      if (end.kind === 'client-stalled') body.destroy();
    };
    // If the client leaves before the stream is read to its end, the generator may wait on the upstream: end it here.
    body.once('close', () => live.abandon());
    return { status: result.status ?? 200, headers, body, summary, live };
  }
  // On the APIs the gateway knows, the answer was judged a JSON object (answer-shape.ts): the client is told so, whatever
  // the provider wrote. The SDKs parse a body as JSON only under a lower-case `application/json`, and hand anything
  // else (no content-type, `Application/JSON`) to the caller as a string, on which `.choices` is undefined.
  if (req.route.api !== 'other') headers['content-type'] = 'application/json';
  const body = result.body ?? Buffer.alloc(0);
  const usage = usageOfBody(body);
  if (usage) summary.usage = usage;
  // Without usage (self-hosted servers often leave it out), the output delivered is what the client's token rate is
  // charged: its prompt alone, a client on such a route could ask for answers of any length. Parsed only then.
  else if (req.countOutput) {
    const chars = outputCharsOfAnswer(req.route.api, body);
    if (chars > 0) summary.outputChars = chars;
  }
  return { status: result.status ?? 200, headers, body, summary, clientStallMs: clientStallMs(plan.client.config.timeouts.idleMs) };
}
