// The gateway's own log of the run, per priority class and phase: what it answered, how many upstream attempts it
// made, how many of its requests met an upstream 429 on the way, and its warnings and errors. The clients' figures
// say what happened; this says what the gateway did about it.
import { readGatewayLog, type LogGroup } from '../lib/gateway-log.ts';

interface ClassLog {
  requests: number;
  byStatus: Record<string, number>;
  byOutcome: Record<string, number>;
  /** Requests by how many upstream attempts they made (0: shed before any). */
  byAttempts: Record<string, number>;
  /** Requests that got at least one upstream 429. */
  met429: number;
  /** Upstream attempts answered 429. */
  attempts429: number;
  /** Successes that needed a retry after a 429. */
  retriedThen200: number;
}

export interface GatewayLog {
  path: string;
  lines: number;
  /** By phase name, then by priority class. */
  phases: Record<string, Record<string, ClassLog>>;
  /** Warn and above, by message: count and first example. */
  problems: LogGroup[];
  unparsed: string[];
  /** The gateway's own time for each online request (its request line's durationMs: from parsed headers to the answer), by id. */
  onlineHandlerMs: Map<string, number>;
}

interface Line {
  level?: number;
  time?: number;
  reqId?: string;
  durationMs?: number;
  msg?: string;
  path?: string;
  status?: number;
  priority?: string;
  outcome?: string;
  attempts?: Array<{ status?: number; reason?: string }>;
}

const emptyClass = (): ClassLog => ({ requests: 0, byStatus: {}, byOutcome: {}, byAttempts: {}, met429: 0, attempts429: 0, retriedThen200: 0 });
const inc = (r: Record<string, number>, k: string) => (r[k] = (r[k] ?? 0) + 1);

/** `phases` maps a name to [from, to) in ms since the epoch; a request line counts in the phase in which it was logged (answered). */
export function scanGatewayLog(path: string, phases: Record<string, [number, number]>): GatewayLog {
  const out: GatewayLog = { path, lines: 0, phases: {}, problems: [], unparsed: [], onlineHandlerMs: new Map() };
  for (const name of Object.keys(phases)) out.phases[name] = {};
  const read = readGatewayLog<Line>(path, (line) => {
    // Request lines of the chat route only: /metrics scrapes are logged too.
    if (line.msg !== 'request' || line.time === undefined || line.path !== '/v1/chat/completions') return;
    if (line.reqId?.startsWith('online-') && line.durationMs !== undefined) out.onlineHandlerMs.set(line.reqId, line.durationMs);
    for (const [name, [from, to]] of Object.entries(phases)) {
      if (line.time < from || line.time >= to) continue;
      const byClass = out.phases[name]!;
      const c = (byClass[line.priority ?? 'none'] ??= emptyClass());
      c.requests++;
      inc(c.byStatus, String(line.status));
      inc(c.byOutcome, line.outcome ?? '?');
      const attempts = line.attempts ?? [];
      inc(c.byAttempts, String(attempts.length));
      const n429 = attempts.filter((a) => a.status === 429).length;
      c.attempts429 += n429;
      if (n429 > 0) c.met429++;
      if (n429 > 0 && line.status === 200) c.retriedThen200++;
    }
  });
  return { ...out, ...read };
}
