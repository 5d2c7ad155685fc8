// Fault specification of the mock provider and the one function that decides a request's fate.
// Decisions are deterministic (counters, not Math.random), so a test that asks for "30% 503s"
// gets exactly 3 failures in every 10 matching requests and never flakes.
import { closest } from '../config/unknown-key.ts';
import type { RateOutcome } from './rate-limit.ts';

/** One way to fail with an HTTP error; rules are checked in order and the first that fires answers. */
export interface ErrorRule {
  /** HTTP status to answer, an integer from 400 to 599, e.g. 503, 429, 400, 401, 500, 529 (Anthropic's overloaded_error). */
  status: number;
  /** Share (0..1) of matching requests that fail, spread evenly: 0.3 fails exactly 3 of every 10. Default: 1. */
  rate?: number;
  /** Only requests without an `x-retry-attempt` header (or with "0") count and can fail; retries pass. */
  firstAttemptsOnly?: boolean;
  /** OpenAI error body fields; unset ones get defaults by status. Anthropic paths use only `message`. */
  code?: string;
  type?: string;
  message?: string;
  param?: string | null;
  /** Extra response headers, e.g. { "retry-after": "2" }. */
  headers?: Record<string, string>;
  /** Fail at most this many times in total; after that the rule no longer matches. */
  times?: number;
}

/** Faults applied to streamed answers; "content chunks" are the events that carry output. */
export interface StreamFaults {
  /** Delay after the headers (and the role-only chunk) before the first content chunk, in ms. Default: 0. */
  firstTokenDelayMs?: number;
  /** Delay between content chunks, in ms. Default: 0. */
  chunkDelayMs?: number;
  /** Number of content chunks. Default: 5. */
  chunks?: number;
  /** Destroy the socket after this many content chunks (no finish event, no [DONE]). */
  cutAfterChunks?: number;
  /**
   * After this many content chunks, send the API's own mid-stream error event and end the response (no finish event,
   * no [DONE]): chat and completions `data: {"error":{...,"type":"server_error"}}`, Messages `event: error` with an
   * `overloaded_error`, the Responses API's `event: error` (`code: "server_error"`).
   */
  errorAfterChunks?: number;
  /** Stop sending after this many content chunks and keep the connection open until the client leaves. */
  stallAfterChunks?: number;
  /** Send `data: {not json` in place of content chunk N (0-based), then continue. */
  malformedAtChunk?: number;
  /** Send the finish event but not the terminal one (`data: [DONE]`, message_stop, response.completed). */
  omitDone?: boolean;
  /** Send an SSE comment `: ping` before the first content chunk (before firstTokenDelayMs). */
  pingBeforeFirstToken?: boolean;
}

/**
 * A rate limit as OpenAI enforces one: per model (every model its own bucket, as OpenAI counts each model apart), a
 * bucket per limit a minute's worth deep that refills continuously. A request counts 1 request, and its estimate at
 * arrival (body bytes / 4 plus its max_tokens or max_completion_tokens, times n, for each prompt of a legacy
 * completion's batch) in tokens; one that does not fit gets 429 and uses up nothing. See src/mock/rate-limit.ts.
 */
export interface RateLimit {
  /** Requests per minute. Default: no request limit. */
  requestsPerMinute?: number;
  /** Tokens per minute. Default: no token limit. */
  tokensPerMinute?: number;
  /**
   * Seconds' worth each bucket holds, over 0 and at most 60: what may be sent at once after a quiet spell (OpenAI may
   * enforce a minute's limit over shorter spans, 60,000 RPM as 1,000 a second). Default: 60 (a minute's worth).
   */
  burstSeconds?: number;
  /** Also send retry-after-ms and retry-after on the 429s (OpenAI's RPM and TPM 429s usually carry neither). Default: false. */
  retryAfter?: boolean;
}

/** Everything the mock can do wrong; see `decide` for the order in which the checks run. */
export interface FaultSpec {
  /** Delay before an answer's headers (non-stream: before the whole answer), in ms; faults (errors, brownouts, 429s) come at once. Default: 0. */
  latencyMs?: number;
  /** Adds a uniform random 0..this ms (seeded PRNG) to the latency. Default: 0. */
  latencyJitterMs?: number;
  /** Adds this many ms per other request in flight: a server that slows down with load. Default: 0. */
  latencyPerInflightMs?: number;
  /** Requests in flight beyond this get 429 rate_limit_exceeded at once. Default: unlimited. */
  capacity?: number;
  /** The requests-per-minute quota advertised in x-ratelimit-* headers (not enforced). Default: 100000. */
  requestsPerMinute?: number;
  /** Requests and tokens per minute enforced with 429s and reported in x-ratelimit-* (or anthropic-ratelimit-*) headers. Default: none. */
  rateLimit?: RateLimit;
  /** Headers on the capacity 429s. Default: none. */
  capacityHeaders?: Record<string, string>;
  /**
   * A request whose client leaves before its answer keeps its place in `inflight` (and so its capacity slot, and its
   * share of latencyPerInflightMs) until the latency it was given, counted from its arrival, has passed: a real provider
   * keeps working on a request its client gave up on. A hung request (hangRate, a `hang` brownout) is held for the
   * latency it would have been given. Default: false (the slot is freed when the client leaves).
   */
  holdAbandoned?: boolean;
  /** Error rules, checked in order; the first that fires answers. */
  errors?: ErrorRule[];
  /** Deterministic share of requests whose socket is destroyed before any response byte. */
  resetRate?: number;
  /** Deterministic share of requests that never get an answer. */
  hangRate?: number;
  stream?: StreamFaults;
  /** Per model name: fields here replace the global ones (shallow) for requests with that `model`. */
  models?: Record<string, Omit<FaultSpec, 'models'>>;
}

/**
 * What every request gets during a brownout. '529' is Anthropic's overload (529 overloaded_error) on Anthropic paths;
 * OpenAI has no 529, so its paths get the overload it documents, 503 "The engine is currently overloaded".
 */
export const BROWNOUT_MODES = ['503', 'hang', '429', '529'] as const;

export type BrownoutMode = (typeof BROWNOUT_MODES)[number];

/** Whether a status can be an error rule's: an integer from 400 to 599 (anything else is no error a client could get). */
export function isErrorStatus(status: unknown): status is number {
  return typeof status === 'number' && Number.isInteger(status) && status >= 400 && status <= 599;
}

/** What the server must do with one request. */
export type Decision =
  | { kind: 'brownout'; mode: BrownoutMode }
  | { kind: 'capacity'; headers: Record<string, string> | undefined }
  | { kind: 'rateLimit'; outcome: RateOutcome }
  | { kind: 'reset' }
  | { kind: 'hang' }
  | { kind: 'error'; rule: ErrorRule }
  | { kind: 'answer'; latencyMs: number; stream: StreamFaults };

/** Facts about a request that the decision depends on. */
export interface RequestFacts {
  model: string | undefined;
  /** True when the request carries a non-zero `x-retry-attempt` header. */
  isRetry: boolean;
  /** Admitted requests in flight, this one excluded. */
  inflight: number;
  /** Admitted requests in flight for this request's model, this one excluded. */
  modelInflight: number;
  /** Active brownout, if any. */
  brownout: BrownoutMode | undefined;
  /** The rate limit's verdict on this request (rateTake), when one is in force for its model. */
  rate?: RateOutcome | undefined;
}

interface Counter {
  /** Requests counted so far. */
  n: number;
  /** Times the fault fired (for ErrorRule.times). */
  fired: number;
}

// Keys look like `resetRate@*` or `errors.2@gpt-4o`: field first, because model names may hold ':' or '.'.
function counterKey(field: keyof FaultSpec, scope: string, index?: number): string {
  return index === undefined ? `${field}@${scope}` : `${field}.${index}@${scope}`;
}

/**
 * Per-fault counters. A counter belongs to the scope its setting came from: '*' for the global
 * spec, the model name for a per-model override, so each override counts its own requests.
 */
export class FaultCounters {
  private readonly map = new Map<string, Counter>();

  get(key: string): Counter {
    let c = this.map.get(key);
    if (c === undefined) {
      c = { n: 0, fired: 0 };
      this.map.set(key, c);
    }
    return c;
  }

  clear(): void {
    this.map.clear();
  }

  /** Forgets the counters of the settings a patch replaces, so their counting restarts. */
  forgetPatched(patch: Partial<FaultSpec>): void {
    for (const key of [...this.map.keys()]) {
      const field = key.slice(0, key.search(/[.@]/));
      const scope = key.slice(key.indexOf('@') + 1);
      if (scope !== '*' ? 'models' in patch : field in patch) this.map.delete(key);
    }
  }
}

// Float products land just below whole numbers (100 * 0.29 = 28.999999999999996); without the
// epsilon such a failure would slip into the next period and break "exactly k of every n".
const EPS = 1e-9;

/** Whether the n-th counted request (0-based) fails at this rate: evenly spread, exact per period. */
export function firesAt(n: number, rate: number): boolean {
  if (rate <= 0) return false;
  if (rate >= 1) return true;
  return Math.floor((n + 1) * rate + EPS) > Math.floor(n * rate + EPS);
}

function countAndFire(counters: FaultCounters, key: string, rate: number): boolean {
  const c = counters.get(key);
  const fires = firesAt(c.n, rate);
  c.n++;
  if (fires) c.fired++;
  return fires;
}

/** Where an effective setting came from: the model's override or the global spec. */
function scopeOf(override: Omit<FaultSpec, 'models'> | undefined, model: string | undefined, field: keyof Omit<FaultSpec, 'models'>): string {
  return override !== undefined && model !== undefined && override[field] !== undefined ? model : '*';
}

/** The spec that applies to a model: the model's override fields replace the global ones. */
export function effectiveSpec(spec: FaultSpec, model: string | undefined): Omit<FaultSpec, 'models'> {
  const override = model === undefined ? undefined : spec.models?.[model];
  if (override === undefined) return spec;
  const merged: Omit<FaultSpec, 'models'> = { ...spec };
  for (const [k, v] of Object.entries(override)) if (v !== undefined) (merged as Record<string, unknown>)[k] = v;
  return merged;
}

/**
 * Decides one request. Order: brownout, capacity, rateLimit, resetRate, hangRate, errors, then latency and a
 * normal answer. Mutates only `counters`; `random` feeds the latency jitter alone.
 */
export function decide(spec: FaultSpec, counters: FaultCounters, facts: RequestFacts, random: () => number): Decision {
  if (facts.brownout !== undefined) return { kind: 'brownout', mode: facts.brownout };

  const override = facts.model === undefined ? undefined : spec.models?.[facts.model];
  const eff = effectiveSpec(spec, facts.model);
  const capacityScope = scopeOf(override, facts.model, 'capacity');
  // A per-model capacity limits that model's concurrency; the global one limits the whole server.
  const inflight = capacityScope === '*' ? facts.inflight : facts.modelInflight;

  if (eff.capacity !== undefined && inflight >= eff.capacity) {
    return { kind: 'capacity', headers: eff.capacityHeaders };
  }
  if (facts.rate !== undefined && !facts.rate.admitted) return { kind: 'rateLimit', outcome: facts.rate };
  if (eff.resetRate !== undefined && eff.resetRate > 0) {
    if (countAndFire(counters, counterKey('resetRate', scopeOf(override, facts.model, 'resetRate')), eff.resetRate)) return { kind: 'reset' };
  }
  if (eff.hangRate !== undefined && eff.hangRate > 0) {
    if (countAndFire(counters, counterKey('hangRate', scopeOf(override, facts.model, 'hangRate')), eff.hangRate)) return { kind: 'hang' };
  }
  if (eff.errors !== undefined) {
    const scope = scopeOf(override, facts.model, 'errors');
    for (let i = 0; i < eff.errors.length; i++) {
      const rule = eff.errors[i]!;
      if (rule.firstAttemptsOnly === true && facts.isRetry) continue;
      const key = counterKey('errors', scope, i);
      if (rule.times !== undefined && counters.get(key).fired >= rule.times) continue;
      if (countAndFire(counters, key, rule.rate ?? 1)) return { kind: 'error', rule };
    }
  }

  return { kind: 'answer', latencyMs: latencyFor(spec, facts, random), stream: eff.stream ?? {} };
}

/**
 * The latency an answer to this request gets: base, jitter and the slowdown per request in flight. Also what a hung
 * request would have been given, for holdAbandoned.
 */
export function latencyFor(spec: FaultSpec, facts: RequestFacts, random: () => number): number {
  const override = facts.model === undefined ? undefined : spec.models?.[facts.model];
  const eff = effectiveSpec(spec, facts.model);
  const latencyInflight = scopeOf(override, facts.model, 'latencyPerInflightMs') === '*' ? facts.inflight : facts.modelInflight;
  return (
    (eff.latencyMs ?? 0) +
    (eff.latencyJitterMs !== undefined && eff.latencyJitterMs > 0 ? random() * eff.latencyJitterMs : 0) +
    (eff.latencyPerInflightMs ?? 0) * latencyInflight
  );
}

/** Every field of a FaultSpec (the compiler checks the list is whole), so an unknown one is refused. */
const SPEC_FIELDS = {
  latencyMs: true, latencyJitterMs: true, latencyPerInflightMs: true, capacity: true, requestsPerMinute: true, rateLimit: true,
  capacityHeaders: true, holdAbandoned: true, errors: true, resetRate: true, hangRate: true, stream: true, models: true,
} satisfies Record<keyof FaultSpec, true>;

/** Every field of an ErrorRule and of StreamFaults, so a misspelt one inside a rule or a stream is refused too. */
const RULE_FIELDS = {
  status: true, rate: true, firstAttemptsOnly: true, code: true, type: true, message: true, param: true, headers: true, times: true,
} satisfies Record<keyof ErrorRule, true>;
const STREAM_FIELDS = {
  firstTokenDelayMs: true, chunkDelayMs: true, chunks: true, cutAfterChunks: true, errorAfterChunks: true, stallAfterChunks: true,
  malformedAtChunk: true, omitDone: true, pingBeforeFirstToken: true,
} satisfies Record<keyof StreamFaults, true>;

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** Refuses a field `fields` does not have, naming the closest one. */
function assertKnownFields(value: Record<string, unknown>, fields: object, what: string): void {
  for (const k of Object.keys(value)) {
    if (!Object.hasOwn(fields, k)) {
      const guess = closest(k, Object.keys(fields));
      throw new Error(`unknown ${what} field ${JSON.stringify(k)}${guess ? `; did you mean "${guess}"?` : ''}`);
    }
  }
}

function assertNonNegative(value: unknown, name: string, integer: boolean): void {
  if (value === undefined) return;
  if (typeof value !== 'number') throw new Error(`${name} must be a number`);
  if (!(value >= 0)) throw new Error(`${name} must be a non-negative number`);
  if (integer && !Number.isInteger(value)) throw new Error(`${name} must be a whole number, got ${value}`);
}

/** Response headers (a rule's, the capacity 429s'): an object of strings or numbers. */
function assertHeaders(value: unknown, name: string): void {
  if (value === undefined) return;
  if (!isObject(value) || !Object.values(value).every((v) => typeof v === 'string' || typeof v === 'number')) {
    throw new Error(`${name} must be an object of header names to values`);
  }
}

function assertErrorRule(r: unknown): void {
  if (!isObject(r)) throw new Error('each error rule must be an object with a status');
  const status = r['status'];
  if (!isErrorStatus(status)) throw new Error(`an error rule's status must be an integer from 400 to 599, got ${JSON.stringify(status) ?? 'none'}`);
  assertKnownFields(r, RULE_FIELDS, 'error rule');
  const rate = r['rate'];
  if (rate !== undefined && !(typeof rate === 'number' && rate >= 0 && rate <= 1)) throw new Error(`an error rule's rate must be a number from 0 to 1, got ${JSON.stringify(rate)}`);
  assertNonNegative(r['times'], "an error rule's times", true);
  assertHeaders(r['headers'], "an error rule's headers");
  if (r['firstAttemptsOnly'] !== undefined && typeof r['firstAttemptsOnly'] !== 'boolean') throw new Error("an error rule's firstAttemptsOnly must be a boolean");
  for (const k of ['code', 'type', 'message', 'param'] as const) {
    if (r[k] !== undefined && r[k] !== null && typeof r[k] !== 'string') throw new Error(`an error rule's ${k} must be a string or null`);
  }
}

function assertStreamFaults(stream: unknown): void {
  if (!isObject(stream)) throw new Error('stream must be an object');
  assertKnownFields(stream, STREAM_FIELDS, 'stream');
  for (const k of ['firstTokenDelayMs', 'chunkDelayMs'] as const) assertNonNegative(stream[k], `stream.${k}`, false);
  for (const k of ['chunks', 'cutAfterChunks', 'stallAfterChunks', 'malformedAtChunk'] as const) assertNonNegative(stream[k], `stream.${k}`, true);
  const n = stream['errorAfterChunks'];
  if (n !== undefined && !(typeof n === 'number' && Number.isInteger(n) && n >= 0)) throw new Error('stream.errorAfterChunks must be a non-negative integer');
  for (const k of ['omitDone', 'pingBeforeFirstToken'] as const) {
    if (stream[k] !== undefined && typeof stream[k] !== 'boolean') throw new Error(`stream.${k} must be a boolean`);
  }
}

/** Throws a readable error when a value (e.g. a PUT body) is not a plausible FaultSpec. */
export function assertFaultSpec(value: unknown): asserts value is FaultSpec {
  if (!isObject(value)) throw new Error('fault spec must be a JSON object');
  const spec = value;
  // A misspelt field would otherwise be kept and ignored: the scenario runs without the fault it asked for.
  assertKnownFields(spec, SPEC_FIELDS, 'fault spec');
  if (spec['errors'] !== undefined) {
    if (!Array.isArray(spec['errors'])) throw new Error('errors must be an array');
    for (const r of spec['errors']) assertErrorRule(r);
  }
  if (spec['stream'] !== undefined) assertStreamFaults(spec['stream']);
  for (const k of ['latencyMs', 'latencyJitterMs', 'latencyPerInflightMs', 'capacity', 'resetRate', 'hangRate']) assertNonNegative(spec[k], k, k === 'capacity');
  // Shares, as an error rule's rate is: over 1 would read as "every request".
  for (const k of ['resetRate', 'hangRate']) {
    if (typeof spec[k] === 'number' && spec[k] > 1) throw new Error(`${k} must be a number from 0 to 1, got ${spec[k]}`);
  }
  const rpm = spec['requestsPerMinute'];
  if (rpm !== undefined && !(typeof rpm === 'number' && Number.isFinite(rpm) && rpm > 0)) throw new Error('requestsPerMinute must be a positive number');
  assertHeaders(spec['capacityHeaders'], 'capacityHeaders');
  if (spec['rateLimit'] !== undefined) assertRateLimit(spec['rateLimit']);
  if (spec['holdAbandoned'] !== undefined && typeof spec['holdAbandoned'] !== 'boolean') throw new Error('holdAbandoned must be a boolean');
  if (spec['models'] !== undefined) {
    if (!isObject(spec['models'])) throw new Error('models must be an object of model names to fault specs');
    for (const [name, m] of Object.entries(spec['models'])) {
      // A model's own spec has no models of its own: kept, they would be ignored, as a misspelt field was.
      if (isObject(m) && Object.hasOwn(m, 'models')) throw new Error(`models.${name}: a model's fault spec cannot have models of its own`);
      assertFaultSpec(m);
    }
  }
}

function assertRateLimit(value: unknown): asserts value is RateLimit {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new Error('rateLimit must be an object');
  const r = value as Record<string, unknown>;
  for (const k of Object.keys(r)) {
    if (!['requestsPerMinute', 'tokensPerMinute', 'burstSeconds', 'retryAfter'].includes(k)) throw new Error(`rateLimit has no field ${k}`);
  }
  for (const k of ['requestsPerMinute', 'tokensPerMinute']) {
    const v = r[k];
    if (v !== undefined && (typeof v !== 'number' || !Number.isFinite(v) || v <= 0)) throw new Error(`rateLimit.${k} must be a positive number`);
  }
  const burst = r['burstSeconds'];
  if (burst !== undefined && (typeof burst !== 'number' || !(burst > 0 && burst <= 60))) throw new Error('rateLimit.burstSeconds must be a number over 0 and at most 60');
  if (r['retryAfter'] !== undefined && typeof r['retryAfter'] !== 'boolean') throw new Error('rateLimit.retryAfter must be a boolean');
}
