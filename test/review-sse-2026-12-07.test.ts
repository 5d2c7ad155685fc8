// Adversarial review of the streaming path (2026-12-07): SSE framing edge cases (WHATWG), error events mid-stream,
// empty, huge and shredded streams, from hand-rolled upstreams on 127.0.0.1, read by the official openai SDK: is the
// answer the SDK parses the one sent, with its finish_reason and usage, and is every failure raised, never a clean end?
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';
import { cc, delta, DONE, recoveringToNext, streamed, useScriptedGateway, type Script, type Step } from './helpers/scripted-provider.ts';
import { metricSum } from './helpers/stack.ts';

const start = useScriptedUpstreams();
const recovering = useScriptedGateway(recoveringToNext());
const msgs = [{ role: 'user' as const, content: 'hi' }];
const TEXT = ['héllo ', '世界 ', '🎉🎉', ' done'];
const usageChunk = cc([], { usage: { prompt_tokens: 7, completion_tokens: 5, total_tokens: 12 } });

/** Every byte its own write, with a pause, so each reaches the gateway as its own read. */
const bytewise = (s: string): Step[] => {
  const b = Buffer.from(s);
  const out: Step[] = [];
  for (let i = 0; i < b.length; i++) out.push(b.subarray(i, i + 1), 1);
  return out;
};
const cr = (s: string) => s.replace(/\n/g, '\r');

async function collect(client: OpenAI, extra: Record<string, unknown> = {}) {
  const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: msgs, stream: true, ...extra } as OpenAI.ChatCompletionCreateParamsStreaming);
  let text = '';
  let finish: string | null = null;
  let usage: unknown;
  let error: unknown;
  try {
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        text += c.delta.content ?? '';
        if (c.finish_reason) finish = c.finish_reason;
      }
      if (chunk.usage) usage = chunk.usage;
    }
  } catch (e) {
    error = e;
  }
  return { text, finish, usage, error };
}

const oneUp = (script: () => Script) => start({ p: () => script() }, [{ provider: 'p' }]);
const body = () => cc([delta({ role: 'assistant', content: '' })]) + TEXT.map((t) => cc([delta({ content: t })])).join('') + cc([delta({}, 'stop')]);

describe('an OpenAI-compatible stream with odd framing or failures, read by the openai SDK', () => {
  it('lone CR line endings, one byte per read: text, finish_reason and usage as sent', async () => {
    const { client } = await oneUp(() => ({ steps: bytewise(cr(body() + usageChunk + DONE)) }));
    const r = await collect(client, { stream_options: { include_usage: true } });
    expect(r).toMatchObject({ text: TEXT.join(''), finish: 'stop', error: undefined });
    expect(r.usage).toMatchObject({ prompt_tokens: 7 });
  });

  it('data: without its space, id: and retry: lines in each event, and data:[DONE]', async () => {
    const raw = body().replace(/data: /g, 'id: 1\nretry: 100\ndata:') + 'data:[DONE]\n\n';
    const { client } = await oneUp(() => ({ steps: [raw] }));
    expect(await collect(client)).toMatchObject({ text: TEXT.join(''), finish: 'stop', error: undefined });
  });

  it('a bare data: heartbeat after every event', async () => {
    const raw = body().replace(/\n\n/g, '\n\ndata:\n\n') + DONE;
    const { client } = await oneUp(() => ({ steps: [raw] }));
    expect(await collect(client)).toMatchObject({ text: TEXT.join(''), finish: 'stop', error: undefined });
  });

  it('a [DONE] without its blank line before the connection ends', async () => {
    const { client } = await oneUp(() => ({ steps: [body() + 'data: [DONE]'] }));
    expect(await collect(client)).toMatchObject({ text: TEXT.join(''), finish: 'stop', error: undefined });
  });

  it('a last text chunk without its blank line, and no finish: the text, then an error', async () => {
    const raw = cc([delta({ role: 'assistant', content: '' })]) + cc([delta({ content: 'a' })]) + cc([delta({ content: 'b' })]).trimEnd();
    const { client } = await oneUp(() => ({ steps: [raw] }));
    const r = await collect(client);
    expect(r.text).toBe('ab');
    expect(r.error).toBeInstanceOf(OpenAI.APIError);
  });

  it('a finish chunk without its blank line and no [DONE]: a whole answer', async () => {
    const { client } = await oneUp(() => ({ steps: [body().trimEnd()] }));
    expect(await collect(client)).toMatchObject({ text: TEXT.join(''), finish: 'stop', error: undefined });
  });

  it('a [DONE] with a trailing space after the finish: a whole answer', async () => {
    const { client } = await oneUp(() => ({ steps: [body() + 'data: [DONE] \n\n'] }));
    expect(await collect(client)).toMatchObject({ text: TEXT.join(''), finish: 'stop', error: undefined });
  });

  it('an {"error"} event after the first output reaches the SDK as an APIError with its message', async () => {
    const raw = cc([delta({ role: 'assistant', content: '' })]) + cc([delta({ content: 'par' })]) + `data: ${JSON.stringify({ error: { message: 'The server had an error', type: 'server_error', param: null, code: null } })}\n\n`;
    const { client } = await oneUp(() => ({ steps: [raw], hold: true }));
    const r = await collect(client);
    expect(r.text).toBe('par');
    expect(r.error).toBeInstanceOf(OpenAI.APIError);
    expect(String((r.error as Error).message)).toContain('The server had an error');
  });

  it('an event: error with a bare {message} after the first output is raised, the [DONE] after it ignored', async () => {
    const raw = cc([delta({ role: 'assistant', content: '' })]) + cc([delta({ content: 'par' })]) + `event: error\ndata: ${JSON.stringify({ message: 'boom' })}\n\n` + DONE;
    const { client } = await oneUp(() => ({ steps: [raw], hold: true }));
    const r = await collect(client);
    expect(r.text).toBe('par');
    expect(r.error).toBeInstanceOf(OpenAI.APIError);
  });

  it('a 200 event stream closed before any event is retried, then an error', async () => {
    const { client, seen } = await oneUp(() => ({ steps: [] }));
    const r = await collect(client).catch((e: unknown) => ({ error: e, text: '' }));
    expect(r.error).toBeInstanceOf(OpenAI.APIError);
    expect(seen.p!.length).toBe(2);
  });

  it('a 5 MB single event passes whole', async () => {
    const big = 'x'.repeat(5 * 1024 * 1024);
    const raw = cc([delta({ role: 'assistant', content: '' })]) + cc([delta({ content: big })]) + cc([delta({}, 'stop')]) + DONE;
    const { client } = await oneUp(() => ({ steps: [raw] }));
    const r = await collect(client);
    expect(r.error).toBeUndefined();
    expect(r.text.length).toBe(big.length);
  });

  it('3000 chunks in 7-byte reads: text, finish_reason and usage whole', async () => {
    const parts: string[] = [];
    for (let i = 0; i < 3000; i++) parts.push(cc([delta({ content: String(i % 10) })]));
    const b = Buffer.from(cc([delta({ role: 'assistant', content: '' })]) + parts.join('') + cc([delta({}, 'stop')]) + usageChunk + DONE);
    const steps: Step[] = [];
    for (let i = 0; i < b.length; i += 7) steps.push(b.subarray(i, i + 7));
    const { client } = await oneUp(() => ({ steps }));
    const r = await collect(client, { stream_options: { include_usage: true } });
    expect(r.error).toBeUndefined();
    expect(r.text.length).toBe(3000);
    expect(r.finish).toBe('stop');
    expect(r.usage).toMatchObject({ completion_tokens: 5 });
  });

  it('TTFT is taken at the first text, not at the role chunk or a ping before it', async () => {
    const { client, s } = await oneUp(() => ({ steps: [cc([delta({ role: 'assistant', content: '' })]), ': ping\n\n', 800, cc([delta({ content: 'a' })]), cc([delta({}, 'stop')]), DONE] }));
    const r = await collect(client);
    expect(r.text).toBe('a');
    expect(await metricSum(s, 'stormgate_ttft_seconds_sum{route="chat"}')).toBeGreaterThanOrEqual(0.7);
  });
});

const aev = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
const messageStart = () => aev('message_start', { message: { id: 'msg_01', type: 'message', role: 'assistant', model: 'claude-sonnet-4-5', content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 12, output_tokens: 1 } } });
const textDeltas = (parts: string[]) => [aev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }), aev('ping', {}), ...parts.map((t) => aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: t } })), aev('content_block_stop', { index: 0 })];
const msgEnd = [aev('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 9 } }), aev('message_stop', {})];
const claude = (script: () => Script) => start({ a: { answer: () => script(), family: 'anthropic' } }, [{ provider: 'a', model: 'claude-sonnet-4-5' }]);
const overloaded = `event: error\ndata: ${JSON.stringify({ type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } })}\n\n`;

describe('an Anthropic stream translated to chat chunks, read by the openai SDK', () => {
  it('CRLF, one byte per read, with usage', async () => {
    const all = [messageStart(), ...textDeltas(TEXT), ...msgEnd].join('').replace(/\n/g, '\r\n');
    const { client } = await claude(() => ({ steps: bytewise(all) }));
    const r = await collect(client, { stream_options: { include_usage: true } });
    expect(r).toMatchObject({ text: TEXT.join(''), finish: 'stop', error: undefined });
    expect(r.usage).toMatchObject({ prompt_tokens: 12, completion_tokens: 9 });
  });

  it('lone CR, one byte per read', async () => {
    const all = cr([messageStart(), ...textDeltas(TEXT), ...msgEnd].join(''));
    const { client } = await claude(() => ({ steps: bytewise(all) }));
    expect(await collect(client)).toMatchObject({ text: TEXT.join(''), finish: 'stop', error: undefined });
  });

  it('a message_stop without its blank line', async () => {
    const all = [messageStart(), ...textDeltas(TEXT), ...msgEnd].join('').trimEnd();
    const { client } = await claude(() => ({ steps: [all] }));
    expect(await collect(client)).toMatchObject({ text: TEXT.join(''), finish: 'stop', error: undefined });
  });

  it('a message_delta then the connection\'s end, no message_stop: finish and usage', async () => {
    const all = [messageStart(), ...textDeltas(TEXT), msgEnd[0]!].join('');
    const { client } = await claude(() => ({ steps: [all] }));
    expect(await collect(client, { stream_options: { include_usage: true } })).toMatchObject({ text: TEXT.join(''), finish: 'stop', error: undefined, usage: { completion_tokens: 9 } });
  });

  it('an overloaded_error after the first output is raised, naming the overload', async () => {
    const all = [messageStart(), ...textDeltas(['Hel']).slice(0, 3), overloaded].join('');
    const { client } = await claude(() => ({ steps: [all], hold: true }));
    const r = await collect(client);
    expect(r.text).toBe('Hel');
    expect(r.error).toBeInstanceOf(OpenAI.APIError);
    expect(String((r.error as Error).message)).toContain('Overloaded');
  });

  it('an overloaded_error without its blank line, then the connection\'s end, is raised', async () => {
    const all = [messageStart(), ...textDeltas(['Hel']).slice(0, 3), overloaded.trimEnd()].join('');
    const { client } = await claude(() => ({ steps: [all] }));
    const r = await collect(client);
    expect(r.text).toBe('Hel');
    expect(r.error).toBeInstanceOf(OpenAI.APIError);
    expect(String((r.error as Error).message)).toContain('Overloaded');
  });

  it('a 200 event stream closed before any event is retried, then an error', async () => {
    const { client, seen } = await claude(() => ({ steps: [] }));
    const r = await collect(client).catch((e: unknown) => ({ error: e, text: '' }));
    expect(r.error).toBeInstanceOf(OpenAI.APIError);
    expect(seen.a!.length).toBe(2);
  });

  it('a 5 MB text delta passes whole', async () => {
    const big = 'y'.repeat(5 * 1024 * 1024);
    const all = [messageStart(), ...textDeltas(['a', big]), ...msgEnd].join('');
    const { client } = await claude(() => ({ steps: [all] }));
    const r = await collect(client);
    expect(r.error).toBeUndefined();
    expect(r.text.length).toBe(big.length + 1);
  });

  it('3000 text deltas in 5-byte reads: text, finish_reason and usage whole', async () => {
    const parts = Array.from({ length: 3000 }, (_, i) => String(i % 10));
    const b = Buffer.from([messageStart(), ...textDeltas(parts), ...msgEnd].join(''));
    const steps: Step[] = [];
    for (let i = 0; i < b.length; i += 5) steps.push(b.subarray(i, i + 5));
    const { client } = await claude(() => ({ steps }));
    const r = await collect(client, { stream_options: { include_usage: true } });
    expect(r).toMatchObject({ text: parts.join(''), finish: 'stop', error: undefined, usage: { completion_tokens: 9 } });
  });

  it('TTFT is taken at the first text delta, not at message_start or a ping', async () => {
    const { client, s } = await claude(() => ({ steps: [messageStart(), aev('ping', {}), 800, ...textDeltas(['a']), ...msgEnd] }));
    const r = await collect(client);
    expect(r.text).toBe('a');
    expect(await metricSum(s, 'stormgate_ttft_seconds_sum{route="chat"}')).toBeGreaterThanOrEqual(0.7);
  });
});

describe('an oversized event, and the legacy completions API', () => {
  it('an event over the limit after the first output: an error, not a truncated success', async () => {
    const big = 'z'.repeat(17 * 1024 * 1024);
    const raw = cc([delta({ role: 'assistant', content: '' })]) + cc([delta({ content: 'a' })]) + cc([delta({ content: big })]) + cc([delta({}, 'stop')]) + DONE;
    const { client } = await oneUp(() => ({ steps: [raw] }));
    const r = await collect(client);
    expect(r.text).toBe('a');
    expect(r.error).toBeInstanceOf(OpenAI.APIError);
  });

  it('legacy completions with lone CR framing, whole and with an error after the first output', async () => {
    const tc = (text: string, finish: string | null = null) => `data: ${JSON.stringify({ id: 'cmpl-1', object: 'text_completion', created: 1, model: 'gpt-3.5-turbo-instruct', choices: [{ index: 0, text, logprobs: null, finish_reason: finish }] })}\n\n`;
    const { client } = await start({ p: (b) => ({ steps: [cr(tc('Hel') + tc('lo') + (b.prompt === 'err' ? `data: ${JSON.stringify({ error: { message: 'kaput', type: 'server_error', code: null, param: null } })}\n\n` : tc('', 'stop') + DONE))] }) }, [{ provider: 'p' }], { path: '/v1/completions' });
    let text = '';
    for await (const c of await client.completions.create({ model: 'gpt-3.5-turbo-instruct', prompt: 'ok', stream: true })) text += c.choices[0]?.text ?? '';
    expect(text).toBe('Hello');
    text = '';
    const err = await (async () => {
      for await (const c of await client.completions.create({ model: 'gpt-3.5-turbo-instruct', prompt: 'err', stream: true })) text += c.choices[0]?.text ?? '';
    })().then(() => undefined, (e: unknown) => e);
    expect(text).toBe('Hello');
    expect(err).toBeInstanceOf(OpenAI.APIError);
  });
});

describe('random framing', () => {
  it('30 chat streams, each with its line ending, comments, id/retry lines, split data lines, heartbeats, a BOM and reads of 1-40 bytes', async () => {
    let seed = 42;
    const rnd = () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff), seed / 0x7fffffff);
    const pick = <T,>(a: T[]) => a[Math.floor(rnd() * a.length)]!;
    const frame = (json: string, eol: string) => {
      const lines: string[] = [];
      if (rnd() < 0.2) lines.push(pick([': ping', 'id: 42', 'retry: 1000', 'event: message', ':']));
      const sp = rnd() < 0.5 ? ' ' : '';
      if (rnd() < 0.3) {
        const cut = json.indexOf(',') + 1;
        lines.push(`data:${sp}${json.slice(0, cut)}`, `data:${sp}${json.slice(cut)}`);
      } else lines.push(`data:${sp}${json}`);
      let out = lines.join(eol) + eol + eol;
      if (rnd() < 0.15) out += pick([`data:${eol}${eol}`, `: keep-alive${eol}${eol}`, `event: ping${eol}${eol}`]);
      return out;
    };
    const scripts: Array<{ steps: Step[]; text: string }> = [];
    for (let k = 0; k < 30; k++) {
      const eol = pick(['\n', '\r\n', '\r']);
      const parts = Array.from({ length: 1 + Math.floor(rnd() * 6) }, () => pick(TEXT));
      const events = [JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }] }),
        ...parts.map((t) => JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { content: t }, finish_reason: null }] })),
        JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] })];
      let text = (rnd() < 0.2 ? '\uFEFF' : '') + events.map((e) => frame(e, eol)).join('');
      const end = pick(['done', 'done-unterminated', 'none']);
      if (end === 'done') text += `data: [DONE]${eol}${eol}`;
      if (end === 'done-unterminated') text += 'data: [DONE]';
      const b = Buffer.from(text);
      const steps: Step[] = [];
      for (let i = 0; i < b.length; ) {
        const n = 1 + Math.floor(rnd() * 40);
        steps.push(b.subarray(i, i + n), 0);
        i += n;
      }
      scripts.push({ steps, text: parts.join('') });
    }
    const { client } = await start({ p: (_b, n) => ({ steps: scripts[n - 1]!.steps }) }, [{ provider: 'p' }], { route: { retry: { maxAttempts: 1 } } });
    for (let k = 0; k < scripts.length; k++) {
      const r = await collect(client);
      expect({ k, ...r }).toMatchObject({ k, text: scripts[k]!.text, finish: 'stop', error: undefined });
    }
  }, 60_000);
});

describe('an upstream failure written as a malformed event, then [DONE], before the finish', () => {
  it('ends the stream with an error the SDK raises, not a clean end of the answer cut short', async () => {
    // A hand-rolled server's `except` branch: the exception's text as data, then its usual [DONE].
    const raw = cc([delta({ role: 'assistant', content: '' })]) + cc([delta({ content: 'par' })]) + 'data: Error: CUDA out of memory\n\n' + DONE;
    const { client } = await oneUp(() => ({ steps: [raw] }));
    const r = await collect(client);
    expect(r.text).toBe('par');
    expect(r.finish).toBeNull();
    expect(r.error).toBeInstanceOf(OpenAI.APIError);
    expect((r.error as InstanceType<typeof OpenAI.APIError>).code).toBe('stream_interrupted');
  });

  it('still ends cleanly when the malformed event came after the finish', async () => {
    const raw = body() + 'data: {"trailer":\n\n' + DONE;
    const { client } = await oneUp(() => ({ steps: [raw] }));
    expect(await collect(client)).toMatchObject({ text: TEXT.join(''), finish: 'stop', error: undefined });
  });

  it('is a cut streamRecovery finishes from the next target', async () => {
    const broken = cc([delta({ role: 'assistant', content: '' })]) + cc([delta({ content: 'Hello, ' })]) + 'data: Internal Server Error\n\n' + DONE;
    const { client, seen } = await recovering((_b, n) => (n === 1 ? { steps: [broken] } : streamed('Hello, world')));
    expect(await collect(client)).toMatchObject({ text: 'Hello, world', finish: 'stop', error: undefined });
    expect(seen).toHaveLength(2);
  });
});

describe('what a stream sends before its first output is bounded', () => {
  it('more than 32 MB of keepalives before any output is a broken stream, retried, not held in memory for the client', async () => {
    // Role chunks that carry no output, 1 MB each: all held (the head, forwarded with the first output) until then.
    const pad = cc([delta({ role: 'assistant', content: '' })], { x_pad: 'p'.repeat(1024 * 1024) });
    const flood: Step[] = [];
    for (let i = 0; i < 40; i++) flood.push(pad);
    const { client, seen } = await start({ p: (_b, n) => (n === 1 ? { steps: [...flood, cc([delta({ content: 'a' })]), cc([delta({}, 'stop')]), DONE] } : { steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'b' })]), cc([delta({}, 'stop')]), DONE] }) }, [{ provider: 'p' }], { provider: { timeouts: { connectMs: 1_000, firstTokenMs: 30_000, idleMs: 30_000 } } });
    expect(await collect(client)).toMatchObject({ text: 'b', finish: 'stop', error: undefined });
    expect(seen.p).toHaveLength(2);
  }, 60_000);
});

describe('an Anthropic stream whose message_delta could not be read, then message_stop', () => {
  it('translated for a chat client, ends with an error, not a finish_reason "stop" made up for it', async () => {
    // The message_delta cut mid-JSON (its stop_reason, max_tokens, lost), then message_stop.
    const all = [messageStart(), ...textDeltas(['Hel']).slice(0, 3), 'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"max_tok\n\n', aev('message_stop', {})].join('');
    const { client } = await claude(() => ({ steps: [all] }));
    const r = await collect(client);
    expect(r.text).toBe('Hel');
    expect(r.finish).toBeNull();
    expect((r.error as InstanceType<typeof OpenAI.APIError>).code).toBe('stream_interrupted');
  });

  it('a message_stop with no message_delta at all (a server that sends none) still stops cleanly', async () => {
    const all = [messageStart(), ...textDeltas(['Hel']), aev('message_stop', {})].join('');
    const { client } = await claude(() => ({ steps: [all] }));
    expect(await collect(client)).toMatchObject({ text: 'Hel', finish: 'stop', error: undefined });
  });
});
