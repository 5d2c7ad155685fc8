// Third-party failure-scenario suite 57: an outside QA team's suite, written from the README alone ("Retry budget,
// circuit breaker, hold-offs, parking", "Priority pools, adaptive concurrency, load shedding", "Failover and API
// families" on `streamRecovery`, "Streaming", "Client keys", "Configuration reference"), on BEHAVIOURS NEW OR CHANGED
// RECENTLY. Driven with the official `openai` 6.x SDK (and plain fetch or node:http where the raw answer or the raw
// request matters) over real HTTP on 127.0.0.1 against the bundled mock provider (its fault spec: per-request 429s with
// retry-after, slow streams, mid-stream error events), and hand-rolled node:http upstreams for what the mock cannot do
// (a server that writes its failure as text, a request-fault error event after output, a log of the raw request URL).
//  1. A 429 with retry-after (a second or more) on the primary, with a healthy backup: the request that got it moves on
//     to the backup at once with parking on, with `park: false` and with a `park.maxWaitMs` shorter than the hold-off;
//     when the backup fails too, it comes back and waits the hold-off out on the primary (all three ways); a hint under
//     a second is waited out in place while newcomers go to the backup; a deadline too short to wait ends at once.
//  2. Priority pools: a class's `maxShare` keeps capacity free for the other classes, idle or not (batch's long streams
//     fill their share and no more, online requests get a slot at once, batch's queued streams still all finish); the
//     default maxShare of 1 lets batch take every slot; "at least one slot"; start-up refuses a maxShare below minShare
//     (file, line, YAML path, what was expected), of 0, or over 1; an `x-stormgate-priority` sent twice (two header
//     lines, or one comma-joined value) takes the lowest class it names, and never raises a route's class; a batch
//     request its share keeps out, with too little time left, is shed at once.
//  3. `streamRecovery: continue` after the provider's own error event mid-stream (an overload from an OpenAI-compatible
//     primary, continued by an OpenAI-compatible backup by splicing and by a Claude backup by prefill; an Anthropic
//     primary's `overloaded_error`, translated; a backup whose answer does not match is not spliced on) against an
//     error event that blames the request (`content_filter`) or the account (`insufficient_quota`), which reach the
//     client as they came with the backup never asked.
//  4. Client keys: a key repeated in the query string (`?key=`, `?api-key=`) never reaches the provider, on a managed
//     path (the SDK's `defaultQuery`) or a passthrough one (the other query parameters kept), percent-encoded or
//     written as it is (a base64 key's `+`, `/`, `=`); a key in the query alone is no key.
//  5. Streams: a server that writes its failure as text then `[DONE]` reaches the SDK as an error, not a complete
//     answer; `streamRecovery` finishes it from the backup; before the first output it is a broken attempt, retried;
//     a malformed event in a stream that does finish is dropped and the answer stands (logged as a warning).
// Bounds are generous: a loaded 2-core machine.
// Found here: one gateway bug, fixed. A client key with `+` (a base64 key, as `openssl rand -base64 32` makes), written
// into the query unencoded (`?key=${key}`, as a client building its URL by hand does), reached the provider: the
// query was read as a form, whose decoder turns `+` into a space, so the value no longer equalled the key (the
// percent-encoded form was taken out); the other parameters were also re-encoded on the way (`%20` became `+`, `~`
// `%7E`). A value now counts as the key read either way, and the rest of the query goes on as it came
// (src/http/client-auth.ts withoutKeyInQuery; README "Client keys"). Everything else behaves as the README says: the
// 429's request moves on at once under all three parking settings and comes back to wait the hold-off out when the
// backup fails; batch holds exactly its maxShare (8 of 10) of streams while online is answered at once, and a batch
// request its share keeps out is shed at once with 429; the config errors name file, line and path. Design questions
// (reported, not built): a query parameter holding ANOTHER client's key goes on to the provider (only the sender's
// own is taken out, under any parameter name); an x-stormgate-priority of `bulk, batch` takes batch and logs no
// `unknownPriority` for the `bulk` it ignored.
import { request as httpRequest } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import type { FaultSpec } from '../src/mock/faults.ts';
import type { MockServer } from '../src/mock/server.ts';
import { streamedText } from './helpers/chat-stream.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { killNow, useGatewayProcesses } from './helpers/gateway-process.ts';
import { scripted, type Script, type Seen } from './helpers/scripted-provider.ts';
import { scrapeMetrics, TEST_KEY, useExtraMocks, useGateways } from './helpers/stack.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();
const startUpstream = useFakeProviders();
const startProcess = useGatewayProcesses();

const CHAT = '/v1/chat/completions';
const messages = [{ role: 'user' as const, content: 'hi' }];
/** What the bundled mock answers `hi` with, streamed or not (the same text from every mock). */
const MOCK_TEXT = 'Mock answer to: hi';
const FAST_RETRY = { maxAttempts: 3, backoff: { strategy: 'fixed' as const, baseMs: 5, capMs: 5 } };

type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- a log line is JSON: tests read whatever field they check
type LogLine = Record<string, any>;

interface Gw {
  url: string;
  logs: string[];
  client(opts?: { maxRetries?: number; headers?: Record<string, string>; query?: Record<string, string>; apiKey?: string; counter?: { requests: number } }): OpenAI;
  /** The request log lines written so far (the lines with a route). */
  lines(): LogLine[];
}

async function gateway(config: ConfigInput): Promise<Gw> {
  const logs: string[] = [];
  const url = await startGateway(ConfigSchema.parse(config), { logs });
  return {
    url,
    logs,
    client: (c = {}) =>
      new OpenAI({
        baseURL: `${url}/v1`,
        apiKey: c.apiKey ?? 'sk-client-not-a-provider-key',
        maxRetries: c.maxRetries ?? 0,
        logLevel: 'off',
        defaultHeaders: c.headers,
        defaultQuery: c.query,
        fetch: async (u, init) => {
          if (c.counter) c.counter.requests++;
          return fetch(u, init);
        },
      }),
    lines: () => logs.map((l) => JSON.parse(l) as LogLine).filter((l) => typeof l.route === 'string'),
  };
}

/** The request log line of one request (by its x-stormgate-request-id), once written. */
async function lineOf(g: Gw, reqId: string | null): Promise<LogLine> {
  const until = Date.now() + 2_000;
  for (;;) {
    const line = g.lines().find((l) => l.reqId === reqId);
    if (line) return line;
    if (Date.now() > until) throw new Error(`no log line for request ${reqId}`);
    await sleep(10);
  }
}

const provider = (baseUrl: string, extra: Partial<ProviderInput> = {}): ProviderInput => ({
  family: 'openai',
  baseUrl,
  apiKey: TEST_KEY,
  maxConnections: 32,
  breaker: false,
  ...extra,
});

/** A primary mock and a backup mock behind one chat route (primary first); breakers off, so hold-offs act alone. */
async function primaryAndBackup(o: { primary?: FaultSpec; backup?: FaultSpec; route?: Partial<RouteInput> }): Promise<Gw & { primary: MockServer; backup: MockServer }> {
  const primary = await startMock({ apiKey: TEST_KEY, faults: o.primary });
  const backup = await startMock({ apiKey: TEST_KEY, faults: o.backup });
  const g = await gateway({
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    providers: { primary: provider(`${primary.url}/v1`), backup: provider(`${backup.url}/v1`) },
    routes: [{ name: 'chat', match: { path: CHAT }, targets: [{ provider: 'primary' }, { provider: 'backup' }], retry: FAST_RETRY, ...o.route }],
  });
  return { ...g, primary, backup };
}

/** One non-streamed SDK chat call, timed: its answer's target, or the SDK error it raised. */
async function timedChat(g: Gw, headers: Record<string, string> = {}): Promise<{ ms: number; target: string | null; fallback: string | null; attempts: string | null; text?: string; err?: InstanceType<typeof OpenAI.APIError> }> {
  const t0 = Date.now();
  try {
    const { data, response } = await g.client({ headers }).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    return {
      ms: Date.now() - t0,
      target: response.headers.get('x-stormgate-target'),
      fallback: response.headers.get('x-stormgate-fallback'),
      attempts: response.headers.get('x-stormgate-attempts'),
      text: data.choices[0]?.message.content ?? '',
    };
  } catch (e) {
    const err = e as InstanceType<typeof OpenAI.APIError>;
    expect(err).toBeInstanceOf(OpenAI.APIError);
    return { ms: Date.now() - t0, target: err.headers?.get('x-stormgate-target') ?? null, fallback: null, attempts: null, err };
  }
}

/** An OpenAI chat chunk as a compatible server frames it. */
const chunk = (delta: Record<string, unknown>, finish: string | null = null): string =>
  `data: ${JSON.stringify({ id: 'chatcmpl-tp57', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
const DONE = 'data: [DONE]\n\n';

/** A whole chat completion a hand-rolled upstream answers with. */
const wholeAnswer = (text: string): Script => ({
  headers: { 'content-type': 'application/json' },
  steps: [
    JSON.stringify({
      id: 'chatcmpl-tp57',
      object: 'chat.completion',
      created: 1,
      model: 'gpt-4o',
      choices: [{ index: 0, message: { role: 'assistant', content: text }, finish_reason: 'stop' }],
      usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
    }),
  ],
});

// ---------------------------------------------------------------------------------------------------------------
describe('1. a 429 with retry-after on the primary, with a backup', () => {
  const parkings: Array<[string, RouteInput['park']]> = [
    ['parking on', {}],
    ['park: false', false],
    ['a park.maxWaitMs shorter than the hold-off', { maxWaitMs: 500 }],
  ];

  it.each(parkings)('the request that got the hint moves on to the backup at once, as every newcomer does during the hold-off (%s)', async (_name, park) => {
    // README: "*a hint of a second or more, and a next target that may answer*: it moves on to that target at once, as
    // every newcomer does during the hold-off (`held_off`)." and "With parking off, or a hold-off longer than what is
    // left of `park.maxWaitMs`, it still moves on".
    const s = await primaryAndBackup({ primary: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '3' } }] }, route: { park } });
    const first = await timedChat(s);
    expect(first.err).toBeUndefined();
    expect(first.target).toBe('backup/gpt-4o');
    expect(first.text).toBe(MOCK_TEXT);
    expect(first.ms).toBeLessThan(1_500);
    // README: x-stormgate-attempts is "the request's upstream attempts, every target's".
    expect(first.attempts).toBe('2');
    expect(first.fallback).toBe('held_off');
    // A newcomer during the hold-off goes to the backup too; the primary is sent nothing more.
    const second = await timedChat(s);
    expect([second.target, second.ms < 1_500]).toEqual(['backup/gpt-4o', true]);
    expect([s.primary.stats().total, s.backup.stats().total]).toEqual([1, 2]);
  });

  it('a stream that got the 429 moves on to the backup too, before its first byte, and reads the backup\'s whole answer', async () => {
    // README: "Retries and failover happen only before that first byte" and the hint "moves on to that target at once".
    const s = await primaryAndBackup({ primary: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '3' } }] }, route: { park: false } });
    const t0 = Date.now();
    const { data: stream, response } = await s.client().chat.completions.create({ model: 'gpt-4o', messages, stream: true }).withResponse();
    expect(await streamedText(stream)).toMatchObject({ text: MOCK_TEXT, err: undefined });
    expect(Date.now() - t0).toBeLessThan(1_500);
    expect(response.headers.get('x-stormgate-target')).toBe('backup/gpt-4o');
    expect([s.primary.stats().total, s.backup.stats().total]).toEqual([1, 1]);
  });

  it.each(parkings)('when the backup fails too, it comes back and waits the hold-off out on the primary, answered there (%s)', async (_name, park) => {
    // README: "Only if none can take it does it come back for this target, parked for the whole hold-off" and "it
    // still moves on, and comes back to wait the rest of the hold-off out itself (no parking lot) should no other
    // target answer".
    const s = await primaryAndBackup({
      primary: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '2' } }] },
      backup: { errors: [{ status: 503 }] },
      route: { park },
    });
    const first = await timedChat(s);
    expect(first.err).toBeUndefined();
    expect(first.target).toBe('primary/gpt-4o');
    expect(first.text).toBe(MOCK_TEXT);
    expect(first.ms).toBeGreaterThanOrEqual(1_900);
    expect(first.ms).toBeLessThan(8_000);
    expect(s.primary.stats().total).toBe(2);
    expect(s.backup.stats().total).toBeGreaterThanOrEqual(1);
    // Nothing reached the primary during its hold-off: its second request came after the 2 s it asked for.
    const [a, b] = s.primary.requests();
    expect(b!.receivedAt - a!.receivedAt).toBeGreaterThanOrEqual(1_900);
  });

  it('a hint under a second is waited out in place, while the hold-off sends a newcomer to the backup', async () => {
    // README: "*otherwise* (a shorter hint, no other target): it waits the hint out itself when the hint is within
    // `maxWaitHintMs`; ... the hold-off still keeps every other request away meanwhile (they go to the next target ...)".
    const s = await primaryAndBackup({ primary: { errors: [{ status: 429, times: 1, headers: { 'retry-after-ms': '600' } }] }, route: { park: false } });
    const firstP = timedChat(s);
    await sleep(150);
    const newcomer = await timedChat(s);
    const first = await firstP;
    expect([first.target, first.text]).toEqual(['primary/gpt-4o', MOCK_TEXT]);
    expect(first.ms).toBeGreaterThanOrEqual(550);
    expect(first.ms).toBeLessThan(5_000);
    expect(newcomer.target).toBe('backup/gpt-4o');
    expect(s.primary.stats().total).toBe(2);
    expect(s.backup.stats().total).toBe(1);
  });

  it('with a deadline too short to wait the hold-off out and the backup failing, it ends at once with a failure, not provider_held_off', async () => {
    // README: "The one wait rule ... wait only if the expected availability ... leaves at least `minAttemptMs` (1000)
    // before the deadline; otherwise answer at once" and "a request that failed on one target and then found none that
    // could take it ... ends with that failure, not with a `load_shed` or `provider_held_off` that invites the SDK back".
    const s = await primaryAndBackup({
      primary: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '3' } }] },
      backup: { errors: [{ status: 503 }] },
      route: { park: false },
    });
    const r = await timedChat(s, { 'x-stormgate-timeout-ms': '2500' });
    expect(r.err).toBeDefined();
    expect(r.ms).toBeLessThan(1_500);
    expect((r.err!.error as { code?: string } | undefined)?.code).not.toBe('provider_held_off');
    expect(s.primary.stats().total).toBe(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('2. priority pools: maxShare', () => {
  /** One mock whose streams take ~3 s (6 chunks 500 ms apart) and whose whole answers come at once. */
  async function pooled(classes: Record<string, { minShare?: number; maxShare?: number; maxQueue?: number }> | undefined, routePriority?: string) {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { stream: { chunks: 6, chunkDelayMs: 500 } } });
    const g = await gateway({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: { mock: provider(`${mock.url}/v1`, { maxConnections: 10, pools: { maxConcurrent: 10, ...(classes ? { classes } : {}) } }) },
      routes: [{ name: 'chat', match: { path: CHAT }, targets: [{ provider: 'mock' }], park: false, ...(routePriority ? { priority: routePriority } : {}) }],
    });
    return { ...g, mock };
  }
  /** Streams the mock has open right now. */
  const openStreams = (m: MockServer): number => m.requests().filter((r) => r.stream && r.endedAt === undefined).length;
  async function until(cond: () => boolean, withinMs: number): Promise<void> {
    const end = Date.now() + withinMs;
    while (!cond()) {
      if (Date.now() > end) throw new Error('condition not met in time');
      await sleep(20);
    }
  }
  const batchStream = (g: Gw) => g.client({ headers: { 'x-stormgate-priority': 'batch' } }).chat.completions.create({ model: 'gpt-4o', messages, stream: true }).then(streamedText);

  it('batch streams fill their maxShare and no more; online requests get a slot at once; the queued batch streams all finish', async () => {
    // README: "A class may use any capacity the others leave idle, up to its `maxShare` of `maxConcurrent` ...
    // `batch: { minShare: 0.1, maxShare: 0.8 }` keeps a fifth of the pool free for the other classes, idle or not".
    const s = await pooled({ online: { minShare: 0.5 }, batch: { minShare: 0.1, maxShare: 0.8 } });
    const batch = Array.from({ length: 12 }, () => batchStream(s));
    await until(() => openStreams(s.mock) >= 8, 5_000);
    await sleep(300);
    expect(openStreams(s.mock)).toBe(8);
    const inUse = (await scrapeMetrics(s.url)).find((m) => m.name === 'stormgate_pool_in_use' && m.labels.priority === 'batch');
    expect(inUse?.value).toBe(8);
    // Online, arriving while batch holds its share: answered at once, not after a batch stream ends.
    const online = await Promise.all([timedChat(s), timedChat(s)]);
    for (const o of online) {
      expect(o.err).toBeUndefined();
      expect(o.ms).toBeLessThan(1_000);
    }
    expect(openStreams(s.mock)).toBe(8);
    const done = await Promise.all(batch);
    expect(done.map((d) => [d.text, d.err])).toEqual(Array.from({ length: 12 }, () => [MOCK_TEXT, undefined]));
    // Over the whole run, never more than batch's 8 streams open at once at the provider.
    const streams = s.mock.requests().filter((r) => r.stream);
    const overlap = (t: number) => streams.filter((r) => r.receivedAt <= t && (r.endedAt ?? Infinity) > t).length;
    expect(Math.max(...streams.map((r) => overlap(r.receivedAt)))).toBeLessThanOrEqual(8);
  }, 30_000);

  it('with the default maxShare (1), batch streams take every idle slot and an online request waits for one to end', async () => {
    // README: "up to its `maxShare` of `maxConcurrent` (default 1: all of it) ... A slot is given back only when its
    // answer ends, so a batch job's minutes-long streams that took every idle slot ... leave each online request
    // arriving ... to wait for one of them to end".
    const s = await pooled(undefined);
    const batch = Array.from({ length: 10 }, () => batchStream(s));
    await until(() => openStreams(s.mock) >= 10, 5_000);
    const online = await timedChat(s);
    expect(online.err).toBeUndefined();
    expect(online.ms).toBeGreaterThanOrEqual(1_000);
    await Promise.all(batch);
  }, 30_000);

  it('a maxShare worth less than a slot still gives its class one slot, and online is not held up by it', async () => {
    // README: "up to its `maxShare` of `maxConcurrent` (... at least one slot, and at least its `minShare`)".
    const s = await pooled({ online: { minShare: 0.5 }, batch: { maxShare: 0.05 } });
    const batch = Array.from({ length: 3 }, () => batchStream(s));
    await until(() => openStreams(s.mock) >= 1, 5_000);
    await sleep(500);
    expect(openStreams(s.mock)).toBe(1);
    const online = await timedChat(s);
    expect([online.err, online.ms < 1_000]).toEqual([undefined, true]);
    const done = await Promise.all(batch);
    expect(done.map((d) => d.text)).toEqual([MOCK_TEXT, MOCK_TEXT, MOCK_TEXT]);
  }, 30_000);

  it('a batch request its maxShare keeps from a slot, with too little time left, is shed at once (429 load_shed, retry-after), idle slots or not', async () => {
    // README: "a request that cannot expect a slot before its deadline (estimated from the queue ahead of it and how
    // long recent answers held their slots: a stream holds its slot until it ends ...) is rejected at once, not after
    // waiting" and "**Shed** requests get `429` (the lowest class) ... `load_shed`, with `retry-after-ms` and
    // `retry-after` estimated from the queue and `x-should-retry: true`".
    const s = await pooled({ online: { minShare: 0.5 }, batch: { maxShare: 0.2 } });
    // Two streams timed first, so the pool knows a batch stream holds its slot about 3 s.
    await Promise.all([batchStream(s), batchStream(s)]);
    const held = [batchStream(s), batchStream(s)];
    await until(() => openStreams(s.mock) >= 2, 5_000);
    const before = s.mock.stats().total;
    const shed = await timedChat(s, { 'x-stormgate-priority': 'batch', 'x-stormgate-timeout-ms': '2500' });
    expect(shed.err?.status).toBe(429);
    expect(shed.err?.code).toBe('load_shed');
    expect(shed.ms).toBeLessThan(800);
    expect(Number(shed.err?.headers?.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect(shed.err?.headers?.get('x-should-retry')).toBe('true');
    expect(s.mock.stats().total).toBe(before);
    // Eight slots idle all along: an online request is answered at once.
    const online = await timedChat(s);
    expect([online.err, online.ms < 1_000]).toEqual([undefined, true]);
    await Promise.all(held);
  }, 30_000);

  const badShares: Array<[string, string, RegExp]> = [
    ['a maxShare below the class\'s minShare', '{ minShare: 0.3, maxShare: 0.2 }', /maxShare \(0\.2\) is below the class's minShare \(0\.3\): expected at least minShare/],
    ['a maxShare of 0', '{ maxShare: 0 }', /must be > 0, got 0/],
    ['a maxShare over 1', '{ maxShare: 1.5 }', /must be <= 1, got 1\.5/],
  ];
  it.each(badShares)('start-up refuses %s, naming the file, line, YAML path and what was expected', async (_name, batchClass, why) => {
    // README: "A bad file fails at start-up with the file, the line, the YAML path and what was expected ... Both exit
    // with code 2 under the heading `stormgate: invalid config`"; maxShare is a "number > 0 and ≤ 1 ... At least minShare".
    const yaml = [
      'server: { host: 127.0.0.1, port: 0 }',
      'providers:',
      '  mock:',
      '    family: openai',
      '    baseUrl: http://127.0.0.1:9/v1',
      '    apiKey: sk-test-not-used-0123456789',
      '    pools:',
      '      maxConcurrent: 10',
      '      classes:',
      '        online: { minShare: 0.5 }',
      `        batch: ${batchClass}`,
      'routes:',
      '  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: mock } ] }',
      '',
    ].join('\n');
    const p = startProcess('bad-share', yaml);
    const code = await Promise.race([p.exited, sleep(20_000).then(() => 'still running')]);
    await killNow(p.proc);
    expect(code).toBe(2);
    const out = p.output();
    expect(out).toContain('stormgate: invalid config');
    expect(out).toContain(`${p.file}:11:`);
    expect(out).toContain('providers.mock.pools.classes.batch.maxShare');
    // What was expected, with the value found.
    expect(out).toMatch(why);
  }, 30_000);

  /** One chat request by node:http, so a header can go as two lines; its status and request id. */
  function rawPost(url: string, headers: Record<string, string | string[]>): Promise<{ status: number; reqId: string }> {
    return new Promise((resolve, reject) => {
      const req = httpRequest(`${url}${CHAT}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers } }, (res) => {
        res.resume();
        res.on('end', () => resolve({ status: res.statusCode!, reqId: String(res.headers['x-stormgate-request-id']) }));
      });
      req.on('error', reject);
      req.end(JSON.stringify({ model: 'gpt-4o', messages }));
    });
  }

  it('an x-stormgate-priority sent twice takes the lowest class it names: two header lines either way, one comma-joined value, any case', async () => {
    // README: "the `x-stormgate-priority` header (a class name, any case) can only lower it ... Sent twice (`batch,
    // online`), the lowest class it names applies."
    const s = await pooled({ online: { minShare: 0.5 }, batch: { minShare: 0.1 } });
    const sent: Array<string | string[]> = [['batch', 'online'], ['online', 'batch'], 'batch, online', 'Online, BATCH'];
    for (const header of sent) {
      const r = await rawPost(s.url, { 'x-stormgate-priority': header });
      expect(r.status).toBe(200);
      const line = await lineOf(s, r.reqId);
      expect([header, line.priority, line.unknownPriority]).toEqual([header, 'batch', undefined]);
    }
  });

  it('sent twice on a batch route, the header cannot raise the class; an unknown name is ignored and logged', async () => {
    // README: "can only lower it (a batch job cannot promote itself)" and "A name no class has (a typo, `bulk`) is
    // ignored, the route's class applies, and the request's log line says so (`unknownPriority`...)".
    const s = await pooled({ online: { minShare: 0.5 }, batch: { minShare: 0.1 } }, 'batch');
    const raised = await rawPost(s.url, { 'x-stormgate-priority': ['online', 'online'] });
    expect((await lineOf(s, raised.reqId)).priority).toBe('batch');
    const online = await pooled({ online: { minShare: 0.5 }, batch: { minShare: 0.1 } });
    const typo = await rawPost(online.url, { 'x-stormgate-priority': 'bulk' });
    expect(typo.status).toBe(200);
    expect(await lineOf(online, typo.reqId)).toMatchObject({ priority: 'online', unknownPriority: 'bulk' });
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('3. streamRecovery: continue after an error event mid-stream', () => {
  const recovery: Partial<RouteInput> = { streamRecovery: 'continue', park: false };
  /** A primary of the test's own that streams `texts`, then the error event `error`; the bundled mock as its backup. */
  const textThenError = async (texts: string[], error: Record<string, unknown>) => {
    const up = await startUpstream(scripted(() => ({ steps: [chunk({ role: 'assistant', content: '' }), ...texts.map((content) => chunk({ content })), `data: ${JSON.stringify({ error })}\n\n`] })));
    const backup = await startMock({ apiKey: TEST_KEY });
    const g = await gateway({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: { primary: provider(`${up.origin}/v1`), backup: provider(`${backup.url}/v1`) },
      routes: [{ name: 'chat', match: { path: CHAT }, targets: [{ provider: 'primary' }, { provider: 'backup' }], retry: FAST_RETRY, ...recovery }],
    });
    return { g, backup };
  };

  it('an overload error event after the first output is continued by the backup: the SDK reads the whole answer, no error', async () => {
    // README: "on a cut or stall after the first byte ..., or the provider's own error event after it (an overload
    // mid-answer: ... OpenAI's `server_error`; one the breaker counts ...), the gateway asks the next target for the
    // rest" and "any other is sent the original request and spliced on only if its answer begins with exactly the
    // delivered text".
    const s = await primaryAndBackup({ primary: { stream: { errorAfterChunks: 2 } }, route: recovery });
    const stream = await s.client().chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    const got = await streamedText(stream);
    expect(got).toMatchObject({ text: MOCK_TEXT, err: undefined });
    expect([s.primary.stats().total, s.backup.stats().total]).toEqual([1, 1]);
  });

  it('the recovered stream carries the documented comment and counts as recovered', async () => {
    // README: "A recovered stream carries the SSE comment `: stormgate stream recovered from the next target` and
    // counts in `stormgate_stream_ends_total{end="recovered"}`, if the continuation ends whole".
    const s = await primaryAndBackup({ primary: { stream: { errorAfterChunks: 2 } }, route: recovery });
    const res = await fetch(`${s.url}${CHAT}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages, stream: true }) });
    const body = await res.text();
    expect(res.status).toBe(200);
    expect(body).toContain(': stormgate stream recovered from the next target');
    expect(body).not.toContain('"error"');
    expect(body.trimEnd().endsWith('data: [DONE]')).toBe(true);
    const ends = (await scrapeMetrics(s.url)).filter((m) => m.name === 'stormgate_stream_ends_total' && m.labels.end === 'recovered');
    expect(ends.reduce((n, m) => n + m.value, 0)).toBe(1);
  });

  it('a Claude backup continues the overloaded answer from a prefill of the text delivered', async () => {
    // README: "A target that continues an assistant prefill (a Claude model before 4.6 ...) is sent the text already
    // delivered as a prefill and streams the continuation".
    const primary = await startMock({ apiKey: TEST_KEY, faults: { stream: { errorAfterChunks: 2 } } });
    const claude = await startMock({ apiKey: TEST_KEY });
    const g = await gateway({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: { primary: provider(`${primary.url}/v1`), claude: provider(`${claude.url}/v1`, { family: 'anthropic' }) },
      routes: [{ name: 'chat', match: { path: CHAT }, targets: [{ provider: 'primary' }, { provider: 'claude', model: 'claude-sonnet-4-5' }], retry: FAST_RETRY, ...recovery }],
    });
    const got = await streamedText(await g.client().chat.completions.create({ model: 'gpt-4o', messages, stream: true }));
    expect(got.err).toBeUndefined();
    const sent = claude.requests();
    expect(sent).toHaveLength(1);
    expect(sent[0]!.path).toBe('/v1/messages');
    // What the client has is what it was delivered, then the continuation (never the answer again from its start).
    expect(got.text.startsWith('Mock ')).toBe(true);
    expect(got.text).toMatch(/continues after \d+ characters\.$/);
    expect(got.text.split('Mock answer').length).toBeLessThanOrEqual(2);
  });

  it('an Anthropic primary\'s overloaded_error mid-answer, translated for a chat client, is continued by the backup', async () => {
    // README: "the provider's own error event after it (an overload mid-answer: Anthropic's `overloaded_error` ...)".
    const claude = await startMock({ apiKey: TEST_KEY, faults: { stream: { errorAfterChunks: 2 } } });
    const backup = await startMock({ apiKey: TEST_KEY });
    const g = await gateway({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: { claude: provider(`${claude.url}/v1`, { family: 'anthropic' }), backup: provider(`${backup.url}/v1`) },
      routes: [{ name: 'chat', match: { path: CHAT }, targets: [{ provider: 'claude', model: 'claude-sonnet-4-5' }, { provider: 'backup', model: 'gpt-4o' }], retry: FAST_RETRY, ...recovery }],
    });
    const got = await streamedText(await g.client().chat.completions.create({ model: 'gpt-4o', messages, stream: true }));
    expect(got).toMatchObject({ text: MOCK_TEXT, err: undefined });
    expect([claude.stats().total, backup.stats().total]).toEqual([1, 1]);
  });

  it('a backup whose answer does not begin with the text delivered is not spliced on: the client gets the provider\'s own error', async () => {
    // README: "any other is sent the original request and spliced on only if its answer begins with exactly the
    // delivered text ... Otherwise, or if the target rejects the attempt, the client gets the original failure as an
    // error event (the provider's own, when that was the break), never the fallback's rejection."
    const overload = { message: 'The server had an error while processing your request.', type: 'server_error', param: null, code: null };
    const { g, backup } = await textThenError(['Totally ', 'different'], overload);
    const got = await streamedText(await g.client().chat.completions.create({ model: 'gpt-4o', messages, stream: true }));
    expect(got.text).toBe('Totally different');
    expect(got.err).toBeInstanceOf(OpenAI.APIError);
    expect(got.err!.message).toContain(overload.message);
    expect(got.err!.message).not.toContain(MOCK_TEXT);
    expect(backup.stats().total).toBe(1);
  });

  const notContinued: Array<[string, Record<string, unknown>]> = [
    ['the request\'s fault (content_filter)', { message: 'Your request was flagged by the content filter.', type: 'invalid_request_error', param: null, code: 'content_filter' }],
    ['the account\'s refusal (insufficient_quota)', { message: 'You exceeded your current quota.', type: 'insufficient_quota', param: null, code: 'insufficient_quota' }],
  ];
  it.each(notContinued)('an error event after output that is %s reaches the client as it came; the backup is never asked', async (_name, error) => {
    // README: "one the breaker counts, not the request's fault nor the account's refusal, which reach the client as
    // they came".
    const { g, backup } = await textThenError(['Mock ', 'answer'], error);
    const got = await streamedText(await g.client().chat.completions.create({ model: 'gpt-4o', messages, stream: true }));
    expect(got.text).toBe('Mock answer');
    expect(got.err).toBeInstanceOf(OpenAI.APIError);
    expect((got.err as InstanceType<typeof OpenAI.APIError>).code).toBe(error.code);
    expect(got.err!.message).toContain(String(error.message));
    expect(backup.stats().total).toBe(0);
  });

  it('without streamRecovery the overload error event ends the stream with an error the SDK raises, after the partial text', async () => {
    // README: "After the first byte: a cut ... ends the stream with an error event that the SDKs raise ... So does an
    // upstream error event".
    const s = await primaryAndBackup({ primary: { stream: { errorAfterChunks: 2 } }, route: { park: false } });
    const got = await streamedText(await s.client().chat.completions.create({ model: 'gpt-4o', messages, stream: true }));
    expect(got.err).toBeInstanceOf(OpenAI.APIError);
    expect(got.text.length).toBeGreaterThan(0);
    expect(MOCK_TEXT.startsWith(got.text) && got.text !== MOCK_TEXT).toBe(true);
    expect(s.backup.stats().total).toBe(0);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('4. client keys repeated in the query string', () => {
  const CLIENT_KEY = 'sk-client-agents-tp57-0123456789abcdef';

  async function keyed() {
    const seen: Seen[] = [];
    const up = await startUpstream((req, res) => {
      if (req.method === 'GET') {
        seen.push({ body: {}, headers: req.headers, url: req.url ?? '', at: Date.now() });
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ object: 'list', data: [] }));
        return;
      }
      scripted(() => wholeAnswer('ok'), seen)(req, res);
    });
    const g = await gateway({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      auth: { keys: { agents: CLIENT_KEY } },
      providers: { up: provider(`${up.origin}/v1`) },
      routes: [{ name: 'chat', match: { path: CHAT }, targets: [{ provider: 'up' }], park: false }],
      passthrough: { provider: 'up', paths: ['/v1/files'] },
    });
    /** Everything the upstream got, as one text, to look for the key anywhere. */
    const everything = () => JSON.stringify(seen.map((s) => [s.url, s.headers, s.raw ?? s.body]));
    return { ...g, seen, everything };
  }

  it('on a managed path, a ?key= or ?api-key= that repeats the client key (the SDK\'s defaultQuery) is taken out of the URL', async () => {
    // README: "The client's key never reaches a provider: not its headers, and not a query parameter that repeats it
    // (`?key=`, `?api-key=`, as some clients also send it), which is taken out of the URL".
    const g = await keyed();
    for (const param of ['key', 'api-key']) {
      const { data } = await g.client({ apiKey: CLIENT_KEY, query: { [param]: CLIENT_KEY } }).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
      expect(data.choices[0]!.message.content).toBe('ok');
    }
    expect(g.seen.map((s) => s.url)).toEqual(['/v1/chat/completions', '/v1/chat/completions']);
    expect(g.everything()).not.toContain(CLIENT_KEY);
    expect(g.seen.map((s) => s.headers.authorization)).toEqual([`Bearer ${TEST_KEY}`, `Bearer ${TEST_KEY}`]);
  });

  it('on a passthrough path, the repeated key is taken out and the other query parameters go on', async () => {
    // README: "neither a managed path nor a passthrough one hands it to the provider" (commit note) and "The client's
    // key never reaches a provider: ... not a query parameter that repeats it".
    const g = await keyed();
    const res = await fetch(`${g.url}/v1/files?purpose=batch&api-key=${CLIENT_KEY}&limit=5`, { headers: { authorization: `Bearer ${CLIENT_KEY}` } });
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    expect(g.seen).toHaveLength(1);
    const sent = new URL(g.seen[0]!.url, 'http://x');
    expect(sent.pathname).toBe('/v1/files');
    expect(sent.searchParams.get('purpose')).toBe('batch');
    expect(sent.searchParams.get('limit')).toBe('5');
    expect(sent.searchParams.has('api-key')).toBe(false);
    expect(g.everything()).not.toContain(CLIENT_KEY);
  });

  it('a base64 key (+, / and =) written into the query as it is, unencoded, is taken out too; the rest goes on as it came', async () => {
    // README: "The client's key never reaches a provider: ... not a query parameter that repeats it". Client keys made
    // by `openssl rand -base64 32` hold `+`, `/` and `=`; a client that builds its URL as `?key=${key}` sends them
    // as they are, and a form decoder reads the `+` as a space: the value no longer equalled the key, and the key
    // went on to the provider.
    const BASE64_KEY = 'q3J+k9/Zx1v0bN7+Lw2aQe5Ft8yHc4RsUd6Gm0pVjXo=';
    const seen: Seen[] = [];
    const up = await startUpstream((req, res) => {
      seen.push({ body: {}, headers: req.headers, url: req.url ?? '', at: Date.now() });
      req.resume();
      req.on('end', () => void res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ object: 'list', data: [] })));
    });
    const g = await gateway({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      auth: { keys: { agents: BASE64_KEY } },
      providers: { up: provider(`${up.origin}/v1`) },
      routes: [{ name: 'chat', match: { path: CHAT }, targets: [{ provider: 'up' }], park: false }],
      passthrough: { provider: 'up', paths: ['/v1/files'] },
    });
    const asIs = await fetch(`${g.url}/v1/files?after=file~1&q=a%20b&key=${BASE64_KEY}`, { headers: { authorization: `Bearer ${BASE64_KEY}` } });
    const encoded = await fetch(`${g.url}/v1/files?api-key=${encodeURIComponent(BASE64_KEY)}&limit=5`, { headers: { authorization: `Bearer ${BASE64_KEY}` } });
    expect([asIs.status, encoded.status]).toEqual([200, 200]);
    await Promise.all([asIs.arrayBuffer(), encoded.arrayBuffer()]);
    expect(seen.map((s) => s.url)).toEqual(['/v1/files?after=file~1&q=a%20b', '/v1/files?limit=5']);
    expect(JSON.stringify(seen.map((s) => s.headers))).not.toContain(BASE64_KEY);
  });

  it('a key in the query alone is no key: 401 invalid_api_key, nothing sent upstream', async () => {
    // README: "every request ... must carry one as its API key, the way the SDKs send a provider key (`Authorization:
    // Bearer <key>`; `x-api-key` and `api-key` are read too ...); others get `401 invalid_api_key`".
    const g = await keyed();
    const res = await fetch(`${g.url}${CHAT}?key=${CLIENT_KEY}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages }) });
    expect(res.status).toBe(401);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('invalid_api_key');
    expect(g.seen).toHaveLength(0);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('5. a server that writes its failure as text, then [DONE]', () => {
  const failingAfter = (delivered: string[]): Script => ({
    steps: [chunk({ role: 'assistant', content: '' }), ...delivered.map((t) => chunk({ content: t })), 'data: Error: CUDA out of memory\n\n', DONE],
  });

  async function behind(handler: Parameters<typeof startUpstream>[0], route: Partial<RouteInput> = {}, backup?: MockServer) {
    const up = await startUpstream(handler);
    return gateway({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: { primary: provider(`${up.origin}/v1`), ...(backup ? { backup: provider(`${backup.url}/v1`) } : {}) },
      routes: [{ name: 'chat', match: { path: CHAT }, targets: [{ provider: 'primary' }, ...(backup ? [{ provider: 'backup' }] : [])], retry: FAST_RETRY, park: false, ...route }],
    });
  }

  it('after output, it reaches the SDK as an error with the partial text, not a complete answer', async () => {
    // README: "Nor does a `data: [DONE]` after a dropped event, before every choice's `finish_reason`, end the answer
    // cleanly (a server that writes its failure as text, `data: Error: ...`, then its usual `[DONE]`): it is a cut,
    // ... else ended with the error event."
    const g = await behind(scripted(() => failingAfter(['Hel', 'lo'])));
    const got = await streamedText(await g.client().chat.completions.create({ model: 'gpt-4o', messages, stream: true }));
    expect(got.text).toBe('Hello');
    expect(got.err).toBeInstanceOf(OpenAI.APIError);
    // The documented error event: `data: {"error":{...,"code":"stream_interrupted"}}`.
    expect((got.err as InstanceType<typeof OpenAI.APIError>).code).toBe('stream_interrupted');
  });

  it('with streamRecovery: continue, the backup finishes it and the SDK reads the whole answer', async () => {
    // README: "it is a cut, finished by `streamRecovery` where the route has it".
    const backup = await startMock({ apiKey: TEST_KEY });
    const g = await behind(scripted(() => failingAfter(['Mock ', 'answer'])), { streamRecovery: 'continue' }, backup);
    const got = await streamedText(await g.client().chat.completions.create({ model: 'gpt-4o', messages, stream: true }));
    expect(got).toMatchObject({ text: MOCK_TEXT, err: undefined });
    expect(backup.stats().total).toBe(1);
  });

  it('before any output, it is a broken attempt: retried, and the SDK gets the retry\'s answer', async () => {
    // README: "a malformed event, an error event, an early end or a lost connection after the stream began and before
    // the first output is a retryable broken stream".
    const seen: Seen[] = [];
    const g = await behind(scripted((_b, n) => (n === 1 ? failingAfter([]) : { steps: [chunk({ role: 'assistant', content: '' }), chunk({ content: 'fine' }), chunk({}, 'stop'), DONE] }), seen));
    const { data: stream, response } = await g.client().chat.completions.create({ model: 'gpt-4o', messages, stream: true }).withResponse();
    const got = await streamedText(stream);
    expect(got).toMatchObject({ text: 'fine', err: undefined });
    expect(seen).toHaveLength(2);
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
  });

  it('a malformed event in a stream that then finishes is dropped; the answer stands and the log line warns', async () => {
    // README: "A malformed event is dropped (the SDKs would crash on it) and logged: the request's line is a warning,
    // `stream events dropped as malformed`, with `droppedMalformed`, even when the stream ended well".
    const g = await behind(
      scripted(() => ({ steps: [chunk({ role: 'assistant', content: '' }), chunk({ content: 'Hel' }), 'data: {not json\n\n', chunk({ content: 'lo' }), chunk({}, 'stop'), DONE] })),
    );
    const { data: stream, response } = await g.client().chat.completions.create({ model: 'gpt-4o', messages, stream: true }).withResponse();
    const got = await streamedText(stream);
    expect(got).toMatchObject({ text: 'Hello', err: undefined });
    const line = await lineOf(g, response.headers.get('x-stormgate-request-id'));
    expect(line.msg).toContain('stream events dropped as malformed');
    expect(line.droppedMalformed).toBeTruthy();
    expect(line.level).toBe(40);
  });
});
