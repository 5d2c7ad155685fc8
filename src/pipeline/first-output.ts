// A stream's beginning: everything up to its first output-bearing event, read within the attempt's first-token timer.
// What comes before (a role chunk, pings) is kept to forward in order; a failure before it (a malformed event, an
// error event, an early end) fails the attempt, to be retried, where after it the LiveStream ends the answer.
import type { ApiKind } from '../routing/router.ts';
import { MAX_EVENT_BYTES, SseEventTooLarge, SseParser, type SseEvent } from '../streaming/sse-parser.ts';
import { eventMeaning, startsAnswer, upstreamErrorOf, type StreamShape } from '../streaming/stream-events.ts';
import type { StreamTranslator } from '../providers/families.ts';
import { cutOutcome } from '../providers/transport-errors.ts';
import { errorVerdict, type ErrorVerdict } from '../providers/error-outcome.ts';
import { abortOutcome } from './abort-reasons.ts';
import { translatedAfterOutput } from './live-stream.ts';
import type { RequestSignal } from './request-abort.ts';
import type { EarlyStart } from './early-start.ts';

type FirstOutput =
  /** pendingRead: the answer was started early (early-start.ts) while this read was in flight; the LiveStream takes it. */
  | { head: string; pending: SseEvent[]; parser: SseParser; iterator: AsyncIterator<Buffer>; pendingRead?: Promise<IteratorResult<Buffer>> }
  | ErrorVerdict;

/**
 * The provider had begun a 2xx stream when its connection broke (a cut a moment after the first token loses that
 * token with the socket): a stream broken before its output, which may have run, not a provider out of reach.
 */
export function brokenBeforeOutput(err: unknown, signal: RequestSignal): FirstOutput {
  const outcome = signal.aborted ? abortOutcome(signal.reason) : cutOutcome(err, 'the stream broke before its first output');
  return { failure: outcome.kind === 'bad-stream' ? outcome.detail : outcome.kind, outcome };
}

/**
 * Reads events until one carries output; everything before it (role chunk, pings) is kept to forward in order.
 * Events are translated one at a time: once output has come, an event the translator cannot read is judged by the
 * LiveStream as any malformed one, even when it arrived in the same read; only before any output does it fail the attempt.
 * `apiKey`, the key the provider was sent, is kept out of the failure an error event's code is quoted in.
 */
export async function readUntilFirstOutput(api: ApiKind, shape: StreamShape, iterator: AsyncIterator<Buffer>, translate: StreamTranslator | undefined, early: EarlyStart | undefined, apiKey: string): Promise<FirstOutput> {
  const parser = new SseParser();
  let taken = false;
  let withdraw: (() => void) | undefined;
  const started =
    early &&
    new Promise<'start'>((resolve) => {
      withdraw = early.offer(() => {
        taken = true;
        resolve('start');
      });
    });
  try {
    const first = await readEvents(api, shape, parser, iterator, translate, started, apiKey);
    // The deadline came just as the read that failed the attempt did: it took the early start instead of aborting the
    // request, so the attempt ends as the deadline's (no retry goes past it) rather than as a retryable failure.
    return taken && 'failure' in first ? DEADLINE_PASSED : first;
  } catch (err) {
    if (taken) return DEADLINE_PASSED;
    throw err;
  } finally {
    withdraw?.();
  }
}

/**
 * The most a stream's head (its events before the first output, held to go out with it) may hold: two events of the
 * largest size, as a Responses API stream's response.created and response.in_progress each echo the request. An
 * upstream that sends more (pings, role chunks, by the megabyte) is a broken stream: the head was held whole until
 * the first-token timeout, hundreds of MB of it, and then written to the client at once.
 */
const MAX_HEAD_CHARS = 2 * MAX_EVENT_BYTES;

const DEADLINE_PASSED: FirstOutput = { failure: 'the deadline passed', outcome: { kind: 'aborted', by: 'deadline' } };

async function readEvents(api: ApiKind, shape: StreamShape, parser: SseParser, iterator: AsyncIterator<Buffer>, translate: StreamTranslator | undefined, started: Promise<'start'> | undefined, apiKey: string): Promise<FirstOutput> {
  let head = '';
  for (;;) {
    const read = iterator.next();
    const next = started ? await Promise.race([read, started]) : await read;
    if (next === 'start') return { head, pending: [], parser, iterator, pendingRead: read };
    const { value, done } = next;
    let raw: SseEvent[];
    try {
      if (done) {
        // An event the upstream left without its closing blank line when it ended the stream is still its event, as the
        // LiveStream reads one after the first output: an error event so sent (`event: error` with Anthropic's overload,
        // a rate limit) was dropped here, and the attempt ended as a stream with nothing in it, a 502.
        const last = parser.flush();
        if (last === undefined) return { failure: 'stream ended before any output' };
        raw = [last];
      } else raw = parser.push(value);
    } catch (err) {
      // At the end too: the read before it may have begun the oversized event after events without output.
      if (err instanceof SseEventTooLarge) return { failure: err.message };
      throw err;
    }
    for (let r = 0; r < raw.length; r++) {
      let events: SseEvent[];
      try {
        events = translate ? translate.push(raw[r]!) : [raw[r]!];
      } catch {
        return { failure: 'malformed event before any output' };
      }
      for (let i = 0; i < events.length; i++) {
        const ev = events[i]!;
        const meaning = eventMeaning(api, ev);
        if (meaning === 'malformed') return { failure: 'malformed event before any output' };
        if (meaning === 'error') return errorBeforeOutput(ev, raw[r]!, apiKey);
        if (meaning === 'done') return { failure: 'stream ended before any output' };
        if (meaning === 'output' || meaning === 'finish' || startsAnswer(api, shape, ev)) {
          // The first output event itself is re-read by the LiveStream, which tracks finish and [DONE].
          return { head, pending: [...events.slice(i), ...translatedAfterOutput(raw.slice(r + 1), translate)], parser, iterator };
        }
        head += `${ev.raw}\n\n`;
        if (head.length > MAX_HEAD_CHARS) return { failure: `more than ${MAX_HEAD_CHARS / 1024 / 1024} MB before any output` };
      }
    }
    if (done) return { failure: 'stream ended before any output' };
  }
}

/**
 * An error event before any output: a broken stream, retried, unless its code says the request itself is at fault
 * (a content policy, the context length, an input the provider cannot use). Retrying that reruns a safety decision
 * and loses the provider's reason; it is answered as the upstream's 400 instead. One that names the gateway's own
 * account is the 429, 402, 401 or 403 it stands for (policy/outcome.ts accountStatusOfError).
 */
function errorBeforeOutput(ev: SseEvent, upstream: SseEvent, apiKey: string): FirstOutput {
  const verdict = errorVerdict(upstreamErrorOf(ev), 'error event before any output', apiKey);
  // The event as the upstream sent it, before any translation: its family reads the status it stands for from it
  // (Anthropic's overloaded_error is its 529), which its translation for another API's clients no longer carries.
  return upstream.data === null ? verdict : { ...verdict, event: Buffer.from(upstream.data) };
}
