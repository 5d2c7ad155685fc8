// What the gateway's own log says about a run: warnings and errors (grouped by message, with the first example), its
// breaker's transitions, request lines answered later than the deadline the gateway computed for them, and attempts
// started too close to that deadline. The
// bench's figures come from the clients and the mock; this is the gateway's side of the story, for the report.
import { readGatewayLog, type LogGroup } from '../lib/gateway-log.ts';
import { percentile } from '../lib/stats.ts';

export interface GatewayLogSummary {
  path: string;
  lines: number;
  requestLines: number;
  /** Requests by the status the gateway answered. */
  byStatus: Record<string, number>;
  /** Requests the gateway answered more than 50 ms after its own deadline for them (budgetMs). */
  pastDeadline: number;
  maxOverDeadlineMs: number;
  /** Requests the gateway answered later than the client's own timeout, by the gateway's clock: certainly too late. */
  pastClientDeadline: number;
  /**
   * Upstream attempts started with less than minAttemptMs left before the request's deadline, which the one wait rule
   * forbids; and the median time they had left. Start times are rebuilt from the attempts' durations and waits.
   */
  lateStarts: number;
  lateStartMedianLeftMs: number;
  /** Level warn (40) and above, by message, breaker transitions aside. */
  problems: LogGroup[];
  /** Breaker transitions: time (ms since the epoch) and the state entered. */
  breaker: Array<{ atMs: number; to: string }>;
  /** Lines that were not JSON (a crash trace, say). */
  unparsed: string[];
}

interface Line {
  level?: number;
  time?: number;
  msg?: string;
  status?: number;
  durationMs?: number;
  budgetMs?: number;
  deadlineSource?: string;
  attempts?: Array<{ durationMs: number; waitMs: number }>;
}

/** Time left before the deadline when each attempt started, walking back from the answer: end, attempt, wait, ... */
function leftAtStarts(line: Required<Pick<Line, 'durationMs' | 'budgetMs'>> & Line): number[] {
  const lefts: number[] = [];
  let end = line.durationMs;
  for (const a of [...(line.attempts ?? [])].reverse()) {
    const start = end - a.durationMs;
    lefts.push(line.budgetMs - start);
    end = start - a.waitMs;
  }
  return lefts;
}

export function scanGatewayLog(path: string, o: { minAttemptMs: number; clientTimeoutMs: number }): GatewayLogSummary {
  const s: GatewayLogSummary = {
    path,
    lines: 0,
    requestLines: 0,
    byStatus: {},
    pastDeadline: 0,
    maxOverDeadlineMs: 0,
    pastClientDeadline: 0,
    lateStarts: 0,
    lateStartMedianLeftMs: Number.NaN,
    problems: [],
    breaker: [],
    unparsed: [],
  };
  const lateLefts: number[] = [];
  const read = readGatewayLog<Line>(path, (line) => {
    const msg = line.msg ?? '';
    if (msg === 'request' || msg === 'stream ended abnormally') {
      s.requestLines++;
      s.byStatus[String(line.status)] = (s.byStatus[String(line.status)] ?? 0) + 1;
      if (line.durationMs !== undefined && line.budgetMs !== undefined) {
        const over = line.durationMs - line.budgetMs;
        // The deadline timer fires at budgetMs; 50 ms covers writing the answer on a busy 2-core machine.
        if (over > 50) s.pastDeadline++;
        s.maxOverDeadlineMs = Math.max(s.maxOverDeadlineMs, over);
        if (line.deadlineSource === 'x-stainless-timeout' && line.durationMs > o.clientTimeoutMs) s.pastClientDeadline++;
        lateLefts.push(...leftAtStarts({ ...line, durationMs: line.durationMs, budgetMs: line.budgetMs }).filter((left) => left < o.minAttemptMs));
      }
    }
    // Breaker transitions are logged at warn by design: listed on their own, not as problems.
    if (!msg.startsWith('breaker ')) return false;
    if (line.time !== undefined) s.breaker.push({ atMs: line.time, to: msg.slice('breaker '.length) });
    return true;
  });
  s.lines = read.lines;
  s.unparsed = read.unparsed;
  s.problems = read.problems;
  s.lateStarts = lateLefts.length;
  s.lateStartMedianLeftMs = percentile(lateLefts, 50);
  return s;
}
