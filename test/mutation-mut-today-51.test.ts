// Mutation round 51 on the last two days' changes: the prompts of a legacy completion's batch (token-estimate.ts
// promptsOf/promptCount, tokenEstimate's n x prompts, stream-events.ts streamShapeOf), the gap timers in an upstream
// error's body (whole-answer.ts errorGapMs, read-capped.ts gapMs, and attempt.ts, which sets them), the drain's
// Connection: close for answers owed (close-sweep.ts closeAfterAnswers) and its grace end (target-attempts.ts
// graceHolds and its callers), the refusals a client's retry is taken for (client-limits.ts retriesRefusal/toldBack),
// a continuation made the client's completion (delivered-text.ts asSameCompletion), the logprobs of a splice
// (stream-recovery.ts logprobsFrom) and a passthrough redirect's Location (passthrough.ts gatewayLocation).
// 49 hand mutants: 26 killed by the existing files, 14 killed here, 9 equivalent, 0 open.
// Killed by existing files: promptsOf's empty-list check, `every` as `some`, token lists not a batch; the batch
// counted on every API, the completion cap's ceiling dropped; streamShapeOf without the prompts (batch-prompts), n not
// an integer (mutation-mut-stream); the gap timer not refreshed by a byte (whole-answer and read-capped,
// mutation-mut-today-49); no errorGapMs for a whole answer (third-party-suite-67); closeAfterAnswers doing nothing
// (review-shutdown-2026-12-06); graceHolds ignoring the wait, or minAttemptMs, the check after the backoff dropped or
// its retry-after the whole wait, waitOutOwnHoldOff's two checks dropped (mutation-mut-today-42, -49,
// review-shutdown-2026-12-06); retriesRefusal taking a refusal twice, always true, refusals not counted up, no slack
// after the time told (review-client-auth-2026-12-06, mutation-mut-today-50); asSameCompletion's id or created alone,
// an event line dropped, its last unended event lost (mutation-mut-today-50); logprobsFrom dropping the token at the
// seam (review-stream-recovery-2026-12-06); a Location mapped back to the provider's path
// (review-passthrough-2026-12-06).
// Killed here: tokenEstimate's `n > 1` dropped (n: 0 reserved no completion); an error's gap timer only from status
// 400 (a redirect's stalled page held to the deadline), its cut settled as whole (a gzipped error cut by the gap read
// as bad gzip, not as its status), or not ending the connection (the provider's socket held open); a stream request's
// 2xx that is no stream cut at idleMs; a draining request's backoff, with a backup target, answered 503
// gateway_draining instead of trying the backup; retriesRefusal's end at exactly the time held (`>=`), a refusal
// whose time passed counted with the next, a later refusal's time not extending the earlier's, a refusal told exactly
// 60 s not counted; a first chunk without `created` making the continuation's chunks lose theirs; a Location of
// exactly the passthrough path, or with a query or fragment right after it, not mapped back, and one to a longer
// sibling path (/v1/filesystem) mapped as if it were under it.
// Equivalent: tokenEstimate's `n > 1` as `n > 0` (n: 0 and n: 1 give one choice either way); streamShapeOf's prompts
// counted on every API but chat (responses and messages return earlier, an embeddings body has no prompt, and an
// 'other' stream ends with its upstream, never by its choices); closeAfterAnswers without the headersSent check (Node
// reads shouldKeepAlive only as it writes the head); whole-answer.ts's clearTimeout in #settle and read-capped.ts's in
// finally dropped (the timer then aborts a completed request, which undici's client-h1 ignores, or destroys a body
// the for-await destroyed already: only the timer lingers for idleMs); asSameCompletion re-serialising a chunk of the
// completion's own id when no created was known (the same JSON, written again); logprobsFrom passing on a logprobs
// object with no token list instead of null (no token either way), and counting 1 for a token without a string
// `token` (every server's token has one, and neither count is right for one without); gatewayLocation's test for the
// origin without its slash (what follows an origin and is not `/` cannot start a path).
// No bugs found.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { ConfigSchema } from '../src/config/schema.ts';
import { clientLimits } from '../src/http/client-limits.ts';
import { asSameCompletion } from '../src/pipeline/delivered-text.ts';
import { tokenEstimate } from '../src/policy/token-estimate.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import { chatCompletion, useFakeProviders } from './helpers/fake-provider.ts';
import { ask, busyOnceThen } from './helpers/one-provider.ts';
import { rawGet } from './helpers/raw-http.ts';
import { configServedBy, useGateways, useStacks } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startGateway = useGateways();
const startStack = useStacks();

describe('the token estimate of a request that asks for n: 0', () => {
  it('reserves one choice\'s completion cap (for each prompt of a batch), as for any n the provider would refuse', () => {
    expect(tokenEstimate('chat', 400, { max_tokens: 10, n: 0 })).toEqual({ prompt: 100, completion: 10 });
    expect(tokenEstimate('completions', 400, { prompt: ['a', 'b'], max_tokens: 10, n: 0 })).toEqual({ prompt: 100, completion: 20 });
  });
});

describe('clientLimits.retriesRefusal: which refusals a client\'s retry is taken for', () => {
  /** A client `agents` of `requestsPerMinute` (burst 1) on a clock the test sets; random 0, so told = the wait. */
  function limits(requestsPerMinute: number) {
    const clock = { now: 0 };
    const limit = clientLimits({ agents: { requestsPerMinute, burst: 1 } }, { store: new MemoryStore(), now: () => clock.now, random: () => 0, onLimited: () => {} })!;
    const told = async () => (await limit.admit('agents'))?.retryAfterMs;
    return { clock, limit, told };
  }

  it('takes each of two refusals once, up to and including the last millisecond held (the time told and its slack)', async () => {
    const { clock, limit, told } = limits(60);
    expect(await told()).toBeUndefined();
    const first = await told();
    const second = await told();
    // A refused request keeps its place: the second is told to come back a slot later.
    expect(first).toBe(1_000);
    expect(second).toBe(2_000);
    // The end held: the later time told and 10 s of slack.
    clock.now = 12_000;
    expect(limit.retriesRefusal('agents')).toBe(true);
    expect(limit.retriesRefusal('agents')).toBe(true);
    expect(limit.retriesRefusal('agents')).toBe(false);
  });

  it('forgets a refusal whose time passed with no retry: the next refusal owes one retry, not two', async () => {
    const { clock, limit, told } = limits(60);
    expect(await told()).toBeUndefined();
    expect(await told()).toBe(1_000);
    // Its retry never came; long after, admitted again, then refused again.
    clock.now = 100_000;
    expect(await told()).toBeUndefined();
    expect(await told()).toBe(1_000);
    clock.now = 101_000;
    expect(limit.retriesRefusal('agents')).toBe(true);
    expect(limit.retriesRefusal('agents')).toBe(false);
  });

  it('holds two refusals until the later one\'s time: a retry of the first, after the first\'s time, is still one of them', async () => {
    const { clock, limit, told } = limits(60);
    expect(await told()).toBeUndefined();
    expect(await told()).toBe(1_000); // held to 11 s
    clock.now = 5_000;
    expect(await told()).toBeUndefined();
    expect(await told()).toBe(1_000); // held to 16 s
    clock.now = 13_000;
    expect(limit.retriesRefusal('agents')).toBe(true);
    expect(limit.retriesRefusal('agents')).toBe(true);
  });

  it('counts a refusal told to come back in exactly a minute (60,000 ms is within the minute)', async () => {
    const { clock, limit, told } = limits(1);
    expect(await told()).toBeUndefined();
    expect(await told()).toBe(60_000);
    clock.now = 60_000;
    expect(limit.retriesRefusal('agents')).toBe(true);
  });
});

describe('a continuation of a completion whose first chunk carried no created time', () => {
  it('keeps the created time of its own chunks (only the id is made the completion\'s)', async () => {
    async function* source() {
      yield `data: ${JSON.stringify({ id: 'chatcmpl-Q', object: 'chat.completion.chunk', created: 200, model: 'm', choices: [{ index: 0, delta: { content: 'ld' }, finish_reason: null }] })}\n\n`;
    }
    let out = '';
    for await (const t of asSameCompletion(source(), { id: 'chatcmpl-A', created: undefined })) out += t;
    expect(JSON.parse(out.trim().slice('data: '.length))).toMatchObject({ id: 'chatcmpl-A', created: 200 });
  });
});

// ---- Real HTTP from here on: a provider of the test's own (node:http), the gateway, fetch. ----

/** A gateway with one target on `origin` (one attempt, no parking), its idleMs `idleMs`, routes deadline `timeoutMs`. */
async function gatewayOn(origin: string, idleMs: number, timeoutMs = 20_000) {
  const config = ConfigSchema.parse({
    server: { host: '127.0.0.1', port: 0, logLevel: 'warn' },
    providers: { p: { family: 'openai', baseUrl: `${origin}/v1`, apiKey: 'sk-provider-51-0123456789abcdef', breaker: false, timeouts: { idleMs } } },
    routes: [
      { name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'p' }], park: false, timeoutMs, retry: { maxAttempts: 1 } },
      { name: 'speech', match: { path: '/v1/audio/speech' }, targets: [{ provider: 'p' }], park: false, timeoutMs, retry: { maxAttempts: 1 } },
    ],
  });
  return startGateway(config);
}

const chat = (url: string, stream = false) =>
  fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream }),
  });

/** Answers `status` with `headers` and `body`'s first `sent` bytes (its content-length the whole), then stalls. */
function stalled(status: number, headers: Record<string, string>, body: Buffer, sent: number) {
  return (req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(status, { ...headers, 'content-length': String(body.length) });
      res.write(body.subarray(0, sent));
    });
  };
}

const errorJson = (message: string, code: string) => JSON.stringify({ error: { message, type: 'invalid_request_error', param: null, code } });

describe('a redirect (3xx) whose page stalls after its headers, to a whole (non-stream) request', () => {
  it('is judged by its status once idleMs passes with no byte: 502 upstream_redirect, long before the deadline', async () => {
    const page = Buffer.from(`<html><body>${'Moved. '.repeat(40)}</body></html>`);
    const p = await startProvider(stalled(301, { 'content-type': 'text/html', location: 'https://elsewhere.example.com/v1/chat/completions' }, page, 20));
    const url = await gatewayOn(p.origin, 400, 8_000);
    const startedAt = Date.now();
    const res = await chat(url);
    expect(res.status).toBe(502);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('upstream_redirect');
    expect(Date.now() - startedAt).toBeLessThan(5_000);
  });
});

describe("a gzipped error whose body stalls after its first half (a whole request)", () => {
  it('is the error its status says (400 to the client), not an answer that is bad gzip', async () => {
    const gz = gzipSync(errorJson('the messages are not valid for this model, and this message goes on for a while', 'invalid_value'));
    const p = await startProvider(stalled(400, { 'content-type': 'application/json', 'content-encoding': 'gzip' }, gz, Math.floor(gz.length / 2)));
    const url = await gatewayOn(p.origin, 400);
    const res = await chat(url);
    expect(res.status).toBe(400);
    await res.text();
  });
});

describe("an error's body that stalls past idleMs (a whole request)", () => {
  it('ends its connection to the provider: a half-read body is not left holding it', async () => {
    let closedAt: number | undefined;
    const p = await startProvider((req, res) => {
      req.socket.once('close', () => (closedAt = Date.now()));
      stalled(503, { 'content-type': 'application/json' }, Buffer.from(errorJson('busy', 'server_busy')), 10)(req, res);
    });
    const url = await gatewayOn(p.origin, 400);
    const res = await chat(url);
    expect(res.status).toBe(503);
    await res.text();
    const answeredAt = Date.now();
    for (let i = 0; i < 30 && closedAt === undefined; i++) await sleep(100);
    expect(closedAt).toBeDefined();
    expect(closedAt! - answeredAt).toBeLessThan(3_000);
  });
});

describe('a stream request on a path with no known API, answered 200 with a body that is no stream and pauses past idleMs', () => {
  it('is waited for (idleMs bounds an error body\'s gaps, not an answer\'s): the client gets all of it', async () => {
    const p = await startProvider((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'audio/mpeg' });
        res.write('ID3-first-half-');
        setTimeout(() => res.end('second-half'), 1_500);
      });
    });
    const url = await gatewayOn(p.origin, 400);
    const res = await fetch(`${url}/v1/audio/speech`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'tts-1', input: 'hi', voice: 'alloy', stream: true }),
    });
    expect(res.status).toBe(200);
    expect(await res.text()).toBe('ID3-first-half-second-half');
  });
});

describe('a backoff begun before SIGTERM that ends with less than minAttemptMs of grace left, with a backup target', () => {
  it('sends the request to the backup, which answers within the grace period (only the last target gets 503 gateway_draining)', async () => {
    // As mutation-mut-today-49: p's 503 at 0, a 1.5 s backoff, the drain at 300 ms, the grace end at 1.8 s (minAttemptMs 1 s).
    const p = await startProvider(busyOnceThen());
    const q = await startProvider((req, res) => {
      req.resume();
      req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end(chatCompletion('from q')));
    });
    const provider = (origin: string) => ({ family: 'openai' as const, baseUrl: `${origin}/v1`, apiKey: 'p-key-0123456789', breaker: false as const });
    const s = await startStack({
      config: () => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: { p: provider(p.origin), q: provider(q.origin) },
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'p' }, { provider: 'q' }], park: false, minAttemptMs: 1_000, retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 1_500, capMs: 1_500 } } }],
        drain: { preStopMs: 500, graceMs: 1_000 },
      }),
    });
    const answer = ask(s.url);
    await sleep(300);
    const drained = s.gateway.drain();
    expect(await answer).toMatchObject({ status: 200 });
    expect(p.hits()).toBe(1);
    expect(q.hits()).toBe(1);
    await drained;
  });
});

describe('a passthrough redirect to the provider\'s own address', () => {

  it('is mapped back when it is the passthrough path itself or has a query or fragment right after it; a sibling path that only begins the same goes on as it is', async () => {
    let origin = '';
    const to: Record<string, string> = {
      '/v1/files/a': '/v1/files',
      '/v1/files/b': '/v1/files?purpose=batch',
      '/v1/files/c': '/v1/files#list',
      '/v1/files/d': '/v1/filesystem/x',
    };
    const p = await startProvider((req, res) => {
      req.resume();
      res.writeHead(302, { location: `${origin}${to[req.url ?? ''] ?? '/nowhere'}` }).end();
    });
    origin = p.origin;
    const s = await startStack({
      config: (mockUrl) => ({ ...configServedBy(mockUrl, 'files', `${p.origin}/v1`), passthrough: { provider: 'files', paths: ['/v1/files'], methods: ['GET'] } }),
    });
    const location = async (path: string) => {
      const res = await rawGet(`${s.url}${path}`);
      expect(res.status).toBe(302);
      return res.headers.location;
    };
    expect(await location('/v1/files/a')).toBe('/v1/files');
    expect(await location('/v1/files/b')).toBe('/v1/files?purpose=batch');
    expect(await location('/v1/files/c')).toBe('/v1/files#list');
    expect(await location('/v1/files/d')).toBe(`${p.origin}/v1/filesystem/x`);
  });
});
