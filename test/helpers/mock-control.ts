// The bundled mock's documented control endpoint (/_mock/...), driven over HTTP as a user's scripts drive it.
import { expect } from 'vitest';
import type { MockServer } from '../../src/mock/server.ts';

/** One control call (`path` after /_mock/, e.g. `faults`, `brownout`, `stats`); fails the test on a non-2xx. */
export async function mockControl(mock: MockServer, method: string, path: string, body?: unknown): Promise<unknown> {
  const res = await fetch(`${mock.url}/_mock/${path}`, {
    method,
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  expect(res.status, `${method} /_mock/${path}: ${text}`).toBeLessThan(300);
  return text ? JSON.parse(text) : undefined;
}
