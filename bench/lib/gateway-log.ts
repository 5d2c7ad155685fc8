// Reading a gateway's JSON log for a bench report: every line parsed once, the lines that are not JSON (a crash
// trace, say) kept as examples, and the warnings and errors grouped by message with the first example of each.
// Each bench adds what it counts through `onLine`.
import { readFileSync } from 'node:fs';

export interface LogGroup {
  level: number;
  msg: string;
  count: number;
  /** The first such line, shortened. */
  example: string;
}

interface LogRead {
  lines: number;
  /** Level warn (40) and above, by message, most frequent first; lines `onLine` claimed aside. */
  problems: LogGroup[];
  /** Lines that were not JSON (at most 20, shortened). */
  unparsed: string[];
}

const EXAMPLE_CHARS = 400;

/** Calls `onLine` for each JSON line; a line it returns `true` for is its own business, never listed as a problem. */
export function readGatewayLog<L extends { level?: number; msg?: string }>(path: string, onLine: (line: L) => boolean | void): LogRead {
  const out: LogRead = { lines: 0, problems: [], unparsed: [] };
  const groups = new Map<string, LogGroup>();
  for (const raw of readFileSync(path, 'utf8').split('\n')) {
    if (raw.trim() === '') continue;
    out.lines++;
    let line: L;
    try {
      line = JSON.parse(raw) as L;
    } catch {
      if (out.unparsed.length < 20) out.unparsed.push(raw.slice(0, EXAMPLE_CHARS));
      continue;
    }
    if (onLine(line) === true || (line.level ?? 0) < 40) continue;
    const key = `${line.level} ${line.msg}`;
    const g = groups.get(key);
    if (g) g.count++;
    else groups.set(key, { level: line.level!, msg: line.msg ?? '', count: 1, example: raw.slice(0, EXAMPLE_CHARS) });
  }
  out.problems = [...groups.values()].sort((a, b) => b.count - a.count);
  return out;
}
