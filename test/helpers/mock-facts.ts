// The facts the mock's fault decision reads about one request (src/mock/faults.ts decide), for the pure tests of it.
import type { RequestFacts } from '../../src/mock/faults.ts';

/** A first attempt at gpt-4o with nothing else in flight and no brownout, `over` changed. */
export const facts = (over: Partial<RequestFacts> = {}): RequestFacts => ({
  model: 'gpt-4o',
  isRetry: false,
  inflight: 0,
  modelInflight: 0,
  brownout: undefined,
  ...over,
});

/** A random source that always draws 0. */
export const noRandom = () => 0;
