// Mutation tests over the day's changes (passthrough errors put in the OpenAI shape, the client's deadline on a
// passthrough path, stormgate_passthrough_requests_total, the drain's grace on the pipeline's clock): each test kills a
// mutant the suite left alive. The bugs the review found are in test/review-today-9.test.ts.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { ask, busyOnceThen, configFor } from './helpers/one-provider.ts';
import { parseMetrics, useStacks, type Stack } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const stack = useStacks();

/** A gateway whose passthrough opens GET on `paths` to a provider answering every request with `answer`. */
async function passthroughTo(answer: (req: IncomingMessage, res: ServerResponse) => void, paths = ['/v1/files']): Promise<Stack> {
  const p = await startProvider((req, res) => {
    req.resume();
    answer(req, res);
  });
  return stack({ config: configFor(p.origin, {}, { passthrough: { provider: 'p', paths, methods: ['GET'] } }) });
}

/** stormgate_passthrough_requests_total's series, as `path class count`. */
async function passthroughSeries(s: Stack): Promise<string[]> {
  const samples = parseMetrics(await (await fetch(`${s.url}/metrics`)).text());
  return samples.filter((m) => m.name === 'stormgate_passthrough_requests_total').map((m) => `${m.labels.path} ${m.labels.status_class} ${m.value}`);
}

describe('a passthrough error already in the OpenAI shape', () => {
  it('passes an error already in the OpenAI shape on byte for byte: its own fields, spacing and byte order mark kept', async () => {
    // Not the strict shape (no type, a numeric code, a field beside `error`), yet `error.message` is there: as read.
    const bodies = ['{ "error": { "message": "bad file", "code": 400, "status": "INVALID_ARGUMENT" }, "request_id": "r-1" }', '\uFEFF{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}'];
    let n = 0;
    const s = await passthroughTo((_req, res) => void res.writeHead(n === 0 ? 400 : 429, { 'content-type': 'application/json' }).end(bodies[n++]));
    for (const body of bodies) {
      const res = await fetch(`${s.url}/v1/files`);
      expect(Buffer.from(await res.arrayBuffer()).equals(Buffer.from(body))).toBe(true);
    }
  });
});

describe('stormgate_passthrough_requests_total', () => {
  it('counts a 451 as 4xx and a 299 as 2xx: the class is the status\'s hundreds', async () => {
    let n = 0;
    const s = await passthroughTo((_req, res) => void res.writeHead(n++ === 0 ? 451 : 299, { 'content-type': 'application/json' }).end(n === 1 ? '{"error":{"message":"no","type":"invalid_request_error","code":null}}' : '{}'));
    await (await fetch(`${s.url}/v1/files`)).text();
    await (await fetch(`${s.url}/v1/files`)).text();
    await sleep(50);
    const series = await passthroughSeries(s);
    expect(series).toContain('/v1/files 4xx 1');
    expect(series).toContain('/v1/files 2xx 1');
    expect(series).toContain('/v1/files 5xx 0');
  });

  it('zeroes a path configured with a trailing slash under the label its requests are counted by', async () => {
    const s = await passthroughTo((_req, res) => void res.writeHead(200, { 'content-type': 'application/json' }).end('{}'), ['/v1/files/']);
    expect(await passthroughSeries(s)).toEqual(['2xx', '3xx', '4xx', '5xx', 'client_gone'].map((c) => `/v1/files ${c} 0`));
    await (await fetch(`${s.url}/v1/files/file-1`)).text();
    await sleep(50);
    expect(await passthroughSeries(s)).toContain('/v1/files 2xx 1');
    expect((await passthroughSeries(s)).filter((l) => l.startsWith('/v1/files/'))).toEqual([]);
  });
});

describe("draining: the grace end on the pipeline's clock", () => {
  it('is set by that clock too: a clock an hour ahead from the start still lets a retry that fits the grace be made', async () => {
    // As mutation-mut-today-8's first drain test, on a clock an hour off the wall's: the grace end taken off the wall
    // clock and its time left off the pipeline's, the grace had passed an hour before it began.
    const p = await startProvider(busyOnceThen());
    const s = await stack({
      config: configFor(p.origin, { retry: { backoff: { strategy: 'fixed', baseMs: 800, capMs: 800 } }, minAttemptMs: 200 }, { drain: { preStopMs: 2_000, graceMs: 300 } }),
      deps: { now: () => Date.now() + 3_600_000 },
    });
    const drained = s.gateway.drain();
    await sleep(50);
    expect(await ask(s.url)).toMatchObject({ status: 200 });
    expect(p.hits()).toBe(2);
    await drained;
  });
});
