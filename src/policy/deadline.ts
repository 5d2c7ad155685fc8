// How long the gateway may spend on one request. The client's own timeout wins when it is shorter: an SDK that
// times out by itself retries whatever the gateway would have said, so the gateway must answer first.
import { firstHeader, type HeaderBag } from '../header-bag.ts';

interface DeadlineInputs {
  routeTimeoutMs: number;
  /** The route's configured margin; undefined means max(250 ms, 5% of the budget). */
  marginMs: number | undefined;
  headers: HeaderBag;
}

interface Deadline {
  /** Time the gateway may spend, margin already taken off. */
  budgetMs: number;
  /** The smallest timeout that applied, before the margin. */
  timeoutMs: number;
  /** Which timeout won, for logs. */
  source: 'route' | 'x-stormgate-timeout-ms' | 'x-stainless-timeout' | 'x-stainless-read-timeout';
}

const MIN_MARGIN_MS = 250;
const MARGIN_SHARE = 0.05;

export function computeDeadline({ routeTimeoutMs, marginMs, headers }: DeadlineInputs): Deadline {
  let timeoutMs = routeTimeoutMs;
  let source: Deadline['source'] = 'route';
  const consider = (ms: number | undefined, from: Deadline['source']) => {
    if (ms !== undefined && ms < timeoutMs) {
      timeoutMs = ms;
      source = from;
    }
  };
  consider(timeoutHeaderMs(firstHeader(headers, 'x-stormgate-timeout-ms')), 'x-stormgate-timeout-ms');
  consider(stainlessTimeoutMs(headers), 'x-stainless-timeout');
  consider(stainlessSeconds(firstHeader(headers, 'x-stainless-read-timeout')), 'x-stainless-read-timeout');
  const margin = marginMs === undefined ? Math.max(MIN_MARGIN_MS, Math.round(timeoutMs * MARGIN_SHARE)) : scaledMargin(marginMs, routeTimeoutMs, timeoutMs);
  // A margin larger than the timeout would leave nothing: keep at least a sliver so the request is tried.
  const budgetMs = Math.max(Math.min(timeoutMs, 50), timeoutMs - margin);
  return { budgetMs, timeoutMs, source };
}

/**
 * A configured margin is kept back whole, but from a client's shorter timeout at most half of it: a route's 5 s margin
 * taken off an SDK's 3 s timeout left 50 ms, and the request was answered 504 before its provider had a chance. (The
 * route's own timeoutMs is the operator's, checked against the margin at start-up.)
 */
function scaledMargin(marginMs: number, routeTimeoutMs: number, timeoutMs: number): number {
  if (timeoutMs >= routeTimeoutMs) return marginMs;
  // Never more time than the route's own (its timeout less the whole margin): halved, a margin of 6 s on a 10 s route
  // gave a client asking 9.999 s 5 s, and one asking 10 s (the route's) 4 s; more time asked got less.
  return Math.max(Math.min(marginMs, Math.round(timeoutMs / 2)), timeoutMs - (routeTimeoutMs - marginMs));
}

/**
 * The deadline of a request whose route is not known yet (its body, which names the model, is still arriving): the
 * longest any of its path's routes would give it, so that it is never answered before its own route would have.
 */
export function longestBudgetMs(routes: ReadonlyArray<{ timeoutMs: number; deadlineMarginMs?: number | undefined }>, headers: HeaderBag): number {
  return Math.max(0, ...routes.map((r) => computeDeadline({ routeTimeoutMs: r.timeoutMs, marginMs: r.deadlineMarginMs, headers }).budgetMs));
}

/** A plain decimal: Number() alone would also read hex (`0x10`), exponents and binary. */
const DECIMAL = /^\s*\d+(\.\d+)?\s*$/;

/**
 * x-stormgate-timeout-ms as a number of ms; undefined when absent or not a positive number (the server refuses those).
 * A decimal too long for a double reads as Infinity: longer than any route's timeout, so the route's applies (refused,
 * it got a 400 saying it was not a positive number of milliseconds).
 */
export function timeoutHeaderMs(v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  // Sent twice (a proxy in front that adds it again), Node joins the values with ", ": the shortest is the deadline.
  // A bare comma is no such list but a typo (`1,5`: a decimal comma), refused as before.
  let shortest: number | undefined;
  for (const part of v.split(', ')) {
    if (!DECIMAL.test(part)) return undefined;
    const n = Number(part);
    if (!(n > 0)) return undefined;
    shortest = shortest === undefined ? n : Math.min(shortest, n);
  }
  return shortest;
}

/**
 * x-stainless-timeout in ms: in seconds, but for the JS SDK releases that sent milliseconds (a 2 s timeout as `2000`,
 * which read as seconds left the route's deadline, so the SDK gave up and sent the call again by itself).
 */
function stainlessTimeoutMs(headers: HeaderBag): number | undefined {
  const v = firstHeader(headers, 'x-stainless-timeout');
  if (!sendsMilliseconds(firstHeader(headers, 'user-agent'))) return stainlessSeconds(v);
  const s = stainlessSeconds(v);
  return s === undefined ? undefined : Math.max(1, s / 1000);
}

/**
 * The releases that sent x-stainless-timeout in milliseconds before both SDKs switched to seconds (their changelogs:
 * "send X-Stainless-Timeout in seconds"): openai 4.83.0 to 4.91.x and @anthropic-ai/sdk 0.37.0 to 0.39.x, told by
 * their user-agent (`OpenAI/JS 4.85.0`, `Anthropic/JS 0.39.0`).
 */
function sendsMilliseconds(userAgent: string | undefined): boolean {
  const m = /^(OpenAI|Anthropic)\/JS (\d+)\.(\d+)\./.exec(userAgent ?? '');
  if (!m) return false;
  const major = Number(m[2]);
  const minor = Number(m[3]);
  return m[1] === 'OpenAI' ? major === 4 && minor >= 83 && minor <= 91 : major === 0 && minor >= 37 && minor <= 39;
}

/**
 * The SDKs send their timeout in seconds (the JS SDK truncates to whole seconds, so a sub-second timeout arrives as 0,
 * which we read as 1 s; the Python SDK may send fractions, which are its exact timeout: a `0.5` read as 1 s would have
 * the gateway answer after the client gave up).
 */
function stainlessSeconds(v: string | undefined): number | undefined {
  if (v === undefined || v.trim() === '') return undefined;
  const s = Number(v);
  if (!Number.isFinite(s) || s < 0) return undefined;
  return (s === 0 ? 1 : s) * 1000;
}
