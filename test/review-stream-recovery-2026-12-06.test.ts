// Second review of streamRecovery (2026-12-06), as a user of the official SDKs meets it: the answer the openai SDK
// assembles from a recovered stream (text, logprobs, usage, finish, id and created) against the same request unbroken,
// the mock's stream faults set through its control endpoint, a continuation refused with a 429, a client that leaves
// while the continuation is being matched, and a route on which the setting can do nothing.
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import type { ChatCompletionChunk } from 'openai/resources/chat/completions';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { configWarnings } from '../src/config/warnings.ts';
import type { MockServer } from '../src/mock/server.ts';
import { mockControl } from './helpers/mock-control.ts';
import { cc, delta, type Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';
import { defaultConfig, metricSum, requestLine, RETRY_LOOP_ONLY, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';

const cut = { destroy: true } as const;
const DONE = 'data: [DONE]\n\n';
const messages = [{ role: 'user' as const, content: 'Where is my order?' }];
/** A chunk of the next target's, whose completion has an id, a created time and a model of its own. */
const qc = (choices: unknown[], extra: Record<string, unknown> = {}) => cc(choices, { id: 'chatcmpl-Q', created: 1800000000, model: 'gpt-4o-mini', ...extra });
const logprobs = (...tokens: string[]) => ({ content: tokens.map((token) => ({ token, logprob: -0.1, bytes: [...Buffer.from(token)], top_logprobs: [] })), refusal: null });
/** p's stream: "Hello" (two tokens), then its connection is lost. */
const cutAfterHello: Script = { steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hello' }, null, 0, { logprobs: logprobs('Hel', 'lo') })]), 30, cut] };

const startUpstreams = useScriptedUpstreams();

describe('a spliced continuation (an OpenAI-compatible target asked the original request)', () => {
  // q's own answer is "Hello world"; the client had "Hello", so the splice falls inside q's chunk "lo wor".
  const q: Script = {
    steps: [
      qc([delta({ role: 'assistant', content: '' })]),
      qc([delta({ content: 'Hel' }, null, 0, { logprobs: logprobs('Hel') })]),
      qc([delta({ content: 'lo wor' }, null, 0, { logprobs: logprobs('lo', ' wor') })]),
      qc([delta({ content: 'ld' }, null, 0, { logprobs: logprobs('ld') })]),
      qc([delta({}, 'stop')]),
      qc([], { usage: { prompt_tokens: 3, completion_tokens: 3, total_tokens: 6 } }),
      DONE,
    ],
  };

  it('keeps the logprobs of the tokens past the seam in the chunk where the splice falls: they spell the text', async () => {
    const { client } = await startUpstreams({ p: () => cutAfterHello, q: () => q }, [{ provider: 'p' }, { provider: 'q' }], { route: { streamRecovery: 'continue' } });
    const done = await client.chat.completions.stream({ model: 'gpt-4o', messages, logprobs: true, stream_options: { include_usage: true } }).finalChatCompletion();
    const choice = done.choices[0]!;
    expect(choice.message.content).toBe('Hello world');
    // Observed before the fix: ["Hel", "lo", "ld"], " wor" lost with the chunk the splice rebuilt (logprobs: null).
    expect(choice.logprobs!.content!.map((t) => t.token)).toEqual(['Hel', 'lo', ' wor', 'ld']);
    expect(choice.finish_reason).toBe('stop');
    expect(done.usage).toEqual({ prompt_tokens: 3, completion_tokens: 3, total_tokens: 6 });
  });

  it('keeps the id and created of the completion the client began to get: every chunk has the same ones', async () => {
    const { client } = await startUpstreams({ p: () => cutAfterHello, q: () => q }, [{ provider: 'p' }, { provider: 'q' }], { route: { streamRecovery: 'continue' } });
    const chunks: ChatCompletionChunk[] = [];
    const stream = client.chat.completions.stream({ model: 'gpt-4o', messages, stream_options: { include_usage: true } });
    stream.on('chunk', (c) => chunks.push(c));
    const done = await stream.finalChatCompletion();
    expect(done.choices[0]!.message.content).toBe('Hello world');
    // Observed before the fix: chatcmpl-9 up to the seam, chatcmpl-Q after it (and the final completion's id q's).
    expect(new Set(chunks.map((c) => c.id))).toEqual(new Set(['chatcmpl-9']));
    expect(new Set(chunks.map((c) => c.created))).toEqual(new Set([1741290958]));
    expect(done.id).toBe('chatcmpl-9');
  });
});

describe('a prefill continuation', () => {
  const rest: Script = { steps: [qc([delta({ role: 'assistant', content: '' })]), qc([delta({ content: ' world' })]), qc([delta({}, 'stop')]), DONE] };

  it('keeps the id and created of the completion the client began to get', async () => {
    const { client } = await startUpstreams({ p: () => cutAfterHello, q: () => rest }, [{ provider: 'p' }, { provider: 'q' }], { route: { streamRecovery: 'continue' }, providers: { q: { prefill: true } } });
    const chunks: ChatCompletionChunk[] = [];
    const stream = client.chat.completions.stream({ model: 'gpt-4o', messages });
    stream.on('chunk', (c) => chunks.push(c));
    const done = await stream.finalChatCompletion();
    expect(done.choices[0]!.message.content).toBe('Hello world');
    expect(new Set(chunks.map((c) => `${c.id} ${c.created}`))).toEqual(new Set(['chatcmpl-9 1741290958']));
    // The model that wrote the rest is named as it is (a design question, not rewritten).
    expect(chunks.at(-1)!.model).toBe('gpt-4o-mini');
  });
});

describe('a continuation the next target refuses with a 429 and a retry-after', () => {
  it('leaves the client with the original cut, holds the target off for its retry-after, and counts one retry', async () => {
    const tooMany: Script = { status: 429, headers: { 'content-type': 'application/json', 'retry-after': '7' }, steps: ['{"error":{"message":"slow down","type":"rate_limit_error","code":"rate_limit_exceeded"}}'] };
    const { client, s } = await startUpstreams({ p: () => cutAfterHello, q: () => tooMany }, [{ provider: 'p' }, { provider: 'q' }], { route: { streamRecovery: 'continue' } });
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    let text = '';
    const err = await (async () => {
      for await (const c of stream) text += c.choices[0]?.delta?.content ?? '';
    })().catch((e: unknown) => e);
    expect(text).toBe('Hello');
    // The provider's cut, never the fallback's 429 (whose "slow down" would have the SDK's user wait and resend).
    expect(String(err)).toMatch(/cut/);
    expect(String(err)).not.toMatch(/slow down/);
    expect(await metricSum(s, 'stormgate_holds_started_total{target="q/gpt-4o",kind="hold_off"')).toBe(1);
    expect(await metricSum(s, 'stormgate_retry_count_total{route="chat",target="q/gpt-4o",reason="stream_cut"}')).toBe(1);
    const line = await requestLine(s);
    expect(line.streamEnd).toBe('cut');
    expect(line.attempts.map((a: { target: string; status: number }) => `${a.target} ${a.status}`)).toEqual(['p/gpt-4o 200', 'q/gpt-4o 429']);
  });
});

describe('a client that leaves while the continuation is matched against what it had', () => {
  it('leaves no continuation running upstream: its slot back at once, the request logged as client-gone', async () => {
    // q's answer comes slowly: "He", then three seconds, while the gateway waits for it to reach "Hello".
    const slow: Script = { steps: [qc([delta({ role: 'assistant', content: '' })]), qc([delta({ content: 'He' })]), 3_000, qc([delta({ content: 'llo' })]), 3_000, qc([delta({}, 'stop')]), DONE] };
    const { client, s, seen } = await startUpstreams({ p: () => cutAfterHello, q: () => slow }, [{ provider: 'p' }, { provider: 'q' }], { route: { streamRecovery: 'continue' } });
    const ac = new AbortController();
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }, { signal: ac.signal });
    const it = stream[Symbol.asyncIterator]();
    let text = '';
    while (text !== 'Hello') text += (await it.next()).value!.choices[0]?.delta?.content ?? '';
    for (const until = Date.now() + 5_000; seen.q!.length === 0 && Date.now() < until; ) await sleep(10);
    expect(seen.q).toHaveLength(1);
    await sleep(100);
    ac.abort();
    const line = await requestLine(s);
    expect(line.streamEnd).toBe('client-gone');
    expect(await metricSum(s, 'stormgate_pool_in_use{target="q/gpt-4o"')).toBe(0);
  });
});

describe('the mock\'s stream faults, set through its control endpoint, against the same request unbroken', () => {
  const startStack = useStacks();
  const startBackup = useExtraMocks();

  /** The stack's mock as the primary, a second mock as the OpenAI-compatible backup the continuation is spliced from. */
  async function primaryAndBackup(): Promise<{ s: Stack; backup: MockServer }> {
    const backup = await startBackup({ quiet: true, apiKey: 'backup-key' });
    const s = await startStack({
      config: (url) => {
        const base = defaultConfig(url, { provider: { ...RETRY_LOOP_ONLY.provider, timeouts: { idleMs: 300 } }, route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 1 } } });
        return {
          ...base,
          providers: { ...base.providers, backup: { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: 'backup-key', breaker: false } },
          routes: base.routes.map((r) => (r.name === 'chat' ? { ...r, targets: [{ provider: 'mock' }, { provider: 'backup' }], streamRecovery: 'continue' as const } : r)),
        } as ConfigInput;
      },
    });
    return { s, backup };
  }

  /** The log line of the second chat request (the recovering one), once written. */
  async function secondChatLine(s: Stack): Promise<Record<string, unknown>> {
    for (const until = Date.now() + 2_000; ; await sleep(10)) {
      const lines = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.route === 'chat');
      if (lines.length >= 2) return lines[1]!;
      if (Date.now() > until) throw new Error('no log line for the second request');
    }
  }

  it.each([
    ['cutAfterChunks', { cutAfterChunks: 2 }, 'recovered'],
    ['stallAfterChunks', { stallAfterChunks: 2 }, 'recovered'],
    ['errorAfterChunks', { errorAfterChunks: 2 }, 'recovered'],
  ])('%s: the SDK helper assembles the unbroken answer (text, logprobs, usage once, finish)', async (_name, stream, end) => {
    const { s, backup } = await primaryAndBackup();
    // Both mocks cut their answers into the same pieces, so the seam falls between two of the backup's tokens (a
    // token it split would be left out of the logprobs: the client had its first part already).
    await mockControl(backup, 'PUT', 'faults', { stream: { chunks: 6 } });
    const sdk = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    const body = { model: 'gpt-4o', messages, logprobs: true, stream_options: { include_usage: true } };
    const whole = await sdk.chat.completions.stream(body).finalChatCompletion();
    await mockControl(s.mock, 'PUT', 'faults', { stream: { chunks: 6, ...stream } });
    const chunks: ChatCompletionChunk[] = [];
    const recovering = sdk.chat.completions.stream(body);
    recovering.on('chunk', (c) => chunks.push(c));
    const done = await recovering.finalChatCompletion();
    const [a, b] = [done.choices[0]!, whole.choices[0]!];
    expect(a.message.content).toBe(b.message.content);
    expect(a.logprobs!.content!.map((t) => t.token).join('')).toBe(b.message.content);
    expect(a.finish_reason).toBe(b.finish_reason);
    expect(done.usage).toEqual(whole.usage);
    expect(chunks.filter((c) => c.usage)).toHaveLength(1);
    expect(new Set(chunks.map((c) => c.id)).size).toBe(1);
    expect((await secondChatLine(s)).streamEnd).toBe(end);
    expect(await metricSum(s, `stormgate_stream_ends_total{route="chat",end="${end}"}`)).toBe(1);
  });
});

describe('streamRecovery on a route whose API it does not cover', () => {
  const warningsOf = (path: string): string[] =>
    configWarnings(
      ConfigSchema.parse({
        providers:
          path === '/v1/messages'
            ? { p: { family: 'anthropic', baseUrl: 'https://api.anthropic.com', apiKey: 'k' }, q: { family: 'anthropic', baseUrl: 'https://example.com', apiKey: 'k2' } }
            : { p: { family: 'openai', baseUrl: 'https://api.openai.com/v1', apiKey: 'k' }, q: { family: 'openai', baseUrl: 'https://example.com/v1', apiKey: 'k2' } },
        routes: [{ name: 'r', match: { path }, targets: [{ provider: 'p' }, { provider: 'q' }], streamRecovery: 'continue' }],
      }),
    );

  it('is said at start-up: an Anthropic SDK user on /v1/messages (or a Responses user) would think it on', () => {
    // Observed before the fix: no warning; messages.stream().finalMessage() just rejects at every cut.
    expect(warningsOf('/v1/messages')).toEqual([expect.stringMatching(/^route r: streamRecovery continue does nothing on \/v1\/messages/)]);
    expect(warningsOf('/v1/responses')).toEqual([expect.stringMatching(/^route r: streamRecovery continue does nothing on \/v1\/responses/)]);
    expect(warningsOf('/v1/chat/completions')).toEqual([]);
  });

  it('leaves the Anthropic SDK\'s cut stream an error, never a partial message finalMessage() resolves with', async () => {
    const { s } = await (async () => {
      const start = startUpstreams;
      const ant = (type: string, body: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...body })}\n\n`;
      const head = [
        ant('message_start', { message: { id: 'msg_1', type: 'message', role: 'assistant', model: 'claude-sonnet-4-5', content: [], stop_reason: null, usage: { input_tokens: 20, output_tokens: 1 } } }),
        ant('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
        ant('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Hello' } }),
      ];
      return start(
        { p: { answer: () => ({ steps: [...head, 30, cut] }), family: 'anthropic' }, q: { answer: () => ({ steps: [...head] }), family: 'anthropic' } },
        [{ provider: 'p', model: 'claude-sonnet-4-5' }, { provider: 'q', model: 'claude-sonnet-4-5' }],
        { path: '/v1/messages', route: { streamRecovery: 'continue' } },
      );
    })();
    const anthropic = new Anthropic({ baseURL: s.url, apiKey: 'client-key', maxRetries: 0 });
    await expect(anthropic.messages.stream({ model: 'claude-sonnet-4-5', max_tokens: 64, messages }).finalMessage()).rejects.toThrow();
  });
});
