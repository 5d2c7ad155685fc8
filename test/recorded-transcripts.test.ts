// Recorded provider streams (test/fixtures/transcripts: Azure, DeepSeek, Mistral, Ollama, Groq, OpenRouter, the
// Responses API, Anthropic) replayed by a fake upstream, byte for byte, split where networks split them (mid-line,
// mid-UTF-8), and read with the official SDKs twice: straight from the upstream and through the gateway. What the SDK
// gets must be the same (every event, in order; the accumulated content, tool calls, usage and finish), the first
// output must be seen as such (not timed out, and not started before it), and a recorded failure must reach the SDK
// as an error, never as a clean end.
import type { RequestListener } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { loadTranscripts, type Transcript } from './fixtures/transcripts/index.ts';
import { useFakeProviders, type FakeProvider } from './helpers/fake-provider.ts';
import { RETRY_LOOP_ONLY, useStacks, type Stack } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();
const transcripts = loadTranscripts();

/** A deterministic generator, so a failure replays with the same splits. */
function random(seedText: string): () => number {
  let s = [...seedText].reduce((h, c) => Math.imul(h ^ c.charCodeAt(0), 16777619), 2166136261) >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = Math.imul(s ^ (s >>> 15), 1 | s);
    t ^= t + Math.imul(t ^ (t >>> 7), 61 | t);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * The body cut into the pieces a network delivers: random sizes up to 61 bytes, and always a cut inside the first
 * multi-byte character, inside the first `data:` field name and between the two line feeds that end an event.
 */
function wirePieces(body: Buffer, seed: string): Buffer[] {
  const rand = random(seed);
  const cuts = new Set<number>();
  const multiByte = body.findIndex((b) => b >= 0xc0);
  if (multiByte >= 0) cuts.add(multiByte + 1);
  const data = body.indexOf('data:');
  if (data >= 0) cuts.add(data + 2);
  const end = body.indexOf('\n\n');
  if (end >= 0) cuts.add(end + 1);
  for (let at = 0; at < body.length; ) cuts.add((at += 1 + Math.floor(rand() * 61)));
  const sorted = [...cuts].filter((c) => c > 0 && c < body.length).sort((a, b) => a - b);
  return [0, ...sorted].map((from, i) => body.subarray(from, sorted[i] ?? body.length));
}

/** How the upstream sends a transcript: all of it, split as a network would; or held before and after its first output. */
type Pace = { kind: 'split' } | { kind: 'timed'; holdMs: number; gapMs: number };

const HOLD_MS = 300;
const GAP_MS = 1200;
/** Between HOLD_MS and HOLD_MS + GAP_MS: the first output comes in time, and a gateway that missed it times out. */
const FIRST_TOKEN_MS = 800;

function upstream(t: Transcript, pace: Pace): RequestListener {
  return (req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' });
      res.flushHeaders();
      void (async () => {
        const write = async (events: string[], seed: string) => {
          const pieces = wirePieces(Buffer.from(events.join('')), `${t.name}/${seed}`);
          for (let i = 0; i < pieces.length; i++) {
            if (res.destroyed) return;
            res.write(pieces[i]);
            // A pause now and then, so the pieces reach the gateway as separate reads.
            if (i % 3 === 2) await sleep(1);
          }
        };
        if (pace.kind === 'split' || t.firstOutput === undefined) await write(t.events, 'all');
        else {
          await write(t.events.slice(0, t.firstOutput), 'head');
          await sleep(pace.holdMs);
          await write([t.events[t.firstOutput]!], 'first');
          await sleep(pace.gapMs);
          await write(t.events.slice(t.firstOutput + 1), 'rest');
        }
        if (!res.destroyed) res.end();
      })();
    });
  };
}

/** The gateway as the README configures it: OpenAI-family routes, Anthropic's own API, and chat translated to Anthropic. */
async function gateway(p: FakeProvider, firstTokenMs = 30_000): Promise<Stack> {
  const timeouts = { connectMs: 2_000, firstTokenMs, idleMs: 30_000 };
  const retry = { maxAttempts: 3, backoff: { strategy: 'fixed' as const, baseMs: 10 } };
  const route = { ...RETRY_LOOP_ONLY.route, retry };
  return startStack({
    config: () => ({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: {
        openai: { family: 'openai', baseUrl: `${p.origin}/v1`, apiKey: 'openai-key', breaker: false, timeouts },
        anthropic: { family: 'anthropic', baseUrl: p.origin, apiKey: 'anthropic-key', breaker: false, timeouts },
        azure: { family: 'azure-openai', baseUrl: p.origin, apiKey: 'azure-key', apiVersion: '2024-10-21', breaker: false, timeouts },
      },
      routes: [
        { name: 'translated', match: { path: '/v1/chat/completions', models: ['claude-*'] }, targets: [{ provider: 'anthropic' }], ...route },
        { name: 'azure', match: { path: '/v1/chat/completions', models: ['azure-*'] }, targets: [{ provider: 'azure', model: 'gpt-5-nano' }], ...route },
        { name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'openai' }], ...route },
        { name: 'responses', match: { path: '/v1/responses' }, targets: [{ provider: 'openai' }], ...route },
        { name: 'messages', match: { path: '/v1/messages' }, targets: [{ provider: 'anthropic' }], ...route },
      ],
    }),
  });
}

const openaiAt = (baseURL: string) => new OpenAI({ baseURL, apiKey: 'client-key', maxRetries: 0 });
const anthropicAt = (baseURL: string) => new Anthropic({ baseURL, apiKey: 'client-key', maxRetries: 0 });

const chatBody = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'hi' }], stream: true as const, stream_options: { include_usage: true } };
const responsesBody = { model: 'gpt-4o', input: 'hi', stream: true as const };
const messagesBody = { model: 'claude-sonnet-4-6', max_tokens: 1024, messages: [{ role: 'user' as const, content: 'hi' }], stream: true as const };

/** What an SDK handed over: every event it yielded, and the error it raised, if any. */
interface Outcome {
  events: unknown[];
  error?: { status: number | undefined; message: string };
  /** When the response's headers reached the SDK, ms after the request. */
  headersMs?: number;
}

const errorOf = (err: unknown) => ({ status: (err as { status?: number }).status, message: String((err as Error).message) });

/** The SDK's raw stream of one transcript's API, read to its end. */
async function rawStream(api: Transcript['api'], baseURL: string, origin: string, chatModel = chatBody.model): Promise<Outcome> {
  const events: unknown[] = [];
  const started = Date.now();
  let headersMs: number | undefined;
  try {
    const call =
      api === 'chat'
        ? openaiAt(baseURL).chat.completions.create({ ...chatBody, model: chatModel }).withResponse()
        : api === 'responses'
          ? openaiAt(baseURL).responses.create(responsesBody).withResponse()
          : anthropicAt(origin).messages.create(messagesBody).withResponse();
    const { data } = await call;
    headersMs = Date.now() - started;
    for await (const ev of data as AsyncIterable<unknown>) events.push(ev);
    return { events, headersMs };
  } catch (err) {
    return { events, error: errorOf(err), headersMs };
  }
}

/** The SDK's own accumulation of a stream (its stream helper's final result), or the error it raised. */
async function accumulated(api: Transcript['api'], baseURL: string, origin: string): Promise<{ value?: unknown; error?: Outcome['error'] }> {
  try {
    if (api === 'chat') return { value: await openaiAt(baseURL).chat.completions.stream(chatBody).finalChatCompletion() };
    if (api === 'responses') return { value: await openaiAt(baseURL).responses.stream(responsesBody).finalResponse() };
    return { value: await anthropicAt(origin).messages.stream(messagesBody).finalMessage() };
  } catch (err) {
    return { error: errorOf(err) };
  }
}

/**
 * The same transcript as other servers frame it: with CRLF line endings (the SSE spec allows CR, LF and CRLF, and
 * servers behind some proxies send CRLF), and with its last event not terminated by a blank line (a server that
 * closes the connection after the event's last line).
 */
const VARIANTS: Array<[string, (t: Transcript) => Transcript]> = [
  ['as recorded', (t) => t],
  ['with CRLF line endings', (t) => ({ ...t, events: t.events.map((e) => e.replace(/\n/g, '\r\n')) })],
  ['its last event unterminated', (t) => ({ ...t, events: [...t.events.slice(0, -1), t.events.at(-1)!.replace(/\n\n$/, '\n')] })],
];

describe('recorded transcripts through the gateway, read by the official SDKs', () => {
  for (const [variant, reframe] of VARIANTS) {
    for (const t of transcripts) {
      it(`the SDK gets what it gets from the upstream itself, ${variant}: ${t.name}`, async () => {
        // The SDK reads the transcript as recorded straight from one upstream, and through the gateway from another that
        // sends it reframed: an SDK drops an event left unterminated at the end (as the SSE spec says), where the
        // gateway completes it, so the client is not handed a clean end without the stream's last event.
        const d = await startProvider(upstream(t, { kind: 'split' }));
        const p = await startProvider(upstream(reframe(t), { kind: 'split' }));
        const s = await gateway(p);
        const direct = await rawStream(t.api, `${d.origin}/v1`, d.origin);
        const through = await rawStream(t.api, s.baseURL, s.url);
        if (t.fails === 'before-output') {
          // Retried, then answered with the status the failure stands for: an error the SDK raises, with a status.
          expect(through.error, 'the SDK raised no error').toBeDefined();
          expect(through.error!.status).toBe(t.failStatus);
          expect(through.events).toEqual([]);
          return;
        }
        expect(direct.events.length).toBeGreaterThan(0);
        expect(through.events).toEqual(direct.events);
        if (t.fails === 'after-output') {
          expect(direct.error, 'the recorded stream is not an error for the SDK itself').toBeDefined();
          expect(through.error, 'the stream ended cleanly through the gateway').toBeDefined();
        } else {
          expect(direct.error).toBeUndefined();
          expect(through.error).toBeUndefined();
        }
        const directFinal = await accumulated(t.api, `${d.origin}/v1`, d.origin);
        const throughFinal = await accumulated(t.api, s.baseURL, s.url);
        expect(throughFinal.value).toEqual(directFinal.value);
        expect(throughFinal.error === undefined).toBe(directFinal.error === undefined);
      });
    }
  }

  for (const t of transcripts.filter((x) => x.firstOutput !== undefined)) {
    it(`its first output starts the answer, in time and not before: ${t.name}`, async () => {
      const d = await startProvider(upstream(t, { kind: 'split' }));
      const direct = await rawStream(t.api, `${d.origin}/v1`, d.origin);
      const p = await startProvider(upstream(t, { kind: 'timed', holdMs: HOLD_MS, gapMs: GAP_MS }));
      const s = await gateway(p, FIRST_TOKEN_MS);
      const through = await rawStream(t.api, s.baseURL, s.url);
      expect(p.hits(), 'the first output was missed: timed out and retried').toBe(1);
      // The headers wait for the first output, which the upstream held back for HOLD_MS.
      expect(through.headersMs).toBeGreaterThanOrEqual(HOLD_MS - 50);
      expect(through.events).toEqual(direct.events);
      expect(through.error === undefined).toBe(t.fails === undefined);
    });
  }
});

/** What a chat completion translated from an Anthropic stream must hold, read off the Anthropic SDK's own events. */
function expectedFromAnthropic(events: Anthropic.RawMessageStreamEvent[]) {
  let text = '';
  let reasoning = '';
  let stop: string | null = null;
  let usage: { input_tokens?: number | null; output_tokens?: number | null; cache_creation_input_tokens?: number | null; cache_read_input_tokens?: number | null } = {};
  const tools = new Map<number, { id: string; name: string; args: string }>();
  for (const ev of events) {
    if (ev.type === 'message_start') usage = { ...ev.message.usage };
    if (ev.type === 'content_block_start' && ev.content_block.type === 'tool_use') tools.set(ev.index, { id: ev.content_block.id, name: ev.content_block.name, args: '' });
    if (ev.type === 'content_block_delta') {
      if (ev.delta.type === 'text_delta') text += ev.delta.text;
      if (ev.delta.type === 'thinking_delta') reasoning += ev.delta.thinking;
      if (ev.delta.type === 'input_json_delta') tools.get(ev.index)!.args += ev.delta.partial_json;
    }
    if (ev.type === 'message_delta') {
      stop = ev.delta.stop_reason;
      usage = { ...usage, ...ev.usage };
    }
  }
  const prompt = (usage.input_tokens ?? 0) + (usage.cache_creation_input_tokens ?? 0) + (usage.cache_read_input_tokens ?? 0);
  return {
    text,
    reasoning,
    finish: ({ end_turn: 'stop', tool_use: 'tool_calls', max_tokens: 'length', stop_sequence: 'stop' } as Record<string, string>)[stop ?? ''],
    tools: [...tools.values()].map((c) => ({ id: c.id, name: c.name, input: JSON.parse(c.args || '{}') as unknown })),
    usage: usage.output_tokens == null ? undefined : { prompt, completion: usage.output_tokens },
  };
}

/** A translated chat stream read chunk by chunk, as a client that keeps reasoning_content accumulates it. */
async function translatedChunks(client: OpenAI, body: OpenAI.ChatCompletionCreateParamsStreaming) {
  const out = { text: '', reasoning: '', finish: null as string | null, tools: [] as Array<{ id: string; name: string; args: string }>, usage: undefined as { prompt: number; completion: number } | undefined, error: undefined as Outcome['error'] };
  try {
    for await (const chunk of await client.chat.completions.create(body)) {
      if (chunk.usage) out.usage = { prompt: chunk.usage.prompt_tokens, completion: chunk.usage.completion_tokens };
      for (const choice of chunk.choices) {
        const delta = choice.delta as OpenAI.ChatCompletionChunk.Choice.Delta & { reasoning_content?: string };
        out.text += delta.content ?? '';
        out.reasoning += delta.reasoning_content ?? '';
        for (const call of delta.tool_calls ?? []) {
          const slot = (out.tools[call.index] ??= { id: '', name: '', args: '' });
          slot.id ||= call.id ?? '';
          slot.name ||= call.function?.name ?? '';
          slot.args += call.function?.arguments ?? '';
        }
        if (choice.finish_reason) out.finish = choice.finish_reason;
      }
    }
  } catch (err) {
    out.error = errorOf(err);
  }
  return out;
}

describe('recorded Anthropic transcripts translated for chat completions clients', () => {
  const translated = (t: Transcript) => {
    const names = [...new Set(t.events.flatMap((e) => [...e.matchAll(/"type":"tool_use","id":"[^"]+","name":"([^"]+)"/g)].map((m) => m[1]!)))];
    return {
      model: 'claude-sonnet-4-6',
      messages: [{ role: 'user' as const, content: 'hi' }],
      stream: true as const,
      stream_options: { include_usage: true },
      ...(names.length > 0 && { tools: names.map((name) => ({ type: 'function' as const, function: { name, parameters: { type: 'object', properties: {} } } })) }),
    };
  };

  for (const [variant, reframe] of VARIANTS) {
    for (const t of transcripts.filter((x) => x.api === 'messages')) {
      it(`the chat client gets the content, reasoning, tool calls, finish and usage Anthropic sent, ${variant}: ${t.name}`, async () => {
        const d = await startProvider(upstream(t, { kind: 'split' }));
        const p = await startProvider(upstream(reframe(t), { kind: 'split' }));
        const s = await gateway(p);
        const direct = await rawStream('messages', '', d.origin);
        const got = await translatedChunks(openaiAt(s.baseURL), translated(t));
        if (t.fails) {
          expect(got.error, 'the translated stream ended cleanly').toBeDefined();
          if (t.fails === 'after-output') expect(got.error!.message).toMatch(/Overloaded/);
          // The status an Anthropic overload stands for, as when it comes as a 529 answer rather than inside the stream.
          else expect(got.error).toMatchObject({ status: 529, message: expect.stringMatching(/Overloaded/) });
          return;
        }
        expect(got.error).toBeUndefined();
        const want = expectedFromAnthropic(direct.events as Anthropic.RawMessageStreamEvent[]);
        expect(got.text).toBe(want.text);
        expect(got.reasoning).toBe(want.reasoning);
        expect(got.tools.map((c) => ({ id: c.id, name: c.name, input: JSON.parse(c.args) as unknown }))).toEqual(want.tools);
        expect(got.finish).toBe(want.finish);
        if (want.usage) expect(got.usage).toEqual(want.usage);
      });
    }
  }

  for (const t of transcripts.filter((x) => x.api === 'messages' && x.firstOutput !== undefined)) {
    it(`its first output starts the translated answer, in time and not before: ${t.name}`, async () => {
      const p = await startProvider(upstream(t, { kind: 'timed', holdMs: HOLD_MS, gapMs: GAP_MS }));
      const s = await gateway(p, FIRST_TOKEN_MS);
      const started = Date.now();
      const { data } = await openaiAt(s.baseURL).chat.completions.create(translated(t)).withResponse();
      const headersMs = Date.now() - started;
      let chunks = 0;
      let failed = false;
      try {
        for await (const chunk of data) chunks += chunk.choices.length;
      } catch {
        failed = true;
      }
      expect(p.hits(), 'the first output was missed: timed out and retried').toBe(1);
      expect(headersMs).toBeGreaterThanOrEqual(HOLD_MS - 50);
      expect(chunks).toBeGreaterThan(0);
      expect(failed).toBe(t.fails !== undefined);
    });
  }
});

describe('recorded Azure OpenAI transcripts through an azure-openai target', () => {
  for (const t of transcripts.filter((x) => x.name.startsWith('azure'))) {
    it(`the SDK gets every chunk Azure sent, filter results included: ${t.name}`, async () => {
      const d = await startProvider(upstream(t, { kind: 'split' }));
      const p = await startProvider(upstream(t, { kind: 'split' }));
      const s = await gateway(p);
      const direct = await rawStream('chat', `${d.origin}/v1`, d.origin);
      const through = await rawStream('chat', s.baseURL, s.url, 'azure-router');
      expect(through.error).toBeUndefined();
      expect(through.events).toEqual(direct.events);
    });
  }
});
