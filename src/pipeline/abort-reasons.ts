// Typed abort reasons: the pipeline tells why a signal fired from its reason, never from an error message.
import type { TimeoutPhase } from '../policy/outcome.ts';

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
