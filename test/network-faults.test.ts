// Network faults between the gateway and a provider that the bundled mock cannot make itself, in the manner of
// Toxiproxy's toxics (helpers/fault-proxy.ts): bytes sliced into pieces of 1-7 bytes, a rate limit, latency and jitter,
// a reset or a FIN after so many bytes of the answer, a black hole on a new and on a kept connection, a server that
// closes idle connections sooner than the gateway keeps them. The client is the openai SDK; what it must see: the
// mock's exact text, or the right status and error code, a retry only where the route consents to one, no hung
// request, and no connection left open.
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import { configServedBy, metricSum, requestLine, TEST_KEY, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';
import { startFaultProxy, type ConnectionToxics, type FaultProxy } from './helpers/fault-proxy.ts';
import type { MockServer } from '../src/mock/server.ts';
import type { FaultSpec } from '../src/mock/faults.ts';
import type { ConfigInput } from '../src/config/schema.ts';

const startStack = useStacks();
const startMock = useExtraMocks();
const proxies: FaultProxy[] = [];
afterEach(async () => {
  await Promise.all(proxies.splice(0).map((p) => p.close()));
});

interface Net {
  s: Stack;
  proxy: FaultProxy;
  mock: MockServer;
  client: OpenAI;
  /** The mock's own client, for the answers the gateway must pass on unchanged. */
  direct: OpenAI;
}

/** A mock behind a fault proxy, and a gateway whose only provider is that proxy. */
async function net(toxics: (n: number) => ConnectionToxics | undefined, opts: { faults?: FaultSpec; tune?: (c: ConfigInput) => void } = {}): Promise<Net> {
  const mock = await startMock({ faults: opts.faults });
  const proxy = await startFaultProxy(Number(new URL(mock.url).port));
  proxies.push(proxy);
  proxy.toxics = toxics;
  const s = await startStack({
    config: (mockUrl) => {
      const c = configServedBy(mockUrl, 'net', `http://127.0.0.1:${proxy.port}/v1`);
      opts.tune?.(c);
      return c;
    },
  });
  return {
    s,
    proxy,
    mock,
    client: new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 }),
    direct: new OpenAI({ baseURL: `${mock.url}/v1`, apiKey: TEST_KEY, maxRetries: 0 }),
  };
}

/** Every route: these retry settings (a short fixed backoff), plus `route` fields. */
const retrying =
  (retry: Record<string, unknown>, route: Record<string, unknown> = {}) =>
  (c: ConfigInput) => {
    for (const r of c.routes) Object.assign(r, { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 }, ...retry }, ...route });
  };
/** A route that does not consent to sending a request the provider may have run again. */
const NO_NETWORK = { retryOn: [429, 503] };

// Multi-byte characters of 2, 3 and 4 bytes, and the SSE framing's own "data: " and "\n\n" inside the text.
const PROMPT = 'héllo 世界 🎉🎉 naïve data: \n\n done';
const messages = [{ role: 'user' as const, content: PROMPT }];

async function streamText(client: OpenAI): Promise<string> {
  let text = '';
  const stream = await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true });
  for await (const c of stream) text += c.choices[0]?.delta?.content ?? '';
  return text;
}
const wholeText = async (client: OpenAI) => (await client.chat.completions.create({ model: 'gpt-4o', messages })).choices[0]!.message.content;
const failure = (p: Promise<unknown>) => p.then(() => undefined, (e: unknown) => e as InstanceType<typeof OpenAI.APIError>);
const codeOf = (err: InstanceType<typeof OpenAI.APIError> | undefined) => (err?.error as { code?: string } | undefined)?.code;
const until = async (ok: () => boolean, ms = 3_000) => {
  for (const end = Date.now() + ms; !ok() && Date.now() < end; ) await new Promise((r) => setTimeout(r, 20));
  return ok();
};

describe('an answer delivered in pieces of 1 to 7 bytes', () => {
  it('reaches the client as the mock wrote it: streams, whole answers and embeddings, split inside characters and framing', async () => {
    const n = await net(() => ({ down: { slicer: { min: 1, max: 7, delayMs: 1 } }, up: { slicer: { min: 1, max: 7 } } }), { faults: { stream: { chunks: 30 } } });
    const want = await wholeText(n.direct);
    expect(want).toContain('🎉🎉 naïve data: \n\n done');
    const input = [PROMPT, 'x'];
    const vectors = (await n.direct.embeddings.create({ model: 'text-embedding-3-small', input })).data;
    for (let i = 0; i < 2; i++) {
      expect(await streamText(n.client)).toBe(want);
      expect(await wholeText(n.client)).toBe(want);
      expect((await n.client.embeddings.create({ model: 'text-embedding-3-small', input })).data).toEqual(vectors);
    }
    // Nothing was retried: two requests straight to the mock, six through the gateway.
    expect(n.mock.requests().length).toBe(8);
    expect(await metricSum(n.s, 'stormgate_upstream_attempts_total')).toBe(6);
  }, 30_000);
});

describe('a connection cut after so many bytes of the answer', () => {
  /** The answer's bytes as the provider sends them, and where each part of a 3-chunk stream ends. */
  async function streamBytes(n: Net): Promise<string> {
    await streamText(n.client);
    return Buffer.concat(n.proxy.downData[0]!).toString('latin1');
  }
  /**
   * The next request goes on a new connection that is cut (RST, or FIN) after `at` bytes of its answer; `afterHead`:
   * bytes of its body. An offset into the body is measured on one answer and used on another, whose head may differ in
   * length (the mock's openai-processing-ms): counted from the first byte, it missed by a byte or two on a busy machine.
   */
  async function cutNext(n: Net, kind: 'resetAfterBytes' | 'closeAfterBytes', at: number, afterHead = false) {
    await n.proxy.drop();
    const next = n.proxy.accepted();
    const down = { [kind]: at, afterHead };
    n.proxy.toxics = (c) => (c >= next ? { down } : undefined);
  }

  it('is retried only where retryOn lists network, and answers in the OpenAI shape for what was cut', async () => {
    // Content chunks 30 ms apart: a reset loses what arrived with it (the kernel drops the unread bytes), so a cut
    // meant to come after the first output must come in a later read than that output.
    const n = await net(() => undefined, { faults: { stream: { chunks: 3, chunkDelayMs: 30 } }, tune: retrying(NO_NETWORK) });
    const raw = await streamBytes(n);
    const headersEnd = raw.indexOf('\r\n\r\n') + 4;
    const events = [...raw.matchAll(/\n\n/g)].map((m) => m.index + 2);
    // events[0]: the role chunk, [1]: the first output, [4]: the finish chunk, [5]: [DONE].
    // In the head: from the first byte; in the body: from the head's end (see cutNext).
    const cases: Array<{ at: number; afterHead?: true; code?: string; message?: RegExp; midStream?: true }> = [
      { at: 0, code: 'upstream_unavailable' },
      { at: 20, code: 'upstream_unavailable' }, // mid status line
      { at: headersEnd - 3, code: 'upstream_unavailable' }, // mid headers
      { at: events[0]! - headersEnd, afterHead: true, code: 'upstream_bad_response', message: /broke before its first output/ },
      { at: events[1]! - 3 - headersEnd, afterHead: true, code: 'upstream_bad_response', message: /broke before its first output/ },
      { at: events[2]! - 3 - headersEnd, afterHead: true, midStream: true },
      { at: events[3]! + 7 - headersEnd, afterHead: true, midStream: true },
    ];
    for (const kind of ['resetAfterBytes', 'closeAfterBytes'] as const) {
      for (const c of cases) {
        await cutNext(n, kind, c.at, c.afterHead);
        const before = n.mock.requests().length;
        const err = await failure(streamText(n.client));
        expect(err, `${kind} ${c.at}`).toBeDefined();
        if (c.midStream) {
          // After the first output: the stream ends with the error event the SDK raises, never a clean end.
          expect(codeOf(err), `${kind} ${c.at}`).toBe('stream_interrupted');
          expect(err!.message).toMatch(/the upstream stream was cut/);
        } else {
          expect(err!.status).toBe(502);
          expect(codeOf(err), `${kind} ${c.at}`).toBe(c.code);
          if (c.message) expect(err!.message).toMatch(c.message);
          expect(err!.headers?.get('x-should-retry')).toBe('false');
        }
        // The route does not consent to a second run: one upstream request, no retry.
        expect(n.mock.requests().length - before).toBe(1);
      }
    }
    // Closed after the finish chunk or after [DONE]: the answer is whole, and the client gets it.
    for (const at of [events[4]!, events[5]!, raw.length - 2]) {
      await cutNext(n, 'closeAfterBytes', at - headersEnd, true);
      expect(await streamText(n.client)).toBe(await wholeText(n.direct));
    }
    expect(await until(() => n.proxy.open() <= 1)).toBe(true);
    expect(await metricSum(n.s, 'stormgate_pool_in_use{provider="net"')).toBe(0);
  }, 60_000);

  it('is retried on a new connection where retryOn lists network, before the first output', async () => {
    const n = await net(() => undefined, { faults: { stream: { chunks: 3 } }, tune: retrying({}) });
    const raw = await streamBytes(n);
    const want = await wholeText(n.direct);
    const headersEnd = raw.indexOf('\r\n\r\n') + 4;
    for (const [at, afterHead] of [[0, false], [20, false], [headersEnd - 4, false], [raw.indexOf('\n\n') + 2 - headersEnd, true]] as const) {
      await cutNext(n, 'resetAfterBytes', at, afterHead);
      const before = n.mock.requests().length;
      expect(await streamText(n.client)).toBe(want);
      expect(n.mock.requests().length - before).toBe(2);
    }
  }, 30_000);

  it('of a whole answer with a content-length is a cut answer the provider ran (limit_data), not a success nor a retry', async () => {
    const n = await net(() => undefined, { tune: retrying(NO_NETWORK) });
    await wholeText(n.client);
    const raw = Buffer.concat(n.proxy.downData[0]!).toString('latin1');
    const bodyBytes = raw.length - (raw.indexOf('\r\n\r\n') + 4);
    for (const at of [bodyBytes - 200, bodyBytes - 1]) {
      await cutNext(n, 'closeAfterBytes', at, true);
      const before = n.mock.requests().length;
      const err = await failure(wholeText(n.client));
      expect(err!.status).toBe(502);
      expect(codeOf(err)).toBe('upstream_bad_response');
      expect(err!.message).toMatch(/the answer was cut before its end/);
      expect(n.mock.requests().length - before).toBe(1);
    }
    expect((await requestLine(n.s)).attempts[0].reason).toBe('ok');
  }, 30_000);
});

describe('a rate-limited link', () => {
  it('does not stall a stream whose events keep coming, and a whole answer slower than the deadline gets its 504 on time', async () => {
    const inputs = Array.from({ length: 300 }, (_, i) => `input ${i} ${PROMPT}`);
    const n = await net(() => ({ down: { bytesPerSecond: 8_000 } }), {
      faults: { stream: { chunks: 60 } },
      tune: (c) => {
        c.providers.net!.timeouts = { idleMs: 500, firstTokenMs: 1_000 };
        for (const r of c.routes) r.timeoutMs = 2_000;
      },
    });
    // About 17 KB of events at 8 KB/s: two seconds, four idle periods, past the route's deadline (a stream that
    // has started is bounded by idleMs alone).
    const started = Date.now();
    expect(await streamText(n.client)).toBe(await wholeText(n.direct));
    expect(Date.now() - started).toBeGreaterThan(1_500);
    // About 28 KB of embeddings: 3.5 s at 8 KB/s, past the 2 s deadline.
    const carrying = n.proxy.accepted() - 1;
    const err = await failure(n.client.embeddings.create({ model: 'text-embedding-3-small', input: inputs }));
    expect(err!.status).toBe(504);
    expect(codeOf(err)).toBe('deadline_exceeded');
    // Its connection is given up, not kept reading an answer nobody will get.
    expect(await until(() => !n.proxy.openIds().includes(carrying))).toBe(true);
  }, 30_000);
});

describe('latency and jitter', () => {
  it('of 300 ms each way (up to 200 ms of jitter) change nothing but the time', async () => {
    const n = await net(() => ({ up: { latencyMs: 300, jitterMs: 100 }, down: { latencyMs: 300, jitterMs: 200, slicer: { min: 1, max: 7 } } }), {
      faults: { stream: { chunks: 10, chunkDelayMs: 20 } },
      tune: (c) => void (c.providers.net!.timeouts = { idleMs: 1_000, firstTokenMs: 2_000 }),
    });
    const want = await wholeText(n.direct);
    expect(await streamText(n.client)).toBe(want);
    expect(await wholeText(n.client)).toBe(want);
    expect(await metricSum(n.s, 'stormgate_upstream_attempts_total')).toBe(2);
  }, 30_000);
});

describe('a black hole (the connection open, nothing coming back)', () => {
  const tune = (c: ConfigInput) => {
    c.providers.net!.timeouts = { firstTokenMs: 400, keepAliveMs: 10_000 };
    retrying({ maxAttempts: 3 }, { timeoutMs: 2_500 })(c);
  };

  for (const where of ['new', 'kept'] as const) {
    it(`on a ${where} connection: a stream is retried on another after firstTokenMs, and the silent one is closed`, async () => {
      const n = await net(() => undefined, { tune });
      expect(await streamText(n.client)).toBe(await wholeText(n.direct));
      const first = n.proxy.accepted();
      if (where === 'kept') n.proxy.strand();
      else {
        await n.proxy.drop();
        const up = { blackhole: true };
        n.proxy.toxics = (c) => (c >= first ? { up } : undefined);
      }
      expect(await streamText(n.client)).toBe(await wholeText(n.direct));
      const line = n.s.logs.map((l) => JSON.parse(l) as { attempts?: Array<{ reason: string }> }).at(-1)!;
      expect(line.attempts!.map((a) => a.reason)).toEqual(['timeout_first_token', 'ok']);
      expect(n.proxy.struck.length).toBe(1);
      expect(await until(() => !n.proxy.openIds().includes(n.proxy.struck[0]!))).toBe(true);
    }, 30_000);
  }

  it('on a kept connection: a whole answer gets its 504 at the deadline, and the connection is closed', async () => {
    const n = await net(() => undefined, { tune });
    await wholeText(n.client);
    n.proxy.strand();
    const started = Date.now();
    const err = await failure(wholeText(n.client));
    expect(err!.status).toBe(504);
    expect(codeOf(err)).toBe('deadline_exceeded');
    expect(Date.now() - started).toBeLessThan(5_000);
    expect(await until(() => !n.proxy.openIds().some((id) => n.proxy.struck.includes(id)))).toBe(true);
  }, 30_000);
});

describe('a provider that closes idle connections sooner than keepAliveMs', () => {
  it('costs nothing when it closed them before the next request: no failed attempt, even where network is not retried', async () => {
    const n = await net(() => ({ idleCloseMs: 300 }), { tune: retrying(NO_NETWORK) });
    const want = await wholeText(n.direct);
    for (let i = 0; i < 4; i++) {
      await new Promise((r) => setTimeout(r, 600));
      expect(await wholeText(n.client)).toBe(want);
      await new Promise((r) => setTimeout(r, 600));
      expect(await streamText(n.client)).toBe(want);
    }
    expect(n.proxy.accepted()).toBe(8);
    expect(await metricSum(n.s, 'stormgate_upstream_attempts_total')).toBe(8);
  }, 30_000);

  // The server closes the connection just as the gateway sends its next request on it. The provider never saw it,
  // but the gateway cannot tell that from a provider that read the request and died: a second run needs `network`.
  for (const stream of [false, true]) {
    it(`closing a kept connection as a ${stream ? 'stream' : 'whole'} request arrives: retried where retryOn lists network, a 502 where it does not`, async () => {
      const send = (n: Net) => (stream ? streamText(n.client) : wholeText(n.client));
      const withNetwork = await net(() => ({ closeOnReuse: true }), { tune: retrying({}) });
      const want = await wholeText(withNetwork.direct);
      expect(await send(withNetwork)).toBe(want);
      expect(await send(withNetwork)).toBe(want);
      expect((await requestLine(withNetwork.s)).attempts.map((a: { reason: string }) => a.reason)).toEqual(['ok']);
      const retried = withNetwork.s.logs.map((l) => JSON.parse(l) as { attempts: Array<{ reason: string; code?: string }> }).at(-1)!;
      expect(retried.attempts.map((a) => a.reason)).toEqual(['network', 'ok']);
      expect(withNetwork.mock.requests().length).toBe(3); // one of them the direct one: no request ran twice
      await withNetwork.s.close(); // useStacks closes only the last one

      const without = await net(() => ({ closeOnReuse: true }), { tune: retrying(NO_NETWORK) });
      expect(await send(without)).toBe(want);
      const err = await failure(send(without));
      expect(err!.status).toBe(502);
      expect(codeOf(err)).toBe('upstream_unavailable');
      expect(err!.headers?.get('x-should-retry')).toBe('false');
      expect(without.mock.requests().length).toBe(1);
    }, 30_000);
  }
});
