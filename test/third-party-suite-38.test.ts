// Third-party failure-scenario suite 38: an outside team's failover suite for LLM gateways, written from the README
// ("Failover and API families", "What the client sees", "Retry budget, circuit breaker, hold-offs, parking",
// "Deadlines and timeouts", "Logs and metrics") and driven over real HTTP on 127.0.0.1 with the official `openai` 6.x
// SDK and `@anthropic-ai/sdk`. Every route has two targets: an OpenAI primary (the bundled mock) and a backup, either
// Claude (a second bundled mock, spoken to in Anthropic's Messages API, which it checks as strictly as the real one)
// or a second OpenAI-compatible mock; on /v1/messages two Anthropic accounts. One primary is the suite's own node:http
// server, for an answer the mock cannot give (a 200 whose `choices` is empty).
// What is asserted is what the client sees (statuses, x-stormgate-* headers, the text, tool calls and JSON it gets,
// what the SDK raises and how often it sent), what each upstream received, and that /metrics agrees with both.
// Found here: no gateway bug. Noted for the maintainers: when both targets fail with errors that are passed on (the
// primary's 503s, then Claude's 529s), the client gets the last target's own error (its status, 529, and message) with
// x-stormgate-target and x-stormgate-attempts naming it, but not the "N attempts in all: a 2, b 2" the gateway adds to
// its own errors (README, "The final error names the target that failed last"); the test asserts the headers only.
import { createServer, type Server } from 'node:http';
import { once } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import type { MockServer } from '../src/mock/server.ts';
import { scrapeMetrics, useExtraMocks, useGateways, type MetricSample } from './helpers/stack.ts';
import { sdkError } from './helpers/openai-error.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();

const CLAUDE = 'claude-sonnet-4-5';

interface Pair {
  url: string;
  primary: MockServer;
  backup: MockServer;
  logs: string[];
  openai(opts?: { maxRetries?: number; headers?: Record<string, string>; counter?: { requests: number } }): OpenAI;
}

interface PairOptions {
  /** The backup's family: a Claude backup (default) or a second OpenAI-compatible server. */
  backup?: 'anthropic' | 'openai';
  /** YAML flow maps spliced into the providers and the route. */
  primaryExtra?: string;
  backupExtra?: string;
  routeExtra?: string;
  breaker?: string;
  park?: boolean;
  retry?: string;
  /** The primary's origin, when it is not a mock. */
  primaryOrigin?: string;
}

/** A gateway whose chat route sends to the primary, then the backup. */
async function pair(o: PairOptions = {}): Promise<Pair> {
  const primary = await startMock();
  const backup = await startMock();
  const family = o.backup ?? 'anthropic';
  const breaker = o.breaker ?? 'false';
  const yaml = `
server: { host: 127.0.0.1, port: 0, logLevel: info }
providers:
  primary: { family: openai, baseUrl: "${o.primaryOrigin ?? primary.url}/v1", apiKey: sk-primary-0123456789, breaker: ${breaker}${o.primaryExtra ? `, ${o.primaryExtra}` : ''} }
  ${family === 'anthropic' ? 'claude' : 'backup'}: { family: ${family}, baseUrl: "${family === 'anthropic' ? backup.url : `${backup.url}/v1`}", apiKey: sk-backup-0123456789, breaker: ${breaker}${o.backupExtra ? `, ${o.backupExtra}` : ''} }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: primary }, ${family === 'anthropic' ? `{ provider: claude, model: ${CLAUDE} }` : '{ provider: backup }'} ]
    retry: ${o.retry ?? '{ maxAttempts: 2, backoff: { baseMs: 10, capMs: 20 } }'}
    budget: { ratio: 10, minRetriesPerSecond: 100 }
${o.park ? '' : '    park: false\n'}${o.routeExtra ? `    ${o.routeExtra}\n` : ''}`;
  const logs: string[] = [];
  const url = await startGateway(parseConfig(yaml, 'suite38.yaml', {}), { logs });
  return {
    url,
    primary,
    backup,
    logs,
    openai: ({ maxRetries = 0, headers = {}, counter } = {}) =>
      new OpenAI({
        baseURL: `${url}/v1`,
        apiKey: 'sk-client-not-a-provider-key',
        maxRetries,
        logLevel: 'off',
        defaultHeaders: headers,
        fetch: async (u, init) => {
          if (counter) counter.requests++;
          return fetch(u, init);
        },
      }),
  };
}

const hi = [{ role: 'user' as const, content: 'Where is my parcel?' }];
const askChat = { model: 'gpt-4o', messages: hi };
const upstreamRequests = (m: MockServer, path: string) => m.requests().filter((r) => r.path === path);
const sum = (samples: MetricSample[], name: string, labels: Record<string, string> = {}) =>
  samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v)).reduce((a, s) => a + s.value, 0);

const tools = [
  { type: 'function' as const, function: { name: 'get_weather', description: 'Weather in a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } },
  { type: 'function' as const, function: { name: 'get_time', description: 'Time in a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } },
];

describe('streaming through a primary brownout', () => {
  it("streams the Claude backup's answer, named on the stream's headers, after the primary's two 503s", async () => {
    const g = await pair();
    g.primary.brownout('503', 60_000);
    const { data: stream, response } = await g.openai().chat.completions.create({ ...askChat, stream: true }).withResponse();
    let text = '';
    let finish: string | null = null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    expect(response.status).toBe(200);
    expect(response.headers.get('content-type')).toMatch(/^text\/event-stream/);
    expect(response.headers.get('x-stormgate-target')).toBe(`claude/${CLAUDE}`);
    expect(response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(response.headers.get('x-stormgate-attempts')).toBe('3');
    expect(text).toBe('Mock answer to: Where is my parcel?');
    expect(finish).toBe('stop');
    expect(upstreamRequests(g.primary, '/v1/chat/completions').map((r) => r.status)).toEqual([503, 503]);
    const sent = upstreamRequests(g.backup, '/v1/messages');
    expect(sent).toHaveLength(1);
    expect(sent[0]!.stream).toBe(true);
    expect(sent[0]!.headers['x-api-key']).toBe('sk-backup-0123456789');
    expect(sent[0]!.headers['authorization']).toBeUndefined();
  });

  it("carries the backup's model and a usage chunk on a streamed answer with include_usage, and the backup's model whole", async () => {
    const g = await pair();
    g.primary.brownout('503', 60_000);
    const stream = await g.openai().chat.completions.create({ ...askChat, stream: true, stream_options: { include_usage: true } });
    const usages: Array<OpenAI.CompletionUsage> = [];
    const models = new Set<string>();
    for await (const chunk of stream) {
      models.add(chunk.model);
      if (chunk.usage) usages.push(chunk.usage);
    }
    expect(usages).toHaveLength(1);
    expect(usages[0]!.prompt_tokens).toBeGreaterThan(0);
    expect(usages[0]!.completion_tokens).toBeGreaterThan(0);
    expect(usages[0]!.total_tokens).toBe(usages[0]!.prompt_tokens + usages[0]!.completion_tokens);
    expect([...models].every((m) => m.startsWith('claude-sonnet-4-5'))).toBe(true);
    const whole = await g.openai().chat.completions.create(askChat);
    expect(whole.model.startsWith('claude-sonnet-4-5')).toBe(true);
    expect(whole.usage!.prompt_tokens).toBeGreaterThan(0);
  });

  it('does not fail a stream over once the primary sent its first output: the SDK raises, the backup is asked nothing', async () => {
    const g = await pair();
    g.primary.patchFaults({ stream: { cutAfterChunks: 2 } });
    const stream = await g.openai().chat.completions.create({ ...askChat, stream: true });
    let text = '';
    let raised: unknown;
    try {
      for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
    } catch (e) {
      raised = e;
    }
    expect(text.length).toBeGreaterThan(0);
    expect(raised).toBeInstanceOf(Error);
    expect(upstreamRequests(g.backup, '/v1/messages')).toHaveLength(0);
    expect(upstreamRequests(g.primary, '/v1/chat/completions')).toHaveLength(1);
  });
});

describe('tool calls through the Claude backup', () => {
  it('translates a named tool_choice and brings the forced call back whole, as the SDK reads it', async () => {
    const g = await pair();
    g.primary.brownout('503', 60_000);
    const { data, response } = await g
      .openai()
      .chat.completions.create({ ...askChat, tools, tool_choice: { type: 'function', function: { name: 'get_time' } } })
      .withResponse();
    expect(response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    const choice = data.choices[0]!;
    expect(choice.finish_reason).toBe('tool_calls');
    const calls = choice.message.tool_calls ?? [];
    expect(calls).toHaveLength(1);
    const call = calls[0]! as OpenAI.ChatCompletionMessageFunctionToolCall;
    expect(call.type).toBe('function');
    expect(call.function.name).toBe('get_time');
    expect(JSON.parse(call.function.arguments)).toEqual({ x: 1 });
    expect(call.id).toMatch(/^toolu_/);
  });

  it('streams tool_choice "required" with parallel_tool_calls false as exactly one call, assembled by the SDK', async () => {
    const g = await pair();
    g.primary.brownout('503', 60_000);
    const runner = g.openai().chat.completions.stream({ ...askChat, tools, tool_choice: 'required', parallel_tool_calls: false });
    const final = await runner.finalChatCompletion();
    const choice = final.choices[0]!;
    expect(choice.finish_reason).toBe('tool_calls');
    expect(choice.message.tool_calls).toHaveLength(1);
    const call = choice.message.tool_calls![0]! as OpenAI.ChatCompletionMessageFunctionToolCall;
    expect(call.function.name).toBe('get_weather');
    expect(JSON.parse(call.function.arguments)).toEqual({ x: 1 });
  });

  it("sends an agent's tool-result turn (OpenAI call ids) to Claude in a shape it accepts, and gets the final text", async () => {
    const g = await pair();
    g.primary.brownout('503', 60_000);
    const messages: OpenAI.ChatCompletionMessageParam[] = [
      { role: 'system', content: 'You are a travel agent.' },
      { role: 'user', content: 'Weather and time in Oslo?' },
      {
        role: 'assistant',
        content: null,
        tool_calls: [
          { id: 'call_abc123', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } },
          { id: 'call_def456', type: 'function', function: { name: 'get_time', arguments: '{"city":"Oslo"}' } },
        ],
      },
      { role: 'tool', tool_call_id: 'call_abc123', content: '3 degrees, snow' },
      { role: 'tool', tool_call_id: 'call_def456', content: '14:05' },
    ];
    const { data, response } = await g.openai().chat.completions.create({ model: 'gpt-4o', messages, tools }).withResponse();
    expect(response.headers.get('x-stormgate-target')).toBe(`claude/${CLAUDE}`);
    expect(data.choices[0]!.finish_reason).toBe('stop');
    expect(data.choices[0]!.message.tool_calls ?? []).toHaveLength(0);
    expect(typeof data.choices[0]!.message.content).toBe('string');
    expect(upstreamRequests(g.backup, '/v1/messages').map((r) => r.status)).toEqual([200]);
  });
});

describe("what other clients send by default, through the Claude backup", () => {
  it("answers a LangChain-style body (n 1, logprobs false, zero penalties, top_p 1, empty tools) from Claude, not 'not tried'", async () => {
    const g = await pair();
    g.primary.brownout('503', 60_000);
    const body = {
      ...askChat,
      n: 1,
      logprobs: false,
      frequency_penalty: 0,
      presence_penalty: 0,
      top_p: 1,
      temperature: 0.7,
      tools: [],
      stream_options: undefined,
    } as unknown as OpenAI.ChatCompletionCreateParamsNonStreaming;
    const { data, response } = await g.openai().chat.completions.create(body).withResponse();
    expect(response.headers.get('x-stormgate-target')).toBe(`claude/${CLAUDE}`);
    expect(data.choices).toHaveLength(1);
    expect(data.choices[0]!.message.content).toBe('Mock answer to: Where is my parcel?');
    expect(upstreamRequests(g.backup, '/v1/messages').map((r) => r.status)).toEqual([200]);
  });

  it('keeps max_completion_tokens through the failover: Claude stops at it, finish_reason length, whole and streamed', async () => {
    const g = await pair();
    g.primary.brownout('503', 60_000);
    const whole = await g.openai().chat.completions.create({ ...askChat, max_completion_tokens: 3 });
    expect(whole.choices[0]!.finish_reason).toBe('length');
    expect(whole.usage!.completion_tokens).toBeLessThanOrEqual(3);
    expect(whole.choices[0]!.message.content!.length).toBeLessThan('Mock answer to: Where is my parcel?'.length);
    const stream = await g.openai().chat.completions.create({ ...askChat, max_completion_tokens: 3, stream: true, stream_options: { include_usage: true } });
    let finish: string | null = null;
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const chunk of stream) {
      finish = chunk.choices[0]?.finish_reason ?? finish;
      usage = chunk.usage ?? usage;
    }
    expect(finish).toBe('length');
    expect(usage!.completion_tokens).toBeLessThanOrEqual(3);
  });

  it("streams an MCP client's dotted tool name back under its own name from Claude", async () => {
    const g = await pair();
    g.primary.brownout('503', 60_000);
    const mcpTools = [{ type: 'function' as const, function: { name: 'fs.read_file', parameters: { type: 'object', properties: { path: { type: 'string' } } } } }];
    const final = await g.openai().chat.completions.stream({ ...askChat, tools: mcpTools, tool_choice: 'required' }).finalChatCompletion();
    const calls = final.choices[0]!.message.tool_calls ?? [];
    expect(calls).toHaveLength(1);
    expect((calls[0] as OpenAI.ChatCompletionMessageFunctionToolCall).function.name).toBe('fs.read_file');
  });
});

describe('structured output through the Claude backup', () => {
  const format = {
    type: 'json_schema' as const,
    json_schema: {
      name: 'forecast',
      strict: true,
      schema: {
        type: 'object',
        properties: { city: { type: 'string' }, celsius: { type: 'number' }, snow: { type: 'boolean' } },
        required: ['city', 'celsius', 'snow'],
        additionalProperties: false,
      },
    },
  };
  const fits = (text: string) => {
    const v = JSON.parse(text) as Record<string, unknown>;
    expect(Object.keys(v).sort()).toEqual(['celsius', 'city', 'snow']);
    expect(typeof v.city).toBe('string');
    expect(typeof v.celsius).toBe('number');
    expect(typeof v.snow).toBe('boolean');
  };

  it('answers a json_schema response_format from Claude with JSON that fits it, whole and streamed', async () => {
    const g = await pair();
    g.primary.brownout('503', 60_000);
    const { data, response } = await g.openai().chat.completions.create({ ...askChat, response_format: format }).withResponse();
    expect(response.headers.get('x-stormgate-target')).toBe(`claude/${CLAUDE}`);
    fits(data.choices[0]!.message.content!);
    const stream = await g.openai().chat.completions.create({ ...askChat, response_format: format, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
    fits(text);
  });

  it('does not send json_object to Claude (it cannot express it): the client gets the primary 503, naming Claude as not tried', async () => {
    const g = await pair();
    g.primary.brownout('503', 60_000);
    const err = await sdkError(g.openai({ maxRetries: 2 }).chat.completions.create({ ...askChat, response_format: { type: 'json_object' } }));
    expect(err.status).toBe(503);
    expect(err.message).toMatch(/not tried: claude/);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(upstreamRequests(g.backup, '/v1/messages')).toHaveLength(0);
    expect(upstreamRequests(g.primary, '/v1/chat/completions')).toHaveLength(2);
  });
});

describe("a backup's rejection after the primary failed", () => {
  it("gives the client the primary's 503 with Claude's 400 reason appended, never a 400 that tells it to change the request", async () => {
    const g = await pair();
    g.primary.brownout('503', 60_000);
    g.backup.setFaults({
      errors: [{ status: 400, message: 'max_tokens: 100000 > 64000, which is the maximum allowed number of output tokens for claude-sonnet-4-5' }],
    });
    const counter = { requests: 0 };
    const err = await sdkError(g.openai({ maxRetries: 2, counter }).chat.completions.create({ ...askChat, max_tokens: 100_000 }));
    expect(err.status).toBe(503);
    expect(err.message).toMatch(/rejected the request \(400/);
    expect(err.message).toMatch(/maximum allowed number of output tokens/);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(counter.requests).toBe(1);
    // A 400 is not retried on Claude.
    expect(upstreamRequests(g.backup, '/v1/messages')).toHaveLength(1);
  });

  it("sampling: refuse on Claude: a request with temperature gets the primary's 503 naming Claude as not tried; Claude is sent nothing", async () => {
    const g = await pair({ backupExtra: 'sampling: refuse' });
    g.primary.brownout('503', 60_000);
    const err = await sdkError(g.openai({ maxRetries: 2 }).chat.completions.create({ ...askChat, temperature: 0.2 }));
    expect(err.status).toBe(503);
    expect(err.message).toMatch(/not tried: claude/);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(upstreamRequests(g.backup, '/v1/messages')).toHaveLength(0);
    // Without a temperature, Claude answers.
    const ok = await g.openai().chat.completions.create(askChat);
    expect(ok.choices[0]!.message.content).toBe('Mock answer to: Where is my parcel?');
  });

  it('sampling: forward on Claude: a temperature of 1.5 (OpenAI allows 2) is clamped to what Claude takes, and Claude answers', async () => {
    const g = await pair({ backupExtra: 'sampling: forward' });
    g.primary.brownout('503', 60_000);
    const { data, response } = await g.openai().chat.completions.create({ ...askChat, temperature: 1.5, top_p: 0.9 }).withResponse();
    expect(response.headers.get('x-stormgate-target')).toBe(`claude/${CLAUDE}`);
    expect(data.choices[0]!.message.content).toBe('Mock answer to: Where is my parcel?');
    expect(upstreamRequests(g.backup, '/v1/messages').map((r) => r.status)).toEqual([200]);
  });

  it('when both targets fail for availability: one SDK request, the backup 529 passed on, its attempts header counting both targets', async () => {
    const g = await pair();
    g.primary.brownout('503', 60_000);
    g.backup.brownout('529', 60_000);
    const counter = { requests: 0 };
    const err = await sdkError(g.openai({ maxRetries: 3, counter }).chat.completions.create(askChat));
    expect(err.status).toBeGreaterThanOrEqual(500);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.headers?.get('x-stormgate-target')).toBe(`claude/${CLAUDE}`);
    // The backup's own error, passed on in the OpenAI shape, with every target's attempts counted on it.
    expect(err.status).toBe(529);
    expect(err.headers?.get('x-stormgate-attempts')).toBe('4');
    expect(counter.requests).toBe(1);
    expect(upstreamRequests(g.primary, '/v1/chat/completions')).toHaveLength(2);
    expect(upstreamRequests(g.backup, '/v1/messages').map((r) => r.status)).toEqual([529, 529]);
  });
});

describe('deadlines shorter than the primary hang', () => {
  it('x-stormgate-timeout-ms 6 s, primary hanging, responseMs 1 s: Claude answers in time (fallback timeout), the hung attempt aborted', async () => {
    const g = await pair({ primaryExtra: 'timeouts: { responseMs: 1000 }' });
    g.primary.brownout('hang', 60_000);
    const started = Date.now();
    const { data, response } = await g.openai({ headers: { 'x-stormgate-timeout-ms': '6000' } }).chat.completions.create(askChat).withResponse();
    const took = Date.now() - started;
    expect(data.choices[0]!.message.content).toBe('Mock answer to: Where is my parcel?');
    expect(response.headers.get('x-stormgate-fallback')).toBe('timeout');
    expect(took).toBeGreaterThanOrEqual(900);
    expect(took).toBeLessThan(5_500);
    // A silent target is not retried when another can answer.
    await sleep(200);
    const hung = upstreamRequests(g.primary, '/v1/chat/completions');
    expect(hung).toHaveLength(1);
    expect(hung[0]!.aborted).toBe(true);
  });

  it("the SDK's own per-request timeout (x-stainless-timeout) on a hung primary: Claude answers before the SDK gives up", async () => {
    const g = await pair({ primaryExtra: 'timeouts: { responseMs: 1000 }' });
    g.primary.brownout('hang', 60_000);
    const counter = { requests: 0 };
    const started = Date.now();
    const { data, response } = await g.openai({ maxRetries: 2, counter }).chat.completions.create(askChat, { timeout: 5_000 }).withResponse();
    expect(Date.now() - started).toBeLessThan(4_500);
    expect(data.choices[0]!.message.content).toBe('Mock answer to: Where is my parcel?');
    expect(response.headers.get('x-stormgate-fallback')).toBe('timeout');
    expect(counter.requests).toBe(1);
  });

  it('a stream with a primary that hangs before its headers: firstTokenMs moves it to Claude before the client deadline', async () => {
    const g = await pair({ primaryExtra: 'timeouts: { firstTokenMs: 1000 }' });
    g.primary.brownout('hang', 60_000);
    const started = Date.now();
    const { data: stream, response } = await g
      .openai({ headers: { 'x-stormgate-timeout-ms': '6000' } })
      .chat.completions.create({ ...askChat, stream: true })
      .withResponse();
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
    expect(Date.now() - started).toBeLessThan(5_500);
    expect(response.headers.get('x-stormgate-fallback')).toBe('timeout');
    expect(response.headers.get('x-stormgate-target')).toBe(`claude/${CLAUDE}`);
    expect(text).toBe('Mock answer to: Where is my parcel?');
  });

  it('a client deadline shorter than firstTokenMs on a hung primary: a 504 within the deadline, nothing sent to the backup too late', async () => {
    const g = await pair({ primaryExtra: 'timeouts: { firstTokenMs: 10000 }' });
    g.primary.brownout('hang', 60_000);
    const started = Date.now();
    const err = await sdkError(g.openai({ maxRetries: 2, headers: { 'x-stormgate-timeout-ms': '1500' } }).chat.completions.create({ ...askChat, stream: true }));
    const took = Date.now() - started;
    expect(err.status).toBe(504);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(took).toBeLessThan(1_500 + 1_000);
    await sleep(200);
    expect(upstreamRequests(g.primary, '/v1/chat/completions').every((r) => r.aborted)).toBe(true);
  });
});

describe('a 200 that is no answer', () => {
  const servers: Server[] = [];
  afterEach(async () => {
    for (const s of servers.splice(0)) {
      s.closeAllConnections();
      await new Promise((r) => s.close(r));
    }
  });

  /** A primary of the suite's own answering every request with `body` (200, `contentType`); counts what it was sent. */
  async function ownPrimary(contentType: string, body: string): Promise<{ origin: string; seen: () => number }> {
    let seen = 0;
    const server = createServer((req, res) => {
      seen++;
      req.resume();
      req.on('end', () => res.writeHead(200, { 'content-type': contentType }).end(body));
    });
    servers.push(server);
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    return { origin: `http://127.0.0.1:${(server.address() as { port: number }).port}`, seen: () => seen };
  }
  const emptyChunk = JSON.stringify({ id: 'chatcmpl-empty', object: 'chat.completion.chunk', created: 1_700_000_000, model: 'gpt-4o', choices: [] });

  it('fails a primary over that answers 200 with an empty choices array: the SDK gets a real answer from the backup', async () => {
    const p = await ownPrimary(
      'application/json',
      JSON.stringify({ id: 'chatcmpl-empty', object: 'chat.completion', created: 1_700_000_000, model: 'gpt-4o', choices: [], usage: { prompt_tokens: 5, completion_tokens: 0, total_tokens: 5 } }),
    );
    const g = await pair({ backup: 'openai', primaryOrigin: p.origin });
    const { data, response } = await g.openai().chat.completions.create(askChat).withResponse();
    expect(data.choices).toHaveLength(1);
    expect(data.choices[0]!.message.content).toBe('Mock answer to: Where is my parcel?');
    expect(response.headers.get('x-stormgate-target')).toMatch(/^backup/);
    expect(response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(p.seen()).toBe(2);
  });

  for (const [what, events] of [
    ['only [DONE]', 'data: [DONE]\n\n'],
    ['chunks whose choices are empty, then [DONE]', `data: ${emptyChunk}\n\ndata: ${emptyChunk}\n\ndata: [DONE]\n\n`],
  ] as const) {
    it(`streams Claude's answer when the primary's 200 stream holds ${what}: no empty stream the SDK cannot assemble`, async () => {
      const p = await ownPrimary('text/event-stream', events);
      const g = await pair({ primaryOrigin: p.origin });
      const final = await g.openai().chat.completions.stream(askChat).finalChatCompletion();
      expect(final.choices[0]!.message.content).toBe('Mock answer to: Where is my parcel?');
      expect(p.seen()).toBe(2);
      expect(upstreamRequests(g.backup, '/v1/messages')).toHaveLength(1);
    });
  }
});

describe('metrics agree with what the client saw', () => {
  it('fallbacks, retries, upstream attempts and fallback_rate match the headers of 12 answers', async () => {
    const g = await pair({ backup: 'openai' });
    // Three of every five attempts at the primary fail: some requests are answered first time, some on their retry,
    // some by the backup.
    g.primary.setFaults({ errors: [{ status: 503, rate: 0.6 }] });
    const seen: Array<{ attempts: number; fallback: string | null }> = [];
    for (let i = 0; i < 12; i++) {
      const { response } = await g.openai().chat.completions.create(askChat).withResponse();
      seen.push({ attempts: Number(response.headers.get('x-stormgate-attempts')), fallback: response.headers.get('x-stormgate-fallback') });
    }
    const fallbacks = seen.filter((s) => s.fallback !== null).length;
    const attempts = seen.reduce((a, s) => a + s.attempts, 0);
    const m = await scrapeMetrics(g.url);
    expect(sum(m, 'stormgate_fallbacks_total', { route: 'chat' })).toBe(fallbacks);
    expect(sum(m, 'stormgate_upstream_attempts_total')).toBe(attempts);
    expect(sum(m, 'stormgate_upstream_attempts_total')).toBe(
      upstreamRequests(g.primary, '/v1/chat/completions').length + upstreamRequests(g.backup, '/v1/chat/completions').length,
    );
    // A first attempt on the fallback is no retry; a second attempt on the same target is.
    const retriesOnTarget = seen.reduce((a, s) => a + (s.attempts - 1) - (s.fallback !== null ? 1 : 0), 0);
    expect(sum(m, 'stormgate_retry_count_total', { route: 'chat' })).toBe(retriesOnTarget);
    expect(sum(m, 'stormgate_retried_requests_total', { route: 'chat' })).toBe(seen.filter((s) => s.attempts > 1).length);
    const rate = m.find((s) => s.name === 'stormgate_fallback_rate' && s.labels.route === 'chat');
    expect(rate?.value).toBeCloseTo(fallbacks / 12, 5);
    expect(fallbacks).toBeGreaterThan(0);
    expect(fallbacks).toBeLessThan(12);
    expect(sum(m, 'stormgate_requests_total', { route: 'chat', outcome: 'success' })).toBe(12);
  });
});

describe('both targets down, then one back', () => {
  const breaker = '{ openS: 2 }';
  const parkedAsk = (g: Pair, timeoutMs: number) =>
    g
      .openai({ headers: { 'x-stormgate-timeout-ms': String(timeoutMs) } })
      .chat.completions.create(askChat)
      .withResponse()
      .then((r) => ({ status: 200, target: r.response.headers.get('x-stormgate-target'), fallback: r.response.headers.get('x-stormgate-fallback'), at: Date.now() }))
      .catch((e: { status?: number }) => ({ status: e.status ?? 0, target: null, fallback: null, at: Date.now() }));

  /** Opens both breakers with short-deadline traffic. */
  async function bothOpen(g: Pair): Promise<void> {
    g.primary.brownout('503', 120_000);
    g.backup.brownout('529', 120_000);
    await Promise.all(Array.from({ length: 16 }, () => parkedAsk(g, 1_200)));
    const m = await scrapeMetrics(g.url);
    expect(m.filter((s) => s.name === 'stormgate_breaker_state' && s.value !== 0).length).toBeGreaterThan(0);
  }

  it("moves parked requests to Claude when it comes back first while traffic keeps coming (park outcome 'moved')", { timeout: 40_000 }, async () => {
    const g = await pair({ breaker, park: true });
    await bothOpen(g);
    const parked = Array.from({ length: 8 }, () => parkedAsk(g, 25_000));
    await sleep(300);
    g.backup.brownout('529', 0);
    const back = Date.now();
    const newcomers: Array<ReturnType<typeof parkedAsk>> = [];
    for (let i = 0; i < 8; i++) {
      newcomers.push(parkedAsk(g, 6_000));
      await sleep(400);
    }
    const answers = await Promise.all(parked);
    expect(answers.map((a) => a.status)).toEqual(Array(8).fill(200));
    expect(answers.every((a) => a.target === `claude/${CLAUDE}`)).toBe(true);
    expect(answers.every((a) => a.fallback !== null)).toBe(true);
    for (const a of answers) expect(a.at - back).toBeLessThan(12_000);
    await Promise.all(newcomers);
    const m = await scrapeMetrics(g.url);
    expect(sum(m, 'stormgate_park_outcomes_total', { route: 'chat', outcome: 'moved' })).toBeGreaterThanOrEqual(1);
    expect(sum(m, 'stormgate_parked_requests', { route: 'chat' })).toBe(0);
  });

  it('moves parked streams to Claude too: each SDK stream assembles the whole text, the move named on its headers', { timeout: 40_000 }, async () => {
    const g = await pair({ breaker, park: true });
    await bothOpen(g);
    const client = g.openai({ headers: { 'x-stormgate-timeout-ms': '25000' } });
    const parked = Array.from({ length: 5 }, async () => {
      const { data, response } = await client.chat.completions.create({ ...askChat, stream: true }).withResponse();
      let text = '';
      for await (const chunk of data) text += chunk.choices[0]?.delta.content ?? '';
      return { text, target: response.headers.get('x-stormgate-target'), fallback: response.headers.get('x-stormgate-fallback') };
    });
    await sleep(300);
    g.backup.brownout('529', 0);
    const newcomers: Array<ReturnType<typeof parkedAsk>> = [];
    for (let i = 0; i < 8; i++) {
      newcomers.push(parkedAsk(g, 6_000));
      await sleep(400);
    }
    const answers = await Promise.all(parked);
    for (const a of answers) {
      expect(a.text).toBe('Mock answer to: Where is my parcel?');
      expect(a.target).toBe(`claude/${CLAUDE}`);
      expect(a.fallback).not.toBeNull();
    }
    await Promise.all(newcomers);
  });

  it('answers parked requests from the primary when it comes back first, with no fallback header', { timeout: 40_000 }, async () => {
    const g = await pair({ breaker, park: true });
    await bothOpen(g);
    const parked = Array.from({ length: 8 }, () => parkedAsk(g, 20_000));
    await sleep(300);
    g.primary.brownout('503', 0);
    const answers = await Promise.all(parked);
    expect(answers.map((a) => a.status)).toEqual(Array(8).fill(200));
    expect(answers.every((a) => a.target?.startsWith('primary'))).toBe(true);
    expect(answers.every((a) => a.fallback === null)).toBe(true);
    const m = await scrapeMetrics(g.url);
    expect(sum(m, 'stormgate_park_outcomes_total', { route: 'chat', outcome: 'released' })).toBeGreaterThanOrEqual(1);
    expect(sum(m, 'stormgate_parked_requests', { route: 'chat' })).toBe(0);
    // Claude, still down, was not sent the parked requests once the primary answered.
    expect(upstreamRequests(g.backup, '/v1/messages').filter((r) => r.status === 200)).toHaveLength(0);
  });
});

describe('Anthropic SDK on /v1/messages with two accounts', () => {
  async function accounts(): Promise<{ url: string; first: MockServer; second: MockServer; client: Anthropic }> {
    const first = await startMock();
    const second = await startMock();
    const yaml = `
server: { host: 127.0.0.1, port: 0 }
providers:
  first: { family: anthropic, baseUrl: "${first.url}", apiKey: sk-ant-first-0123456789, breaker: false }
  second: { family: anthropic, baseUrl: "${second.url}", apiKey: sk-ant-second-0123456789, breaker: false }
routes:
  - name: agents
    match: { path: /v1/messages }
    targets: [ { provider: first }, { provider: second, model: claude-haiku-4-5 } ]
    retry: { maxAttempts: 2, backoff: { baseMs: 10, capMs: 20 } }
    budget: { ratio: 10, minRetriesPerSecond: 100 }
    park: false
`;
    const url = await startGateway(parseConfig(yaml, 'suite38-agents.yaml', {}));
    return { url, first, second, client: new Anthropic({ baseURL: url, apiKey: 'unused', maxRetries: 0, logLevel: 'off' }) };
  }

  it('streams a tool_use from the second account during the first one\'s 529 overload, assembled by the SDK', async () => {
    const a = await accounts();
    a.first.brownout('529', 60_000);
    const { data: stream, response } = await a.client.messages
      .create({
        model: 'claude-sonnet-4-5',
        max_tokens: 512,
        stream: true,
        tools: [{ name: 'lookup_order', description: 'Find an order', input_schema: { type: 'object', properties: { id: { type: 'string' } } } }],
        tool_choice: { type: 'tool', name: 'lookup_order' },
        messages: [{ role: 'user', content: 'Where is order 42?' }],
      })
      .withResponse();
    const blocks: Array<{ type: string; name?: string; json: string }> = [];
    let stop: string | null = null;
    for await (const ev of stream) {
      if (ev.type === 'content_block_start') blocks.push({ type: ev.content_block.type, name: 'name' in ev.content_block ? ev.content_block.name : undefined, json: '' });
      if (ev.type === 'content_block_delta' && ev.delta.type === 'input_json_delta') blocks.at(-1)!.json += ev.delta.partial_json;
      if (ev.type === 'message_delta') stop = ev.delta.stop_reason;
    }
    expect(response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(response.headers.get('x-stormgate-target')).toBe('second/claude-haiku-4-5');
    expect(stop).toBe('tool_use');
    expect(blocks).toHaveLength(1);
    expect(blocks[0]!.type).toBe('tool_use');
    expect(blocks[0]!.name).toBe('lookup_order');
    expect(JSON.parse(blocks[0]!.json)).toEqual({ x: 1 });
    expect(upstreamRequests(a.first, '/v1/messages').map((r) => r.status)).toEqual([529, 529]);
    const sent = upstreamRequests(a.second, '/v1/messages');
    expect(sent).toHaveLength(1);
    expect(sent[0]!.model).toBe('claude-haiku-4-5');
    expect(sent[0]!.headers['x-api-key']).toBe('sk-ant-second-0123456789');
  });

  it('both accounts overloaded: the SDK raises an overloaded error once (x-should-retry false), each account asked twice', async () => {
    const a = await accounts();
    a.first.brownout('529', 60_000);
    a.second.brownout('529', 60_000);
    let requests = 0;
    const client = new Anthropic({
      baseURL: a.url,
      apiKey: 'unused',
      maxRetries: 2,
      logLevel: 'off',
      fetch: async (u, init) => {
        requests++;
        return fetch(u, init);
      },
    });
    const err = await client.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 64, messages: [{ role: 'user', content: 'hi' }] }).then(
      () => undefined,
      (e: unknown) => e as InstanceType<typeof Anthropic.APIError>,
    );
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(err!.status).toBe(529);
    expect((err!.error as { error?: { type?: string } } | undefined)?.error?.type).toBe('overloaded_error');
    expect(err!.headers?.get('x-should-retry')).toBe('false');
    expect(requests).toBe(1);
    expect(upstreamRequests(a.first, '/v1/messages')).toHaveLength(2);
    expect(upstreamRequests(a.second, '/v1/messages')).toHaveLength(2);
  });
});
