// The ways a stream that reached its client can end, and what each one means to the code that acts on it: did the
// client get a whole answer, was it a failure, may a background response run on. One table, so that a new kind is
// read the same by the LiveStream, the request's outcome and the idempotency keys, and cannot be missed by any of them.

export const STREAM_END_KINDS = ['complete', 'done-added', 'cut', 'stalled', 'upstream-error', 'client-gone', 'client-stalled', 'recovered', 'shutdown'] as const;
export type StreamEndKind = (typeof STREAM_END_KINDS)[number];

interface StreamEndReading {
  /**
   * The client got a whole answer: `done-added` too (every choice finished; the provider, as some do, never sent
   * [DONE]). A recovery's continuation that ends so makes its stream `recovered`; an idempotency key is kept for it
   * (left out, every stream from a provider that never sends [DONE] gave its key back, and each repeat ran it again).
   */
  whole: boolean;
  /** The client got an error event, not an answer: the request's outcome is `stream_error`, not among the successes. */
  broken: boolean;
  /** A background response's stream ended so may leave the response running on at the provider. */
  backgroundRunsOn: boolean;
}

const STREAM_ENDS: Readonly<Record<StreamEndKind, StreamEndReading>> = {
  complete: { whole: true, broken: false, backgroundRunsOn: false },
  'done-added': { whole: true, broken: false, backgroundRunsOn: false },
  cut: { whole: false, broken: true, backgroundRunsOn: true },
  stalled: { whole: false, broken: true, backgroundRunsOn: true },
  'upstream-error': { whole: false, broken: true, backgroundRunsOn: false },
  'client-gone': { whole: false, broken: false, backgroundRunsOn: false },
  'client-stalled': { whole: false, broken: false, backgroundRunsOn: true },
  recovered: { whole: true, broken: false, backgroundRunsOn: false },
  shutdown: { whole: false, broken: true, backgroundRunsOn: true },
};

/** See StreamEndReading.whole. */
export function endedWhole(kind: StreamEndKind): boolean {
  return STREAM_ENDS[kind].whole;
}

/** See StreamEndReading.broken. */
export function endedBroken(kind: StreamEndKind): boolean {
  return STREAM_ENDS[kind].broken;
}

/** See StreamEndReading.backgroundRunsOn. */
export function backgroundRunsOn(kind: StreamEndKind): boolean {
  return STREAM_ENDS[kind].backgroundRunsOn;
}
