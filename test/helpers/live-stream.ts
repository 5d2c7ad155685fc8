// A LiveStream as runAttempt hands it over (its first output parsed, the rest read from `iterator`), built by hand for
// tests of the stream itself, and the promise of how it ends.
import { setTimeout as sleep } from 'node:timers/promises';
import { AttemptTimeout } from '../../src/pipeline/abort-reasons.ts';
import { LiveStream, type StreamEnd } from '../../src/pipeline/live-stream.ts';
import type { StreamTranslator } from '../../src/providers/families.ts';
import type { ApiKind } from '../../src/routing/router.ts';
import { SseParser } from '../../src/streaming/sse-parser.ts';
import { readEvent, type StreamShape } from '../../src/streaming/stream-events.ts';
import type { DeliveredChunk, DeliveredText } from '../../src/pipeline/delivered-text.ts';

export function handedOverStream(o: {
  first: string | Buffer;
  iterator: AsyncIterator<Buffer>;
  controller: AbortController;
  api?: ApiKind;
  shape?: StreamShape;
  idleMs?: number;
  /** How long a finished answer waits for the upstream's own end; the LiveStream's default (a second) when absent. */
  afterFinishMs?: number;
  apiKey?: string;
  /** What the client was sent before the hand-over (the events before the first output); none by default. */
  head?: string;
  /** A translated stream's translator (its upstream's events into the client's API); none by default. */
  translate?: StreamTranslator;
  /**
   * Handed over before its first output (`first` holds none: a role chunk, a background response's response.created),
   * with this much left of the attempt's first-token timer, which then aborts `controller` as runAttempt's does.
   */
  firstTokenLeftMs?: number;
}): { live: LiveStream; ended: Promise<StreamEnd> } {
  const parser = new SseParser();
  const left = o.firstTokenLeftMs;
  const firstTokenTimer = left === undefined ? undefined : setTimeout(() => o.controller.abort(new AttemptTimeout('first-token', left)), left);
  const live = new LiveStream({
    api: o.api ?? 'chat',
    shape: o.shape ?? { choices: 1, usage: false },
    head: o.head ?? '',
    pending: parser.push(typeof o.first === 'string' ? Buffer.from(o.first) : o.first),
    parser,
    iterator: o.iterator,
    translate: o.translate,
    controller: o.controller,
    requestSignal: new AbortController().signal,
    detach: () => undefined,
    idleMs: o.idleMs ?? 2_000,
    ...(o.afterFinishMs !== undefined && { afterFinishMs: o.afterFinishMs }),
    ...(firstTokenTimer && { firstTokenTimer }),
    apiKey: o.apiKey ?? 'sk-provider',
  });
  const ended = new Promise<StreamEnd>((resolve) => (live.onEnd = resolve));
  return { live, ended };
}

/** A step of the upstream: text it sends, a pause in ms, or an error (a reset). Like undici's body, it fails once its request is aborted. */
export type Step = string | number | Error;

export function upstream(controller: AbortController, steps: Step[]): AsyncIterator<Buffer> {
  return (async function* () {
    for (const step of steps) {
      controller.signal.throwIfAborted();
      if (typeof step === 'number') await sleep(step, undefined, { signal: controller.signal });
      else if (step instanceof Error) throw step;
      else yield Buffer.from(step);
    }
    controller.signal.throwIfAborted();
  })();
}

/** The whole text the client gets; `pauseAfterFirstMs`: a client slow to read on after the first part. */
export async function readAll(live: LiveStream, pauseAfterFirstMs = 0): Promise<string> {
  let text = '';
  let first = true;
  for await (const part of live.body()) {
    text += part;
    if (first && pauseAfterFirstMs > 0) await sleep(pauseAfterFirstMs);
    first = false;
  }
  return text;
}

/** An event's data handed to `d` as LiveStream hands it: the chunk readEvent parsed, nothing for a malformed event. */
export function deliverData(d: DeliveredText, data: string): void {
  const { parsed } = readEvent('chat', { raw: `data: ${data}`, data, event: null });
  if (parsed) d.noteChunk(parsed as DeliveredChunk);
}
