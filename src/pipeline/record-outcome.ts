// What one upstream attempt's outcome tells its target's guards (breaker, adaptive limit, hold-offs, credential holds),
// shared by every path that sends one: the attempt loop (target-attempts.ts) and a stream recovery's continuation
// (stream-recovery.ts). Kept in one place so that no path sends upstream requests the target's breaker or limit never
// hears of.
import { OUTCOME_TABLE, type Classification } from '../policy/outcome.ts';
import { sharedKey } from '../routing/target-keys.ts';
import type { Probe } from '../state/breaker-board.ts';
import { ACCOUNT_REFUSED_IN_STREAM, flexTierKey, startsHoldOff } from '../state/hold-offs.ts';
import type { AttemptResult } from './attempt.ts';
import type { LiveStream } from './live-stream.ts';
import type { Guards, TargetPlan } from './target-attempts.ts';

/** A network (or the gateway's own) failure's code, for the log's attempt and the breaker's facts. */
export function failureCode(result: AttemptResult): string | undefined {
  const { outcome } = result;
  return outcome.kind === 'network' || outcome.kind === 'internal' ? outcome.code : undefined;
}

/**
 * What an attempt's outcome tells its target's guards (the outcome table's breaker, limit and hold-off columns, and a
 * hold of the gateway's refused credentials), whichever path sent it: the attempt loop, or a stream recovery's
 * continuation, which must open the breaker of a backup that fails every continuation as its failed attempts would,
 * and cut its adaptive limit on a 429 as theirs would. Resolves once a breaker transition it causes is written;
 * returns the end of the hold-off its wait hint started, if it started one.
 */
export async function recordOutcome(guards: Guards, plan: TargetPlan, result: AttemptResult, cls: Classification, durationMs: number, probe: Probe | undefined): Promise<number | undefined> {
  const row = OUTCOME_TABLE[cls.cls];
  const { outcome } = result;
  const code = failureCode(result);
  // Before any await, while the attempt's slot (if it took one) is still held: the limit learns how many were in
  // flight when the provider said no. A 429 without a wait hint starts no hold-off: the limit is all that hears it.
  plan.pool.observe(plan.limitKey, row.limit, durationMs);
  // An attempt to the same target sent before this one and still unanswered may yet be a success that ends a run.
  const olderUnanswered = plan.pool.unansweredSince(plan.key, durationMs);
  await guards.board.record(plan.key, plan.breaker, row.breaker, durationMs, probe, { reason: cls.reason, ...(code !== undefined && { code }) }, olderUnanswered);
  // The gateway's own credentials or billing: no request goes to this target for authHoldS.
  if (cls.cls === 'credentials' && !refusesOneSharedModel(plan, result)) guards.holdOffs.holdCredentials(plan.key, plan.client.config.authHoldS * 1000, { reason: cls.reason, status: result.status });
  if (outcome.kind !== 'http' || !row.holdOff || !plan.sharesHoldOffs || !startsHoldOff(outcome.status, outcome.hint)) return undefined;
  const key = row.holdOff === 'flex-tier' ? flexTierKey(plan.key) : plan.key;
  const untilMs = guards.holdOffs.start(key, outcome.hint, { reason: cls.reason, status: outcome.status });
  // A flex tier's hold-off does not hold a request on another tier (one Groq answered 498 all the same): it is not
  // the request's own to wait out, and its answer's hint goes to it as a hint alone.
  return key === plan.key || key === plan.holdOffKey ? untilMs : undefined;
}

/**
 * A refusal of the model alone (OpenAI's 403 `model_not_found`: "Project `proj_...` does not have access to model ...")
 * under `<provider>/other`, the key every model past the learned ones shares: held, one client's request for a model
 * the gateway's key may not use turned every other tenant's unlisted models away for authHoldS, fleet-wide. A learned
 * model has a key of its own, and is held alone.
 */
function refusesOneSharedModel(plan: TargetPlan, result: AttemptResult): boolean {
  const { outcome } = result;
  return outcome.kind === 'http' && outcome.errorCode === 'model_not_found' && plan.key === sharedKey(plan.client.name);
}

/**
 * What a stream's end tells its target's guards that its first output could not: an account refused after the answer
 * began (a quota spent mid-stream) holds the credentials, as a refusal before it would; a break the provider made
 * turns the success its first output counted in `judgedIn` (the breaker's window then) into a failure. No `judgedIn`
 * for a probe, whose verdict was its first output.
 */
export function judgeStreamEnd(guards: Guards, plan: TargetPlan, stream: LiveStream, judgedIn: { generation: number; atMs: number } | undefined): void {
  // Heard when the upstream is let go of, as the slot goes back: for a stream a recovery continues, at the break, not
  // at the end of a continuation on another target, with the slot long taken by the provider's next requests.
  stream.whenUpstreamDone(() => {
    if (stream.accountRefused) guards.holdOffs.holdCredentials(plan.key, plan.client.config.authHoldS * 1000, { reason: ACCOUNT_REFUSED_IN_STREAM });
    const broke = stream.upstreamBroke;
    if (broke && judgedIn) guards.board.streamBroke(plan.key, plan.breaker, judgedIn, broke);
  });
}
