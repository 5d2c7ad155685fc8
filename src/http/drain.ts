// SIGTERM's graceful shutdown, so a rolling deploy loses no request: what is in flight finishes, or ends saying why.
import type { Readable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import type { FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import type { Config } from '../config/schema.ts';
import type { LiveStream } from '../pipeline/live-stream.ts';
import type { Runtime } from '../runtime.ts';
import type { CloseSweep } from './close-sweep.ts';

declare module 'fastify' {
  interface FastifyInstance {
    /** SIGTERM's graceful shutdown: readiness off, preStopMs of service, then parked answered, new refused, in-flight given graceMs. */
    drain(): Promise<void>;
  }
}

type Phase = 'serving' | 'draining' | 'closing';

/** After the drain's grace period, how long interrupted streams get to write their error event (and close() to finish) before the exit. */
const STREAM_GOODBYE_MS = 500;

/** Where the instance is in its shutdown, and what the end of the grace period must reach. */
export interface Drain {
  /** `draining`: readiness off, still serving; `closing`: new managed requests refused. */
  readonly phase: Phase;
  /** The grace period is over: whatever is still running is being ended. */
  readonly pastGrace: boolean;
  /** From SIGTERM on, the time left before the grace period is over (preStopMs included); undefined while serving. */
  graceLeftMs: () => number | undefined;
  /** The pipeline's abort for when the grace period is over (at once if it is); returns its removal. */
  onShutdown: (listener: () => void) => () => void;
  /**
   * A call for when the drain begins (SIGTERM; at once if it has), with graceLeftMs set: a retry's wait begun before
   * it is weighed against the grace end then, not only once it is over. Returns its removal.
   */
  onDrainStart: (listener: () => void) => () => void;
  /** A run under an idempotency key, until it has ended in the store: a drain waits for it before the store closes. */
  holdRun(ended: Promise<void>): void;
  /** A stream being sent, until `body` closes: the end of the grace period ends it with an error event. */
  holdStream(stream: LiveStream, body: Readable): void;
}

/** Adds app.drain() and the close hooks; `sweep` closes the connections no answer is owed on. */
export function gracefulDrain(app: FastifyInstance, config: Config['drain'], logger: Logger, runtime: Pick<Runtime, 'lot' | 'close' | 'pipeline'>, sweep: CloseSweep): Drain {
  // The grace end on the pipeline's clock: the retry waits it bounds (target-attempts.ts) are read off that clock.
  const { now } = runtime.pipeline;
  let phase: Phase = 'serving';
  /** Streams being sent, and the aborts of requests still in the pipeline, for the end of a drain's grace period. */
  const live = new Set<LiveStream>();
  /** Runs under idempotency keys not yet ended in the store (pipeline/idempotent-request.ts), for a drain to wait for. */
  const detachedRuns = new Set<Promise<void>>();
  const inPipeline = new Set<() => void>();
  /** Retry waits begun before SIGTERM, to be weighed against the grace end as the drain begins. */
  const waiting = new Set<() => void>();
  let pastGrace = false;
  let graceEndsAtMs: number | undefined;
  app.decorate('drain', async () => {
    if (phase !== 'serving') return;
    phase = 'draining';
    graceEndsAtMs = now() + config.preStopMs + config.graceMs;
    for (const listener of [...waiting]) listener();
    waiting.clear();
    // A request already in flight is answered during the drain too: its keep-alive client must not send its next one
    // into this instance (past preStopMs, into the idle-connection sweep: a reset no client retries for a POST).
    sweep.closeAfterAnswers();
    logger.info({ preStopMs: config.preStopMs }, 'draining: readiness off');
    await sleep(config.preStopMs);
    phase = 'closing';
    runtime.lot.close();
    logger.info({ graceMs: config.graceMs }, 'closing: parked requests answered, new requests refused');
    // Idle connections are closed as they turn idle (the preClose sweep), so only requests in flight hold close().
    const closed = app.close();
    const graceOver = new AbortController();
    const graceTimer = sleep(config.graceMs, true, { signal: graceOver.signal }).catch(() => false);
    const outOfTime = await Promise.race([closed.then(() => false), graceTimer]);
    // Closed in time: the grace timer must not keep the process (or a test) alive, nor log a late warning.
    graceOver.abort();
    if (outOfTime) {
      logger.warn({ streams: live.size, requests: inPipeline.size }, 'grace period over: ending the remaining streams and requests');
      pastGrace = true;
      // A stream cut by the exit would end in a reset the SDKs report as a network error; an error event says why.
      for (const stream of live) stream.interrupt();
      // Requests not answered yet stop where they are (no new attempt goes upstream) and get 503 gateway_draining.
      for (const abort of inPipeline) abort();
      // So do requests whose body is still arriving: they never reached the pipeline, and must not hold the exit.
      sweep.cutUnfinishedBodies();
      // Ended streams let close() finish, which runs onClose (the state store's last flush); it gets a moment, no more.
      await Promise.race([closed, sleep(STREAM_GOODBYE_MS)]);
    }
  });
  // Parked requests are answered at once when the server starts closing, so closing never waits out their deadlines;
  // connections no answer is owed on are closed as they turn idle, so closing waits for requests in flight alone.
  // A request whose body has not arrived whole has not reached the pipeline: a drain gives it its grace period to
  // arrive, a close without a drain (SIGINT, app.close()) none, and it is answered 503 gateway_draining at once.
  app.addHook('preClose', async () => {
    sweep.start();
    if (phase !== 'closing') sweep.cutUnfinishedBodies();
    runtime.lot.close();
  });
  app.addHook('onClose', async () => {
    sweep.stop();
    // Runs under idempotency keys whose clients left hold no connection, so close() did not wait for them: a drain
    // does, before the store closes, or their answers (or their keys given back) never reached it and the keys stayed
    // claimed. Past the grace period they were interrupted with the rest, and end at once.
    if (phase === 'closing') await Promise.allSettled([...detachedRuns]);
    await runtime.close();
  });
  return {
    get phase() {
      return phase;
    },
    get pastGrace() {
      return pastGrace;
    },
    graceLeftMs: () => (graceEndsAtMs === undefined ? undefined : graceEndsAtMs - now()),
    onShutdown: (listener) => {
      if (pastGrace) {
        listener();
        return () => {};
      }
      inPipeline.add(listener);
      return () => inPipeline.delete(listener);
    },
    onDrainStart: (listener) => {
      if (phase !== 'serving') {
        listener();
        return () => {};
      }
      waiting.add(listener);
      return () => waiting.delete(listener);
    },
    holdRun: (ended) => {
      detachedRuns.add(ended);
      void ended.then(() => detachedRuns.delete(ended));
    },
    holdStream: (stream, body) => {
      live.add(stream);
      body.once('close', () => live.delete(stream));
      // Its first output came just as the grace period ran out: it ends after it, with the error event.
      if (pastGrace) stream.interrupt();
    },
  };
}
