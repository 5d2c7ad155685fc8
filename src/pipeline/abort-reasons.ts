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

export class AttemptTimeout extends Error {
  constructor(readonly phase: TimeoutPhase, readonly limitMs: number) {
    super(`no ${phase.replace('-', ' ')} within ${limitMs} ms`);
  }
}
