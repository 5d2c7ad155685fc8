// A breaker probe whose answer the breaker ignores. Some such answers are the request's own and say nothing of the
// target: Groq's 498 to a request on its flex tier (the tier's capacity, not the default tier's), a request larger than
// the provider's whole token limit, a request the gateway could not send at all. The probe's permit must come back with
// no verdict then, and the next probe (a default-tier request, one that fits) go at once: written as an inconclusive
// probe, the fleet's next probe waited twice probeWhileParkedMs for an answer that told nothing. Other ignored answers
// are the target's (a 429 without a wait hint, a probe its deadline cut short): they keep the wait that stops a probe
// loop. Driven on the board with a fake clock, with the verdicts the outcome table gives each answer.
import { describe, expect, it } from 'vitest';
import { BreakerSchema } from '../src/config/schema.ts';
import { settingsForModel } from '../src/policy/breaker.ts';
import { classify, OUTCOME_TABLE, OVER_RATE_LIMIT_CODE, type AttemptOutcome } from '../src/policy/outcome.ts';
import { BreakerBoard, type Probe } from '../src/state/breaker-board.ts';
import { MemoryStore } from '../src/state/memory-store.ts';

const s = settingsForModel(BreakerSchema.parse({ consecutiveFailures: 2, openS: 30, probeWhileParkedMs: 1_000, probeWhileParkedMaxMs: 5_000, halfOpenProbes: 1, closeAfter: 3 }), undefined);
const T0 = 10_000;
const verdictOf = (o: AttemptOutcome) => OUTCOME_TABLE[classify(o).cls].breaker;

const FLEX_498: AttemptOutcome = { kind: 'http', status: 498, errorCode: 'capacity_exceeded', hint: undefined };
const OVER_LIMIT: AttemptOutcome = { kind: 'http', status: 429, errorCode: OVER_RATE_LIMIT_CODE, hint: undefined };
const INTERNAL: AttemptOutcome = { kind: 'internal', code: 'ERR_INVALID_CHAR' };
const BARE_429: AttemptOutcome = { kind: 'http', status: 429, errorCode: 'rate_limit_exceeded', hint: undefined };
const CLIENT_400: AttemptOutcome = { kind: 'http', status: 400, errorCode: 'invalid_value', hint: undefined };

function board() {
  let now = T0;
  const store = new MemoryStore();
  const b = new BreakerBoard({ store, now: () => now, random: () => 0 });
  return { b, store, advance: (ms: number) => (now += ms), now: () => now };
}

async function openedBoard() {
  const x = board();
  for (let i = 0; i < 2; i++) await x.b.record('groq/llama', s, 'failure', 10, undefined);
  expect(x.b.current('groq/llama').state).toBe('open');
  return x;
}

/** A parked request's probe, taken with a permit of `ttlMs`. */
async function probe(b: BreakerBoard, ttlMs = 30_000): Promise<Probe> {
  const a = await b.admit('groq/llama', s, true, ttlMs);
  expect(a.admitted && a.probe).toBeTruthy();
  return (a as { probe: Probe }).probe;
}

describe('a probe whose answer is the request\'s own (the breaker ignores it)', () => {
  for (const [name, outcome] of [
    ["Groq's 498 to a flex-tier request", FLEX_498],
    ['a request over the whole token limit', OVER_LIMIT],
    ['a request the gateway could not send', INTERNAL],
  ] as const) {
    it(`${name}: gives its permit back with no verdict, so the next parked request probes at once`, async () => {
      const { b, advance } = await openedBoard();
      advance(1_000);
      const p = await probe(b);
      const before = b.current('groq/llama');
      advance(200);
      await b.record('groq/llama', s, verdictOf(outcome), 200, p);
      // The record is as it was: no reopen, no failed probe counted, no new probe time.
      expect(b.current('groq/llama')).toEqual(before);
      expect(b.availability('groq/llama', s, true)).toEqual({ kind: 'probing', probes: 1 });
      // And the permit is back: the next probe (a default-tier request) goes now, not at the permit's expiry.
      await probe(b);
    });
  }

  it("Groq's 498 while half-open: the permit comes back at once and the round does not count it", async () => {
    const { b, advance } = await openedBoard();
    advance(1_000);
    await b.record('groq/llama', s, 'success', 100, await probe(b));
    const halfOpen = b.current('groq/llama');
    expect(halfOpen).toMatchObject({ state: 'half-open', probeSuccesses: 1 });
    const flex = await probe(b);
    // halfOpenProbes 1: while the flex probe is out, nobody else may probe.
    expect((await b.admit('groq/llama', s, true, 30_000)).admitted).toBe(false);
    advance(50);
    await b.record('groq/llama', s, verdictOf(FLEX_498), 50, flex);
    expect(b.current('groq/llama')).toEqual(halfOpen);
    await b.record('groq/llama', s, 'success', 100, await probe(b));
    await b.record('groq/llama', s, 'success', 100, await probe(b));
    // Three successes of three answered probes: closed. The 498 was in no round.
    expect(b.current('groq/llama').state).toBe('closed');
  });

  it("a client's 400 is no ignored answer: the provider answered, the probe succeeds and the next goes at once", async () => {
    expect(verdictOf(CLIENT_400)).toBe('success');
    const { b, advance } = await openedBoard();
    advance(1_000);
    await b.record('groq/llama', s, verdictOf(CLIENT_400), 50, await probe(b));
    expect(b.current('groq/llama')).toMatchObject({ state: 'half-open', probeSuccesses: 1 });
    await probe(b);
  });

  it('a 429 without a wait hint is still the target refusing: the next parked probe waits twice as long, no probe loop', async () => {
    const { b, advance, now } = await openedBoard();
    advance(1_000);
    const p = await probe(b);
    advance(100);
    await b.record('groq/llama', s, verdictOf(BARE_429), 100, p);
    expect(b.availability('groq/llama', s, true)).toEqual({ kind: 'open', probeAtMs: now() + 2_000 });
  });
});
