// Typed abort reasons: the pipeline tells why a signal fired from its reason, never from an error message.
import type { AttemptOutcome, TimeoutPhase } from '../policy/outcome.ts';

export class ClientGone extends Error {
  constructor() {
    super('client disconnected');
  }
}

export class DeadlineReached extends Error {
  constructor(readonly budgetMs: number) {
    super(`deadline of ${budgetMs} ms reached`);
  }
}

const WHAT_DID_NOT_COME: Record<TimeoutPhase, string> = {
  connect: 'no connection within',
  headers: 'no response headers within',
  'first-token': 'no first token within',
  response: 'no whole answer within',
  idle: 'no event for',
};

export class AttemptTimeout extends Error {
  constructor(readonly phase: TimeoutPhase, readonly limitMs: number) {
    super(`${WHAT_DID_NOT_COME[phase]} ${limitMs} ms`);
  }
}

/** The instance's drain grace period ran out with the stream still going: it ends with an error event, not a reset. */
export class GatewayShutdown extends Error {
  constructor() {
    super('the gateway instance is shutting down');
  }
}

/** The outcome of an attempt its signal ended, by the signal's reason. */
export function abortOutcome(reason: unknown): AttemptOutcome {
  if (reason instanceof AttemptTimeout) return { kind: 'timeout', phase: reason.phase };
  if (reason instanceof DeadlineReached) return { kind: 'aborted', by: 'deadline' };
  if (reason instanceof ClientGone) return { kind: 'aborted', by: 'client' };
  if (reason instanceof GatewayShutdown) return { kind: 'aborted', by: 'shutdown' };
  return { kind: 'aborted', by: 'client' };
}
