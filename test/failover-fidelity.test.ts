// Failover never silently changes what the client asked for: a backup that cannot honour a request (another
// embeddings model, an Anthropic target for n > 1 or logprobs, a compatible server without tools or the Responses
// API) is not sent it, or its rejection does not hide the primary's failure; contextWindowFallback takes only a
// prompt too long. The official SDKs over real HTTP against the bundled mock and scripted fake providers.
import { readFileSync } from 'node:fs';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import type { FaultSpec, MockServer } from '../src/mock/server.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { scripted, type Script, type Seen } from './helpers/scripted-provider.ts';
import { defaultConfig, RETRY_LOOP_ONLY, TEST_KEY, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';

const startStack = useStacks();
const startBackup = useExtraMocks();
const startProvider = useFakeProviders();

type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];
type APIError = InstanceType<typeof OpenAI.APIError>;

const quick = { maxAttempts: 2, backoff: { strategy: 'fixed' as const, baseMs: 5, capMs: 5 } };

/**
 * The stack's mock as the OpenAI primary `mock`, and `backup` (a second mock, or a provider at `backupUrl`) of the
 * given family as the second target of the route on `path`.
 */
async function stackWith(opts: {
  faults?: FaultSpec;
  backupFaults?: FaultSpec;
  family?: 'openai' | 'anthropic';
  /** A provider of the test's own (its origin), in place of a second mock. */
  backupOrigin?: string;
  path?: string;
  targets?: RouteInput['targets'];
  route?: Partial<RouteInput>;
  provider?: Partial<ProviderInput>;
  /** More providers, by name. */
  more?: Record<string, ProviderInput>;
}): Promise<{ s: Stack; backup: MockServer | undefined }> {
  const family = opts.family ?? 'anthropic';
  const backup = opts.backupOrigin ? undefined : await startBackup({ faults: opts.backupFaults, quiet: true, apiKey: 'backup-key' });
  const origin = opts.backupOrigin ?? backup!.url;
  const path = opts.path ?? '/v1/chat/completions';
  const s = await startStack({
    faults: opts.faults,
    config: (url) => {
      const base = defaultConfig(url, { provider: { ...RETRY_LOOP_ONLY.provider, ...opts.provider }, route: { ...RETRY_LOOP_ONLY.route, retry: quick } });
      const targets = opts.targets ?? [{ provider: 'mock' }, { provider: 'backup', model: family === 'anthropic' ? 'claude-sonnet-4-5' : 'gpt-4.1' }];
      return {
        ...base,
        providers: { ...base.providers, backup: { family, baseUrl: family === 'anthropic' ? origin : `${origin}/v1`, apiKey: 'backup-key', breaker: false }, ...opts.more },
        routes: base.routes.map((r) => (r.match.path === path ? { ...r, targets, ...opts.route } : r)),
      };
    },
  });
  return { s, backup };
}

const sdk = (s: Stack) => new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
const messages = [{ role: 'user' as const, content: 'Where is my order?' }];

// ---- Anthropic's answers, as a scripted provider replays them ----

const aev = (type: string, data: Record<string, unknown> = {}) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
const anthropicText = (text: string): string[] => [
  aev('message_start', { message: { id: 'msg_01', type: 'message', role: 'assistant', content: [], model: 'claude-sonnet-4-5-20250929', stop_reason: null, stop_sequence: null, usage: { input_tokens: 12, output_tokens: 1 } } }),
  aev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
  aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text } }),
  aev('content_block_stop', { index: 0 }),
  aev('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 3 } }),
  aev('message_stop'),
];
const anthropicAnswer = (body: Record<string, unknown>, text = '{"ok":true}'): Script =>
  body.stream === true
    ? { steps: anthropicText(text) }
    : {
        headers: { 'content-type': 'application/json' },
        steps: [JSON.stringify({ id: 'msg_02', type: 'message', role: 'assistant', model: 'claude-sonnet-4-5-20250929', content: [{ type: 'text', text }], stop_reason: 'end_turn', stop_sequence: null, usage: { input_tokens: 9, output_tokens: 4 } })],
      };

describe('embeddings: a backup serves the same model or none', () => {
  const providers = {
    openai: { family: 'openai' as const, baseUrl: 'https://api.openai.com/v1', apiKey: 'k' },
    other: { family: 'openai' as const, baseUrl: 'https://other.example/v1', apiKey: 'k' },
  };
  const route = (extra: Partial<RouteInput>): ConfigInput => ({ providers, routes: [{ name: 'e', match: { path: '/v1/embeddings' }, targets: [{ provider: 'openai', model: 'text-embedding-3-large' }], ...extra }] });

  it.each<[string, Partial<RouteInput>]>([
    ['a backup of a smaller model', { targets: [{ provider: 'openai', model: 'text-embedding-3-large' }, { provider: 'other', model: 'text-embedding-3-small' }] }],
    ['a backup that takes the client\'s model behind a primary that names its own', { targets: [{ provider: 'openai', model: 'text-embedding-3-large' }, { provider: 'other' }] }],
    ['a contextWindowFallback of another model', { contextWindowFallback: { provider: 'other', model: 'text-embedding-3-small' } }],
    ['a weighted target of another model', { strategy: 'weighted', targets: [{ provider: 'openai', model: 'text-embedding-3-large' }, { provider: 'other', model: 'text-embedding-3-small' }] }],
  ])('refuses at start-up %s (its vectors live in another space)', (_name, extra) => {
    const r = ConfigSchema.safeParse(route(extra));
    expect(r.success).toBe(false);
    expect(JSON.stringify(r.error?.issues)).toMatch(/same model/);
  });

  it('answers from the same model at the backup while the primary is down: dimensions passed on, the serving model and target named', async () => {
    const seen: Seen[] = [];
    const vector = Array.from({ length: 256 }, (_, i) => i / 256);
    const p = await startProvider(
      scripted(
        (body) => ({
          headers: { 'content-type': 'application/json' },
          steps: [JSON.stringify({ object: 'list', data: [{ object: 'embedding', index: 0, embedding: vector }], model: body.model, usage: { prompt_tokens: 3, total_tokens: 3 } })],
        }),
        seen,
      ),
    );
    const model = 'text-embedding-3-large';
    const { s } = await stackWith({
      faults: { errors: [{ status: 503 }] },
      family: 'openai',
      backupOrigin: p.origin,
      path: '/v1/embeddings',
      targets: [{ provider: 'mock', model }, { provider: 'backup', model }],
    });
    const { data, response } = await sdk(s).embeddings.create({ model, input: 'hello', dimensions: 256, encoding_format: 'float' }).withResponse();
    expect(data.model).toBe(model);
    expect(data.data[0]!.embedding).toHaveLength(256);
    expect(seen[0]!.body).toMatchObject({ model, dimensions: 256 });
    expect(response.headers.get('x-stormgate-target')).toBe(`backup/${model}`);
    expect(response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
  });
});

describe('an Anthropic backup and a chat request it cannot honour', () => {
  // Each is refused by the translation (request.ts): the backup is never sent it, and the client gets the primary's
  // failure naming the backup it did not try, never a single choice or an answer without the logprobs it asked for.
  const cannot: Array<[string, Record<string, unknown>, RegExp]> = [
    ['n: 2', { n: 2 }, /n > 1/],
    ['logprobs', { logprobs: true, top_logprobs: 3 }, /logprobs/],
    ['top_logprobs alone', { top_logprobs: 2 }, /logprobs/],
    ['logit_bias', { logit_bias: { '50256': -100 } }, /logit_bias/],
    ['audio output', { modalities: ['text', 'audio'], audio: { voice: 'alloy', format: 'wav' } }, /audio output/],
    ['modalities with audio', { modalities: ['audio'] }, /audio output/],
    ['a frequency penalty', { frequency_penalty: 0.5 }, /frequency_penalty/],
    ['json_object output', { response_format: { type: 'json_object' } }, /json_object/],
  ];

  it.each(cannot)('keeps the primary\'s 503 for %s, naming the backup not tried, streamed and not', async (_name, extra, reason) => {
    const { s, backup } = await stackWith({ faults: { errors: [{ status: 503, message: 'the primary is overloaded' }] } });
    for (const stream of [false, true]) {
      const err = (await sdk(s)
        .chat.completions.create({ model: 'gpt-4o', messages, ...extra, stream } as never)
        .catch((e: unknown) => e)) as APIError;
      expect(err.status).toBe(503);
      expect(err.message).toMatch(/the primary is overloaded/);
      expect(err.message).toMatch(/not tried: backup\/claude-sonnet-4-5 \(anthropic cannot express this request/);
      expect(err.message).toMatch(reason);
      expect(err.headers?.get('x-stormgate-target')).toBe('mock/gpt-4o');
    }
    expect(backup!.stats().total).toBe(0);
  });

  // OpenAI answers 400 to each of these; translated, a wrong type was dropped and the backup answered one choice, no
  // logprobs, text for audio: an answer in an outage that the primary would have refused as malformed.
  const malformed: Array<[string, Record<string, unknown>, string]> = [
    ['n as a string', { n: '2' }, 'n'],
    ['n of 0', { n: 0 }, 'n'],
    ['a fractional n', { n: 1.5 }, 'n'],
    ['logprobs as a string', { logprobs: 'true' }, 'logprobs'],
    ['top_logprobs as a string', { top_logprobs: '3' }, 'top_logprobs'],
    ['modalities as a string', { modalities: 'audio' }, 'modalities'],
    ['a penalty as a string', { presence_penalty: '0.5' }, 'presence_penalty'],
  ];

  it.each(malformed)('does not answer %s with something that looks fine: the primary\'s 503, the backup not tried', async (_name, extra, param) => {
    const { s, backup } = await stackWith({ faults: { errors: [{ status: 503, message: 'the primary is overloaded' }] } });
    const err = (await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, ...extra } as never).catch((e: unknown) => e)) as APIError;
    expect(err.status).toBe(503);
    expect(err.message).toMatch(new RegExp(`not tried: backup/claude-sonnet-4-5 \\(anthropic cannot express this request: ${param}`));
    expect(backup!.stats().total).toBe(0);
  });

  it.each(malformed)('answers %s on an Anthropic-only route with a 400 naming the field', async (_name, extra, param) => {
    const { s, backup } = await stackWith({ targets: [{ provider: 'backup', model: 'claude-sonnet-4-5' }] });
    const err = (await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, ...extra } as never).catch((e: unknown) => e)) as APIError;
    expect(err.status).toBe(400);
    expect((err.error as { code?: string; param?: string }).param).toBe(param);
    expect(backup!.stats().total).toBe(0);
  });

  it('answers circuit_open while the primary\'s breaker is open, naming the backup not tried', async () => {
    const { s, backup } = await stackWith({ faults: { errors: [{ status: 503 }] }, provider: { breaker: { consecutiveFailures: 2, openS: 60 } } });
    await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, n: 2 }).catch(() => undefined);
    const err = (await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, n: 2 }).catch((e: unknown) => e)) as APIError;
    expect(err.status).toBe(503);
    expect((err.error as { code?: string }).code).toBe('circuit_open');
    expect(err.message).toMatch(/not tried: backup\/claude-sonnet-4-5 \(.*n > 1/);
    expect(s.mock.stats().total).toBe(2);
    expect(backup!.stats().total).toBe(0);
  });

  it('answers provider_held_off while the primary asked for a pause, naming the backup not tried', async () => {
    const { s, backup } = await stackWith({ faults: { errors: [{ status: 429, headers: { 'retry-after': '30' } }] } });
    const first = (await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, logprobs: true }).catch((e: unknown) => e)) as APIError;
    expect(first.status).toBe(429);
    expect(first.message).toMatch(/not tried: backup\/claude-sonnet-4-5 \(.*logprobs/);
    const err = (await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, logprobs: true }).catch((e: unknown) => e)) as APIError;
    expect(err.status).toBe(429);
    expect((err.error as { code?: string }).code).toBe('provider_held_off');
    expect(err.message).toMatch(/not tried: backup\/claude-sonnet-4-5 \(.*logprobs/);
    expect(s.mock.stats().total).toBe(1);
    expect(backup!.stats().total).toBe(0);
  });

  it('answers upstream_timeout when the primary is silent, naming the backup not tried, streamed and not', async () => {
    const { s, backup } = await stackWith({ faults: { latencyMs: 1_500 }, provider: { timeouts: { firstTokenMs: 150, responseMs: 150 } } });
    for (const stream of [false, true]) {
      const err = (await sdk(s)
        .chat.completions.create({ model: 'gpt-4o', messages, n: 3, stream } as never)
        .catch((e: unknown) => e)) as APIError;
      expect(err.status).toBe(504);
      expect((err.error as { code?: string }).code).toBe('upstream_timeout');
      expect(err.message).toMatch(/not tried: backup\/claude-sonnet-4-5 \(.*n > 1/);
    }
    expect(backup!.stats().total).toBe(0);
  });

  it('never hands a weighted route\'s n: 2 to its Anthropic target: every answer has the two choices asked for', async () => {
    const { s, backup } = await stackWith({
      route: { strategy: 'weighted' },
      targets: [
        { provider: 'mock', weight: 1 },
        { provider: 'backup', model: 'claude-sonnet-4-5', weight: 1 },
      ],
    });
    for (let i = 0; i < 4; i++) {
      const r = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, n: 2 });
      expect(r.choices).toHaveLength(2);
    }
    // Requests without n are spread as weighted.
    for (let i = 0; i < 4; i++) await sdk(s).chat.completions.create({ model: 'gpt-4o', messages });
    expect(s.mock.stats().total).toBe(6);
    expect(backup!.stats().total).toBe(2);
  });

  it('translates what Anthropic can honour: strict json_schema and tools, parallel_tool_calls false, the usage chunk', async () => {
    const seen: Seen[] = [];
    const p = await startProvider(scripted((body) => anthropicAnswer(body), seen));
    const { s } = await stackWith({ faults: { errors: [{ status: 503 }] }, backupOrigin: p.origin });
    const tool: OpenAI.ChatCompletionTool = {
      type: 'function',
      function: { name: 'lookup', strict: true, parameters: { type: 'object', properties: { id: { type: 'string' } }, required: ['id'], additionalProperties: false } },
    };
    const format = { type: 'json_schema' as const, json_schema: { name: 'r', strict: true, schema: { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false } } };
    const { data, response } = await sdk(s)
      .chat.completions.create({ model: 'gpt-4o', messages, tools: [tool], parallel_tool_calls: false, response_format: format, seed: 7 })
      .withResponse();
    expect(JSON.parse(data.choices[0]!.message.content!)).toEqual({ ok: true });
    // The model that answered, not the one the client named.
    expect(data.model).toBe('claude-sonnet-4-5-20250929');
    expect(response.headers.get('x-stormgate-target')).toBe('backup/claude-sonnet-4-5');
    expect(seen[0]!.body).toMatchObject({
      tools: [{ name: 'lookup', strict: true, input_schema: { type: 'object', required: ['id'] } }],
      tool_choice: { type: 'auto', disable_parallel_tool_use: true },
      output_config: { format: { type: 'json_schema', schema: { type: 'object', required: ['ok'] } } },
    });

    const chunks: OpenAI.ChatCompletionChunk[] = [];
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true, stream_options: { include_usage: true } });
    for await (const c of stream) chunks.push(c);
    expect(chunks.map((c) => c.choices[0]?.delta.content ?? '').join('')).toBe('{"ok":true}');
    expect(chunks.at(-1)).toMatchObject({ choices: [], usage: { prompt_tokens: 12, completion_tokens: 3, total_tokens: 15 } });
    expect(chunks.every((c) => c.model === 'claude-sonnet-4-5-20250929')).toBe(true);
  });
});

describe('what an Anthropic backup leaves out', () => {
  // Hints about OpenAI's own storage, caching, billing or latency: the answer is the same without them. Each is left
  // out of the Messages request, and the README says so, or a client that sent it would take the answer for one
  // that honoured it.
  const ignored: Record<string, unknown> = {
    seed: 7,
    prediction: { type: 'content', content: 'Your order is on its way.' },
    prompt_cache_key: 'orders-v1',
    prompt_cache_retention: '24h',
    service_tier: 'flex',
    store: true,
    metadata: { team: 'support' },
    verbosity: 'low',
  };

  it('answers a request with each field OpenAI uses only for its own hints, sends none of them, and the README names every one', async () => {
    const seen: Seen[] = [];
    const p = await startProvider(scripted((body) => anthropicAnswer(body, 'On its way.'), seen));
    const { s } = await stackWith({ faults: { errors: [{ status: 503 }] }, backupOrigin: p.origin });
    const r = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true, stream_options: { include_obfuscation: false }, ...ignored } as never);
    let text = '';
    for await (const c of r as unknown as AsyncIterable<OpenAI.ChatCompletionChunk>) text += c.choices[0]?.delta.content ?? '';
    expect(text).toBe('On its way.');
    for (const field of Object.keys(ignored)) expect(seen[0]!.body, field).not.toHaveProperty(field);
    const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
    const families = readme.slice(readme.indexOf('- **API families**'), readme.indexOf('- **Anthropic clients'));
    const sentence = /`temperature`\/`top_p` are dropped by default[\s\S]*?are ignored/.exec(families)?.[0] ?? '';
    expect([...Object.keys(ignored), 'stream_options.include_obfuscation'].filter((f) => !sentence.includes(`\`${f}\``)), 'name these among the ignored fields').toEqual([]);
  });
});

describe('an OpenAI-compatible backup that cannot serve the request', () => {
  it('leaves the client the primary\'s 503, not the backup\'s 400 about tools (vLLM\'s flat error)', async () => {
    const vllm = (): Script => ({
      status: 400,
      headers: { 'content-type': 'application/json' },
      steps: [JSON.stringify({ object: 'error', message: '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set', type: 'BadRequestError', param: null, code: 400 })],
    });
    const p = await startProvider(scripted(vllm));
    const { s } = await stackWith({ faults: { errors: [{ status: 503, message: 'the primary is overloaded' }] }, family: 'openai', backupOrigin: p.origin, targets: [{ provider: 'mock' }, { provider: 'backup' }] });
    const tools: OpenAI.ChatCompletionTool[] = [{ type: 'function', function: { name: 'lookup', parameters: { type: 'object', properties: {} } } }];
    for (const stream of [false, true]) {
      const err = (await sdk(s)
        .chat.completions.create({ model: 'gpt-4o', messages, tools, stream } as never)
        .catch((e: unknown) => e)) as APIError;
      expect(err.status).toBe(503);
      expect(err.message).toMatch(/the primary is overloaded; the fallback backup\/gpt-4o rejected the request \(400: "auto" tool choice requires --enable-auto-tool-choice/);
      expect(err.headers?.get('x-should-retry')).toBe('false');
    }
    expect(p.hits()).toBe(2);
  });

  it.each<[string, Script]>([
    ['a plain-text 404 (Ollama before the Responses API)', { status: 404, headers: { 'content-type': 'text/plain' }, steps: ['404 page not found'] }],
    ['FastAPI\'s 404', { status: 404, headers: { 'content-type': 'application/json' }, steps: ['{"detail":"Not Found"}'] }],
    ['a 405', { status: 405, headers: { 'content-type': 'application/json' }, steps: ['{"detail":"Method Not Allowed"}'] }],
  ])('leaves a Responses API client the primary\'s 503 when the backup answers %s', async (_name, answer) => {
    const p = await startProvider(scripted(() => answer));
    const { s } = await stackWith({ faults: { errors: [{ status: 503, message: 'the primary is overloaded' }] }, family: 'openai', backupOrigin: p.origin, path: '/v1/responses', targets: [{ provider: 'mock' }, { provider: 'backup' }] });
    for (const stream of [false, true]) {
      const err = (await sdk(s)
        .responses.create({ model: 'gpt-4o', input: 'hi', store: false, stream } as never)
        .catch((e: unknown) => e)) as APIError;
      expect(err.status).toBe(503);
      expect(err.message).toMatch(/the primary is overloaded; the fallback backup\/gpt-4o rejected the request \(40[45]/);
      expect(err.headers?.get('x-stormgate-target')).toBe('mock/gpt-4o');
    }
  });
});

describe('contextWindowFallback', () => {
  const tooLong = { status: 400, code: 'context_length_exceeded', message: "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens." };

  it('moves a prompt too long to the larger model, streamed as whole, and names it', async () => {
    const { s, backup } = await stackWith({ faults: { errors: [tooLong] }, family: 'openai', targets: [{ provider: 'mock' }], route: { contextWindowFallback: { provider: 'backup', model: 'gpt-4.1' } } });
    const chunks: OpenAI.ChatCompletionChunk[] = [];
    const { data: stream, response } = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true }).withResponse();
    for await (const c of stream) chunks.push(c);
    expect(response.headers.get('x-stormgate-fallback')).toBe('context_length');
    expect(response.headers.get('x-stormgate-target')).toBe('backup/gpt-4.1');
    expect(chunks.length).toBeGreaterThan(2);
    expect(chunks.every((c) => c.model === 'gpt-4.1')).toBe(true);
    expect(backup!.stats().total).toBe(1);
  });

  it.each<[string, FaultSpec['errors']]>([
    ['an invalid value', [{ status: 400, code: 'invalid_value', message: "Invalid value for 'temperature': must be at most 2." }]],
    ['a message that quotes the words', [{ status: 400, message: "Invalid 'messages[0].content': the text \"This model's maximum context length is 8192\" is not allowed." }]],
    ['a 422', [{ status: 422, message: 'Unprocessable' }]],
    ['a content-policy rejection', [{ status: 400, code: 'content_policy_violation', message: 'flagged' }]],
  ])('is not taken for %s: the client gets the primary\'s answer', async (_name, errors) => {
    const { s, backup } = await stackWith({ faults: { errors }, family: 'openai', targets: [{ provider: 'mock' }], route: { contextWindowFallback: { provider: 'backup', model: 'gpt-4.1' } } });
    for (const stream of [false, true]) {
      const err = (await sdk(s)
        .chat.completions.create({ model: 'gpt-4o', messages, stream } as never)
        .catch((e: unknown) => e)) as APIError;
      expect(err.status).toBe(errors![0]!.status);
      expect((err.error as { message?: string }).message).toBe(errors![0]!.message);
    }
    expect(backup!.stats().total).toBe(0);
  });

  it('takes a fallback\'s prompt too long after the primary was down', async () => {
    const wide = await startBackup({ quiet: true, apiKey: 'wide-key' });
    const { s, backup } = await stackWith({
      faults: { errors: [{ status: 503 }] },
      backupFaults: { errors: [tooLong] },
      family: 'openai',
      targets: [{ provider: 'mock' }, { provider: 'backup', model: 'gpt-4o-mini' }],
      route: { contextWindowFallback: { provider: 'wide', model: 'gpt-4.1' } },
      more: { wide: { family: 'openai', baseUrl: `${wide.url}/v1`, apiKey: 'wide-key', breaker: false } },
    });
    const { data, response } = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(data.model).toBe('gpt-4.1');
    expect(response.headers.get('x-stormgate-fallback')).toBe('context_length');
    expect(backup!.stats().total).toBe(1);
    expect(wide.stats().total).toBe(1);
  });
});

describe('contextWindowFallback on Anthropic\'s own API (/v1/messages)', () => {
  it('moves a prompt too long to the larger model, and not a request refused for another reason', async () => {
    const wide = await startBackup({ quiet: true, apiKey: 'wide-key' });
    const s = await startStack({
      faults: { errors: [{ status: 400, message: 'prompt is too long: 215000 tokens > 200000 maximum', times: 2 }, { status: 400, message: 'max_tokens: 100000 > 64000, which is the maximum allowed number of output tokens' }] },
      config: (url) => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: {
          claude: { family: 'anthropic', baseUrl: url, apiKey: TEST_KEY, breaker: false },
          wide: { family: 'anthropic', baseUrl: wide.url, apiKey: 'wide-key', breaker: false },
        },
        routes: [{ name: 'messages', match: { path: '/v1/messages' }, targets: [{ provider: 'claude' }], contextWindowFallback: { provider: 'wide', model: 'claude-sonnet-4-5-1m' }, ...RETRY_LOOP_ONLY.route }],
      }),
    });
    const client = new Anthropic({ baseURL: s.url, apiKey: 'client-key', maxRetries: 0 });
    const ask = { model: 'claude-sonnet-4-5', max_tokens: 256, messages: [{ role: 'user' as const, content: 'a long prompt' }] };
    const { data, response } = await client.messages.create(ask).withResponse();
    expect(data.model).toBe('claude-sonnet-4-5-1m');
    expect(response.headers.get('x-stormgate-fallback')).toBe('context_length');
    const events: string[] = [];
    for await (const ev of client.messages.stream(ask)) events.push(ev.type);
    expect(events.at(-1)).toBe('message_stop');
    expect(wide.stats().total).toBe(2);
    const err = (await client.messages.create(ask).catch((e: unknown) => e)) as InstanceType<typeof Anthropic.APIError>;
    expect(err.status).toBe(400);
    expect(err.message).toMatch(/max_tokens: 100000 > 64000/);
    expect(wide.stats().total).toBe(2);
  });
});

describe('contextWindowFallback for a prompt too long said inside a 2xx', () => {
  it.each<[string, string, (body: Record<string, unknown>) => Script]>([
    ['a chat stream\'s error event before any output', '/v1/chat/completions', () => ({ steps: [`data: ${JSON.stringify({ error: { message: "This model's maximum context length is 128000 tokens.", type: 'invalid_request_error', param: 'messages', code: 'context_length_exceeded' } })}\n\n`] })],
    ['a vLLM error event that names no code', '/v1/chat/completions', () => ({ steps: [`data: ${JSON.stringify({ error: { object: 'error', message: "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens.", type: 'BadRequestError', code: 400 } })}\n\n`] })],
  ])('takes %s', async (_name, path, answer) => {
    const p = await startProvider(scripted(answer));
    const wide = await startBackup({ quiet: true, apiKey: 'wide-key' });
    const { s } = await stackWith({
      family: 'openai',
      backupOrigin: p.origin,
      path,
      targets: [{ provider: 'backup' }],
      route: { contextWindowFallback: { provider: 'wide', model: 'gpt-4.1' } },
      more: { wide: { family: 'openai', baseUrl: `${wide.url}/v1`, apiKey: 'wide-key', breaker: false } },
    });
    const chunks: OpenAI.ChatCompletionChunk[] = [];
    const { data: stream, response } = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true }).withResponse();
    for await (const c of stream) chunks.push(c);
    expect(response.headers.get('x-stormgate-fallback')).toBe('context_length');
    expect(chunks.every((c) => c.model === 'gpt-4.1')).toBe(true);
    expect(wide.stats().total).toBe(1);
  });

  it('takes a Responses API stream that fails with context_length_exceeded after response.created', async () => {
    const failed = (body: Record<string, unknown>): Script => {
      const response = { id: 'resp_1', object: 'response', created_at: 1, status: 'failed', model: body.model, output: [], error: { code: 'context_length_exceeded', message: 'Your input exceeds the context window of this model.' } };
      return body.stream === true
        ? { steps: [`event: response.created\ndata: ${JSON.stringify({ type: 'response.created', sequence_number: 0, response: { ...response, status: 'in_progress', error: null } })}\n\n`, `event: response.failed\ndata: ${JSON.stringify({ type: 'response.failed', sequence_number: 1, response })}\n\n`] }
        : { headers: { 'content-type': 'application/json' }, steps: [JSON.stringify(response)] };
    };
    const p = await startProvider(scripted(failed));
    const wide = await startBackup({ quiet: true, apiKey: 'wide-key' });
    const { s } = await stackWith({
      family: 'openai',
      backupOrigin: p.origin,
      path: '/v1/responses',
      targets: [{ provider: 'backup' }],
      route: { contextWindowFallback: { provider: 'wide', model: 'gpt-4.1' } },
      more: { wide: { family: 'openai', baseUrl: `${wide.url}/v1`, apiKey: 'wide-key', breaker: false } },
    });
    const whole = await sdk(s).responses.create({ model: 'gpt-4o', input: 'a long prompt', store: false }).withResponse();
    expect(whole.data.model).toBe('gpt-4.1');
    expect(whole.response.headers.get('x-stormgate-fallback')).toBe('context_length');
    const events: string[] = [];
    const stream = await sdk(s).responses.create({ model: 'gpt-4o', input: 'a long prompt', store: false, stream: true });
    for await (const ev of stream) events.push(ev.type);
    expect(events.at(-1)).toBe('response.completed');
    expect(wide.stats().total).toBe(2);
  });
});

describe('a /v1/messages backup of another model that rejects what the client asked for', () => {
  it('leaves the Anthropic SDK the primary\'s overload, with the backup\'s rejection as a note', async () => {
    const backup = await startBackup({ quiet: true, apiKey: 'backup-key', faults: { errors: [{ status: 400, message: 'thinking: this model does not support extended thinking' }] } });
    const s = await startStack({
      faults: { errors: [{ status: 529 }] },
      config: (url) => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: {
          claude: { family: 'anthropic', baseUrl: url, apiKey: TEST_KEY, breaker: false },
          backup: { family: 'anthropic', baseUrl: backup.url, apiKey: 'backup-key', breaker: false },
        },
        routes: [{ name: 'messages', match: { path: '/v1/messages' }, targets: [{ provider: 'claude' }, { provider: 'backup', model: 'claude-3-5-haiku' }], ...RETRY_LOOP_ONLY.route, retry: quick }],
      }),
    });
    const client = new Anthropic({ baseURL: s.url, apiKey: 'client-key', maxRetries: 0 });
    const ask = { model: 'claude-sonnet-4-6', max_tokens: 2048, thinking: { type: 'enabled' as const, budget_tokens: 1024 }, messages: [{ role: 'user' as const, content: 'think' }] };
    for (const stream of [false, true]) {
      const err = (await client.messages.create({ ...ask, stream } as never).catch((e: unknown) => e)) as InstanceType<typeof Anthropic.APIError>;
      expect(err.status).toBe(529);
      expect((err.error as { error?: { type?: string } }).error?.type).toBe('overloaded_error');
      expect(err.message).toMatch(/the fallback backup\/claude-3-5-haiku rejected the request \(400: thinking: this model does not support extended thinking\)/);
    }
    expect(backup.stats().total).toBe(2);
  });
});

describe('the route\'s degraded answer, the backup of last resort', () => {
  // A fixed text has no token log probabilities and no audio: a client that asked for them reads
  // choices[0].logprobs.content or message.audio.data and crashes on a null, as parse() would on structured output.
  it.each<[string, Record<string, unknown>]>([
    ['logprobs', { logprobs: true }],
    ['top_logprobs', { logprobs: true, top_logprobs: 2 }],
    ['audio output', { modalities: ['text', 'audio'], audio: { voice: 'alloy', format: 'wav' } }],
  ])('is not given to a request for %s: it gets the primary\'s failure', async (_name, extra) => {
    const { s, backup } = await stackWith({ faults: { errors: [{ status: 503, message: 'the primary is overloaded' }] }, route: { degraded: { message: 'Sorry, try again later.' } } });
    for (const stream of [false, true]) {
      const err = (await sdk(s)
        .chat.completions.create({ model: 'gpt-4o', messages, ...extra, stream } as never)
        .catch((e: unknown) => e)) as APIError;
      expect(err.status).toBe(503);
      expect(err.message).toMatch(/the primary is overloaded/);
    }
    expect(backup!.stats().total).toBe(0);
  });

  it('is still given to a plain request, and to one that asked for n choices, one per choice', async () => {
    const { s } = await stackWith({ faults: { errors: [{ status: 503 }] }, route: { degraded: { message: 'Sorry, try again later.' } } });
    const { data, response } = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, n: 2 }).withResponse();
    expect(response.headers.get('x-stormgate-degraded')).toBe('true');
    expect(data.choices.map((c) => c.message.content)).toEqual(['Sorry, try again later.', 'Sorry, try again later.']);
  });
});
