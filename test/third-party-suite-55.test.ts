// Third-party failure-scenario suite 55: translation fidelity under faults. An outside QA team's suite, written from
// the README alone ("Failover and API families", "Anthropic clients", "Streaming", "What the client sees", "Errors"):
// an `openai` 6.x client on a chat route whose OpenAI-family primary (the stack's mock) is failing (503s, resets, 500s,
// a silent first token) and whose Anthropic-family backup (a second mock, behind a recording forwarder that keeps each
// Messages body the gateway sent) answers, translated; and the `@anthropic-ai/sdk` on /v1/messages failing over from
// one Anthropic account to another. What a user expects to survive the translation while the primary is down: tool
// calls (single, parallel, streamed and assembled by the SDK's stream helpers, their arguments JSON intact both ways),
// system and developer messages, stop sequences, max_tokens / max_completion_tokens, finish_reason mapping, usage (the
// backup's own, streamed with include_usage), response_format, image parts, what Anthropic cannot express (the backup
// skipped, never sent something wrong), the backup's errors in the OpenAI shape, and the x-stormgate-* headers naming
// the backup.
// Found here: no translation bug; every case behaves as the README says. Asserted as the gateway behaves today, and
// reported as design questions: a backup's lasting 529 reaches an OpenAI client as HTTP 529 (a status OpenAI never
// sends); a history whose call arguments are not JSON skips the backup (not in the README's list of such requests).
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import { TOOL_ARGUMENTS } from '../src/mock/content.ts';
import type { FaultSpec, MockServer } from '../src/mock/server.ts';
import { claudeBackupConfig } from './helpers/claude-backup.ts';
import { toolCalls } from './helpers/chat-stream.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { expectOpenAIError, sdkError } from './helpers/openai-error.ts';
import { countingClient, requestLine, scrapeMetrics, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';

const startStack = useStacks();
const startMock = useExtraMocks();
const startProvider = useFakeProviders();

const CHAT = '/v1/chat/completions';
const BACKUP = 'claude/claude-sonnet-4-5';
const PRIMARY_DOWN: FaultSpec = { errors: [{ status: 503 }] };

type Chunk = OpenAI.ChatCompletionChunk;
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- a Messages body as the gateway wrote it: tests read the fields they check
type Sent = Record<string, any>;

const ask = [{ role: 'user' as const, content: 'What is the weather in Paris and the time in Tokyo?' }];
const params = { type: 'object', properties: { x: { type: 'number' } }, required: ['x'] };
const weatherTool = { type: 'function' as const, function: { name: 'get_weather', description: 'Weather of a city', parameters: params } };
const timeTool = { type: 'function' as const, function: { name: 'get_time', description: 'Local time of a city', parameters: params } };

interface Backup {
  mock: MockServer;
  /** The Messages bodies the gateway sent the backup, in order. */
  sent: Sent[];
  origin: string;
}

/**
 * The Anthropic backup: a mock (with `faults`) behind a forwarder that records each body and passes the answer back
 * byte for byte as it streams (a cut or reset of the mock's cuts the gateway's connection too).
 */
async function claudeBackup(faults: FaultSpec = {}): Promise<Backup> {
  const mock = await startMock({ apiKey: 'claude-key', faults });
  const sent: Sent[] = [];
  const hop = new Set(['host', 'connection', 'content-length', 'keep-alive', 'transfer-encoding']);
  const p = await startProvider((req, res) => {
    const parts: Buffer[] = [];
    req.on('data', (d: Buffer) => parts.push(d));
    req.on('end', () => {
      const raw = Buffer.concat(parts);
      sent.push(JSON.parse(raw.toString()) as Sent);
      const ac = new AbortController();
      res.on('close', () => ac.abort());
      const headers = Object.fromEntries(Object.entries(req.headers).filter(([k]) => !hop.has(k))) as Record<string, string>;
      void (async () => {
        try {
          const up = await fetch(`${mock.url}${req.url}`, { method: req.method, headers, body: raw, signal: ac.signal });
          const out: Record<string, string> = {};
          up.headers.forEach((v, k) => {
            if (!hop.has(k) && k !== 'content-encoding') out[k] = v;
          });
          res.writeHead(up.status, out);
          res.flushHeaders();
          if (up.body) for await (const c of up.body) res.write(c);
          res.end();
        } catch {
          res.destroy();
        }
      })();
    });
  });
  return { mock, sent, origin: p.origin };
}

interface Failover {
  s: Stack;
  backup: Backup;
  client: OpenAI;
  /** HTTP requests the SDK sent (its own retries included). */
  counter: { requests: number };
}

/** A chat route: the OpenAI primary with `primary` faults (down by default), then the Anthropic backup with `faults`. */
async function failover(opts: { primary?: FaultSpec; backup?: FaultSpec; edit?: (c: ConfigInput) => void } = {}): Promise<Failover> {
  const backup = await claudeBackup(opts.backup);
  const s = await startStack({
    faults: opts.primary ?? PRIMARY_DOWN,
    config: (url) => {
      const c = claudeBackupConfig(url, backup.origin);
      opts.edit?.(c);
      return c;
    },
  });
  const { client, counter } = countingClient(s, { logLevel: 'off', maxRetries: 0 });
  return { s, backup, client, counter };
}

const primaryRequests = (s: Stack) => s.mock.requests().filter((r) => r.path === CHAT);

/** The headers that say who answered: the backup, after the primary's two attempts. */
function expectBackupAnswered(h: Headers, attempts = '3', fallback = 'retries_exhausted') {
  expect(h.get('x-stormgate-target')).toBe(BACKUP);
  expect(h.get('x-stormgate-attempts')).toBe(attempts);
  expect(h.get('x-stormgate-fallback')).toBe(fallback);
}

async function drain(stream: AsyncIterable<Chunk>): Promise<{ chunks: Chunk[]; error?: unknown }> {
  const chunks: Chunk[] = [];
  try {
    for await (const c of stream) chunks.push(c);
    return { chunks };
  } catch (error) {
    return { chunks, error };
  }
}

/** A raw chat call (no SDK): the exact status, headers and body. */
async function raw(s: Stack, body: Record<string, unknown>) {
  const r = await fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages: ask, ...body }) });
  return { status: r.status, headers: r.headers, body: (await r.json()) as Record<string, unknown> };
}

// ---------------------------------------------------------------------------------------------------------------
describe('tool calls survive the failover', () => {
  it('a named tool_choice through a primary answering 503: one call, its arguments JSON intact, finish tool_calls, content null; Anthropic asked for that tool', async () => {
    const { s, backup, client } = await failover();
    const { data, response } = await client.chat.completions
      .create({ model: 'gpt-4o', messages: ask, tools: [weatherTool, timeTool], tool_choice: { type: 'function', function: { name: 'get_time' } } })
      .withResponse();
    expectBackupAnswered(response.headers);
    const choice = data.choices[0]!;
    expect(choice.finish_reason).toBe('tool_calls');
    expect(choice.message.content).toBeNull();
    expect(choice.message.tool_calls).toHaveLength(1);
    const call = choice.message.tool_calls![0]! as OpenAI.ChatCompletionMessageFunctionToolCall;
    expect(call.type).toBe('function');
    expect(call.function.name).toBe('get_time');
    expect(JSON.parse(call.function.arguments)).toEqual(JSON.parse(TOOL_ARGUMENTS));
    expect(call.id).toMatch(/^toolu_/);
    expect(backup.sent[0]!.tool_choice).toEqual({ type: 'tool', name: 'get_time' });
    expect(backup.sent[0]!.tools.map((t: { name: string }) => t.name)).toEqual(['get_weather', 'get_time']);
    expect(primaryRequests(s).map((r) => r.status)).toEqual([503, 503]);
  });

  it('tool_choice required through a primary that resets every connection: two parallel calls, distinct ids, each arguments parseable; Anthropic asked with tool_choice any', async () => {
    const { backup, client } = await failover({ primary: { resetRate: 1 } });
    const { data, response } = await client.chat.completions.create({ model: 'gpt-4o', messages: ask, tools: [weatherTool, timeTool], tool_choice: 'required' }).withResponse();
    expect(response.headers.get('x-stormgate-target')).toBe(BACKUP);
    const calls = data.choices[0]!.message.tool_calls as OpenAI.ChatCompletionMessageFunctionToolCall[];
    expect(calls.map((c) => c.function.name)).toEqual(['get_weather', 'get_time']);
    expect(new Set(calls.map((c) => c.id)).size).toBe(2);
    for (const c of calls) expect(JSON.parse(c.function.arguments)).toEqual({ x: 1 });
    expect(data.choices[0]!.finish_reason).toBe('tool_calls');
    expect(backup.sent[0]!.tool_choice).toEqual({ type: 'any' });
  });

  it("an agent's next turn during the outage: the history's call arguments (nested, non-ASCII) reach Anthropic as the same object, each result paired with its call", async () => {
    const { backup, client } = await failover();
    const args = { city: 'São Paulo', opts: { units: 'metric', days: [1, 2], note: 'quote " and \\ backslash' } };
    const data = await client.chat.completions.create({
      model: 'gpt-4o',
      tools: [weatherTool],
      messages: [
        { role: 'user', content: 'Weather in São Paulo?' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_Ab12', type: 'function', function: { name: 'get_weather', arguments: JSON.stringify(args) } }] },
        { role: 'tool', tool_call_id: 'call_Ab12', content: '{"temp":21}' },
      ],
    });
    expect(data.choices[0]!.finish_reason).toBe('stop');
    expect(data.choices[0]!.message.content).toMatch(/^Mock answer to: /);
    const [user, assistant, results] = backup.sent[0]!.messages as Sent[];
    expect(user!.role).toBe('user');
    const use = assistant!.content.find((b: Sent) => b.type === 'tool_use');
    expect(use.input).toEqual(args);
    expect(use.name).toBe('get_weather');
    const result = results!.content.find((b: Sent) => b.type === 'tool_result');
    expect(result.tool_use_id).toBe(use.id);
    expect(JSON.stringify(result.content)).toContain('temp');
  });

  it('a history whose call arguments are not JSON: the backup is skipped (never sent a guess), and the client gets the primary\'s 503 naming why', async () => {
    const { s, backup } = await failover();
    const r = await raw(s, {
      tools: [weatherTool],
      messages: [
        { role: 'user', content: 'Weather?' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"x": 1' } }] },
        { role: 'tool', tool_call_id: 'call_1', content: 'sunny' },
      ],
    });
    expect(r.status).toBe(503);
    const e = expectOpenAIError(r.body, 'service_unavailable', 'server_error');
    expect(e.message).toContain(`not tried: ${BACKUP}`);
    expect(e.message).toContain('arguments');
    expect(backup.sent).toHaveLength(0);
  });

  it('chat.completions.stream() through a primary that never answers (first-token timeout): finalChatCompletion() holds both calls whole, one arguments.done event each, finish tool_calls', async () => {
    const { s, backup } = await failover({
      // A hang, not a slow first token: the mock opens a tool call in its role chunk, and that opening is output.
      primary: { hangRate: 1 },
      edit: (c) => (c.providers['openai']!.timeouts = { firstTokenMs: 400 }),
    });
    // The stream helper has no withResponse(): the headers are read off the SDK's fetch.
    const answered: Headers[] = [];
    const watching = new OpenAI({ baseURL: s.baseURL, apiKey: 'k', maxRetries: 0, logLevel: 'off', fetch: async (u, i) => {
      const r = await fetch(u, i);
      answered.push(r.headers);
      return r;
    } });
    const done: Array<{ name: string; arguments: string }> = [];
    const runner = watching.chat.completions.stream({ model: 'gpt-4o', messages: ask, tools: [weatherTool, timeTool] });
    runner.on('tool_calls.function.arguments.done', (e) => done.push({ name: e.name, arguments: e.arguments }));
    const final = await runner.finalChatCompletion();
    expect(answered).toHaveLength(1);
    // A silent target is not retried when another can answer.
    expectBackupAnswered(answered[0]!, '2', 'timeout');
    expect(final.choices[0]!.finish_reason).toBe('tool_calls');
    const calls = final.choices[0]!.message.tool_calls as OpenAI.ChatCompletionMessageFunctionToolCall[];
    expect(calls.map((c) => [c.function.name, c.function.arguments])).toEqual([
      ['get_weather', TOOL_ARGUMENTS],
      ['get_time', TOOL_ARGUMENTS],
    ]);
    expect(done).toEqual([
      { name: 'get_weather', arguments: TOOL_ARGUMENTS },
      { name: 'get_time', arguments: TOOL_ARGUMENTS },
    ]);
    expect(backup.sent[0]!.stream).toBe(true);
    expect(primaryRequests(s)).toHaveLength(1);
  });

  it('strict tools streamed through a primary answering 500: finalChatCompletion() parses each call (parsed_arguments), as from OpenAI', async () => {
    const strictParams = { ...params, additionalProperties: false };
    const strict = (name: string) => ({ type: 'function' as const, function: { name, parameters: strictParams, strict: true } });
    const { backup, client } = await failover({ primary: { errors: [{ status: 500 }] } });
    const runner = client.chat.completions.stream({ model: 'gpt-4o', messages: ask, tools: [strict('get_weather'), strict('get_time')] });
    const final = await runner.finalChatCompletion();
    const calls = final.choices[0]!.message.tool_calls as Array<OpenAI.ChatCompletionMessageFunctionToolCall & { function: { parsed_arguments?: unknown } }>;
    expect(calls.map((c) => c.function.parsed_arguments)).toEqual([{ x: 1 }, { x: 1 }]);
    expect(backup.sent[0]!.tools.every((t: Sent) => t.strict === true)).toBe(true);
  });

  it("a malformed event inside the backup's streamed tool call: the stream helper's finalChatCompletion() rejects with stream_interrupted, never resolves a call with half its arguments", async () => {
    const { client } = await failover({ backup: { stream: { malformedAtChunk: 2 } } });
    const runner = client.chat.completions.stream({ model: 'gpt-4o', messages: ask, tools: [weatherTool, timeTool] });
    const done: string[] = [];
    runner.on('tool_calls.function.arguments.done', (e) => done.push(e.arguments));
    const err = await runner.finalChatCompletion().then(
      () => expect.unreachable('finalChatCompletion() resolved'),
      (e: unknown) => e as InstanceType<typeof OpenAI.APIError>,
    );
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.code).toBe('stream_interrupted');
    expect(done).toEqual([]);
  });

  it('streamed tool deltas in the shape the SDK needs: per call, the first delta alone carries id, type and name; the rest only argument fragments; one finish', async () => {
    const { client } = await failover();
    const { chunks, error } = await drain(await client.chat.completions.create({ model: 'gpt-4o', messages: ask, tools: [weatherTool, timeTool], stream: true }));
    expect(error).toBeUndefined();
    const deltas = chunks.flatMap((c) => c.choices.flatMap((x) => x.delta.tool_calls ?? []));
    for (const index of [0, 1]) {
      const mine = deltas.filter((d) => d.index === index);
      expect(mine[0]!.id).toMatch(/^toolu_/);
      expect(mine[0]!.type).toBe('function');
      expect(mine.slice(1).every((d) => d.id === undefined && d.function?.name === undefined)).toBe(true);
    }
    const calls = toolCalls(chunks);
    expect([calls[0]!.args, calls[1]!.args]).toEqual([TOOL_ARGUMENTS, TOOL_ARGUMENTS]);
    expect(chunks.filter((c) => c.choices[0]?.finish_reason != null).map((c) => c.choices[0]!.finish_reason)).toEqual(['tool_calls']);
    expect(chunks[0]!.choices[0]!.delta.role).toBe('assistant');
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('the request fields that shape the answer', () => {
  it('system and developer messages, wherever they stand, join the one system prompt in order; only user and assistant turns remain', async () => {
    const { backup, client } = await failover();
    const { response } = await client.chat.completions
      .create({
        model: 'gpt-4o',
        messages: [
          { role: 'system', content: 'You are terse.' },
          { role: 'developer', content: 'Answer in French.' },
          { role: 'user', content: 'Bonjour?' },
          { role: 'assistant', content: 'Oui.' },
          { role: 'user', content: 'Encore?' },
        ],
      })
      .withResponse();
    expectBackupAnswered(response.headers);
    const sent = backup.sent[0]!;
    const system = typeof sent.system === 'string' ? sent.system : (sent.system as Sent[]).map((b) => b.text).join('\n');
    expect(system).toContain('You are terse.');
    expect(system).toContain('Answer in French.');
    expect(system.indexOf('You are terse.')).toBeLessThan(system.indexOf('Answer in French.'));
    expect(sent.messages.map((m: Sent) => m.role)).toEqual(['user', 'assistant', 'user']);
  });

  it('stop sequences go as stop_sequences, a list as it is and a lone string as a list of one', async () => {
    const { backup, client } = await failover();
    await client.chat.completions.create({ model: 'gpt-4o', messages: ask, stop: ['END', '###'] });
    await client.chat.completions.create({ model: 'gpt-4o', messages: ask, stop: 'STOP' });
    expect(backup.sent.map((b) => b.stop_sequences)).toEqual([['END', '###'], ['STOP']]);
  });

  it('max_tokens 3: sent as max_tokens 3, the cut answer finishes with "length" and bills 3 tokens; without a limit, defaultMaxTokens (4096) and "stop"', async () => {
    const { backup, client } = await failover();
    const data = await client.chat.completions.create({ model: 'gpt-4o', messages: ask, max_tokens: 3 });
    expect(backup.sent[0]!.max_tokens).toBe(3);
    expect(data.choices[0]!.finish_reason).toBe('length');
    expect(data.usage!.completion_tokens).toBe(3);
    expect(data.choices[0]!.message.content!.length).toBeLessThanOrEqual(12);
    const free = await client.chat.completions.create({ model: 'gpt-4o', messages: ask });
    expect(backup.sent[1]!.max_tokens).toBe(4096);
    expect(free.choices[0]!.finish_reason).toBe('stop');
    expect(free.choices[0]!.message.content).toBe(`Mock answer to: ${ask[0]!.content.slice(0, 40)}`);
  });

  it('max_completion_tokens 4 streamed with include_usage: sent as max_tokens 4, the finish is "length" and the usage chunk counts 4', async () => {
    const { backup, client } = await failover();
    const { chunks, error } = await drain(
      await client.chat.completions.create({ model: 'gpt-4o', messages: ask, max_completion_tokens: 4, stream: true, stream_options: { include_usage: true } }),
    );
    expect(error).toBeUndefined();
    expect(backup.sent[0]!.max_tokens).toBe(4);
    expect(chunks.filter((c) => c.choices[0]?.finish_reason != null).map((c) => c.choices[0]!.finish_reason)).toEqual(['length']);
    expect(chunks.at(-1)!.usage!.completion_tokens).toBe(4);
  });

  it('temperature and top_p are dropped (the documented default), and the request is answered rather than refused', async () => {
    const { backup, client } = await failover();
    const { response } = await client.chat.completions.create({ model: 'gpt-4o', messages: ask, temperature: 0.7, top_p: 0.9 }).withResponse();
    expect(response.status).toBe(200);
    expect(backup.sent[0]).not.toHaveProperty('temperature');
    expect(backup.sent[0]).not.toHaveProperty('top_p');
  });

  it('image parts, an https URL and a base64 PNG beside text, reach Anthropic in order as url and base64 sources', async () => {
    const { backup, client } = await failover();
    // A 1x1 PNG: its bytes say image/png.
    const png = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==';
    const { response } = await client.chat.completions
      .create({
        model: 'gpt-4o',
        messages: [
          {
            role: 'user',
            content: [
              { type: 'text', text: 'Compare these.' },
              { type: 'image_url', image_url: { url: 'https://example.com/cat.jpg', detail: 'high' } },
              { type: 'image_url', image_url: { url: `data:image/png;base64,${png}` } },
            ],
          },
        ],
      })
      .withResponse();
    expectBackupAnswered(response.headers);
    const blocks = backup.sent[0]!.messages[0].content as Sent[];
    expect(blocks.map((b) => b.type)).toEqual(['text', 'image', 'image']);
    expect(blocks[1]!.source).toEqual({ type: 'url', url: 'https://example.com/cat.jpg' });
    expect(blocks[2]!.source).toEqual({ type: 'base64', media_type: 'image/png', data: png });
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe("usage is the backup's own", () => {
  it("a whole answer's usage is what Anthropic reported for the body the gateway sent, prompt + completion = total", async () => {
    const { backup, client } = await failover();
    const data = await client.chat.completions.create({ model: 'gpt-4o', messages: ask, tools: [weatherTool] });
    const direct = await new Anthropic({ baseURL: backup.mock.url, apiKey: 'claude-key', maxRetries: 0, logLevel: 'off' }).messages.create(
      backup.sent[0] as Anthropic.MessageCreateParamsNonStreaming,
    );
    expect(data.usage!.prompt_tokens).toBe(direct.usage.input_tokens);
    expect(data.usage!.completion_tokens).toBe(direct.usage.output_tokens);
    expect(data.usage!.total_tokens).toBe(direct.usage.input_tokens + direct.usage.output_tokens);
    expect(data.model).toBe('claude-sonnet-4-5');
  });

  it('streamed with include_usage: exactly one usage chunk (choices []), last, equal to the whole answer\'s; stream_options is not sent to Anthropic', async () => {
    const { backup, client } = await failover();
    const whole = await client.chat.completions.create({ model: 'gpt-4o', messages: ask });
    const { chunks, error } = await drain(await client.chat.completions.create({ model: 'gpt-4o', messages: ask, stream: true, stream_options: { include_usage: true } }));
    expect(error).toBeUndefined();
    const withUsage = chunks.filter((c) => c.usage != null);
    expect(withUsage).toHaveLength(1);
    expect(chunks.at(-1)).toBe(withUsage[0]);
    expect(withUsage[0]!.choices).toEqual([]);
    expect(withUsage[0]!.usage).toMatchObject({ prompt_tokens: whole.usage!.prompt_tokens, completion_tokens: whole.usage!.completion_tokens, total_tokens: whole.usage!.total_tokens });
    expect(backup.sent[1]).not.toHaveProperty('stream_options');
  });

  it("a text stream whose primary was cut after its role chunk (before any output): the client's stream is the backup's alone, one role chunk, one id, one model", async () => {
    const { s, client } = await failover({ primary: { stream: { cutAfterChunks: 0 } } });
    const { data, response } = await client.chat.completions.create({ model: 'gpt-4o', messages: ask, stream: true, stream_options: { include_usage: true } }).withResponse();
    const { chunks, error } = await drain(data);
    expect(error).toBeUndefined();
    expectBackupAnswered(response.headers);
    expect(chunks.filter((c) => c.choices[0]?.delta.role !== undefined)).toHaveLength(1);
    expect(new Set(chunks.map((c) => c.id)).size).toBe(1);
    expect(new Set(chunks.map((c) => c.model))).toEqual(new Set(['claude-sonnet-4-5']));
    expect(chunks.map((c) => c.choices[0]?.delta.content ?? '').join('')).toBe(`Mock answer to: ${ask[0]!.content.slice(0, 40)}`);
    expect(primaryRequests(s).every((r) => r.stream)).toBe(true);
  });

  it("the streamed answer's tokens are billed to the backup that answered (stormgate_tokens_total, the log line), none to the primary that failed", async () => {
    const { s, client } = await failover();
    const { chunks } = await drain(await client.chat.completions.create({ model: 'gpt-4o', messages: ask, stream: true, stream_options: { include_usage: true } }));
    const usage = chunks.at(-1)!.usage!;
    const line = await requestLine(s);
    expect(line.target).toBe(BACKUP);
    expect(line.usage).toMatchObject({ prompt: usage.prompt_tokens, completion: usage.completion_tokens });
    const tokens = (await scrapeMetrics(s.url)).filter((m) => m.name === 'stormgate_tokens_total');
    const billed = (target: string, kind: string) => tokens.filter((m) => m.labels['target'] === target && m.labels['kind'] === kind).reduce((a, m) => a + m.value, 0);
    expect(billed(BACKUP, 'prompt')).toBe(usage.prompt_tokens);
    expect(billed(BACKUP, 'completion')).toBe(usage.completion_tokens);
    expect(billed('openai/gpt-4o', 'prompt') + billed('openai/gpt-4o', 'completion')).toBe(0);
  });

});

// ---------------------------------------------------------------------------------------------------------------
describe('response_format', () => {
  it('json_schema while the primary asks for a 120 s pause: .parse() gets an object of the schema from the backup (fallback wait_hint), Anthropic asked for output_config.format', async () => {
    const { backup, client } = await failover({ primary: { errors: [{ status: 429, headers: { 'retry-after': '120' } }] } });
    const schema = { type: 'object', properties: { city: { type: 'string' }, temp: { type: 'number' } }, required: ['city', 'temp'], additionalProperties: false };
    const { data, response } = await client.chat.completions
      .parse({ model: 'gpt-4o', messages: ask, response_format: { type: 'json_schema', json_schema: { name: 'weather', strict: true, schema } } })
      .withResponse();
    expectBackupAnswered(response.headers, '2', 'wait_hint');
    const parsed = data.choices[0]!.message.parsed as unknown as { city: unknown; temp: unknown };
    expect(typeof parsed.city).toBe('string');
    expect(typeof parsed.temp).toBe('number');
    expect(backup.sent[0]!.output_config.format.type).toBe('json_schema');
  });

  it("json_object, which Anthropic cannot express: the backup is never asked, the client gets the primary's 503 in the OpenAI shape naming the backup not tried", async () => {
    const { s, backup } = await failover();
    const r = await raw(s, { response_format: { type: 'json_object' } });
    expect(r.status).toBe(503);
    const e = expectOpenAIError(r.body, 'service_unavailable', 'server_error');
    expect(e.message).toMatch(new RegExp(`not tried: ${BACKUP} \\(.*json_object`));
    expect(r.headers.get('x-stormgate-target')).toBe('openai/gpt-4o');
    expect(r.headers.get('x-should-retry')).toBe('false');
    expect(backup.sent).toHaveLength(0);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('what the backup cannot express is skipped, never sent wrong', () => {
  const inexpressible: Array<[string, Record<string, unknown>]> = [
    ['n: 2', { n: 2 }],
    ['logprobs', { logprobs: true, top_logprobs: 2 }],
    ['a whitespace-only stop sequence', { stop: ['\n'] }],
  ];
  it.each(inexpressible)("%s with the primary down: the primary's 503, its message ending with the backup not tried and why; nothing sent to the backup", async (_, extra) => {
    const { s, backup } = await failover();
    const r = await raw(s, extra);
    expect(r.status).toBe(503);
    const e = expectOpenAIError(r.body, 'service_unavailable', 'server_error');
    expect(e.message).toMatch(new RegExp(`not tried: ${BACKUP} \\(.+\\)$`));
    expect(backup.sent).toHaveLength(0);
    expect(primaryRequests(s)).toHaveLength(2);
  });

  it("n: 2 on a route whose only target is Anthropic: 400 invalid_body in the OpenAI shape, param n, the client's to fix (not a 503)", async () => {
    const { s, backup } = await failover({
      edit: (c) => c.routes.unshift({ name: 'smart', match: { path: CHAT, models: ['smart'] }, targets: [{ provider: 'claude', model: 'claude-sonnet-4-5' }] }),
    });
    const r = await raw(s, { model: 'smart', n: 2 });
    expect(r.status).toBe(400);
    const e = expectOpenAIError(r.body, 'invalid_body');
    expect(e.param).toBe('n');
    expect(r.headers.get('x-should-retry')).toBe('false');
    expect(backup.sent).toHaveLength(0);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe("the backup's errors, as the OpenAI SDK sees them", () => {
  it("the backup's 400 after the primary was down: the primary's 503 with the fallback's rejection appended, never a 4xx telling the client to change a valid request", async () => {
    const { client } = await failover({ backup: { errors: [{ status: 400, message: 'max_tokens: 999999 > 64000, which is the maximum' }] } });
    const err = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages: ask }));
    expect(err.status).toBe(503);
    expect(err.message).toContain(`the fallback ${BACKUP} rejected the request (400`);
    expect(err.message).toContain('max_tokens: 999999');
    expect(err.headers?.get('x-should-retry')).toBe('false');
  });

  it("a lasting 529 overloaded_error at the backup too: its status and message in the OpenAI shape, naming the backup as the last to fail after every attempt; the SDK does not retry", async () => {
    const { s, backup } = await failover({ backup: { errors: [{ status: 529, message: 'Overloaded, try later.' }] } });
    const { client, counter } = countingClient(s, { logLevel: 'off' }); // the SDK's default retries
    const err = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages: ask }));
    expect(err.status).toBe(529);
    expect(err).toBeInstanceOf(OpenAI.InternalServerError);
    expect(err.message).toContain('Overloaded, try later.');
    expect(err.headers?.get('x-stormgate-target')).toBe(BACKUP);
    expect(err.headers?.get('x-stormgate-attempts')).toBe('4');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(counter.requests).toBe(1);
    expect(backup.sent).toHaveLength(2);
    const r = await raw(s, {});
    expect(r.status).toBe(529);
    expectOpenAIError(r.body, 'overloaded', 'server_error');
  });

  it("the backup's 401 (the gateway's key for it refused): 502 upstream_auth_error, no retry-after, x-should-retry false; the backup asked once", async () => {
    const { s, backup } = await failover({ backup: { errors: [{ status: 401 }] } });
    const r = await raw(s, {});
    expect(r.status).toBe(502);
    expectOpenAIError(r.body, 'upstream_auth_error', 'server_error');
    expect(r.headers.get('retry-after')).toBeNull();
    expect(r.headers.get('x-should-retry')).toBe('false');
    expect(backup.sent).toHaveLength(1);
  });

  it("a streamed request whose backup's stream opens with an overloaded_error event every time: the SDK gets an error status before any chunk, never an empty stream", async () => {
    const { client, backup } = await failover({ backup: { stream: { errorAfterChunks: 0 } } });
    const err = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages: ask, stream: true }));
    expect(err.status).toBeGreaterThanOrEqual(500);
    expect(err.headers?.get('x-stormgate-target')).toBe(BACKUP);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(backup.sent).toHaveLength(2);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('the Anthropic SDK on /v1/messages, failing over to another account', () => {
  async function messagesFailover(primary: FaultSpec, backupFaults: FaultSpec = {}) {
    const backup = await claudeBackup(backupFaults);
    const s = await startStack({
      faults: primary,
      config: (url) => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: {
          anthropic: { family: 'anthropic', baseUrl: url, apiKey: 'sk-test-stormgate-0123456789', breaker: false },
          'anthropic-backup': { family: 'anthropic', baseUrl: backup.origin, apiKey: 'claude-key', breaker: false },
        },
        routes: [
          {
            name: 'claude-agents',
            match: { path: '/v1/messages', models: ['claude-*'] },
            targets: [{ provider: 'anthropic' }, { provider: 'anthropic-backup', model: 'claude-haiku-4-5' }],
            retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 10, capMs: 10 } },
            budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 },
            park: false,
          },
        ],
      }),
    });
    const anthropic = new Anthropic({ baseURL: s.url, apiKey: 'client-key', maxRetries: 0, logLevel: 'off' });
    return { s, backup, anthropic };
  }

  const body = {
    model: 'claude-sonnet-4-6',
    max_tokens: 256,
    system: 'You are a weather bot.',
    stop_sequences: ['END'],
    tools: [{ name: 'get_weather', description: 'Weather', input_schema: { type: 'object' as const, properties: { x: { type: 'number' } } } }],
    messages: [{ role: 'user' as const, content: 'Weather in Paris?' }],
  };

  it('messages.stream() through a lasting 529 at the first account: finalMessage() has the tool_use input whole, the model is the backup\'s, and the body went on as written but for the model', async () => {
    const { backup, anthropic } = await messagesFailover({ errors: [{ status: 529 }] });
    const stream = anthropic.messages.stream(body);
    const final = await stream.finalMessage();
    const { response } = await stream.withResponse();
    expect(response.headers.get('x-stormgate-target')).toBe('anthropic-backup/claude-haiku-4-5');
    expect(response.headers.get('x-stormgate-attempts')).toBe('3');
    expect(final.model).toBe('claude-haiku-4-5');
    expect(final.stop_reason).toBe('tool_use');
    const use = final.content.find((b) => b.type === 'tool_use');
    expect(use).toMatchObject({ name: 'get_weather', input: { x: 1 } });
    expect(backup.sent[0]).toEqual({ ...body, model: 'claude-haiku-4-5', stream: true });
  });

  it('a lasting 529 at both accounts: the SDK raises OverloadedError (529) once, naming the backup and 4 attempts, the body Anthropic\'s shape', async () => {
    const { s, anthropic } = await messagesFailover({ errors: [{ status: 529 }] }, { errors: [{ status: 529 }] });
    const err = await anthropic.messages.create(body).then(
      () => expect.unreachable('expected a rejection'),
      (e: unknown) => e as InstanceType<typeof Anthropic.APIError>,
    );
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(err.status).toBe(529);
    expect(err.headers?.get('x-stormgate-target')).toBe('anthropic-backup/claude-haiku-4-5');
    expect(err.headers?.get('x-stormgate-attempts')).toBe('4');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect((err.error as { type?: string; error?: { type?: string } }).error?.type).toBe('overloaded_error');
    expect(s.mock.requests()).toHaveLength(2);
  });
});
