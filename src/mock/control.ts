// The mock's control API over HTTP (`/_mock/*`), for the CLI, the demo and scripts in other processes.
// These requests bypass faults, stats and the request log, so watching the mock never disturbs it.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { parseJsonObject, readBody } from './body.ts';
import type { BrownoutMode, FaultSpec } from './faults.ts';
import type { MockServer } from './server.ts';

function reply(res: ServerResponse, status: number, payload: unknown): void {
  const body = JSON.stringify(payload);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

function lastN<T>(items: T[], limit: string | null): T[] {
  const n = limit === null ? NaN : Number(limit);
  return Number.isInteger(n) && n >= 0 ? items.slice(Math.max(0, items.length - n)) : items;
}

/** Answers one control request. */
export function handleControl(mock: MockServer, req: IncomingMessage, res: ServerResponse, path: string): void {
  readBody(req, (raw) => {
    // Read as no body, a PUT too large to read would clear every fault.
    if (raw === undefined) return reply(res, 413, { error: 'request body too large' });
    try {
      const body = parseJsonObject(raw);
      const route = `${req.method ?? 'GET'} ${path}`;
      switch (route) {
        case 'GET /_mock/health':
          return reply(res, 200, { ok: true });
        case 'GET /_mock/stats':
          return reply(res, 200, mock.stats());
        case 'GET /_mock/requests': {
          const limit = new URL(req.url ?? '/', 'http://mock').searchParams.get('limit');
          return reply(res, 200, lastN(mock.requests(), limit));
        }
        case 'GET /_mock/faults':
          return reply(res, 200, mock.faults());
        case 'PUT /_mock/faults':
          mock.setFaults(body as FaultSpec);
          return reply(res, 200, mock.faults());
        case 'PATCH /_mock/faults':
          mock.patchFaults(body as Partial<FaultSpec>);
          return reply(res, 200, mock.faults());
        case 'POST /_mock/reset':
          mock.reset();
          return reply(res, 200, { ok: true });
        case 'POST /_mock/brownout': {
          // A misspelt field or a duration that is no number would brown out for the default 10 s instead.
          const unknown = Object.keys(body).find((k) => k !== 'mode' && k !== 'durationMs');
          if (unknown !== undefined) throw new Error(`unknown brownout field ${JSON.stringify(unknown)} (the fields are "mode" and "durationMs")`);
          const mode = String(body['mode'] ?? '503') as BrownoutMode;
          const durationMs = body['durationMs'] ?? 10_000;
          if (typeof durationMs !== 'number' || !Number.isFinite(durationMs) || durationMs < 0) throw new Error('durationMs must be a non-negative number');
          const before = mock.brownout(mode, durationMs);
          // Ending one names the brownout that ran (null: none was in force), not the mode this call named or defaulted to.
          return reply(res, 200, durationMs === 0 ? { ok: true, ended: before ?? null, durationMs } : { ok: true, mode, durationMs });
        }
        default:
          return reply(res, 404, { error: `unknown control endpoint ${route}` });
      }
    } catch (err) {
      reply(res, 400, { error: err instanceof Error ? err.message : String(err) });
    }
  });
}
