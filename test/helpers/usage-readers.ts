// Reading what a gateway of useScriptedUpstreams reported about a request's tokens: its log lines, the token metric,
// and what a client with a token rate was charged (read from the refusal of its next request). Shared by the usage
// suites (third-party suites 79 and 82).
import OpenAI from 'openai';
import { expect } from 'vitest';
import type { useScriptedUpstreams, UpstreamsGateway, UpstreamsOptions } from './scripted-upstreams.ts';
import { scrapeMetrics } from './stack.ts';

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- a log line is JSON: tests read whatever field they check
export type Line = Record<string, any>;

export async function until(what: string, check: () => boolean, withinMs = 10_000): Promise<void> {
  for (const end = Date.now() + withinMs; !check(); ) {
    if (Date.now() > end) throw new Error(`timed out waiting until ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** The request log lines (one per request), once `n` of them are written. */
export async function requestLines(g: UpstreamsGateway, n: number): Promise<Line[]> {
  const lines = () => g.s.logs.map((l) => JSON.parse(l) as Line).filter((l) => typeof l.reqId === 'string' && typeof l.durationMs === 'number');
  await until(`${n} request log lines`, () => lines().length >= n);
  return lines();
}

/** Every series of stormgate_tokens_total with a non-zero count, as `target kind` -> tokens. */
export async function tokens(g: UpstreamsGateway): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const s of await scrapeMetrics(g.s.url)) if (s.name === 'stormgate_tokens_total' && s.value !== 0) out[`${s.labels.target} ${s.labels.kind}`] = s.value;
  return out;
}

/** 3 tokens a minute: a token each 20 s, a bucket of 3 (as test/client-rate-delivered.test.ts reads a charge). */
export const TOKENS_PER_MINUTE = 3;
const MS_PER_TOKEN = 60_000 / TOKENS_PER_MINUTE;

type Start = ReturnType<typeof useScriptedUpstreams>;

/** Gateways whose one client (`agents`, key `key`) has a token rate, no random spread on its retry-after; and its client. */
export function tokenRated(start: Start, key: string) {
  const rated = (ups: Parameters<Start>[0], targets: Parameters<Start>[1], opts: UpstreamsOptions = {}) =>
    start(ups, targets, {
      ...opts,
      extra: { auth: { keys: { agents: key }, limits: { agents: { tokensPerMinute: TOKENS_PER_MINUTE } } } },
      deps: { random: () => 0 },
    });
  const agents = (g: UpstreamsGateway) => new OpenAI({ baseURL: g.s.baseURL, apiKey: key, maxRetries: 0 });
  /**
   * The tokens the client was charged so far, once `lines` request lines are written (after the settlement): the wait
   * its next request is told is the overdraft's time to pay back, so the charge is burst - 1 + wait / interval.
   */
  const charged = async (g: UpstreamsGateway, lines = 1): Promise<number> => {
    await requestLines(g, lines);
    const refused = await agents(g)
      .chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] })
      .catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(OpenAI.RateLimitError);
    const waitMs = Number((refused as InstanceType<typeof OpenAI.RateLimitError>).headers.get('retry-after-ms'));
    return TOKENS_PER_MINUTE - 1 + Math.round(waitMs / MS_PER_TOKEN);
  };
  return { rated, agents, charged };
}

/** What a body reserves for its prompt: its bytes / 4, rounded up (the SDK sends the params as JSON, in order). */
export const promptEstimate = (params: object) => Math.ceil(Buffer.byteLength(JSON.stringify(params)) / 4);
