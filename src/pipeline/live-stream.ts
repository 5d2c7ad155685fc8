// A stream whose first output has arrived: from here on the gateway only passes events through as they come.
// It never retries (bytes have reached the client) and never ends a broken answer cleanly: a cut or a stall ends
// with an error event the SDKs raise; a finished answer missing its `[DONE]` gets one.
import { type ApiKind } from '../routing/router.ts';
import { SseParser, type SseEvent } from '../streaming/sse-parser.ts';
import { cutShort, doneEvent, errorEventForClient, nextSequenceNumber, readEvent, streamErrorEvent, upstreamErrorOf, type OutputTally, type StreamShape } from '../streaming/stream-events.ts';
import { accountStatusOfError } from '../policy/outcome.ts';
import type { FailureFacts } from '../state/breaker-board.ts';
import { brokenBy, errorEventBreaks, type ErrorEventMeaning } from './stream-break.ts';
import type { StreamTranslator } from '../providers/families.ts';
import { laterUsage, usageOf, type Usage } from '../streaming/usage.ts';
import { withoutKey } from '../providers/key-echo.ts';
import { MAX_TIMER_MS, type ProviderConfig } from '../config/schema.ts';
import { AnswerProgress } from '../streaming/answer-progress.ts';
import { drainResponse } from '../providers/drain-response.ts';
import { AttemptTimeout, GatewayShutdown } from './abort-reasons.ts';
import { RequestAbort, type Aborter, type RequestSignal } from './request-abort.ts';
import { endedWhole, type StreamEndKind } from './stream-ends.ts';
import { asSameCompletion, DeliveredText, type DeliveredChunk } from './delivered-text.ts';

/**
 * Why a broken stream on a `streamRecovery: continue` route was not continued, for the request's log line: the next
 * target's guards (its breaker not closed, a hold-off, the budget), what was delivered (not text alone, no text), what
 * the next target is (another family that cannot take a prefill, a request it cannot be sent), or what became of the
 * continuation (not sent, failed, or an answer that did not begin with the delivered text).
 */
export type RecoveryRefusal =
  | 'no_next_target' | 'several_choices' | 'not_plain_text' | 'no_text' | 'breaker_not_closed' | 'held_off' | 'other_family'
  | 'not_expressible' | 'budget' | 'not_sent' | 'failed' | 'no_match';

/**
 * Asks the next target for the rest of a text answer that broke after its first byte (streamRecovery: continue), given
 * the text delivered (empty, or only whitespace, when the client had reasoning alone) and why the stream broke (the
 * breaker's reason: `stream_cut`, `stream_stalled`): the SSE text to send after what was delivered, and how that
 * continuation ended once it is read; or, when it cannot (the client then gets the original error), why (undefined:
 * the client or the instance's shutdown ended it first).
 * `shutdown` aborts (with GatewayShutdown) when the instance's shutdown ends the stream: the continuation ends with it.
 * `idleMs`: the broken stream's idle limit, the longest silence the client's stream is kept waiting for a pool slot.
 * `whenEnded` hears the continuation's end however it comes, even one it reaches by itself while nobody reads it (its
 * client stalled): the stream it continues, whose own timers stopped at the break, ends with it. `abandon` ends a
 * continuation whose text is never read (its client left first), giving back its upstream request and pool slot.
 */
export type StreamRecovery = (
  delivered: string,
  brokeBy: string,
  shutdown: RequestSignal,
  idleMs: number,
) => Promise<{ text: AsyncIterable<string>; ended: () => StreamEnd | undefined; whenEnded?: (fn: (end: StreamEnd) => void) => void; abandon?: () => void; target: string } | RecoveryRefusal | undefined>;

export interface StreamEnd {
  kind: StreamEndKind;
  events: number;
  droppedMalformed: number;
  /**
   * The usage this stream's own upstream reported (chat with include_usage, the Responses API's completed event, an
   * Anthropic stream's message_start and message_delta), as far as it went: a recovered stream's broken part included.
   */
  usage?: Usage;
  /** A streamRecovery continuation's usage, billed to the target it went to (its key), not to the one that broke. */
  continuation?: { target: string; usage: Usage };
  /** It ended with an upstream error event that names the gateway's own account (a quota spent mid-answer). */
  accountRefused?: true;
  /** It broke on a `streamRecovery: continue` route and was not continued: why. */
  recoveryRefused?: RecoveryRefusal;
  /**
   * The characters of output passed on to the client (text, reasoning, tool arguments: stream-events.ts outputChars),
   * absent when none; with a streamRecovery continuation's all of it, as its provider generated it (one asked afresh
   * generates the answer from its start, and the client is passed only the rest). A client's token rate is settled by
   * it when no usage came (policy/client-rate.ts settlement).
   */
  outputChars?: number;
  /**
   * The provider broke the stream after it began (a cut, a stall, a server error event), whatever a recovery made of
   * it: a failure for its breaker in place of the success its first output counted (BreakerBoard.streamBroke).
   */
  upstreamBroke?: FailureFacts;
}

interface LiveStreamOptions {
  api: ApiKind;
  shape: StreamShape;
  /** Events before the first output (role chunk, pings), already framed. */
  head: string;
  /** Events already parsed, starting with the first output event. */
  pending: SseEvent[];
  parser: SseParser;
  iterator: AsyncIterator<Buffer>;
  /** A read of `iterator` already in flight (an answer started before its first output): the first one to take. */
  pendingRead?: Promise<IteratorResult<Buffer>>;
  /** Another family's events into OpenAI ones (Anthropic); undefined for OpenAI-compatible targets. */
  translate: StreamTranslator | undefined;
  controller: Aborter;
  requestSignal: RequestSignal;
  /** Releases the attempt's listeners once the stream is over. */
  detach: () => void;
  idleMs: number;
  /**
   * For a stream handed over before its first output (started early at the client's deadline, or a background or
   * conversation response at its response.created: StreamShape.startsAtCreated): the attempt's first-token timer,
   * still running. Until the first output (or a finish) it alone bounds the upstream's silence, as it did before the
   * hand-over: pings and role chunks do not put it back, and idleMs, kept short for gaps within an answer, cut a model thinking within its firstTokenMs. The
   * stream stops it at that output; idleMs bounds the gaps from there (and a client that reads nothing, throughout).
   */
  firstTokenTimer?: NodeJS.Timeout;
  /** How long a finished answer waits for the upstream's own end (afterFinishWaitMs); default a second. */
  afterFinishMs?: number;
  /** The provider's key, taken out of the error events it sends (providers/key-echo.ts). */
  apiKey: string;
  /** The status a family's own error event stands for (UpstreamRequest.errorEventMeaning), as before the first output. */
  errorEventMeaning?: ErrorEventMeaning | undefined;
}

/** Stands in for an event the translator could not read, so it is judged (and counted) as any malformed one. */
const UNTRANSLATABLE: SseEvent = { raw: '', data: 'untranslatable', event: null };

/**
 * Events after the first output, translated (Anthropic); one the translator cannot read becomes a malformed event,
 * dropped or, inside a tool call, the end of the stream, as the LiveStream judges any malformed event.
 */
export function translatedAfterOutput(events: SseEvent[], translate: StreamTranslator | undefined): SseEvent[] {
  if (!translate) return events;
  const out: SseEvent[] = [];
  for (const ev of events) {
    try {
      out.push(...translate.push(ev));
    } catch {
      out.push(UNTRANSLATABLE);
    }
  }
  return out;
}

/** The data of the last event in framed SSE text (a stream's head), or null when it has none. */
function lastDataIn(text: string): string | null {
  if (text === '') return null;
  const events = new SseParser().push(Buffer.from(text));
  for (let i = events.length - 1; i >= 0; i--) if (events[i]!.data !== null) return events[i]!.data;
  return null;
}

/**
 * Why the upstream request is aborted once the stream is over. One instance: a fresh error (or the DOMException an
 * abort without a reason makes) per stream, with undici formatting its stack, was a tenth of a stream's CPU.
 */
const STREAM_OVER = new Error('the stream is over');

/** After a finish_reason only [DONE] (and perhaps a usage chunk) is left: do not wait a whole idle period for it. */
const AFTER_FINISH_GRACE_MS = 1_000;

/**
 * How long an answer whose every choice has finished waits for the upstream's own end ([DONE]) before the gateway
 * writes one: a second, since most providers send it at once and some never do. Not Azure: its asynchronous content
 * filter (a deployment's setting) checks the answer's last part after the model's finish, and sends its annotations
 * and, for a violation, a `finish_reason: "content_filter"` only then, when the filter is done. Cut after a second,
 * the client lost that verdict and was told the answer had ended well. An Azure stream waits for its [DONE] as for
 * any other event, up to idleMs.
 */
export function afterFinishWaitMs(family: ProviderConfig['family'], idleMs: number): number {
  return family === 'azure-openai' ? idleMs : Math.min(AFTER_FINISH_GRACE_MS, idleMs);
}

/**
 * A client that reads nothing for this many idle periods (5 min with the default idleMs) is given up on: a stream's
 * here, a whole answer's by the server (PipelineAnswer.clientStallMs).
 */
const CLIENT_STALL_IDLE_PERIODS = 10;

/**
 * How long a whole answer's client (or a passthrough download's) may take nothing before its connection is closed:
 * ten idle periods, at most the longest socket timer (an idle period near that limit, set to switch the timer off in
 * all but name, made Node truncate it with a TimeoutOverflowWarning on every answer).
 */
export function clientStallMs(idleMs: number): number {
  return Math.min(MAX_TIMER_MS, CLIENT_STALL_IDLE_PERIODS * idleMs);
}

export class LiveStream {
  onEnd: ((end: StreamEnd) => void) | undefined;
  /**
   * Called once, when the first output event is taken: in open() for a stream whose first output had arrived, later for
   * one started early (at the client's deadline, before its first output), whose time to first token is only known then.
   */
  onFirstOutput: (() => void) | undefined;

  readonly #opts: LiveStreamOptions;
  #ended: StreamEnd | undefined;
  /** Run once the upstream response is let go of (whenUpstreamDone). */
  readonly #finishers: Array<() => void> = [];
  #upstreamLetGo = false;
  #outputSeen = false;
  // Where the answer stands; read by #take as events pass, and by #finish when it ends.
  #events = 0;
  #dropped = 0;
  readonly #progress: AnswerProgress;
  /** The wait for [DONE] after the last finish has begun. */
  #graceArmed = false;
  /** When every choice had finished (performance.now()), once they have: the stream ends idleMs from here at the latest. */
  #finishedAt: number | undefined;
  /** What the idle timer waits for now: idleMs, or afterFinishMs once only [DONE] is left. */
  #idlePeriodMs = 0;
  #kind: StreamEndKind = 'client-gone';
  #accountRefused = false;
  #upstreamBroke: FailureFacts | undefined;
  #usage: Usage | undefined;
  /** What the streamRecovery continuation reported, once it has ended. */
  #continuationUsage: StreamEnd['continuation'];
  /** The characters of output passed on (StreamEnd.outputChars), counted as each event's meaning is read. */
  readonly #output: OutputTally = { chars: 0 };
  /** A streamRecovery continuation's own outputChars, once it has ended. */
  #continuationChars = 0;
  #idle: NodeJS.Timeout | undefined;
  /** Handed over before its first output, which has not come yet: the first-token timer bounds the upstream's silence. */
  #beforeOutput = false;
  /** The last Responses API event passed on: an error event the gateway writes numbers on from it (read only then). */
  #lastResponsesData: string | null = null;
  /**
   * A continuation's shutdown signal, from the moment one is asked for: interrupt() ends it through this, since this
   * stream's own upstream, let go of at the break, has nothing left to abort.
   */
  #continuation: RequestAbort | undefined;
  /** interrupt() was called: a continuation asked for after it (the break read as the shutdown came) is not sent. */
  #interrupted = false;
  /** Ends the streamRecovery continuation being passed on (StreamRecovery's abandon), once one is. */
  #abandonContinuation: (() => void) | undefined;
  /** With streamRecovery on: how to ask for the rest, and the text the client has had so far. */
  #recover: { continueFrom: StreamRecovery; delivered: DeliveredText } | undefined;
  /** Why a break will not be, or was not, continued on a route that has streamRecovery (StreamEnd.recoveryRefused). */
  #recoveryRefused: RecoveryRefusal | undefined;
  /** Why this stream's route cannot continue it, known before it broke (no next target, n > 1). */
  #unrecoverable: RecoveryRefusal | undefined;
  #upstreamEnded = false;
  /** What cut the answer short while its stream went on (vLLM's abort, stream-events.ts cutShort): a cut all the same. */
  #cutShortBy: string | undefined;
  /**
   * The provider's own error event after the first output (Anthropic's overloaded_error, OpenAI's server_error), held
   * back while streamRecovery asks the next target for the rest; the client gets it only if none continues the answer.
   */
  #heldError: string | undefined;
  #awaitingUpstream = false;
  /** Reads of the upstream that completed an event: an idle timer that fired tells by it whether one came in its turn. */
  #progressedReads = 0;
  /** How long the client has taken nothing while the gateway had text for it (backpressure). */
  #clientWaitMs = 0;

  constructor(opts: LiveStreamOptions) {
    this.#opts = opts;
    this.#progress = new AnswerProgress(opts.api, opts.shape);
  }

  /**
   * The text to write to the client: `first` (the events up to and including the first output) at once, as the
   * answer's first bytes are the time to first token, then `rest` as the upstream sends it. Stopping `rest` early
   * (client gone) aborts the upstream; a `rest` never read is ended by abandon().
   */
  open(): { first: string; rest: AsyncGenerator<string> } {
    this.#idlePeriodMs = this.#opts.idleMs;
    this.#idle = this.#armIdle(this.#idlePeriodMs);
    // A stream whose first output is among its pending events stops the first-token timer as #take passes it.
    this.#beforeOutput = this.#opts.firstTokenTimer !== undefined;
    // An Anthropic stream tells its input tokens in message_start, before any output; with n > 1, the role chunks
    // before it tell which choices have begun.
    const { head } = this.#opts;
    if (head.includes('"usage"') || this.#opts.shape.choices > 1) {
      for (const ev of new SseParser().push(Buffer.from(head))) {
        this.#noteUsage(ev);
        this.#progress.announced(ev);
      }
    }
    const out: string[] = [head];
    const over = this.#take(this.#opts.pending, out);
    return { first: out.join(''), rest: this.#rest(over) };
  }

  /** The whole text as one iteration: open()'s two parts in a row. */
  async *body(): AsyncGenerator<string> {
    const { first, rest } = this.open();
    yield first;
    yield* rest;
  }

  async *#rest(overAlready: boolean): AsyncGenerator<string> {
    const { api, controller, iterator, parser } = this.#opts;
    let pendingRead = this.#opts.pendingRead;
    let over = overAlready;
    /** The last read completed an event: the upstream's silence counts afresh. Bytes of no whole event do not reset it. */
    let progressed = true;
    try {
      while (!over) {
        // The idle timer counts the upstream's silence only, from when the next event is asked for: a client that
        // reads slowly (backpressure holds the generator at its yield) is not an upstream stall.
        if (progressed) this.#putIdleOff();
        this.#clientWaitMs = 0;
        this.#awaitingUpstream = true;
        let read: IteratorResult<Buffer>;
        try {
          read = await (pendingRead ?? iterator.next());
          pendingRead = undefined;
        } finally {
          this.#awaitingUpstream = false;
        }
        const { value, done } = read;
        if (done) {
          this.#upstreamEnded = true;
          break;
        }
        const batch: string[] = [];
        const events = parser.push(value);
        progressed = events.length > 0;
        if (progressed) this.#progressedReads++;
        over = this.#take(this.#translated(events), batch);
        if (batch.length > 0) yield batch.join('');
      }
      if (!over) {
        const tail = parser.flush();
        const batch: string[] = [];
        over = this.#take([...this.#translated(tail ? [tail] : []), ...(this.#opts.translate?.end() ?? [])], batch);
        if (batch.length > 0) yield batch.join('');
      }
      if (!over && api === 'other') {
        // A path without a known API: its answer is whatever the upstream sent, and it has sent all of it.
        over = true;
        this.#kind = 'complete';
      }
      if (!over) {
        const whole = this.#progress.whole();
        this.#kind = whole ? 'done-added' : 'cut';
        if (!whole) this.#upstreamBroke = { reason: 'stream_cut' };
        if (whole) yield doneEvent(api) ?? '';
        else if (!(yield* this.#recovered())) yield this.#streamError('the upstream stream ended before the answer was complete');
      }
      if (this.#cutShortBy !== undefined && !(yield* this.#recovered())) yield this.#streamError(`the upstream stream was cut: ${this.#cutShortBy}`);
      if (this.#heldError !== undefined && !(yield* this.#recovered())) yield this.#heldError;
    } catch (err) {
      const reason: unknown = controller.signal.reason;
      if (this.#opts.requestSignal.aborted) {
        this.#kind = 'client-gone';
      } else if (api === 'other') {
        // No error event can be written in a format the gateway does not know: the client's connection is cut too.
        this.#kind = reason instanceof AttemptTimeout ? 'stalled' : 'cut';
        // The instance's own shutdown broke nothing of the provider's: a fleet's rolling restart must not count every
        // passthrough stream it ends against the providers' shared windows.
        if (!(reason instanceof GatewayShutdown)) this.#upstreamBroke = brokenBy(reason, err);
        throw err;
      } else if (this.#progress.finished) {
        // Every choice had finished: what broke (a stall, a reset, the instance's shutdown) only kept [DONE] from coming.
        // Not whole(): fewer choices than `n` is a provider that ignores `n` only when its response ends as any does;
        // broken, it may be one that sends the choices one after another, cut between two of them: [DONE] would have
        // the client take one answer of the `n` it asked for as all of them.
        this.#kind = 'done-added';
        yield this.#addedEnd();
      } else if (reason instanceof GatewayShutdown) {
        this.#kind = 'shutdown';
        yield this.#shutdownError(reason);
      } else if (reason instanceof AttemptTimeout) {
        this.#kind = 'stalled';
        this.#upstreamBroke = brokenBy(reason, err);
        if (!(yield* this.#recovered())) yield this.#streamError(`the upstream stream stalled: ${reason.message}`);
      } else {
        this.#kind = 'cut';
        this.#upstreamBroke = brokenBy(reason, err);
        if (!(yield* this.#recovered())) yield this.#streamError(`the upstream stream was cut: ${(err as Error)?.message ?? 'unknown error'}`);
      }
    } finally {
      this.#finish(this.#kind);
    }
  }

  /**
   * The end written for an answer whose every choice finished when its upstream broke off: a translated stream's own
   * (the usage chunk its client asked for, which the translator writes at the end it never got, then [DONE]), else [DONE].
   */
  #addedEnd(): string {
    const end = this.#opts.translate?.end() ?? [];
    return end.length > 0 ? end.map((ev) => `${ev.raw}\n\n`).join('') : (doneEvent(this.#opts.api) ?? '');
  }

  /**
   * Whether an error event after the first output is the provider's failure (one its breaker counts, not its account's
   * refusal nor the request's fault) that streamRecovery may continue past: then it is held back (#heldError) and the
   * stream ends as the upstream's error. The commonest break of all (an overload mid-answer) ended the client's stream
   * where a cut or a stall at the same point was continued by the next target.
   */
  #holdsError(ev: SseEvent): boolean {
    const { accountRefused, broke } = this.#errorFacts(ev);
    if (accountRefused || broke === undefined) return false;
    this.#kind = 'upstream-error';
    this.#upstreamBroke = broke;
    this.#heldError = withoutKey(errorEventForClient(this.#opts.api, ev, this.#nextSequence()), this.#opts.apiKey);
    return true;
  }

  /** What an upstream error event says of the provider: its account's refusal, or a failure its breaker counts. */
  #errorFacts(ev: SseEvent): { accountRefused: boolean; broke: FailureFacts | undefined } {
    const err = upstreamErrorOf(ev);
    return { accountRefused: accountStatusOfError(err?.code, err?.type) !== undefined, broke: errorEventBreaks(err, ev, this.#opts.errorEventMeaning, this.#opts.apiKey) };
  }

  /** The error event that ends a broken answer (stream_interrupted), numbered on from the last event passed. */
  #streamError(message: string): string {
    return streamErrorEvent(this.#opts.api, message, 'stream_interrupted', this.#nextSequence());
  }

  /** The error event that ends a stream the instance's shutdown cut short. */
  #shutdownError(reason: GatewayShutdown): string {
    return this.#streamError(`${reason.message} before the answer was complete; send the request again`);
  }

  /**
   * The Responses API's next sequence_number, parsed from the last event passed only when an error event needs it.
   * None passed yet: a stream the client's deadline started before its first output has sent only its head
   * (response.created, in_progress, a reasoning item added), and the error that ends it numbers on from there. With
   * no event at all (the provider sent its headers and nothing by the deadline) the error is the stream's first: 0,
   * where the API starts; without a number the Vercel AI SDK read the stall as a validation failure.
   */
  #nextSequence(): number | undefined {
    if (this.#opts.api !== 'responses') return undefined;
    const last = this.#lastResponsesData ?? lastDataIn(this.#opts.head);
    return last === null ? 0 : nextSequenceNumber(last);
  }

  /** One pass over a batch of events, framed into `out`; true when the answer is over. */
  #take(batch: SseEvent[], out: string[]): boolean {
    const { api, shape } = this.#opts;
    for (const ev of batch) {
      // A malformed event is not passed on, and counts nothing; an error event (cutShort's) carries no output.
      const { meaning, parsed } = readEvent(api, ev, this.#output);
      if (meaning === 'malformed') {
        this.#dropped++;
        // Dropped text leaves a gap; dropped arguments leave a tool call that runs with garbage: that answer is broken.
        if (this.#progress.toolCallOpen) {
          this.#kind = 'cut';
          this.#upstreamBroke = { reason: 'bad_stream' };
          out.push(this.#streamError('the upstream sent a malformed event inside a tool call, whose arguments would be incomplete'));
          return true;
        }
        continue;
      }
      const cutByDone = meaning === 'done' ? this.#cutByDone() : undefined;
      if (cutByDone !== undefined) {
        // Passed on, the answer cut short reached the client as complete. A cut, as vLLM's abort is (streamRecovery may
        // finish it).
        this.#kind = 'cut';
        this.#upstreamBroke = { reason: 'stream_cut' };
        this.#cutShortBy = cutByDone;
        return true;
      }
      const short = meaning === 'error' ? cutShort(api, ev) : undefined;
      if (short) {
        // What the chunk still carries goes on as any chunk would, then the answer ends as a cut (#rest recovers it).
        if (short.left) this.#take([short.left], out);
        this.#kind = 'cut';
        this.#upstreamBroke = { reason: 'stream_cut' };
        this.#cutShortBy = short.why;
        return true;
      }
      if (meaning === 'error' && this.#recover && this.#outputSeen && this.#holdsError(ev)) return true;
      this.#events++;
      // A finish is output too: a short answer's one chunk carries its text and its finish_reason together (Gemini's
      // OpenAI-compatible API), and its time to first token went unmeasured.
      if ((meaning === 'output' || meaning === 'finish') && !this.#outputSeen) {
        this.#outputSeen = true;
        this.onFirstOutput?.();
      }
      if (this.#beforeOutput && (meaning === 'output' || meaning === 'finish')) {
        // The answer has begun (a finish begins an empty one, as before the hand-over): from here its gaps are idleMs's.
        this.#beforeOutput = false;
        clearTimeout(this.#opts.firstTokenTimer);
      }
      out.push(meaning === 'error' ? withoutKey(errorEventForClient(api, ev, this.#nextSequence()), this.#opts.apiKey) : `${ev.raw}\n\n`);
      if (api === 'responses' && ev.data !== null) this.#lastResponsesData = ev.data;
      if (this.#recover && parsed) this.#recover.delivered.noteChunk(parsed as DeliveredChunk);
      this.#noteUsage(ev);
      const end = this.#progress.passed(meaning, ev, parsed);
      if (end !== undefined) {
        this.#kind = end;
        if (end === 'upstream-error') {
          const facts = this.#errorFacts(ev);
          this.#accountRefused = facts.accountRefused;
          this.#upstreamBroke = facts.broke;
        }
        return true;
      }
    }
    // Once per batch, not per event: the usage chunk the gateway asked for is taken out of the client's events (a
    // batch of none), and the wait for it is over all the same.
    // The usage the client asked for is due unless it has come; a translated stream's is the translator's, known from the
    // upstream's own events (Anthropic's message_start) and written at the end: waited for, it kept the client idleMs.
    const usageDue = shape.usage && (this.#opts.translate?.usage() ?? this.#usage) === undefined;
    if (this.#progress.finished) this.#finishedAt ??= performance.now();
    if (this.#progress.finished && !this.#graceArmed && !usageDue && this.#opts.translate?.usageDue?.() !== true) {
      // After the last finish only [DONE] is left: wait afterFinishMs for it (a second; a whole idle period on Azure).
      this.#graceArmed = true;
      this.#idlePeriodMs = Math.min(this.#opts.afterFinishMs ?? AFTER_FINISH_GRACE_MS, this.#opts.idleMs);
      this.#rearmIdle();
    }
    return false;
  }

  /**
   * Restarts the wait for the upstream's next event. After the last finish, never past idleMs from it: an upstream that
   * pinged on for ever never got its end, whether [DONE] was waited for or a usage chunk that never came (a server
   * that ignores include_usage), and pings that restarted each wait held the client idleMs and more past the finish.
   */
  #putIdleOff(): void {
    if (this.#finishedAt === undefined) this.#idle!.refresh();
    else if (performance.now() - this.#finishedAt < this.#opts.idleMs) this.#rearmIdle();
  }

  /** Arms the idle timer afresh for its period, or what is left of idleMs from the finish when that is less. */
  #rearmIdle(): void {
    clearTimeout(this.#idle);
    const left = this.#finishedAt === undefined ? Infinity : Math.max(0, this.#finishedAt + this.#opts.idleMs - performance.now());
    this.#idle = this.#armIdle(Math.min(this.#idlePeriodMs, left));
  }

  #noteUsage(ev: SseEvent): void {
    if (ev.data === null || !ev.data.includes('"usage"')) return;
    try {
      this.#usage = laterUsage(this.#usage, usageOf(JSON.parse(ev.data)));
    } catch {
      // a malformed event carries nothing to count
    }
  }

  /** Turns on streamRecovery for this stream (before it is read), or says why its route's cannot be had. */
  recoverWith(recover: StreamRecovery | RecoveryRefusal | undefined): void {
    if (typeof recover === 'string') this.#unrecoverable = recover;
    else this.#recover = recover && { continueFrom: recover, delivered: new DeliveredText() };
  }

  /**
   * Tries the route's stream recovery; yields the marker and the continuation, and says whether it was sent (then
   * the continuation has ended the client's stream its own way: no error event of this stream's own is to follow).
   * The stream counts as recovered only if the continuation ended whole; one that broke too (cut, stalled, an error
   * event, which the client got from it) leaves the stream as broken as the continuation ended.
   */
  async *#recovered(): AsyncGenerator<string, boolean> {
    const recover = this.#recover;
    // #ended: abandoned (the answer's body was destroyed): nobody would read a continuation. Reasoning alone is an
    // answer begun with no text to continue: the next target is asked afresh.
    if (this.#ended || this.#opts.requestSignal.aborted) return false;
    if (!recover) {
      this.#recoveryRefused = this.#unrecoverable;
      return false;
    }
    const { delivered } = recover;
    if (delivered.notPlainText || (delivered.text === '' && !delivered.reasoning)) {
      this.#recoveryRefused = delivered.notPlainText ? 'not_plain_text' : 'no_text';
      return false;
    }
    // The continuation is another stream with its own first-token, idle and client timers: this one's stop here.
    clearTimeout(this.#idle);
    clearTimeout(this.#opts.firstTokenTimer);
    // And another upstream request: the broken one is over, whatever the continuation makes of the answer. Its pool
    // slot goes back now, and its response (cut short but perhaps still open, or stalled) is closed: held until the
    // continuation ended, each recovering stream kept a slot of the provider that broke it, and a dead socket, for
    // the whole continuation; a brownout that cut many streams took half the pool just when it was short.
    this.#letGoUpstream(this.#kind)();
    const shutdown = (this.#continuation = new RequestAbort());
    if (this.#interrupted) shutdown.abort(new GatewayShutdown());
    let rest: Awaited<ReturnType<StreamRecovery>>;
    try {
      rest = await recover.continueFrom(delivered.text, this.#upstreamBroke?.reason ?? 'stream_cut', shutdown.signal, this.#opts.idleMs);
    } catch {
      rest = undefined;
    }
    if (typeof rest !== 'object' && shutdown.aborted) {
      // The shutdown gave up the continuation's request before its first output: the client is told so, as any
      // stream the shutdown ends is, not that the stream was cut (sent again, the request would meet the same cut).
      this.#kind = 'shutdown';
      yield this.#shutdownError(shutdown.reason as GatewayShutdown);
      return true;
    }
    if (typeof rest !== 'object') {
      this.#recoveryRefused = rest;
      return false;
    }
    this.#abandonContinuation = rest.abandon;
    // How this stream ends once its continuation has: the continuation's kind, or `recovered` for a whole answer.
    const endedAs = (end: StreamEnd): StreamEndKind => (endedWhole(end.kind) ? 'recovered' : end.kind);
    // A continuation can end while nobody reads it (its client stalled, on its own target's timer): this stream, held
    // at its yield with its own timers stopped, ends with it then, or the client's connection stayed open unlogged.
    // Its bill is its target's: the continuation is a request of its own at another provider.
    const billed = (end: StreamEnd | undefined) => {
      if (end?.usage) this.#continuationUsage = { target: rest.target, usage: end.usage };
      if (end?.outputChars) this.#continuationChars = end.outputChars;
    };
    rest.whenEnded?.((end) => {
      billed(end);
      this.#finish(endedAs(end));
    });
    try {
      yield ': stormgate stream recovered from the next target\n\n';
      // Chunks of the one completion the client began to get, whichever target wrote them.
      const { completion } = delivered;
      for await (const text of completion ? asSameCompletion(rest.text, completion) : rest.text) yield text;
    } finally {
      const end = rest.ended();
      billed(end);
      // Left before its end (the client went away): the kind this stream ends with says so, not the continuation's.
      if (end) this.#kind = endedAs(end);
      else if (rest.abandon) {
        // Left before the continuation was read at all (at the marker, its client not reading): nothing reads it to
        // its end, which gives back its upstream request and its pool slot, so it is ended here.
        this.#kind = 'client-gone';
        rest.abandon();
      }
    }
    return true;
  }

  /**
   * Runs `fn` once, when the upstream response is over and let go of: when the stream ends, however it ends; or, for a
   * broken stream that a streamRecovery continuation takes over, before that continuation starts. The pool slot is
   * given back then, and the target's guards hear how the stream broke (upstreamBroke, accountRefused).
   */
  whenUpstreamDone(fn: () => void): void {
    if (this.#upstreamLetGo) fn();
    else this.#finishers.push(fn);
  }

  /**
   * How the provider broke the stream after it began, once it has (StreamEnd.upstreamBroke): for a recovered stream,
   * known at its break, before its end.
   */
  get upstreamBroke(): FailureFacts | undefined {
    return this.#upstreamBroke;
  }

  /** It ended with an upstream error event that names the gateway's own account (StreamEnd.accountRefused). */
  get accountRefused(): boolean {
    return this.#accountRefused;
  }

  /**
   * Ends the stream now with an error event the SDKs raise (the instance is shutting down), not with a reset; a stream
   * a streamRecovery continuation has taken over, through that continuation (whose upstream request is aborted).
   */
  interrupt(): void {
    if (this.#ended) return;
    this.#interrupted = true;
    this.#opts.controller.abort(new GatewayShutdown());
    this.#continuation?.abort(new GatewayShutdown());
  }

  /** The client went away before the stream was read to its end: free the upstream connection and the slot. */
  abandon(): void {
    // A continuation being passed on ends first, at once: its end bills its target (whenEnded) before this stream's own
    // end is told. Left to end by itself, a moment later, its usage (an Anthropic target's input tokens, in its first
    // event) came after this stream's end had been counted, and was in no metric nor log line.
    this.#abandonContinuation?.();
    this.#finish('client-gone');
  }

  #finish(kind: StreamEndKind): void {
    if (this.#ended) return;
    clearTimeout(this.#idle);
    clearTimeout(this.#opts.firstTokenTimer);
    // A translated stream's usage is the translator's, read from the upstream's events: the client's events carry it
    // only when it asked for include_usage, and the tokens metric bills every answer. A recovered stream's is what its
    // provider reported before the break (billed to it, as a cut stream's is), and its continuation's apart.
    const usage = this.#opts.translate?.usage() ?? this.#usage;
    const continuation = this.#continuationUsage;
    const outputChars = this.#output.chars + this.#continuationChars;
    const end: StreamEnd = { kind, events: this.#events, droppedMalformed: this.#dropped, ...(usage && { usage }), ...(continuation && { continuation }), ...(outputChars > 0 && { outputChars }), ...(this.#accountRefused && { accountRefused: true }), ...(this.#upstreamBroke && { upstreamBroke: this.#upstreamBroke }), ...(this.#recoveryRefused && { recoveryRefused: this.#recoveryRefused }) };
    this.#ended = end;
    const giveBack = this.#letGoUpstream(kind);
    this.onEnd?.(end);
    giveBack();
  }

  /**
   * Done with the upstream response, once (a recovered stream is done with it before its continuation, its end then
   * lets go of nothing more): cut off if still open, and its listeners released. Returns what gives back what it held
   * (whenUpstreamDone's callbacks), for the caller to run when it has said how the stream ended.
   */
  #letGoUpstream(kind: StreamEndKind): () => void {
    if (this.#upstreamLetGo) return () => {};
    this.#upstreamLetGo = true;
    const { controller, iterator } = this.#opts;
    // The upstream's response is still open: a finished answer's last bytes are read, anything else is cut off.
    const open = !controller.signal.aborted && !this.#upstreamEnded;
    const draining = open && kind === 'complete';
    if (open && !draining) controller.abort(STREAM_OVER);
    this.#opts.detach();
    // The pool slot stands for the connection: while the last bytes are read it is still taken.
    const finishers = this.#finishers.splice(0);
    const done = () => {
      for (const fn of finishers) fn();
    };
    return draining ? () => drainResponse(iterator, () => controller.abort(STREAM_OVER), done) : done;
  }

  /**
   * Why a [DONE] that has come cut the answer short: after an event dropped as malformed, a server that writes its
   * failure as text (`data: Error: CUDA out of memory`, then its usual [DONE]), where the SDK alone would have thrown
   * on that event; or what the answer's progress shows (a server may send no finish_reason at all: [DONE] alone is not).
   */
  #cutByDone(): string | undefined {
    if (this.#progress.whole()) return undefined;
    return this.#dropped > 0 ? 'a malformed event, then [DONE] before the answer\'s finish' : this.#progress.cutByDone();
  }

  get ended(): StreamEnd | undefined {
    return this.#ended;
  }

  /** How long its client may take nothing before the stream gives up on it (`client-stalled`). */
  get clientStallMs(): number {
    return clientStallMs(this.#opts.idleMs);
  }

  #translated(events: SseEvent[]): SseEvent[] {
    return translatedAfterOutput(events, this.#opts.translate);
  }

  /**
   * Ends an upstream silent for `ms` while it is waited for. While the client is the one not reading, it counts the
   * client's stall instead: one that takes nothing for CLIENT_STALL_IDLE_PERIODS idle periods (a hung consumer that
   * keeps its socket open) gives back the upstream connection and the pool slot it holds.
   */
  #armIdle(ms: number): NodeJS.Timeout {
    const timer = setTimeout(() => {
      if (this.#awaitingUpstream) {
        // Before the first output the upstream's silence is the first-token timer's to bound; a client's is still this one's.
        if (this.#beforeOutput) timer.refresh();
        else {
          // A process starved of CPU runs its expired timers before it reads the sockets: the upstream's next event may
          // be waiting unread. The stall is decided after this turn's reads (setImmediate runs after the poll phase): an
          // event read by then keeps the stream, and this timer counts again (the upstream's silence or the client's).
          const reads = this.#progressedReads;
          setImmediate(() => {
            if (this.#ended) return;
            if (this.#progressedReads === reads && this.#awaitingUpstream) this.#opts.controller.abort(new AttemptTimeout('idle', ms));
            else if (this.#idle === timer) timer.refresh();
          });
        }
        return;
      }
      this.#clientWaitMs += ms;
      if (this.#clientWaitMs >= CLIENT_STALL_IDLE_PERIODS * this.#opts.idleMs) this.#finish('client-stalled');
      else timer.refresh();
    }, ms);
    return timer;
  }
}
