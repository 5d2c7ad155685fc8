// Streaming through the gateway: headers held until the first output, events passed through as they arrive,
// retries only before the first byte, and broken streams ending in an error the SDK raises.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { RETRY_LOOP_ONLY, useStacks, type Stack } from './helpers/stack.ts';
import { cc, delta, fastRetries, useScriptedGateway } from './helpers/scripted-provider.ts';
import { MAX_EVENT_BYTES } from '../src/streaming/sse-parser.ts';
import { streamedText } from './helpers/chat-stream.ts';

const start = useStacks(RETRY_LOOP_ONLY);


const sdk = (s: Stack) => new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 2 });

async function collect(s: Stack): Promise<string> {
  const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'tell me' }], stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  return text;
}

async function rawStream(s: Stack): Promise<{ status: number; text: string }> {
  const res = await fetch(`${s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true }),
  });
  return { status: res.status, text: await res.text() };
}

describe('streaming', () => {
  it('passes events through as they arrive: the client reads the first chunk before the mock has sent the last', async () => {
    const s = await start({ faults: { stream: { chunks: 6, chunkDelayMs: 150 } } });
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    let firstContentAt: number | undefined;
    for await (const chunk of stream) {
      if (firstContentAt === undefined && chunk.choices[0]?.delta?.content) firstContentAt = Date.now();
    }
    const upstreamEnded = s.mock.requests()[0]!.endedAt!;
    expect(firstContentAt).toBeDefined();
    expect(upstreamEnded - firstContentAt!).toBeGreaterThan(400);
  });

  it('delivers the same text as the non-streaming answer, with [DONE] at the end', async () => {
    const s = await start({});
    const text = await collect(s);
    const whole = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'tell me' }] });
    expect(text).toBe(whole.choices[0]!.message.content);
    const raw = await rawStream(s);
    expect(raw.text.trimEnd().endsWith('data: [DONE]')).toBe(true);
  });

  it('retries a first-token timeout before any byte reaches the client, and answers 504 when every attempt is silent', async () => {
    const s = await start({
      faults: { stream: { firstTokenDelayMs: 1_000 } },
      provider: { timeouts: { firstTokenMs: 200 } },
      route: { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 10, capMs: 10 } } },
    });
    const started = Date.now();
    const raw = await rawStream(s);
    expect(raw.status).toBe(504);
    expect(JSON.parse(raw.text).error.code).toBe('upstream_timeout');
    expect(s.mock.stats().total).toBe(2);
    expect(Date.now() - started).toBeLessThan(1_000);
  });

  it('does not count a role-only chunk or a ping as the first token, but a slow first token within the limit succeeds', async () => {
    const s = await start({ faults: { stream: { firstTokenDelayMs: 300, pingBeforeFirstToken: true } }, provider: { timeouts: { firstTokenMs: 2_000 } } });
    const text = await collect(s);
    expect(text.length).toBeGreaterThan(0);
    expect(s.mock.stats().total).toBe(1);
  });

  it('lets a stream run longer than firstTokenMs once its first token has arrived', async () => {
    const s = await start({ faults: { stream: { chunks: 10, chunkDelayMs: 60 } }, provider: { timeouts: { firstTokenMs: 300, idleMs: 1_000 } } });
    const text = await collect(s);
    expect(text.length).toBeGreaterThan(0);
    expect(s.mock.stats().total).toBe(1);
  });

  it('retries a stream that is malformed before its first output', async () => {
    const s = await start({
      faults: { stream: { malformedAtChunk: 0 } },
      route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } },
    });
    const raw = await rawStream(s);
    expect(raw.status).toBe(502);
    expect(JSON.parse(raw.text).error.code).toBe('upstream_bad_response');
    expect(s.mock.stats().total).toBe(3);
  });

  it('ends a stream cut after the first byte with an error event that the SDK raises, without retrying', async () => {
    const s = await start({ faults: { stream: { chunks: 5, cutAfterChunks: 2 } } });
    await expect(collect(s)).rejects.toThrow(/cut|ended before the answer was complete/);
    expect(s.mock.stats().total).toBe(1);
  });

  it('counts a stream that broke after its first byte as stream_error, not as a success', async () => {
    const s = await start({ faults: { stream: { chunks: 5, cutAfterChunks: 2 } } });
    await expect(collect(s)).rejects.toThrow();
    await new Promise((r) => setTimeout(r, 50));
    const line = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.route === 'chat');
    expect(line).toMatchObject({ outcome: 'stream_error', streamEnd: 'cut' });
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toMatch(/stormgate_requests_total\{[^}]*outcome="stream_error"[^}]*\} 1/);
    expect(metrics).not.toMatch(/stormgate_requests_total\{[^}]*outcome="success"[^}]*\} [1-9]/);
  });

  it('ends a stalled stream after idleMs with an error event that the SDK raises', async () => {
    const s = await start({ faults: { stream: { chunks: 5, stallAfterChunks: 2 } }, provider: { timeouts: { idleMs: 300 } } });
    const started = Date.now();
    await expect(collect(s)).rejects.toThrow(/stalled/);
    expect(Date.now() - started).toBeLessThan(2_000);
    expect(s.mock.stats().total).toBe(1);
  });

  it('drops a malformed event after the first byte and completes the answer', async () => {
    const s = await start({ faults: { stream: { chunks: 5, malformedAtChunk: 2 } } });
    const raw = await rawStream(s);
    expect(raw.text).not.toContain('{not json');
    const text = await collect(s);
    expect(text.length).toBeGreaterThan(0);
    // Dropped, but not in silence: the client never saw that event's text.
    const lines = s.logs.map((l) => JSON.parse(l) as { msg: string; level: number; droppedMalformed?: number }).filter((l) => l.droppedMalformed !== undefined);
    expect(lines).toHaveLength(2);
    expect(lines[0]).toMatchObject({ msg: 'stream events dropped as malformed', level: 40, droppedMalformed: 1 });
  });

  it('ends a tool call broken by a malformed event with an error the SDK raises, never with corrupt arguments', async () => {
    const s = await start({ faults: { stream: { chunks: 5, malformedAtChunk: 2 } } });
    const tools = [{ type: 'function' as const, function: { name: 'lookup', parameters: { type: 'object', properties: { x: { type: 'number' } } } } }];
    const outcome = await sdk(s)
      .chat.completions.stream({ model: 'gpt-4o', messages: [{ role: 'user', content: 'call it' }], tools })
      .finalChatCompletion()
      .then((c) => `answered: ${c.choices[0]?.message.tool_calls?.map((t) => (t.type === 'function' ? t.function.arguments : '')).join()}`, (e: Error) => e.message);
    expect(outcome).toMatch(/malformed event inside a tool call/);
    expect(s.mock.stats().total).toBe(1);
  });

  it('finalises a finished stream that ends without [DONE]', async () => {
    const s = await start({ faults: { stream: { omitDone: true } } });
    const raw = await rawStream(s);
    expect(raw.text.trimEnd().endsWith('data: [DONE]')).toBe(true);
    expect((await collect(s)).length).toBeGreaterThan(0);
  });

  it('streams the Responses API through the SDK', async () => {
    const s = await start({ faults: { stream: { chunks: 4 } } });
    const stream = await sdk(s).responses.create({ model: 'gpt-4o', input: 'hello', stream: true });
    let text = '';
    let completed = false;
    for await (const ev of stream) {
      if (ev.type === 'response.output_text.delta') text += ev.delta;
      if (ev.type === 'response.completed') completed = true;
    }
    expect(text.length).toBeGreaterThan(0);
    expect(completed).toBe(true);
  });

  it('ends a cut Responses API stream with an error the SDK raises', async () => {
    const s = await start({ faults: { stream: { chunks: 5, cutAfterChunks: 2 } } });
    const stream = await sdk(s).responses.create({ model: 'gpt-4o', input: 'hello', stream: true });
    await expect(
      (async () => {
        for await (const _ of stream) void _;
      })(),
    ).rejects.toThrow(/cut|ended before the answer was complete/);
  });
});

describe('an event larger than the gateway holds (16 MB)', () => {
  const scripted = useScriptedGateway(fastRetries);
  const messages = [{ role: 'user' as const, content: 'hi' }];
  const role = cc([delta({ role: 'assistant', content: '' })]);
  const whole = [role, cc([delta({ content: 'Hi there' })]), cc([delta({}, 'stop')]), 'data: [DONE]\n\n'];
  // Written at once with the events before it: they are the answer's, whatever reads the gateway's socket makes of it.
  // A MB over the limit: the parser checks an event's size while it is open, so one whose end comes in the read that
  // takes it over the limit (a read is at most some 64 KB) still passes.
  const oversized = `data: {"x":"${'a'.repeat(MAX_EVENT_BYTES + 1024 * 1024)}"}\n\n`;

  it('after the first output breaks the stream: the client gets the text before it, then an error the SDK raises', async () => {
    const { client, seen } = await scripted(() => ({ steps: [role, cc([delta({ content: 'Hi' })]) + cc([delta({ content: ' there' })]) + oversized, ...whole.slice(2)] }));
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    const { text, err } = await streamedText(stream);
    expect(err?.message).toMatch(/an event larger than 16 MB/);
    expect(text).toBe('Hi there');
    expect(seen).toHaveLength(1);
  });

  it('before the first output is a broken stream, retried', async () => {
    const { client, seen } = await scripted((_, n) => ({ steps: n === 1 ? [role + oversized] : whole }));
    const answer = await client.chat.completions.stream({ model: 'gpt-4o', messages }).finalChatCompletion();
    expect(answer.choices[0]!.message.content).toBe('Hi there');
    expect(seen).toHaveLength(2);
  });
});

describe('a client that stops reading a stream', () => {
  it('is given up on after 10 idle periods: its connection is closed, not only the upstream one', async () => {
    const { connect } = await import('node:net');
    // A long answer, sent at once: the client's socket fills and the gateway waits on it, not on the upstream.
    const s = await start({ faults: { stream: { chunks: 100_000 } }, provider: { ...RETRY_LOOP_ONLY.provider, timeouts: { idleMs: 100 } } });
    const { port } = new URL(s.url);
    const socket = connect(Number(port), '127.0.0.1');
    const body = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    socket.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`);
    socket.pause();
    try {
      const connections = () => new Promise<number>((resolve) => s.gateway.server.getConnections((_e, n) => resolve(n)));
      // A bound, not a wait: the stall is counted once the sockets' buffers are full, which on a loaded machine (the
      // mock, the gateway and this client share its CPU) took more than 5 s where a quiet one needs under one.
      const deadline = Date.now() + 20_000;
      await new Promise((r) => setTimeout(r, 300));
      expect(await connections()).toBe(1);
      while ((await connections()) > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
      expect(await connections()).toBe(0);
      // Its line is written as the request's end settles, a moment after the socket is gone.
      while (!s.logs.join('').includes('"streamEnd"') && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
      expect(s.logs.join('')).toContain('"streamEnd":"client-stalled"');
    } finally {
      socket.destroy();
    }
  });
});
