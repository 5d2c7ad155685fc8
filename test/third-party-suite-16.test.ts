// A sixteenth third-party failure-scenario suite, written from the README ("Retries", "Failover and API families",
// "Retry budget, circuit breaker, hold-offs, parking", "Deadlines and timeouts", "Streaming", "What the client sees",
// "Errors") as a team whose agents are built on agent FRAMEWORKS rather than on the bare `openai` SDK would test the
// gateway: the Vercel AI SDK (`ai` 6 + `@ai-sdk/openai` 3, chat completions through `createOpenAI(...).chat()`),
// LangChain.js (`@langchain/openai` ChatOpenAI on `@langchain/core`) and the OpenAI Agents SDK (`@openai/agents`,
// its chat-completions model on an `openai` client). The newest releases of each that run on Node 20 (ai 7,
// @ai-sdk/openai 4, @langchain/openai 1.5.9+ and @openai/agents 0.15+ need Node 22).
//
// Every framework runs at its DEFAULT retry settings: that is the point. What each one does with a failure:
// - AI SDK: retries 408, 409, 429 and every 5xx, `maxRetries` 2, after 2 s and 4 s, or after `retry-after-ms` /
//   `retry-after` when under 60 s; `x-should-retry` is not read.
// - LangChain (@langchain/core's AsyncCaller): `maxRetries` 6 with p-retry's 1 s doubling (randomised x1..2); gives up
//   at once on 400-407, 409, 413, insufficient_quota and a 429 without a wait hint; retries every 5xx; a 429 with a
//   `retry-after` up to 60 s waits it. `x-should-retry` is not read.
// - Agents SDK: the openai client's own retries (2), which honour `x-should-retry`.
// Black box over real HTTP: a real gateway in front of the bundled mock provider (its stats and request log count the
// upstream attempts) or scripted upstreams (an Anthropic-family backup for the failover scenarios). Each framework's
// HTTP requests to the gateway are counted through the `fetch` it is given.
//
// Client backoff compressed: LangChain's default schedule against a provider that stays down waits 63 to 126 s, the AI
// SDK's 6 s. Where a scenario's answer does not depend on when the client comes back (a provider that stays down, a
// deadline, a breaker that stays open, a spent budget), the frameworks' OWN backoff sleeps (p-retry's, provider-utils'
// delay) are shortened 500x by `compressFrameworkSleeps`; their decisions and counts are the frameworks' own. A sleep
// taken on the gateway's wait hint is never compressed where it matters (the hold-off scenario runs in real time).
//
// Measured amplification (upstream attempts per client call, route maxAttempts 3) is printed at the end of the run.
import { setTimeout as sleep } from 'node:timers/promises';
import { createOpenAI } from '@ai-sdk/openai';
import { AIMessage, HumanMessage, ToolMessage, type AIMessageChunk } from '@langchain/core/messages';
import { tool as lcTool } from '@langchain/core/tools';
import { ChatOpenAI } from '@langchain/openai';
import { Agent, OpenAIChatCompletionsModel, run, setTracingDisabled, tool as agentTool } from '@openai/agents';
import { generateText, stepCountIs, streamText, tool as aiTool } from 'ai';
import OpenAI from 'openai';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import type { FaultSpec } from '../src/mock/faults.ts';
import { cc, delta, DONE, json, streamed, type Answer } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';
import { RETRY_LOOP_ONLY, useStacks, type Stack, type StackOptions } from './helpers/stack.ts';

setTracingDisabled(true); // the Agents SDK exports traces to api.openai.com by default; nothing leaves 127.0.0.1 here
(globalThis as { AI_SDK_LOG_WARNINGS?: boolean }).AI_SDK_LOG_WARNINGS = false;

const startStack = useStacks();
const upstreams = useScriptedUpstreams();

const CLIENT_KEY = 'sk-client-not-a-provider-key';
const prompt = 'Summarise the incident report.';
type Framework = 'ai-sdk' | 'langchain' | 'agents';
const FRAMEWORKS: Framework[] = ['ai-sdk', 'langchain', 'agents'];

// ---------------------------------------------------------------------------------------------------------------
// The three frameworks, pointed at a gateway, with their HTTP requests counted.

interface Counted {
  /** HTTP requests the framework sent to the gateway (its own retries included). */
  requests: number;
  /** What each of them was answered with. */
  answers: Array<{ status: number; shouldRetry: string | null; retryAfterMs: string | null }>;
  /** The x-stainless-retry-count each request declared (null: none sent). */
  declared: Array<string | null>;
}

function countingFetch(c: Counted, extraHeaders: Record<string, string> = {}): typeof fetch {
  return async (input, init) => {
    c.requests++;
    const headers = new Headers(init?.headers);
    for (const [k, v] of Object.entries(extraHeaders)) headers.set(k, v);
    c.declared.push(headers.get('x-stainless-retry-count'));
    const res = await fetch(input, { ...init, headers });
    c.answers.push({ status: res.status, shouldRetry: res.headers.get('x-should-retry'), retryAfterMs: res.headers.get('retry-after-ms') });
    return res;
  };
}

interface ClientOpts {
  /** Headers on every request (x-stormgate-timeout-ms, as the README recommends for these frameworks). */
  headers?: Record<string, string>;
  signal?: AbortSignal;
}

/** One plain text call through `fw` at its default retry settings; resolves the text or rejects with its error. */
async function call(fw: Framework, baseURL: string, c: Counted, opts: ClientOpts = {}): Promise<string> {
  const f = countingFetch(c, opts.headers);
  if (fw === 'ai-sdk') {
    const gateway = createOpenAI({ baseURL, apiKey: CLIENT_KEY, fetch: f });
    const { text } = await generateText({ model: gateway.chat('gpt-4o'), prompt, abortSignal: opts.signal });
    return text;
  }
  if (fw === 'langchain') {
    const model = new ChatOpenAI({ model: 'gpt-4o', apiKey: CLIENT_KEY, configuration: { baseURL, fetch: f } });
    const answer = await model.invoke(prompt, { signal: opts.signal });
    return String(answer.content);
  }
  const client = new OpenAI({ baseURL, apiKey: CLIENT_KEY, fetch: f });
  const agent = new Agent({ name: 'summariser', instructions: 'Be brief.', model: agentsModel(client) });
  const result = await run(agent, prompt, { signal: opts.signal });
  return String(result.finalOutput);
}

/** The Agents SDK's chat-completions model on an openai client (its typings resolve openai's CommonJS types). */
const agentsModel = (client: OpenAI) => new OpenAIChatCompletionsModel(client as unknown as ConstructorParameters<typeof OpenAIChatCompletionsModel>[0], 'gpt-4o');
const counted = (): Counted => ({ requests: 0, answers: [], declared: [] });
const settle = <T>(p: Promise<T>) => p.then((value) => ({ ok: true as const, value }), (error: unknown) => ({ ok: false as const, error }));

/** Every message, status and code on an error and its causes (RetryError -> APICallError, LangChain's wrappers). */
function errorText(err: unknown): string {
  const parts: string[] = [];
  const seen = new Set<unknown>();
  const walk = (e: unknown) => {
    if (e == null || typeof e !== 'object' || seen.has(e)) return;
    seen.add(e);
    const o = e as Record<string, unknown>;
    for (const k of ['message', 'status', 'statusCode', 'code', 'responseBody', 'name']) if (o[k] != null) parts.push(`${k}=${String(o[k])}`);
    walk(o.cause);
    walk(o.lastError);
    walk(o.error);
    if (Array.isArray(o.errors)) o.errors.forEach(walk);
  };
  walk(err);
  return parts.join(' | ');
}

/** The HTTP status the framework's error carries (the last one, for the AI SDK's RetryError). */
function statusOf(err: unknown): number | undefined {
  const o = err as Record<string, unknown> | undefined;
  if (!o) return undefined;
  if (typeof o.statusCode === 'number') return o.statusCode;
  if (typeof o.status === 'number') return o.status;
  return statusOf(o.lastError) ?? statusOf(o.cause);
}

// ---------------------------------------------------------------------------------------------------------------
// Compressing the frameworks' own backoff (see the header).

let restoreTimers: (() => void) | undefined;
afterEach(() => {
  restoreTimers?.();
  restoreTimers = undefined;
});

/** Shortens the frameworks' own retry sleeps 500x for this test; returns the sleeps they asked for, in ms. */
function compressFrameworkSleeps(): number[] {
  const real = globalThis.setTimeout;
  const asked: number[] = [];
  const patched = (fn: (...a: unknown[]) => void, ms?: number, ...args: unknown[]) => {
    if (typeof ms === 'number' && ms >= 200) {
      const stack = new Error().stack ?? '';
      if (stack.includes('p-retry') || stack.includes('provider-utils')) {
        asked.push(ms);
        ms = Math.ceil(ms / 500);
      }
    }
    return real(fn, ms, ...args);
  };
  globalThis.setTimeout = Object.assign(patched, real) as unknown as typeof setTimeout;
  restoreTimers = () => (globalThis.setTimeout = real);
  return asked;
}

// ---------------------------------------------------------------------------------------------------------------
// The measurements, printed at the end.

const table: string[] = [];
afterAll(() => {
  if (table.length) console.info(`\nthird-party suite 16: upstream attempts per client call (framework defaults)\n${table.join('\n')}\n`);
});
function record(scenario: string, fw: string, c: Counted, upstream: number, calls = 1): void {
  table.push(`${scenario.padEnd(34)} ${fw.padEnd(10)} gateway requests/call ${(c.requests / calls).toFixed(2).padStart(5)}   upstream attempts/call ${(upstream / calls).toFixed(2).padStart(5)}`);
}

/** Three quick attempts per target (the default maxAttempts, a short fixed backoff). */
const THREE_FAST = { maxAttempts: 3, backoff: { strategy: 'fixed' as const, baseMs: 20, capMs: 20 } };

async function stackFor(faults: FaultSpec, opts: Omit<StackOptions, 'faults'> = {}): Promise<Stack> {
  return startStack({ faults, ...opts });
}
const upstreamTotal = (s: Stack) => s.mock.stats().total;

// ---------------------------------------------------------------------------------------------------------------

describe('1. retry multiplication at the frameworks\' default retry settings', () => {
  it('a provider that is down (503 to everything): the AI SDK and LangChain multiply the gateway\'s 3 attempts, the Agents SDK honours x-should-retry', async () => {
    compressFrameworkSleeps();
    for (const fw of FRAMEWORKS) {
      const s = await stackFor({ errors: [{ status: 503 }] }, { ...RETRY_LOOP_ONLY, route: { ...RETRY_LOOP_ONLY.route, retry: THREE_FAST } });
      const c = counted();
      const r = await settle(call(fw, s.baseURL, c));
      expect(r.ok).toBe(false);
      expect(statusOf(r.ok ? undefined : r.error)).toBe(503);
      // Every answer told the client not to retry; only the Agents SDK (the openai client) listens.
      expect(c.answers.every((a) => a.shouldRetry === 'false')).toBe(true);
      const expectedRequests = { 'ai-sdk': 3, langchain: 7, agents: 1 }[fw];
      expect(c.requests).toBe(expectedRequests);
      // None of the frameworks' retries says it is one: the AI SDK sends no x-stainless-retry-count, LangChain's openai
      // client (maxRetries 0 under its own AsyncCaller) says 0 on every one, so the gateway counts each as a new request.
      expect(c.declared).toEqual(Array(expectedRequests).fill(fw === 'ai-sdk' ? null : '0'));
      // Each gateway request costs its 3 attempts today; gateway-side detection of undeclared client retries may only
      // lower that, never raise it.
      expect(upstreamTotal(s)).toBeLessThanOrEqual(3 * expectedRequests);
      expect(upstreamTotal(s)).toBeGreaterThanOrEqual(3);
      record('upstream down (503), no breaker', fw, c, upstreamTotal(s));
      await s.close();
    }
  });

  it('the deadline ends it (504 deadline_exceeded from x-stormgate-timeout-ms): every framework but the Agents SDK asks again', async () => {
    compressFrameworkSleeps();
    // A provider that hangs; each framework sends the README's x-stormgate-timeout-ms. Three stacks at once (wall time).
    await Promise.all(
      FRAMEWORKS.map(async (fw) => {
        const s = await startStack({ faults: { hangRate: 1 }, ...RETRY_LOOP_ONLY });
        const c = counted();
        const r = await settle(call(fw, s.baseURL, c, { headers: { 'x-stormgate-timeout-ms': '600' } }));
        expect(r.ok).toBe(false);
        expect(statusOf(r.ok ? undefined : r.error)).toBe(504);
        expect(errorText(r.ok ? undefined : r.error)).toContain('deadline');
        expect(c.answers.every((a) => a.status === 504 && a.shouldRetry === 'false')).toBe(true);
        expect(c.requests).toBe({ 'ai-sdk': 3, langchain: 7, agents: 1 }[fw]);
        // One attempt per gateway request: the deadline leaves no time for a second.
        await sleep(50);
        expect(upstreamTotal(s)).toBeLessThanOrEqual(c.requests);
        // No ghost requests: each attempt was aborted at its deadline, none is still open at the provider (the abort
        // reaches the provider's socket a moment after the client's 504 on a loaded machine; a ghost hangs on forever).
        await expect.poll(() => s.mock.stats().inflight, { timeout: 2_000 }).toBe(0);
        record('deadline (504)', fw, c, upstreamTotal(s));
      }),
    );
  });

  it('an open breaker (503 circuit_open): no framework retry reaches the provider while it is open', async () => {
    compressFrameworkSleeps();
    const chat = (s: Stack) =>
      fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x' }] }) }).then((r) => r.arrayBuffer());
    await Promise.all(
      FRAMEWORKS.map(async (fw) => {
        const s = await startStack({
          faults: { errors: [{ status: 503 }] },
          route: { park: false, retry: { maxAttempts: 1 } },
          provider: { breaker: { consecutiveFailures: 2, openS: 30 } },
        });
        // Open it: failures in a row, and no success for 250 ms.
        for (let i = 0; i < 3; i++) await chat(s);
        await sleep(300);
        await chat(s);
        const before = upstreamTotal(s);
        const c = counted();
        const r = await settle(call(fw, s.baseURL, c));
        expect(r.ok).toBe(false);
        expect(errorText(r.ok ? undefined : r.error)).toContain('circuit_open');
        expect(c.answers.every((a) => a.status === 503 && a.shouldRetry === 'false')).toBe(true);
        // Within openS nothing of it goes upstream, however often the framework asks.
        expect(upstreamTotal(s) - before).toBe(0);
        expect(c.requests).toBe({ 'ai-sdk': 3, langchain: 7, agents: 1 }[fw]);
        record('breaker open (503 circuit_open)', fw, c, upstreamTotal(s) - before);
      }),
    );
  });

  it('a hold-off (the provider\'s 429 with retry-after 2): each framework waits the gateway\'s retry-after-ms and the provider sees 2 requests per call', async () => {
    // Real time: the frameworks' sleeps here are the gateway's hint. maxWaitHintMs below the hint: the gateway does not
    // wait it out, it answers 429 with x-should-retry: true and the hold-off's end.
    const results = await Promise.all(
      FRAMEWORKS.map(async (fw) => {
        const s = await startStack({
          faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '2' }, code: 'rate_limit_exceeded' }] },
          route: { park: false, retry: { ...THREE_FAST, maxWaitHintMs: 500 } },
        });
        const c = counted();
        const t0 = Date.now();
        const r = await settle(call(fw, s.baseURL, c));
        return { fw, s, c, r, ms: Date.now() - t0 };
      }),
    );
    for (const { fw, s, c, r, ms } of results) {
      expect(r.ok, `${fw}: ${r.ok ? '' : errorText(r.error)}`).toBe(true);
      expect(c.answers[0]).toMatchObject({ status: 429, shouldRetry: 'true' });
      expect(Number(c.answers[0]?.retryAfterMs)).toBeGreaterThanOrEqual(2000);
      expect(c.requests).toBe(2);
      // It came back after the hold-off, not before it (then it would have been turned away again).
      expect(ms).toBeGreaterThanOrEqual(1900);
      expect(upstreamTotal(s)).toBe(2);
      record('hold-off (429 retry-after 2)', fw, c, upstreamTotal(s));
      await s.close();
    }
  });

  it('a bare 429 (no wait hint, which no breaker counts): the AI SDK multiplies it, LangChain gives up at once', async () => {
    compressFrameworkSleeps();
    for (const fw of FRAMEWORKS) {
      const s = await stackFor({ errors: [{ status: 429, code: 'rate_limit_exceeded' }] }, { ...RETRY_LOOP_ONLY, route: { ...RETRY_LOOP_ONLY.route, retry: THREE_FAST } });
      const c = counted();
      const r = await settle(call(fw, s.baseURL, c));
      expect(r.ok).toBe(false);
      expect(statusOf(r.ok ? undefined : r.error)).toBe(429);
      expect(c.answers.every((a) => a.status === 429 && a.shouldRetry === 'false')).toBe(true);
      expect(c.requests).toBe({ 'ai-sdk': 3, langchain: 1, agents: 1 }[fw]);
      expect(upstreamTotal(s)).toBeLessThanOrEqual(3 * c.requests);
      record('bare 429, no breaker', fw, c, upstreamTotal(s));
      await s.close();
    }
  });

  it("the README's settings for these frameworks (AI SDK: maxRetries 0 and a fetch that follows x-should-retry; LangChain: onFailedAttempt) cost what the openai SDK costs", async () => {
    // The README's gatewayFetch, as written there.
    const gatewayFetch =
      (inner: typeof fetch): typeof fetch =>
      async (input, init) => {
        for (let retries = 0; ; retries++) {
          const res = await inner(input, init);
          if (res.headers.get('x-should-retry') !== 'true' || retries === 2) return res;
          await res.body?.cancel();
          await sleep(Number(res.headers.get('retry-after-ms') ?? 1000), undefined, { signal: init?.signal ?? undefined });
        }
      };
    const aiSdk = (baseURL: string, c: Counted) => generateText({ model: createOpenAI({ baseURL, apiKey: CLIENT_KEY, fetch: gatewayFetch(countingFetch(c)) }).chat('gpt-4o'), prompt, maxRetries: 0 });
    const langchain = (baseURL: string, c: Counted) =>
      new ChatOpenAI({
        model: 'gpt-4o',
        apiKey: CLIENT_KEY,
        configuration: { baseURL, fetch: countingFetch(c) },
        onFailedAttempt: async (err: { name?: string; headers?: Headers }) => {
          if (err?.name === 'AbortError' || err?.headers?.get?.('x-should-retry') === 'false') throw err;
          const waitMs = Number(err?.headers?.get?.('retry-after-ms'));
          if (waitMs > 0) await new Promise((done) => setTimeout(done, waitMs));
        },
      }).invoke(prompt);
    // A provider that is down: one request from each, the gateway's 3 attempts.
    for (const send of [aiSdk, langchain] as Array<(baseURL: string, c: Counted) => Promise<unknown>>) {
      const s = await stackFor({ errors: [{ status: 503 }] }, { ...RETRY_LOOP_ONLY, route: { ...RETRY_LOOP_ONLY.route, retry: THREE_FAST } });
      const c = counted();
      expect((await settle(send(s.baseURL, c))).ok).toBe(false);
      expect(c.requests).toBe(1);
      expect(upstreamTotal(s)).toBe(3);
      await s.close();
    }
    // A hold-off the gateway invites them back from (x-should-retry: true): they come back once, after it, and succeed.
    const held = await Promise.all(
      ([aiSdk, langchain] as Array<(baseURL: string, c: Counted) => Promise<unknown>>).map(async (send) => {
        const s = await stackFor({ errors: [{ status: 429, times: 1, headers: { 'retry-after': '1' }, code: 'rate_limit_exceeded' }] }, { route: { park: false, retry: { ...THREE_FAST, maxWaitHintMs: 300 } } });
        const c = counted();
        const r = await settle(send(s.baseURL, c));
        return { s, c, r };
      }),
    );
    for (const { s, c, r } of held) {
      expect(r.ok).toBe(true);
      expect(c.requests).toBe(2);
      expect(upstreamTotal(s)).toBe(2);
      await s.close();
    }
  });

  it('a spent retry budget: the gateway stops retrying, the frameworks do not', async () => {
    compressFrameworkSleeps();
    for (const fw of FRAMEWORKS) {
      // A budget of a tenth of requests, at least 1 retry a second (the default floor is 10, which these few calls
      // would not spend), no breaker, no parking.
      const s = await startStack({ faults: { errors: [{ status: 503 }] }, route: { park: false, retry: THREE_FAST, budget: { minRetriesPerSecond: 1 } }, provider: { breaker: false } });
      const c = counted();
      const calls = 5;
      for (let i = 0; i < calls; i++) {
        const r = await settle(call(fw, s.baseURL, c));
        expect(r.ok).toBe(false);
      }
      // Whatever the frameworks do, the gateway's own retries stay within the budget: the floor (1 a second over the
      // 10 s window) plus a tenth of the requests. The frameworks' retries come on top, each one a new request.
      const gatewayRetries = upstreamTotal(s) - c.requests;
      expect(gatewayRetries).toBeLessThanOrEqual(10 + Math.ceil(0.1 * c.requests));
      expect(c.requests).toBe(calls * { 'ai-sdk': 3, langchain: 7, agents: 1 }[fw]);
      record('budget spent (5 calls, 503)', fw, c, upstreamTotal(s), calls);
      await s.close();
    }
  });
});

// ---------------------------------------------------------------------------------------------------------------

describe('2. streaming through the frameworks', () => {
  it('a stream cut after its first output reaches every framework as an error, never as a clean short answer', async () => {
    for (const fw of FRAMEWORKS) {
      const s = await startStack({ faults: { stream: { chunks: 6, cutAfterChunks: 2 } }, ...RETRY_LOOP_ONLY });
      const c = counted();
      const f = countingFetch(c);
      let text = '';
      let error: unknown;
      let finished: string | undefined;
      if (fw === 'ai-sdk') {
        const result = streamText({ model: createOpenAI({ baseURL: s.baseURL, apiKey: CLIENT_KEY, fetch: f }).chat('gpt-4o'), prompt, onError: () => {} });
        for await (const part of result.fullStream) {
          if (part.type === 'text-delta') text += part.text;
          if (part.type === 'error') error = part.error;
          if (part.type === 'finish') finished = part.finishReason;
        }
      } else if (fw === 'langchain') {
        const model = new ChatOpenAI({ model: 'gpt-4o', apiKey: CLIENT_KEY, configuration: { baseURL: s.baseURL, fetch: f } });
        try {
          for await (const chunk of await model.stream(prompt)) text += String(chunk.content);
        } catch (err) {
          error = err;
        }
      } else {
        const agent = new Agent({ name: 'a', model: agentsModel(new OpenAI({ baseURL: s.baseURL, apiKey: CLIENT_KEY, fetch: f })) });
        try {
          const result = await run(agent, prompt, { stream: true });
          for await (const t of result.toTextStream()) text += t;
          await result.completed;
          if (result.error) throw result.error;
        } catch (err) {
          error = err;
        }
      }
      expect(text.length, fw).toBeGreaterThan(0); // the first output reached it
      expect(error, `${fw} ended the cut stream cleanly with ${JSON.stringify(text)}`).toBeDefined();
      expect(errorText(error)).toMatch(/stream_interrupted|cut/);
      expect(finished).not.toBe('stop');
      // After the first byte nobody retries: one request from the framework, one upstream attempt.
      expect(c.requests).toBe(1);
      expect(upstreamTotal(s)).toBe(1);
      await s.close();
    }
  });

  it('a first-token timeout the gateway retries is invisible to every framework', async () => {
    for (const fw of FRAMEWORKS) {
      // The first attempt stalls before any output (past firstTokenMs), the second answers.
      const g = await upstreams(
        { p: (body, n) => (n === 1 ? { steps: [cc([delta({ role: 'assistant', content: '' })]), 2_000, DONE] } : body.stream === true ? streamed('All systems nominal.') : json(200, {})) },
        [{ provider: 'p' }],
        { provider: { timeouts: { connectMs: 1_000, firstTokenMs: 300, idleMs: 5_000 } } },
      );
      const c = counted();
      const f = countingFetch(c);
      let text = '';
      if (fw === 'ai-sdk') {
        const result = streamText({ model: createOpenAI({ baseURL: g.s.baseURL, apiKey: CLIENT_KEY, fetch: f }).chat('gpt-4o'), prompt });
        for await (const t of result.textStream) text += t;
      } else if (fw === 'langchain') {
        const model = new ChatOpenAI({ model: 'gpt-4o', apiKey: CLIENT_KEY, configuration: { baseURL: g.s.baseURL, fetch: f } });
        for await (const chunk of await model.stream(prompt)) text += String(chunk.content);
      } else {
        const agent = new Agent({ name: 'a', model: agentsModel(new OpenAI({ baseURL: g.s.baseURL, apiKey: CLIENT_KEY, fetch: f })) });
        const result = await run(agent, prompt, { stream: true });
        for await (const t of result.toTextStream()) text += t;
        await result.completed;
      }
      expect(text, fw).toBe('All systems nominal.');
      expect(c.requests).toBe(1);
      expect(g.seen.p).toHaveLength(2);
      expect(g.seen.p?.[1]?.headers['x-retry-reason']).toBe('timeout_first_token');
      await g.s.close();
    }
  });
});

// ---------------------------------------------------------------------------------------------------------------
// Tool calls across a failover to an Anthropic-family backup: the primary (OpenAI family) is down, Claude answers
// through the gateway's translation, streamed, as each framework's agent loop runs the tool and asks again.

const aev = (type: string, fields: object = {}) => `event: ${type}\ndata: ${JSON.stringify({ type, ...fields })}\n\n`;
const aUsage = { input_tokens: 40, output_tokens: 12 };
const aStart = () => aev('message_start', { message: { id: 'msg_01', type: 'message', role: 'assistant', model: 'claude-sonnet-4-6', content: [], stop_reason: null, stop_sequence: null, usage: aUsage } });
/** Claude's streamed tool call: a tool_use block whose input arrives in three pieces. */
const claudeToolCall = (name: string): string[] => [
  aStart(),
  aev('content_block_start', { index: 0, content_block: { type: 'tool_use', id: 'toolu_01A', name, input: {} } }),
  aev('content_block_delta', { index: 0, delta: { type: 'input_json_delta', partial_json: '{"city": "Pa' } }),
  aev('content_block_delta', { index: 0, delta: { type: 'input_json_delta', partial_json: 'ris", "unit": "cel' } }),
  aev('content_block_delta', { index: 0, delta: { type: 'input_json_delta', partial_json: 'sius"}' } }),
  aev('content_block_stop', { index: 0 }),
  aev('message_delta', { delta: { stop_reason: 'tool_use', stop_sequence: null }, usage: { output_tokens: 12 } }),
  aev('message_stop'),
];
const claudeText = (text: string): string[] => [
  aStart(),
  aev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
  aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text } }),
  aev('content_block_stop', { index: 0 }),
  aev('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 12 } }),
  aev('message_stop'),
];
/** Claude: a tool call first; once the conversation carries the tool's result, the answer. */
const claude: Answer = (body) => {
  const messages = body.messages as Array<{ role: string; content: unknown }>;
  const hasResult = messages.some((m) => Array.isArray(m.content) && (m.content as Array<{ type: string }>).some((b) => b.type === 'tool_result'));
  const steps = hasResult ? claudeText('It is 18 degrees in Paris.') : claudeToolCall('get_weather');
  if (body.stream === true) return { headers: { 'content-type': 'text/event-stream' }, steps };
  const content = hasResult ? [{ type: 'text', text: 'It is 18 degrees in Paris.' }] : [{ type: 'tool_use', id: 'toolu_01A', name: 'get_weather', input: { city: 'Paris', unit: 'celsius' } }];
  return json(200, { id: 'msg_02', type: 'message', role: 'assistant', model: 'claude-sonnet-4-6', content, stop_reason: hasResult ? 'end_turn' : 'tool_use', stop_sequence: null, usage: aUsage });
};
const down: Answer = () => json(503, { error: { message: 'The engine is currently overloaded', type: 'server_error', param: null, code: null } });

describe('3. tool calls through the frameworks, across a failover to Claude', () => {
  const weatherInput = z.object({ city: z.string(), unit: z.enum(['celsius', 'fahrenheit']) });
  const failover = () => upstreams({ openai: down, claude: { family: 'anthropic', answer: claude } }, [{ provider: 'openai' }, { provider: 'claude', model: 'claude-sonnet-4-6' }], { route: { retry: { maxAttempts: 1 } } });

  it('AI SDK streamText with a zod tool and stopWhen: the tool runs with intact arguments and the loop ends on Claude\'s answer', async () => {
    const g = await failover();
    const calls: unknown[] = [];
    const result = streamText({
      model: createOpenAI({ baseURL: g.s.baseURL, apiKey: CLIENT_KEY }).chat('gpt-4o'),
      prompt: 'What is the weather in Paris?',
      tools: { get_weather: aiTool({ description: 'Weather of a city', inputSchema: weatherInput, execute: async (input) => (calls.push(input), { degrees: 18 }) }) },
      stopWhen: stepCountIs(3),
    });
    let text = '';
    for await (const t of result.textStream) text += t;
    expect(calls).toEqual([{ city: 'Paris', unit: 'celsius' }]);
    expect(text).toBe('It is 18 degrees in Paris.');
    const steps = await result.steps;
    expect(steps[0]?.response.headers?.['x-stormgate-fallback']).toBeDefined();
    // Claude got the tool's result in its own shape, under the id it gave the call.
    const second = g.seen.claude?.[1]?.body.messages as Array<{ role: string; content: Array<Record<string, unknown>> }>;
    expect(second.flatMap((m) => (Array.isArray(m.content) ? m.content : [])).find((b) => b.type === 'tool_result')).toMatchObject({ tool_use_id: 'toolu_01A' });
  });

  it('LangChain ChatOpenAI.bindTools, streamed: the chunks concatenate to the whole tool call, and the ToolMessage turn is answered', async () => {
    const g = await failover();
    const getWeather = lcTool(async () => JSON.stringify({ degrees: 18 }), { name: 'get_weather', description: 'Weather of a city', schema: weatherInput });
    const model = new ChatOpenAI({ model: 'gpt-4o', apiKey: CLIENT_KEY, configuration: { baseURL: g.s.baseURL } }).bindTools([getWeather]);
    let whole: AIMessageChunk | undefined;
    for await (const chunk of await model.stream([new HumanMessage('What is the weather in Paris?')])) whole = whole ? whole.concat(chunk) : chunk;
    expect(whole?.tool_calls).toEqual([expect.objectContaining({ name: 'get_weather', args: { city: 'Paris', unit: 'celsius' }, id: 'toolu_01A' })]);
    const toolResult = await getWeather.invoke(whole!.tool_calls![0]!);
    const answer = await model.invoke([new HumanMessage('What is the weather in Paris?'), new AIMessage({ content: '', tool_calls: whole!.tool_calls }), toolResult as ToolMessage]);
    expect(answer.content).toBe('It is 18 degrees in Paris.');
  });

  it('Agents SDK run() with a zod tool: the multi-step loop runs the tool and ends on Claude\'s answer', async () => {
    const g = await failover();
    const calls: unknown[] = [];
    const getWeather = agentTool({ name: 'get_weather', description: 'Weather of a city', parameters: weatherInput, execute: async (input) => (calls.push(input), 'degrees: 18') });
    const agent = new Agent({ name: 'weather', instructions: 'Answer with the tool.', tools: [getWeather], model: agentsModel(new OpenAI({ baseURL: g.s.baseURL, apiKey: CLIENT_KEY })) });
    const result = await run(agent, 'What is the weather in Paris?', { stream: true });
    for await (const _ of result.toTextStream()) void _;
    await result.completed;
    expect(calls).toEqual([{ city: 'Paris', unit: 'celsius' }]);
    expect(result.finalOutput).toBe('It is 18 degrees in Paris.');
  });
});

// ---------------------------------------------------------------------------------------------------------------

describe('4. the gateway\'s errors as each framework surfaces them', () => {
  const PROVIDER_KEY_ECHO = 'sk-proj-provider-secret-abcdef0123456789';
  const refused: Answer = () =>
    json(401, { error: { message: `Incorrect API key provided: ${PROVIDER_KEY_ECHO}. You can find your API key at https://platform.openai.com/account/api-keys.`, type: 'invalid_request_error', param: null, code: 'invalid_api_key' } });

  it('502 upstream_auth_error: status and code reach the framework, the provider\'s key never does, and the credential hold keeps the frameworks\' retries off the provider', async () => {
    compressFrameworkSleeps();
    for (const fw of FRAMEWORKS) {
      const g = await upstreams({ p: refused }, [{ provider: 'p' }], { providers: { p: { apiKey: PROVIDER_KEY_ECHO } } });
      const c = counted();
      const r = await settle(call(fw, g.s.baseURL, c));
      expect(r.ok).toBe(false);
      const text = errorText(r.ok ? undefined : r.error);
      expect(statusOf(r.ok ? undefined : r.error)).toBe(502);
      expect(text).toContain('upstream_auth_error');
      expect(text).not.toContain(PROVIDER_KEY_ECHO);
      expect(text).not.toContain('abcdef0123456789');
      expect(c.requests).toBe({ 'ai-sdk': 3, langchain: 7, agents: 1 }[fw]);
      // The target is held for authHoldS: the frameworks' retries are answered by the gateway alone.
      expect(g.seen.p).toHaveLength(1);
      record('upstream_auth_error (502)', fw, c, g.seen.p?.length ?? 0);
      await g.s.close();
    }
  });

  it('a client error (400 context_length_exceeded) reaches every framework at once, with its message and code, never retried', async () => {
    for (const fw of FRAMEWORKS) {
      const s = await startStack({ faults: { errors: [{ status: 400, code: 'context_length_exceeded', message: "This model's maximum context length is 128000 tokens." }] } });
      const c = counted();
      const r = await settle(call(fw, s.baseURL, c));
      expect(r.ok).toBe(false);
      const text = errorText(r.ok ? undefined : r.error);
      expect(statusOf(r.ok ? undefined : r.error)).toBe(400);
      expect(text).toContain('maximum context length');
      expect(c.requests).toBe(1);
      expect(upstreamTotal(s)).toBe(1);
      await s.close();
    }
  });
});

// ---------------------------------------------------------------------------------------------------------------

describe('5. the frameworks\' abort signals', () => {
  it('abortSignal (AI SDK), signal (LangChain) and run({ signal }) (Agents SDK) cancel the upstream request: no ghost at the provider', async () => {
    for (const fw of FRAMEWORKS) {
      const s = await startStack({ faults: { latencyMs: 3_000 }, ...RETRY_LOOP_ONLY });
      const c = counted();
      const controller = new AbortController();
      const pending = settle(call(fw, s.baseURL, c, { signal: controller.signal }));
      await waitFor(() => s.mock.stats().inflight === 1);
      controller.abort();
      const r = await pending;
      expect(r.ok).toBe(false);
      // The provider sees its request end (aborted), well before its 3 s answer, and no other request follows.
      await waitFor(() => s.mock.stats().inflight === 0, 1_500);
      await sleep(200);
      expect(s.mock.stats().total).toBe(1);
      expect(s.mock.requests()[0]?.aborted).toBe(true);
      expect(c.requests).toBe(1);
      await s.close();
    }
  });
});

async function waitFor(cond: () => boolean, ms = 3_000): Promise<void> {
  const until = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > until) throw new Error('condition not met in time');
    await sleep(10);
  }
}
