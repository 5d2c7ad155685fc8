// An upstream that honours backpressure and keeps a ledger of each request: when its head and body came, how many
// bytes of its answer it managed to hand to the socket (it writes the next piece only once the last one drained), and
// whether the gateway let it finish or went away first. For tests of slow and misbehaving clients, where what the
// upstream was able to write is the measure of what the gateway buffered on a client's behalf.
import type { IncomingMessage, RequestListener, ServerResponse } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';

/** One request the upstream got, and what became of its answer. */
export interface PacedRequest {
  method: string;
  url: string;
  headers: IncomingMessage['headers'];
  /** The body as far as it came (all of it once `bodyDoneAt` is set). */
  body: string;
  /** When its head arrived (performance.now()). */
  arrivedAt: number;
  /** When its body had come whole (performance.now()); undefined while it is still coming, or if it never did. */
  bodyDoneAt?: number;
  /** Bytes of the answer handed to the socket so far. */
  written: number;
  /** Writes that found the socket full and waited for it to drain. */
  waits: number;
  /** The answer was written to its end. */
  finished: boolean;
  /** The gateway closed the connection before the answer's end (or before the request's body was whole). */
  aborted: boolean;
  /** When the connection closed, if it did (performance.now()). */
  closedAt?: number;
}

/** A piece of an answer: bytes, or a pause. */
export type Piece = string | Buffer | { pauseMs: number };

/** What the upstream answers a request with; `hang`: nothing at all, ever; `hold`: leave the response open after the pieces. */
export type PacedAnswer = (req: PacedRequest, n: number) => 'hang' | { status?: number; headers?: Record<string, string>; pieces: Iterable<Piece>; hold?: boolean };

export interface PacedUpstream {
  /** Its origin, e.g. http://127.0.0.1:4711 (append /v1 for an OpenAI-style baseUrl). */
  origin: string;
  requests: PacedRequest[];
}

/** Writes each piece only when the socket can take it, as a well-behaved server does. */
async function writePaced(res: ServerResponse, rec: PacedRequest, pieces: Iterable<Piece>, hold: boolean): Promise<void> {
  for (const piece of pieces) {
    if (res.destroyed) return;
    if (typeof piece === 'object' && 'pauseMs' in piece) {
      await sleep(piece.pauseMs);
      continue;
    }
    rec.written += Buffer.byteLength(piece);
    if (!res.write(piece)) {
      rec.waits++;
      const drained = await new Promise<boolean>((resolve) => {
        const settle = (v: boolean) => () => {
          res.off('drain', onDrain);
          res.off('close', onClose);
          resolve(v);
        };
        const onDrain = settle(true);
        const onClose = settle(false);
        res.on('drain', onDrain);
        res.on('close', onClose);
      });
      if (!drained) return;
    }
  }
  if (!res.destroyed && !hold) {
    res.end();
    rec.finished = true;
  }
}

/** A request listener (for useFakeProviders) answering with `answer` once each request's body is whole. */
export function pacedUpstream(answer: PacedAnswer): { listener: RequestListener; requests: PacedRequest[] } {
  const requests: PacedRequest[] = [];
  const listener: RequestListener = (req, res) => {
    const rec: PacedRequest = { method: req.method ?? '', url: req.url ?? '', headers: req.headers, body: '', arrivedAt: performance.now(), written: 0, waits: 0, finished: false, aborted: false };
    requests.push(rec);
    res.on('close', () => {
      rec.closedAt = performance.now();
      if (!res.writableFinished) rec.aborted = true;
    });
    req.on('data', (d: Buffer) => (rec.body += d.toString()));
    req.on('error', () => undefined);
    req.on('end', () => {
      rec.bodyDoneAt = performance.now();
      const a = answer(rec, requests.length);
      if (a === 'hang') return;
      res.writeHead(a.status ?? 200, a.headers ?? { 'content-type': 'text/event-stream' });
      res.flushHeaders();
      void writePaced(res, rec, a.pieces, a.hold ?? false);
    });
  };
  return { listener, requests };
}

/** Polls `cond` every 20 ms until it holds or `ms` pass; whether it held. */
export async function until(cond: () => boolean | Promise<boolean>, ms = 15_000): Promise<boolean> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await cond()) return true;
    await sleep(20);
  }
  return cond();
}

// ---------- stream bodies in each API's framing ----------

/** The text of chunk i: numbered and padded, so the order and completeness of a stream are checked by its text. */
export const word = (i: number, pad = 0) => `<${i}>${'.'.repeat(pad)}`;
/** The whole text of `n` chunks. */
export const textOf = (n: number, pad = 0) => Array.from({ length: n }, (_, i) => word(i, pad)).join('');

const chunk = (choices: unknown[], extra: Record<string, unknown> = {}) =>
  `data: ${JSON.stringify({ id: 'chatcmpl-62', object: 'chat.completion.chunk', created: 1741290958, model: 'gpt-4o-2024-08-06', choices, ...extra })}\n\n`;
const choice = (delta: Record<string, unknown>, finish: string | null = null) => ({ index: 0, delta, logprobs: null, finish_reason: finish });

/** An OpenAI chat stream of `n` numbered chunks, its finish, a usage chunk when `usage`, and [DONE]. */
export function* chatStream(n: number, pad = 0, opts: { usage?: boolean; beforeDone?: Piece[] } = {}): Generator<Piece> {
  yield chunk([choice({ role: 'assistant', content: '' })]);
  for (let i = 0; i < n; i++) yield chunk([choice({ content: word(i, pad) })]);
  yield chunk([choice({}, 'stop')]);
  if (opts.usage) yield chunk([], { usage: { prompt_tokens: 9, completion_tokens: n, total_tokens: 9 + n } });
  yield* opts.beforeDone ?? [];
  yield 'data: [DONE]\n\n';
}

const aev = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;

/** An Anthropic Messages stream of `n` numbered text deltas. */
export function* anthropicStream(n: number, pad = 0): Generator<Piece> {
  yield aev('message_start', { message: { id: 'msg_62', type: 'message', role: 'assistant', model: 'claude-sonnet-4-6', content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 9, output_tokens: 1 } } });
  yield aev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } });
  for (let i = 0; i < n; i++) yield aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: word(i, pad) } });
  yield aev('content_block_stop', { index: 0 });
  yield aev('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: n } });
  yield aev('message_stop', {});
}

/** The data payloads of an SSE text, in order. */
export const dataOf = (sse: string): string[] =>
  sse
    .split('\n\n')
    .map((e) => e.split('\n').find((l) => l.startsWith('data: '))?.slice(6))
    .filter((d): d is string => d !== undefined);
