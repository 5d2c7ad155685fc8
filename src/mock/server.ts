// The fault-injecting mock LLM provider: raw node:http with keep-alive, so it costs the gateway's
// benchmarks next to nothing, and deterministic faults, so the gateway's tests never flake.
import { createServer, type IncomingMessage, type OutgoingHttpHeaders, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { performance } from 'node:perf_hooks';
import { ANTHROPIC_MODELS_BODY, anthropicModelObject, message, messageStream, tokenCount } from './anthropic-responses.ts';
import { flattenHeaders, parseJsonObject, pathOf, readBody } from './body.ts';
import { idSource } from './content.ts';
import { seededRandom } from '../policy/random.ts';
import { handleControl } from './control.ts';
import { Exchange, streamIO, type Family } from './exchange.ts';
import { anthropicErrorBody, errorDetails, MockRequestError, openaiErrorBody, overloadedDetails, type ErrorDetails } from './errors.ts';
import { assertFaultSpec, BROWNOUT_MODES, decide, effectiveSpec, FaultCounters, latencyFor, type BrownoutMode, type Decision, type FaultSpec, type RequestFacts } from './faults.ts';
import { chatCompletion, chatStream, embeddings, modelObject, MODELS_BODY, textCompletion, textCompletionStream, type AnswerContext, type Body, type ThreadState } from './openai-responses.ts';
import { responseObject, responseStream } from './responses-api.ts';
import { DEFAULT_CHUNKS, runStream, type StreamPlan } from './sse.ts';
import { RequestLogRing, StatsCollector, type MockRequestLog, type MockStats } from './stats.ts';
import { goDuration, rateHeaders, rateState, rateTake, refill, refusalHeaders, refusalMessage, requestTokens, type RateBucket, type RateOutcome } from './rate-limit.ts';

export type { MockRequestLog, MockStats } from './stats.ts';
export type { FaultSpec } from './faults.ts';

export interface MockOptions {
  /** Port to listen on; 0 picks a free one. Default: 0. */
  port?: number;
  /** Default: 127.0.0.1. */
  host?: string;
  /** Initial fault spec. Default: none (every request answered at once). */
  faults?: FaultSpec;
  /** When set, requests with another key get 401. Default: any key is accepted. */
  apiKey?: string;
  /** Suppresses the notes on stderr (brownouts, fault changes). Default: false. */
  quiet?: boolean;
  /** Seed of the latency-jitter PRNG. Default: 1. */
  seed?: number;
}

export interface MockServer {
  /** e.g. http://127.0.0.1:41234 (no trailing slash, no /v1). */
  url: string;
  port: number;
  /** Replaces the fault spec; fault counters restart. */
  setFaults(spec: FaultSpec): void;
  /** Merges fields into the spec (shallow; null or undefined removes a field); their counters restart. */
  patchFaults(spec: Partial<FaultSpec>): void;
  /** Current fault spec. */
  faults(): FaultSpec;
  /**
   * Every request gets the brownout answer for durationMs from now; 0 ends the one in force. Returns the brownout that
   * was in force before (ended or replaced), if any.
   */
  brownout(mode: BrownoutMode, durationMs: number): BrownoutMode | undefined;
  stats(): MockStats;
  /** The last 10000 requests, oldest first. */
  requests(): MockRequestLog[];
  /** Clears stats, the request log, fault counters and the rate limit's buckets (not the fault spec). */
  reset(): void;
  /** Closes the server and destroys every socket, hanging requests included. */
  close(): Promise<void>;
}

interface Route {
  family: Family;
  answer(body: Body, ctx: AnswerContext): string;
  stream?: (body: Body, ctx: AnswerContext) => StreamPlan;
}

const json = (build: (body: Body, ctx: AnswerContext) => unknown) => (body: Body, ctx: AnswerContext) => JSON.stringify(build(body, ctx));

const ROUTES: Record<string, Route> = {
  'POST /v1/chat/completions': { family: 'openai', answer: json(chatCompletion), stream: chatStream },
  'POST /v1/completions': { family: 'openai', answer: json(textCompletion), stream: textCompletionStream },
  'POST /v1/embeddings': { family: 'openai', answer: json(embeddings) },
  'POST /v1/responses': { family: 'openai', answer: json(responseObject), stream: responseStream },
  'POST /v1/messages': { family: 'anthropic', answer: json(message), stream: messageStream },
  'POST /v1/messages/count_tokens': { family: 'anthropic', answer: json(tokenCount) },
};

const MODELS_PREFIX = '/v1/models/';

/** A path segment decoded; as sent when it is not valid percent-encoding (a model no list has). */
function decodedSegment(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch {
    return segment;
  }
}

/**
 * GET /v1/models and GET /v1/models/{model}, each in the shape and with the errors of the API it is asked as: Anthropic's
 * when the request carries `anthropic-version`, else OpenAI's. Undefined for any other request.
 */
function modelsRoute(method: string, path: string, anthropic: boolean): Route | undefined {
  if (method !== 'GET' || (path !== '/v1/models' && !path.startsWith(MODELS_PREFIX))) return undefined;
  const id = path === '/v1/models' ? undefined : decodedSegment(path.slice(MODELS_PREFIX.length));
  if (anthropic) return { family: 'anthropic', answer: id === undefined ? () => ANTHROPIC_MODELS_BODY : json(() => anthropicModelObject(id)) };
  return { family: 'openai', answer: id === undefined ? () => MODELS_BODY : json(() => modelObject(id)) };
}

/** Requests per minute advertised in x-ratelimit-limit-requests when the spec sets no requestsPerMinute. */
const DEFAULT_RPM = 100_000;

class MockProvider implements MockServer {
  url = '';
  port = 0;
  private spec: FaultSpec;
  private readonly counters = new FaultCounters();
  private readonly statsCollector = new StatsCollector();
  /** Requests counted against each quota this minute: '*' for the global one, a model name for a per-model override. */
  private readonly quota = new Map<string, { minute: number; used: number }>();
  /** The rate limit's bucket of each model (rateLimit); '' for requests that name none. A new bucket starts full. */
  private readonly buckets = new Map<string, RateBucket>();
  private readonly log = new RequestLogRing(10_000);
  private readonly modelInflight = new Map<string, number>();
  private readonly ids = idSource();
  /** Anthropic message threads this mock holds (`thread: {"type":"create"}`), by the id of their last reply. */
  private readonly threads = new Map<string, ThreadState>();
  private readonly random: () => number;
  private brownoutState: { mode: BrownoutMode; until: number } | undefined = undefined;
  private seq = 0;
  /** Slots of abandoned requests still held (holdAbandoned), cleared on close. */
  private readonly holds = new Set<NodeJS.Timeout>();
  private closing = false;
  private closed: Promise<void> | undefined = undefined;
  readonly server: Server;
  private readonly opts: MockOptions;

  constructor(opts: MockOptions) {
    this.opts = opts;
    this.spec = opts.faults ?? {};
    if (opts.faults !== undefined) assertFaultSpec(opts.faults);
    this.random = seededRandom(opts.seed ?? 1);
    this.server = createServer({ keepAlive: true, noDelay: true, requestTimeout: 0 }, (req, res) => this.onRequest(req, res));
    // Longer than undici's 4 s keep-alive default, so the client always closes idle sockets first.
    this.server.keepAliveTimeout = 65_000;
    this.server.headersTimeout = 66_000;
  }

  // ---------- control ----------

  setFaults(spec: FaultSpec): void {
    assertFaultSpec(spec);
    this.spec = spec;
    this.counters.clear();
    this.buckets.clear();
    this.note(`faults set: ${JSON.stringify(spec)}`);
  }

  patchFaults(patch: Partial<FaultSpec>): void {
    const merged: Record<string, unknown> = { ...this.spec };
    for (const [k, v] of Object.entries(patch)) {
      if (v === null || v === undefined) delete merged[k];
      else merged[k] = v;
    }
    assertFaultSpec(merged);
    this.spec = merged as FaultSpec;
    this.counters.forgetPatched(patch);
    // A new limit starts with full buckets, as a counter restarts with its setting.
    if ('rateLimit' in patch || 'models' in patch) this.buckets.clear();
    this.note(`faults patched: ${JSON.stringify(patch)}`);
  }

  faults(): FaultSpec {
    return this.spec;
  }

  brownout(mode: BrownoutMode, durationMs: number): BrownoutMode | undefined {
    if (!BROWNOUT_MODES.includes(mode)) throw new Error(`unknown brownout mode ${String(mode)} (one of ${BROWNOUT_MODES.join(', ')})`);
    const before = this.activeBrownout();
    if (durationMs === 0) {
      this.brownoutState = undefined;
      if (before !== undefined) this.note(`brownout ${before} ended`);
      return before;
    }
    this.brownoutState = { mode, until: Date.now() + durationMs };
    this.note(`brownout ${mode} for ${durationMs} ms`);
    return before;
  }

  stats(): MockStats {
    return this.statsCollector.snapshot();
  }

  requests(): MockRequestLog[] {
    return this.log.list();
  }

  reset(): void {
    this.statsCollector.reset();
    this.log.clear();
    this.counters.clear();
    this.buckets.clear();
  }

  close(): Promise<void> {
    if (this.closed !== undefined) return this.closed;
    this.closing = true;
    for (const timer of this.holds) clearTimeout(timer);
    this.holds.clear();
    this.closed = new Promise((resolve) => {
      this.server.close(() => resolve());
      // Destroys hanging and keep-alive sockets too; server.close alone would wait for them.
      this.server.closeAllConnections();
    });
    return this.closed;
  }

  private note(msg: string): void {
    if (this.opts.quiet !== true) process.stderr.write(`[mock] ${msg}\n`);
  }

  // ---------- requests ----------

  private onRequest(req: IncomingMessage, res: ServerResponse): void {
    const path = pathOf(req.url);
    if (path.startsWith('/_mock/')) {
      handleControl(this, req, res, path);
      return;
    }
    const method = req.method ?? 'GET';
    const route = modelsRoute(method, path, req.headers['anthropic-version'] !== undefined) ?? ROUTES[`${method} ${path}`];
    const now = Date.now();
    const entry: MockRequestLog = {
      id: ++this.seq,
      receivedAt: now,
      method,
      path,
      stream: false,
      headers: flattenHeaders(req.headers),
      aborted: false,
    };
    this.log.add(entry);
    this.statsCollector.arrived(route === undefined ? 'other' : path, now);
    const family: Family = route?.family ?? (path.startsWith('/v1/messages') ? 'anthropic' : 'openai');
    const x = new Exchange(req, res, entry, family, this.ids('req_'));
    res.on('close', () => this.onClose(x));
    readBody(req, (raw) => {
      if (x.closed) return;
      try {
        this.onBody(x, route, raw);
      } catch (err) {
        this.fail(x, err);
      }
    });
  }

  private onBody(x: Exchange, route: Route | undefined, raw: Buffer | undefined): void {
    const { entry } = x;
    if (route === undefined) {
      this.sendError(x, { ...errorDetails(404), message: `Invalid URL (${entry.method} ${entry.path})` });
      return;
    }
    if (raw === undefined) {
      this.sendError(x, { ...errorDetails(413), type: 'invalid_request_error', message: 'Request body too large (mock).' });
      return;
    }
    let body: Body;
    try {
      body = parseJsonObject(raw);
    } catch {
      this.sendError(x, { ...errorDetails(400), message: 'We could not parse the JSON body of your request (mock).' });
      return;
    }
    if (typeof body['model'] === 'string') entry.model = body['model'];
    entry.stream = body['stream'] === true && route.stream !== undefined;
    if (!this.authorized(x)) {
      this.sendError(x, errorDetails(401));
      return;
    }

    const attempt = entry.headers['x-retry-attempt'];
    const model = entry.model;
    const facts: RequestFacts = {
      model,
      isRetry: attempt !== undefined && attempt !== '' && attempt !== '0',
      inflight: this.statsCollector.inflight,
      modelInflight: model === undefined ? 0 : (this.modelInflight.get(model) ?? 0),
      brownout: this.activeBrownout(),
      rate: this.rateVerdict(x, raw.length, body),
    };
    const decision = decide(this.spec, this.counters, facts, this.random);
    // A request turned away before the rate limit looked at it (brownout, capacity) uses up nothing.
    if (facts.rate !== undefined && decision.kind !== 'brownout' && decision.kind !== 'capacity') this.buckets.set(x.rate!.key, facts.rate.bucket);
    if (decision.kind !== 'capacity') {
      this.admit(x);
      if (effectiveSpec(this.spec, model).holdAbandoned === true) x.wouldEndAt = x.startedAt + this.wouldBeLatency(decision, facts);
    }
    this.act(x, route, body, decision);
  }

  /** The rate limit's verdict on a request (not yet kept), when one is in force for its model; notes the limit on `x`. */
  private rateVerdict(x: Exchange, bodyBytes: number, body: Body): RateOutcome | undefined {
    const limit = effectiveSpec(this.spec, x.entry.model).rateLimit;
    if (limit === undefined || (limit.requestsPerMinute === undefined && limit.tokensPerMinute === undefined)) return undefined;
    x.rate = { limit, key: x.entry.model ?? '' };
    return rateTake(limit, this.buckets.get(x.rate.key), Date.now(), requestTokens(bodyBytes, body));
  }

  /** How long the provider would have worked on an admitted request, for holdAbandoned. */
  private wouldBeLatency(d: Decision, facts: RequestFacts): number {
    if (d.kind === 'answer') return d.latencyMs;
    if (d.kind === 'hang' || (d.kind === 'brownout' && d.mode === 'hang')) return latencyFor(this.spec, facts, this.random);
    // Answered at once (an error, a 503, 529 or 429 brownout, a reset): nothing left to hold.
    return 0;
  }

  private act(x: Exchange, route: Route, body: Body, d: Decision): void {
    switch (d.kind) {
      case 'brownout':
        if (d.mode === 'hang') x.entry.status = 'hang';
        else if (d.mode === '503') this.sendError(x, errorDetails(503));
        else if (d.mode === '529') this.sendError(x, overloadedDetails(x.family));
        else {
          const seconds = Math.max(1, Math.ceil((this.brownoutState!.until - Date.now()) / 1000));
          this.sendError(x, errorDetails(429), { 'retry-after': String(seconds) });
        }
        return;
      case 'capacity':
        this.sendError(x, errorDetails(429), d.headers);
        return;
      case 'rateLimit': {
        const { outcome } = d;
        const limit = outcome.refused === 'tokens' ? 'tokens' : 'requests';
        this.statsCollector.rateLimited(limit);
        const message = refusalMessage(x.family, x.entry.model, outcome);
        this.sendError(x, { ...errorDetails(429), type: limit, message }, refusalHeaders(x.family, x.rate!.limit, outcome));
        return;
      }
      case 'reset':
        x.entry.status = 'reset';
        x.destroy();
        return;
      case 'hang':
        // Never answered: the socket's close (client abort or close()) ends it.
        x.entry.status = 'hang';
        return;
      case 'error':
        this.sendError(x, errorDetails(d.rule.status, d.rule), d.rule.headers);
        return;
      case 'answer':
        this.answer(x, route, body, d).catch((err: unknown) => this.fail(x, err));
        return;
    }
  }

  private async answer(x: Exchange, route: Route, body: Body, d: Extract<Decision, { kind: 'answer' }>): Promise<void> {
    const ctx: AnswerContext = { id: this.ids, created: Math.floor(Date.now() / 1000), chunks: d.stream.chunks ?? DEFAULT_CHUNKS, threads: this.threads };
    // Build first: a request the provider would reject is rejected at once, without the latency.
    let text: string | undefined;
    let plan: StreamPlan | undefined;
    try {
      if (x.entry.stream) plan = route.stream!(body, ctx);
      else text = route.answer(body, ctx);
    } catch (err) {
      if (!(err instanceof MockRequestError)) throw err;
      this.sendError(x, err.details());
      return;
    }
    if (d.latencyMs > 0 && !(await x.wait(d.latencyMs))) return;

    const { res } = x;
    x.entry.status = 200;
    if (plan === undefined) {
      const headers = this.headers(x, 'application/json');
      headers['content-length'] = Buffer.byteLength(text!);
      res.writeHead(200, headers);
      res.end(text);
      return;
    }
    const headers = this.headers(x, 'text/event-stream; charset=utf-8');
    headers['cache-control'] = 'no-cache';
    res.writeHead(200, headers);
    res.flushHeaders();
    x.entry.chunksSent = 0;
    await runStream(plan, d.stream, streamIO(x));
  }

  /**
   * Quota headers as each API sends them (OpenAI's x-ratelimit-*, Anthropic's anthropic-ratelimit-*): a requests-per-minute
   * limit, what is left of it in the current minute, and the time until the minute (and so the quota) resets.
   * Concurrency (`capacity`) is a separate limit, as at real providers.
   */
  private headers(x: Exchange, contentType: string): OutgoingHttpHeaders {
    // A model's own requestsPerMinute (spec.models) is its own quota, counted apart, as providers limit each model.
    const model = x.entry.model;
    const scope = model !== undefined && this.spec.models?.[model]?.requestsPerMinute !== undefined ? model : '*';
    const limit = effectiveSpec(this.spec, model).requestsPerMinute ?? DEFAULT_RPM;
    const nowMs = Date.now();
    const minute = Math.floor(nowMs / 60_000);
    let q = this.quota.get(scope);
    if (q === undefined || q.minute !== minute) this.quota.set(scope, (q = { minute, used: 0 }));
    q.used++;
    const remaining = Math.max(0, limit - q.used);
    const resetMs = (minute + 1) * 60_000 - nowMs;
    // Each API's own names: Anthropic sends neither openai-processing-ms nor x-ratelimit-*, but anthropic-ratelimit-*.
    const h: OutgoingHttpHeaders =
      x.family === 'anthropic'
        ? { 'content-type': contentType }
        : {
            'content-type': contentType,
            'openai-processing-ms': String(Math.round(performance.now() - x.startedAt)),
            'x-ratelimit-limit-requests': String(limit),
            'x-ratelimit-remaining-requests': String(remaining),
            'x-ratelimit-reset-requests': goDuration(resetMs),
          };
    if (x.rate !== undefined) {
      // An enforced rate limit reports its buckets as they are now, in the API's own names, in place of the advertised quota.
      const { limit: rate, key } = x.rate;
      Object.assign(h, rateHeaders(x.family, rateState(rate, refill(rate, this.buckets.get(key), nowMs)), nowMs));
    } else if (x.family === 'anthropic') {
      Object.assign(h, rateHeaders('anthropic', { requests: { limit, remaining, resetMs }, tokens: undefined }, nowMs));
    }
    // Each API's own name for it, as the real ones send.
    h[x.family === 'anthropic' ? 'request-id' : 'x-request-id'] = x.requestId;
    return h;
  }

  private sendError(x: Exchange, d: ErrorDetails, extra?: Record<string, string>): void {
    if (x.closed || x.res.headersSent) return;
    const body = x.family === 'anthropic' ? anthropicErrorBody(d, x.requestId) : openaiErrorBody(d);
    const headers = this.headers(x, 'application/json');
    headers['content-length'] = Buffer.byteLength(body);
    if (extra !== undefined) for (const k in extra) headers[k.toLowerCase()] = extra[k];
    x.entry.status = d.status;
    x.res.writeHead(d.status, headers);
    x.res.end(body);
  }

  /** A bug in the mock: answer 500 if nothing was sent yet, else drop the connection. */
  private fail(x: Exchange, err: unknown): void {
    this.note(`internal error: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
    if (x.res.headersSent) x.destroy();
    else this.sendError(x, { ...errorDetails(500), message: `mock internal error: ${String(err)}` });
  }

  private authorized(x: Exchange): boolean {
    const key = this.opts.apiKey;
    if (key === undefined) return true;
    const h = x.entry.headers;
    if (h['authorization'] === `Bearer ${key}`) return true;
    return x.family === 'anthropic' && h['x-api-key'] === key;
  }

  private activeBrownout(): BrownoutMode | undefined {
    const b = this.brownoutState;
    if (b === undefined) return undefined;
    if (Date.now() < b.until) return b.mode;
    this.brownoutState = undefined;
    this.note('brownout over');
    return undefined;
  }

  private admit(x: Exchange): void {
    x.admitted = true;
    this.statsCollector.admit();
    const m = x.entry.model;
    if (m !== undefined) this.modelInflight.set(m, (this.modelInflight.get(m) ?? 0) + 1);
  }

  private onClose(x: Exchange): void {
    x.markClosed();
    const { entry } = x;
    const now = Date.now();
    entry.endedAt = now;
    entry.aborted = !x.res.writableFinished && !x.destroyedByUs && !this.closing;
    if (x.admitted) {
      // holdAbandoned: the provider goes on working on what its client gave up on, so the slot stays taken.
      const holdMs = entry.aborted && x.wouldEndAt !== undefined ? x.wouldEndAt - performance.now() : 0;
      if (holdMs > 0) {
        const timer = setTimeout(() => {
          this.holds.delete(timer);
          this.release(entry.model);
        }, holdMs);
        timer.unref();
        this.holds.add(timer);
      } else {
        this.release(entry.model);
      }
    }
    this.statsCollector.ended(String(entry.status ?? 'aborted'), entry.aborted, now);
  }

  private release(model: string | undefined): void {
    this.statsCollector.release();
    if (model !== undefined) {
      const n = (this.modelInflight.get(model) ?? 1) - 1;
      if (n === 0) this.modelInflight.delete(model);
      else this.modelInflight.set(model, n);
    }
  }
}

/** Starts the mock provider and resolves once it listens. */
export async function startMock(opts: MockOptions = {}): Promise<MockServer> {
  const mock = new MockProvider(opts);
  const host = opts.host ?? '127.0.0.1';
  await new Promise<void>((resolve, reject) => {
    mock.server.once('error', reject);
    mock.server.listen(opts.port ?? 0, host, () => {
      mock.server.off('error', reject);
      resolve();
    });
  });
  const { port } = mock.server.address() as AddressInfo;
  mock.port = port;
  mock.url = `http://${host.includes(':') ? `[${host}]` : host}:${port}`;
  return mock;
}
