// Third-party failure-scenario suite 39: an outside QA team's suite for LLM gateways, written from the README alone
// ("What the client sees", "Streaming", "Retries", "Failover and API families") and driven over real HTTP on 127.0.0.1
// with the official `openai` 6.x SDK, `@anthropic-ai/sdk` and raw sockets. The providers are the suite's own node:http
// servers (test/helpers/scripted-provider.ts), which play the exact bytes a fault needs.
// What it looks at, which the team's other suites did not:
//  1. The raw answer under retries, as `withResponse()` hands it over: x-stormgate-attempts, the request id the SDK
//     reports (the answering attempt's x-request-id, or Anthropic's request-id; never a failed attempt's, not even a
//     broken 200 stream's), the client's own x-request-id echoed and sent to every target as x-client-request-id, and
//     two concurrent calls that carry the same x-request-id (two requests; one leaving ends only its own upstream call).
//  2. Bytes on the wire: emoji and other multi-byte text cut mid-character between TCP writes of an Anthropic backup's
//     stream (LF, CRLF and CR line ends), a surrogate pair split between two JSON escapes in two events, tool_use
//     blocks whose partial_json is cut mid-escape, a gzip-encoded Anthropic stream, a gzip stream without its trailer;
//     HTTP/1.0 clients (no chunked framing) streaming through a retry, a stream pipelined ahead of a whole request;
//     request bodies uploaded one byte per chunk, or starting with a UTF-8 byte order mark.
//  3. A Responses API stream whose first attempt breaks after response.created, before any output: one stream, one
//     response.created, gap-free sequence numbers.
//  4. Header names and values in capitals from the provider; retry-after: 0 (and retry-after-ms: 0 beside a
//     retry-after) on a route that retries: no hint, the backoff or the next header decides, no retry-after: 0 sent on.
// Found here: no gateway bug. Noted for the maintainers: two requests that carry the same client x-request-id get
// that id as their reqId both (README: "the client's x-request-id when it sent a plausible one"), so their two log
// lines share it; a client that reuses ids (a trace id per user turn, say) makes "find the request by its id" ambiguous.
import { connect } from 'node:net';
import { once } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { gzipSync } from 'node:zlib';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { chatCompletion, useFakeProviders } from './helpers/fake-provider.ts';
import { configServedBy, requestLine, useStacks } from './helpers/stack.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';
import { completion, json, rev, baseResponse, msgItem, textDelta, responsesTail, streamed, type Answer, type Script, type Step } from './helpers/scripted-provider.ts';
import { sdkError } from './helpers/openai-error.ts';

const start = useScriptedUpstreams();
const startProvider = useFakeProviders();
const startStack = useStacks();

const CLAUDE = 'claude-sonnet-4-6';
const ask = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'hi' }] };

/** A provider's 503 carrying its own request id. */
const unavailable = (id: string, headers: Record<string, string> = {}): Script =>
  json(503, { error: { message: 'The server is overloaded', type: 'server_error', param: null, code: null } }, { 'x-request-id': id, ...headers });

/** A whole completion with the provider's request id. */
const answered = (text: string, id: string): Script => {
  const c = completion(text, 'gpt-4o-2024-08-06');
  return { ...c, headers: { ...c.headers, 'x-request-id': id } };
};

// --- Anthropic's stream, as its API frames it ---------------------------------------------------------------------

const ev = (type: string, fields: Record<string, unknown> = {}) => `event: ${type}\ndata: ${JSON.stringify({ type, ...fields })}\n\n`;
/** The events of a Claude text answer whose text comes in `parts`; each part's JSON is written as `raw` says. */
function claudeEvents(parts: string[], rawParts?: string[]): string {
  const deltas = rawParts
    ? rawParts.map((raw) => `event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"${raw}"}}\n\n`)
    : parts.map((text) => ev('content_block_delta', { index: 0, delta: { type: 'text_delta', text } }));
  return [
    ev('message_start', { message: { id: 'msg_s39', type: 'message', role: 'assistant', model: CLAUDE, content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 9, output_tokens: 1 } } }),
    ev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
    ...deltas,
    ev('content_block_stop', { index: 0 }),
    ev('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 12 } }),
    ev('message_stop'),
  ].join('');
}
/** Bytes cut every `size` bytes, each piece its own TCP write (a millisecond apart). */
function cutEvery(bytes: Buffer, size: number): Step[] {
  const steps: Step[] = [];
  for (let i = 0; i < bytes.length; i += size) steps.push(bytes.subarray(i, i + size), 1);
  return steps;
}
const claudeMessage = (text: string): Script =>
  json(200, { id: 'msg_s39', type: 'message', role: 'assistant', model: CLAUDE, content: [{ type: 'text', text }], stop_reason: 'end_turn', stop_sequence: null, usage: { input_tokens: 9, output_tokens: 3 } }, { 'request-id': 'req_claude_whole' });

/** A primary that is down (503 on every attempt), then a Claude backup answering with `claude`. */
async function toClaude(claude: Answer) {
  return start(
    { primary: (_b, n) => unavailable(`req_primary_${n}`), claude: { family: 'anthropic', answer: claude } },
    [{ provider: 'primary' }, { provider: 'claude', model: CLAUDE }],
  );
}

describe('the raw answer under retries, as withResponse() hands it over', () => {
  it("after a 503 and a retry: x-stormgate-attempts 2, the SDK's request_id the answering attempt's, the client's x-request-id echoed and sent on both attempts", async () => {
    const g = await start({ primary: (_b, n) => (n === 1 ? unavailable('req_first_503') : answered('second time lucky', 'req_second_ok')) }, [{ provider: 'primary' }]);
    const { data, response, request_id } = await g.client.chat.completions
      .create(ask, { headers: { 'x-request-id': 'qa39-trace-7f2c1d' } })
      .withResponse();
    expect(data.choices[0]!.message.content).toBe('second time lucky');
    expect(response.status).toBe(200);
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(response.headers.get('x-stormgate-fallback')).toBeNull();
    // the upstream's own id, untouched: only the answering attempt's, never joined with the failed one's
    expect(response.headers.get('x-request-id')).toBe('req_second_ok');
    expect(request_id).toBe('req_second_ok');
    expect(response.headers.get('x-stormgate-request-id')).toBe('qa39-trace-7f2c1d');
    expect(g.seen.primary).toHaveLength(2);
    for (const s of g.seen.primary!) expect(s.headers['x-client-request-id']).toBe('qa39-trace-7f2c1d');
  });

  it("an answering attempt that sends no x-request-id: the failed attempt's id is not handed over as the answer's", async () => {
    const g = await start({ primary: (_b, n) => (n === 1 ? unavailable('req_failed_attempt') : completion('no id on this one', 'gpt-4o')) }, [{ provider: 'primary' }]);
    const { data, response, request_id } = await g.client.chat.completions.create(ask).withResponse();
    expect(data.choices[0]!.message.content).toBe('no id on this one');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(request_id).not.toBe('req_failed_attempt');
    expect(response.headers.get('x-request-id') ?? '').not.toContain('req_failed_attempt');
  });

  it('a stream after a 503: the same headers on the event stream, and the request_id of the attempt that streamed', async () => {
    const g = await start(
      {
        primary: (_b, n) => {
          if (n === 1) return unavailable('req_first_503');
          const s = streamed('streamed after a retry');
          return { ...s, headers: { 'content-type': 'text/event-stream', 'x-request-id': 'req_stream_ok' } };
        },
      },
      [{ provider: 'primary' }],
    );
    const { data: stream, response, request_id } = await g.client.chat.completions.create({ ...ask, stream: true }).withResponse();
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text).toBe('streamed after a retry');
    expect(response.headers.get('content-type')).toMatch(/^text\/event-stream/);
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(request_id).toBe('req_stream_ok');
    expect(response.headers.get('x-stormgate-request-id')).toMatch(/\S/);
  });

  it("a 200 stream that broke before its first output, then a retry: the request id and headers are the retry's, not the broken 200's", async () => {
    const g = await start(
      {
        primary: (_b, n): Script => {
          if (n === 1)
            return {
              headers: { 'content-type': 'text/event-stream', 'x-request-id': 'req_broken_200', 'openai-processing-ms': '1' },
              steps: [`data: ${JSON.stringify({ id: 'chatcmpl-broken', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }] })}\n\n`, 20, { destroy: true }],
            };
          const st = streamed('from the retry');
          return { ...st, headers: { 'content-type': 'text/event-stream', 'x-request-id': 'req_retry_200' } };
        },
      },
      [{ provider: 'primary' }],
    );
    const { data: stream, response, request_id } = await g.client.chat.completions.create({ ...ask, stream: true }).withResponse();
    const ids = new Set<string>();
    let text = '';
    for await (const chunk of stream) {
      ids.add(chunk.id);
      text += chunk.choices[0]?.delta?.content ?? '';
    }
    expect(text).toBe('from the retry');
    expect(ids.has('chatcmpl-broken')).toBe(false);
    expect(request_id).toBe('req_retry_200');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(g.seen.primary).toHaveLength(2);
  });

  it("when every attempt fails, the SDK's error names the last attempt's request id and the attempts", async () => {
    const g = await start({ primary: (_b, n) => unavailable(`req_503_${n}`) }, [{ provider: 'primary' }]);
    const err = await sdkError(g.client.chat.completions.create(ask));
    expect(err.status).toBe(503);
    expect(err.requestID).toBe('req_503_2');
    expect(err.headers?.get('x-stormgate-attempts')).toBe('2');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(g.seen.primary).toHaveLength(2);
  });

  it("failed over to Claude: the openai SDK's request_id is Anthropic's request-id, attempts count both targets, the fallback says why", async () => {
    const g = await toClaude(() => claudeMessage('hello from the backup'));
    const { data, response, request_id } = await g.client.chat.completions.create(ask).withResponse();
    expect(data.choices[0]!.message.content).toBe('hello from the backup');
    expect(request_id).toBe('req_claude_whole');
    expect(response.headers.get('x-stormgate-attempts')).toBe('3');
    expect(response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(response.headers.get('x-stormgate-target')).toBe(`claude/${CLAUDE}`);
    expect(g.seen.primary).toHaveLength(2);
    expect(g.seen.claude).toHaveLength(1);
  });

  it("failed over to Claude, the client's x-request-id goes to both targets as x-client-request-id and is echoed; Claude's answer without a request-id does not carry the primary's", async () => {
    const g = await toClaude(() => {
      const m = claudeMessage('no request-id here');
      return { ...m, headers: { 'content-type': 'application/json' } };
    });
    const { data, response, request_id } = await g.client.chat.completions.create(ask, { headers: { 'x-request-id': 'qa39-failover-trace-01' } }).withResponse();
    expect(data.choices[0]!.message.content).toBe('no request-id here');
    expect(response.headers.get('x-stormgate-request-id')).toBe('qa39-failover-trace-01');
    expect(request_id ?? '').not.toMatch(/req_primary_/);
    for (const seen of [...g.seen.primary!, ...g.seen.claude!]) expect(seen.headers['x-client-request-id']).toBe('qa39-failover-trace-01');
  });

  it("the Anthropic SDK on /v1/messages after a 529: withResponse() gives the answering attempt's request-id and attempts 2", async () => {
    const overloaded = (n: number) => json(529, { type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } }, { 'request-id': `req_529_${n}` });
    const g = await start({ claude: { family: 'anthropic', answer: (_b, n) => (n === 1 ? overloaded(n) : claudeMessage('after the overload')) } }, [{ provider: 'claude' }], {
      path: '/v1/messages',
    });
    const anthropic = new Anthropic({ baseURL: g.s.url, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0 });
    const { data, response, request_id } = await anthropic.messages
      .create({ model: CLAUDE, max_tokens: 64, messages: [{ role: 'user', content: 'hi' }] })
      .withResponse();
    expect(data.content).toEqual([{ type: 'text', text: 'after the overload' }]);
    expect(request_id).toBe('req_claude_whole');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(g.seen.claude).toHaveLength(2);
  });

  it('two concurrent identical calls with the same x-request-id are two requests: each its own answer, both echo the id', async () => {
    const g = await start(
      {
        primary: (_b, n) => {
          const c = answered(`answer ${n}`, `req_${n}`);
          return { ...c, steps: [300, ...c.steps] };
        },
      },
      [{ provider: 'primary' }],
    );
    const call = () => g.client.chat.completions.create(ask, { headers: { 'x-request-id': 'qa39-same-id-0001' } }).withResponse();
    const [a, b] = await Promise.all([call(), call()]);
    expect(new Set([a.data.choices[0]!.message.content, b.data.choices[0]!.message.content])).toEqual(new Set(['answer 1', 'answer 2']));
    expect(new Set([a.request_id, b.request_id])).toEqual(new Set(['req_1', 'req_2']));
    for (const r of [a, b]) {
      expect(r.response.headers.get('x-stormgate-request-id')).toBe('qa39-same-id-0001');
      expect(r.response.headers.get('x-stormgate-attempts')).toBe('1');
    }
    expect(g.seen.primary).toHaveLength(2);
  });
});

describe('bytes on the wire', () => {
  const TEXT = 'naïve café — 日本語のテキスト 👩‍💻🎉🇯🇵 done';

  it.each([
    ['LF', '\n'],
    ['CRLF', '\r\n'],
    ['CR', '\r'],
  ])("an Anthropic backup's stream (%s line ends) cut every 3 bytes, mid-character and mid-emoji: the openai SDK gets the text exactly", async (_name, eol) => {
    const parts = ['naïve café — ', '日本語のテキスト ', '👩‍💻🎉🇯🇵', ' done'];
    expect(parts.join('')).toBe(TEXT);
    const events = claudeEvents(parts).replaceAll('\n', eol);
    const g = await toClaude(() => ({ headers: { 'content-type': 'text/event-stream', 'request-id': 'req_claude_stream' }, steps: cutEvery(Buffer.from(events), 3) }));
    const { data: stream, response } = await g.client.chat.completions.create({ ...ask, stream: true, stream_options: { include_usage: true } }).withResponse();
    let text = '';
    let usage: OpenAI.CompletionUsage | undefined | null;
    let finish: string | null | undefined;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
      if (chunk.usage) usage = chunk.usage;
    }
    expect(text).toBe(TEXT);
    expect(text).not.toContain('\uFFFD');
    expect(finish).toBe('stop');
    expect(usage?.completion_tokens).toBe(12);
    expect(response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(response.headers.get('x-request-id')).toBe('req_claude_stream');
    expect(response.headers.get('x-stormgate-attempts')).toBe('3');
  });

  it("Claude's overloaded_error event after message_start and a ping, before any text: retried on Claude, one coherent stream from the retry", async () => {
    const broken = [
      ev('message_start', { message: { id: 'msg_broken', type: 'message', role: 'assistant', model: CLAUDE, content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 9, output_tokens: 1 } } }),
      ev('ping'),
      ev('error', { error: { type: 'overloaded_error', message: 'Overloaded' } }),
    ].join('');
    const g = await toClaude((_b, n) => ({ headers: { 'content-type': 'text/event-stream' }, steps: n === 1 ? [broken] : cutEvery(Buffer.from(claudeEvents(['the ', 'retry ', 'speaks 🗣'])), 7) }));
    const { data: stream, response } = await g.client.chat.completions.create({ ...ask, stream: true }).withResponse();
    let text = '';
    let roles = 0;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? '';
      if (chunk.choices[0]?.delta?.role) roles++;
    }
    expect(text).toBe('the retry speaks 🗣');
    expect(roles).toBe(1);
    expect(response.headers.get('x-stormgate-attempts')).toBe('4');
    expect(g.seen.claude).toHaveLength(2);
  });

  it('a surrogate pair split between two JSON escapes in two events (\\ud83d | \\ude80) arrives as the one emoji', async () => {
    const g = await toClaude(() => ({
      headers: { 'content-type': 'text/event-stream' },
      steps: [claudeEvents([], ['lift-off ', '\\ud83d', '\\ude80', ' ok'])],
    }));
    const stream = await g.client.chat.completions.create({ ...ask, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text).toBe('lift-off 🚀 ok');
  });

  it("a gzip-encoded Anthropic stream, its compressed bytes in pieces: decoded, translated, and the client's stream not encoded", async () => {
    const zipped = gzipSync(Buffer.from(claudeEvents(['compressed ', 'and ', 'translated ✓'])));
    const g = await toClaude(() => ({ headers: { 'content-type': 'text/event-stream', 'content-encoding': 'gzip' }, steps: cutEvery(zipped, 17) }));
    const { data: stream, response } = await g.client.chat.completions.create({ ...ask, stream: true }).withResponse();
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text).toBe('compressed and translated ✓');
    expect(response.headers.get('content-encoding')).toBeNull();
  });

  it('a gzip chat stream whose gzip trailer never comes (the proxy closed after [DONE]): the client has its whole answer and a clean end', async () => {
    const plain = Buffer.from(streamed('all of it arrived').steps.join(''));
    const zipped = gzipSync(plain);
    const g = await start({ primary: () => ({ headers: { 'content-type': 'text/event-stream', 'content-encoding': 'gzip' }, steps: cutEvery(zipped.subarray(0, zipped.length - 8), 11) }) }, [{ provider: 'primary' }]);
    const res = await fetch(`${g.s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...ask, stream: true }) });
    expect(res.status).toBe(200);
    const body = await res.text();
    expect(body).not.toContain('"error"');
    expect(body.trimEnd().endsWith('data: [DONE]')).toBe(true);
    const text = body
      .split('\n\n')
      .filter((e) => e.startsWith('data: {'))
      .map((e) => (JSON.parse(e.slice(6)) as OpenAI.ChatCompletionChunk).choices[0]?.delta?.content ?? '')
      .join('');
    expect(text).toBe('all of it arrived');
    expect(g.seen.primary).toHaveLength(1);
    const line = await requestLine(g.s);
    expect(line).toMatchObject({ outcome: 'success', streamEnd: 'complete', status: 200 });
  });

  it.each([['no connection header', ''], ['connection: keep-alive', 'Connection: keep-alive\r\n']])('an HTTP/1.0 client (%s) streaming through a retry: the events unframed (no chunked), the end marked by the close', async (_what, connection) => {
    const g = await start({ primary: (_b, n) => (n === 1 ? unavailable('req_1') : streamed('old clients welcome')) }, [{ provider: 'primary' }]);
    const body = JSON.stringify({ ...ask, stream: true });
    const port = Number(new URL(g.s.url).port);
    const sock = connect(port, '127.0.0.1');
    await once(sock, 'connect');
    const chunks: Buffer[] = [];
    sock.on('data', (d: Buffer) => chunks.push(d));
    sock.write(`POST /v1/chat/completions HTTP/1.0\r\nHost: 127.0.0.1:${port}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n${connection}\r\n${body}`);
    await Promise.race([once(sock, 'close'), new Promise((_r, reject) => setTimeout(() => reject(new Error('the gateway never closed the HTTP/1.0 stream')), 10_000))]);
    const raw = Buffer.concat(chunks).toString('utf8');
    const [head, ...rest] = raw.split('\r\n\r\n');
    const payload = rest.join('\r\n\r\n');
    expect(head).toMatch(/^HTTP\/1\.[01] 200 /);
    expect(head!.toLowerCase()).not.toContain('transfer-encoding');
    expect(head!.toLowerCase()).toMatch(/\r\nx-stormgate-attempts: 2(\r\n|$)/);
    expect(head!.toLowerCase()).toMatch(/\r\ncontent-type: text\/event-stream/);
    const events = payload.split('\n\n').filter((e) => e.startsWith('data: '));
    expect(events.at(-1)).toBe('data: [DONE]');
    const text = events
      .slice(0, -1)
      .map((e) => JSON.parse(e.slice(6)) as OpenAI.ChatCompletionChunk)
      .map((c) => c.choices[0]?.delta?.content ?? '')
      .join('');
    expect(text).toBe('old clients welcome');
    expect(g.seen.primary).toHaveLength(2);
  });

  it('a stream pipelined ahead of a whole request on one socket: the stream (retried first) ends before the second answer starts', async () => {
    let streams = 0;
    const g = await start(
      {
        primary: (body) => {
          if (body.stream !== true) return answered('second in line', 'req_whole');
          streams++;
          if (streams === 1) return unavailable('req_stream_503');
          return { steps: streamed('first in line, slowly').steps.flatMap((st) => [st, 40]) };
        },
      },
      [{ provider: 'primary' }],
    );
    const port = Number(new URL(g.s.url).port);
    const req = (body: string, last: boolean) =>
      `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n${last ? 'Connection: close\r\n' : ''}\r\n${body}`;
    const sock = connect(port, '127.0.0.1');
    await once(sock, 'connect');
    const chunks: Buffer[] = [];
    sock.on('data', (d: Buffer) => chunks.push(d));
    sock.write(req(JSON.stringify({ ...ask, stream: true }), false) + req(JSON.stringify(ask), true));
    await Promise.race([once(sock, 'close'), new Promise((_r, reject) => setTimeout(() => reject(new Error('no close')), 10_000))]);
    const raw = Buffer.concat(chunks).toString('utf8');
    const heads = [...raw.matchAll(/HTTP\/1\.1 (\d{3}) /g)];
    expect(heads.map((m) => m[1])).toEqual(['200', '200']);
    const done = raw.indexOf('data: [DONE]');
    expect(done).toBeGreaterThan(heads[0]!.index);
    expect(done).toBeLessThan(heads[1]!.index);
    expect(raw.slice(heads[0]!.index, heads[1]!.index)).toMatch(/text\/event-stream/);
    expect(raw.slice(heads[1]!.index)).toContain('second in line');
    expect(raw.slice(heads[1]!.index)).not.toContain('data: ');
    expect(streams).toBe(2);
  });

  it('an HTTP/1.0 client asking for a whole answer gets it with its content-length, then the close', async () => {
    const g = await start({ primary: () => answered('whole, for HTTP/1.0', 'req_whole') }, [{ provider: 'primary' }]);
    const body = JSON.stringify(ask);
    const port = Number(new URL(g.s.url).port);
    const sock = connect(port, '127.0.0.1');
    await once(sock, 'connect');
    const chunks: Buffer[] = [];
    sock.on('data', (d: Buffer) => chunks.push(d));
    sock.write(`POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    await Promise.race([once(sock, 'close'), new Promise((_r, reject) => setTimeout(() => reject(new Error('no close')), 10_000))]);
    const raw = Buffer.concat(chunks);
    const split = raw.indexOf('\r\n\r\n');
    const head = raw.subarray(0, split).toString('latin1').toLowerCase();
    const payload = raw.subarray(split + 4);
    expect(head).toMatch(/^http\/1\.[01] 200 /);
    expect(head).not.toContain('transfer-encoding');
    expect(Number(/\r\ncontent-length: (\d+)/.exec(head)?.[1])).toBe(payload.length);
    expect((JSON.parse(payload.toString('utf8')) as OpenAI.ChatCompletion).choices[0]!.message.content).toBe('whole, for HTTP/1.0');
  });
});

describe('tool calls streamed from the Anthropic backup, cut on the wire', () => {
  it('a text block then two tool_use blocks, their partial_json cut mid-escape and the bytes every 5: indices 0 and 1, the ids once, arguments whole JSON', async () => {
    const weatherArgs = '{"city": "Z\\u00fcrich \\"Altstadt\\" 🏔", "unit": "c"}';
    const timeArgs = '{"tz": "Asia/Tōkyō"}';
    const pieces = (text: string, size: number) => Array.from({ length: Math.ceil(text.length / size) }, (_v, i) => text.slice(i * size, (i + 1) * size));
    const toolBlock = (index: number, id: string, name: string, args: string) => [
      ev('content_block_start', { index, content_block: { type: 'tool_use', id, name, input: {} } }),
      ...pieces(args, 3).map((partial_json) => ev('content_block_delta', { index, delta: { type: 'input_json_delta', partial_json } })),
      ev('content_block_stop', { index }),
    ];
    const events = [
      ev('message_start', { message: { id: 'msg_tools', type: 'message', role: 'assistant', model: CLAUDE, content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 40, output_tokens: 1 } } }),
      ev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
      ev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Checking ' } }),
      ev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'both.' } }),
      ev('content_block_stop', { index: 0 }),
      ...toolBlock(1, 'toolu_01Weather', 'get_weather', weatherArgs),
      ...toolBlock(2, 'toolu_02Time', 'get_time', timeArgs),
      ev('message_delta', { delta: { stop_reason: 'tool_use', stop_sequence: null }, usage: { output_tokens: 50 } }),
      ev('message_stop'),
    ].join('');
    const g = await toClaude(() => ({ headers: { 'content-type': 'text/event-stream' }, steps: cutEvery(Buffer.from(events), 5) }));
    const fn = (name: string) => ({ type: 'function' as const, function: { name, parameters: { type: 'object', properties: {} } } });
    const stream = await g.client.chat.completions.create({ ...ask, stream: true, tools: [fn('get_weather'), fn('get_time')] });
    const calls = new Map<number, { ids: string[]; name: string; args: string }>();
    let text = '';
    let finish: string | null | undefined;
    for await (const chunk of stream) {
      const choice = chunk.choices[0];
      if (!choice) continue;
      text += choice.delta.content ?? '';
      finish = choice.finish_reason ?? finish;
      for (const tc of choice.delta.tool_calls ?? []) {
        const c = calls.get(tc.index) ?? { ids: [], name: '', args: '' };
        if (tc.id) c.ids.push(tc.id);
        c.name += tc.function?.name ?? '';
        c.args += tc.function?.arguments ?? '';
        calls.set(tc.index, c);
      }
    }
    expect(text).toBe('Checking both.');
    expect(finish).toBe('tool_calls');
    expect([...calls.keys()].sort()).toEqual([0, 1]);
    expect(calls.get(0)).toMatchObject({ ids: ['toolu_01Weather'], name: 'get_weather' });
    expect(calls.get(1)).toMatchObject({ ids: ['toolu_02Time'], name: 'get_time' });
    expect(JSON.parse(calls.get(0)!.args)).toEqual({ city: 'Zürich "Altstadt" 🏔', unit: 'c' });
    expect(JSON.parse(calls.get(1)!.args)).toEqual({ tz: 'Asia/Tōkyō' });
    // the tools went to Claude in its own shape
    expect((g.seen.claude![0]!.body.tools as Array<{ name: string }>).map((t) => t.name)).toEqual(['get_weather', 'get_time']);
  });
});

describe('request bodies cut on the wire', () => {
  it('a chunked upload one byte per chunk (emoji cut mid-character, a lone surrogate escape): both attempts get the same text', async () => {
    const content = 'emoji 🎉, accents é, CJK 漢字, a lone \ud83d and the end';
    const g = await start({ primary: (_b, n) => (n === 1 ? unavailable('req_1') : answered('got it', 'req_2')) }, [{ provider: 'primary' }]);
    const bytes = Buffer.from(JSON.stringify({ ...ask, messages: [{ role: 'user', content }] }));
    expect(bytes.toString()).toContain('\\ud83d'); // JSON.stringify writes the lone surrogate as an escape
    const port = Number(new URL(g.s.url).port);
    const sock = connect(port, '127.0.0.1');
    sock.setNoDelay(true);
    await once(sock, 'connect');
    const got: Buffer[] = [];
    sock.on('data', (d: Buffer) => got.push(d));
    sock.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n`);
    for (let i = 0; i < bytes.length; i++) {
      sock.write(Buffer.concat([Buffer.from('1\r\n'), bytes.subarray(i, i + 1), Buffer.from('\r\n')]));
      if (i % 16 === 0) await new Promise((r) => setImmediate(r));
    }
    sock.write('0\r\n\r\n');
    await Promise.race([once(sock, 'close'), new Promise((_r, reject) => setTimeout(() => reject(new Error('no answer')), 10_000))]);
    const raw = Buffer.concat(got).toString('utf8');
    expect(raw).toMatch(/^HTTP\/1\.1 200 /);
    expect(raw).toContain('got it');
    expect(g.seen.primary).toHaveLength(2);
    for (const s of g.seen.primary!) expect((s.body.messages as Array<{ content: string }>)[0]!.content).toBe(content);
  });

  it('a body that starts with a UTF-8 byte order mark (PowerShell 5, Notepad files sent with curl -d @file): answered, the provider gets JSON it parses', async () => {
    const g = await start({ primary: () => answered('BOM or not', 'req_bom') }, [{ provider: 'primary' }]);
    const body = Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(JSON.stringify({ ...ask, messages: [{ role: 'user', content: 'from a file 📄' }] }))]);
    const res = await fetch(`${g.s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
    expect(res.status).toBe(200);
    expect(((await res.json()) as OpenAI.ChatCompletion).choices[0]!.message.content).toBe('BOM or not');
    // the scripted provider JSON.parse()s what it got: a BOM passed on would have thrown there
    expect((g.seen.primary![0]!.body.messages as Array<{ content: string }>)[0]!.content).toBe('from a file 📄');
  });
});

describe('two concurrent calls with the same x-request-id, one of which leaves', () => {
  it('the one that leaves ends its own upstream request only; the other is answered, and each gets its own log line', async () => {
    const upstream: Array<{ aborted: boolean; done: boolean }> = [];
    const p = await startProvider((req, res) => {
      const me = { aborted: false, done: false };
      upstream.push(me);
      req.resume();
      res.on('close', () => {
        if (!res.writableFinished) me.aborted = true;
      });
      setTimeout(() => {
        if (res.destroyed) return;
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(chatCompletion(`answer ${upstream.indexOf(me) + 1}`));
        me.done = true;
      }, 800);
    });
    const s = await startStack({ config: (mockUrl) => configServedBy(mockUrl, 'p', `${p.origin}/v1`) });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0 });
    const id = 'qa39-shared-id-0002';
    const leaving = new AbortController();
    const a = client.chat.completions.create(ask, { headers: { 'x-request-id': id }, signal: leaving.signal }).then(
      () => 'answered',
      (e: unknown) => e,
    );
    const b = client.chat.completions.create(ask, { headers: { 'x-request-id': id } });
    for (const until = Date.now() + 5_000; upstream.length < 2 && Date.now() < until; ) await sleep(10);
    expect(upstream).toHaveLength(2);
    leaving.abort();
    expect(await a).toBeInstanceOf(OpenAI.APIUserAbortError);
    const answer = await b;
    expect(answer.choices[0]!.message.content).toMatch(/^answer [12]$/);
    for (const until = Date.now() + 2_000; upstream.filter((u) => u.aborted).length < 1 && Date.now() < until; ) await sleep(10);
    expect(upstream.filter((u) => u.aborted)).toHaveLength(1);
    expect(upstream.filter((u) => u.done)).toHaveLength(1);
    let lines: Array<Record<string, unknown>> = [];
    for (const until = Date.now() + 2_000; lines.length < 2 && Date.now() < until; await sleep(10))
      lines = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.route === 'chat' && l.reqId === id);
    expect(lines).toHaveLength(2);
    expect(lines.filter((l) => l.clientGone === true)).toHaveLength(1);
    expect(lines.filter((l) => l.status === 200)).toHaveLength(1);
  });
});

describe('a Responses API stream through a retry', () => {
  it('broken after response.created, before any output: the client sees one stream, one response.created, sequence numbers 0, 1, 2, ... with no gap', async () => {
    const created = (id: string) => rev('response.created', { response: { ...baseResponse('in_progress'), id } }, 0);
    const inProgress = (id: string) => rev('response.in_progress', { response: { ...baseResponse('in_progress'), id } }, 1);
    const responses: Answer = (_b, n) =>
      n === 1
        ? { steps: [created('resp_first'), inProgress('resp_first'), rev('error', { code: 'server_error', message: 'The server had an error', param: null }, 2)] }
        : {
            steps: [
              created('resp_second'),
              inProgress('resp_second'),
              rev('response.output_item.added', { output_index: 0, item: msgItem('', 'in_progress') }, 2),
              rev('response.content_part.added', { item_id: 'msg_1', output_index: 0, content_index: 0, part: { type: 'output_text', text: '', annotations: [] } }, 3),
              textDelta('second ', 4),
              textDelta('attempt', 5),
              ...responsesTail('second attempt', 6),
            ],
          };
    const g = await start({ primary: responses }, [{ provider: 'primary' }], { path: '/v1/responses' });
    const stream = await g.client.responses.create({ model: 'gpt-4.1', input: 'hi', stream: true });
    const types: string[] = [];
    const seqs: number[] = [];
    let createdId: string | undefined;
    let text = '';
    for await (const e of stream) {
      types.push(e.type);
      seqs.push(e.sequence_number);
      if (e.type === 'response.created') createdId = e.response.id;
      if (e.type === 'response.output_text.delta') text += e.delta;
    }
    expect(types.filter((t) => t === 'response.created')).toHaveLength(1);
    expect(types).not.toContain('error');
    expect(types.at(-1)).toBe('response.completed');
    expect(seqs).toEqual(seqs.map((_s, i) => i));
    expect(createdId).toBe('resp_second');
    expect(text).toBe('second attempt');
    expect(g.seen.primary).toHaveLength(2);
  });
});

describe('header names and values in odd case from the provider', () => {
  it('RETRY-AFTER: 1 on a 429 is waited out; X-Request-ID and a CONTENT-TYPE in capitals on the answer are read as theirs', async () => {
    const at: number[] = [];
    const g = await start(
      {
        primary: (_b, n): Script => {
          at.push(Date.now());
          if (n === 1) return { status: 429, headers: { 'CONTENT-TYPE': 'APPLICATION/JSON', 'RETRY-AFTER': '1', 'X-REQUEST-ID': 'Req_Limited' }, steps: [JSON.stringify({ error: { message: 'Rate limit reached', type: 'requests', param: null, code: 'rate_limit_exceeded' } })] };
          const c = completion('mixed case is fine', 'gpt-4o');
          return { ...c, headers: { 'Content-Type': 'Application/JSON; Charset=UTF-8', 'X-Request-ID': 'Req_MixedCase' } };
        },
      },
      [{ provider: 'primary' }],
      { route: { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 20, capMs: 20 } } } },
    );
    const { data, response, request_id } = await g.client.chat.completions.create(ask).withResponse();
    expect(data.choices[0]!.message.content).toBe('mixed case is fine');
    expect(at[1]! - at[0]!).toBeGreaterThanOrEqual(950);
    expect(request_id).toBe('Req_MixedCase');
    expect(response.headers.get('content-type')).toMatch(/^application\/json/i);
  });

  it('a stream labelled TEXT/EVENT-STREAM; CHARSET=UTF-8 is a stream: passed through, not a failed attempt', async () => {
    const g = await start(
      {
        primary: () => {
          const st = streamed('shouted content-type');
          return { ...st, headers: { 'CONTENT-TYPE': 'TEXT/EVENT-STREAM; CHARSET=UTF-8' } };
        },
      },
      [{ provider: 'primary' }],
    );
    const { data: stream, response } = await g.client.chat.completions.create({ ...ask, stream: true }).withResponse();
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text).toBe('shouted content-type');
    expect(response.headers.get('x-stormgate-attempts')).toBe('1');
    expect(g.seen.primary).toHaveLength(1);
  });
});

describe('retry-after: 0 on a route that retries', () => {
  const limited = (n: number) => json(429, { error: { message: 'Rate limit reached', type: 'requests', param: null, code: 'rate_limit_exceeded' } }, { 'retry-after': '0', 'x-request-id': `req_429_${n}` });

  it('is no hint: the retry waits the backoff (fixed 300 ms), not zero, and is answered', async () => {
    const at: number[] = [];
    const g = await start(
      {
        primary: (_b, n) => {
          at.push(Date.now());
          return n === 1 ? limited(n) : answered('after the backoff', 'req_ok');
        },
      },
      [{ provider: 'primary' }],
      { route: { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 300, capMs: 300 } } } },
    );
    const { data, response } = await g.client.chat.completions.create(ask).withResponse();
    expect(data.choices[0]!.message.content).toBe('after the backoff');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(at[1]! - at[0]!).toBeGreaterThanOrEqual(280);
  });

  it('retry-after-ms: 0 beside retry-after: 1: the zero is no hint, the next header decides (waited 1 to 1.2 s, not the 20 ms backoff)', async () => {
    const at: number[] = [];
    const g = await start(
      {
        primary: (_b, n) => {
          at.push(Date.now());
          if (n > 1) return answered('after a second', 'req_ok');
          const l = limited(n);
          return { ...l, headers: { ...l.headers, 'retry-after-ms': '0', 'retry-after': '1' } };
        },
      },
      [{ provider: 'primary' }],
      { route: { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 20, capMs: 20 } } } },
    );
    const r = await g.client.chat.completions.create(ask);
    expect(r.choices[0]!.message.content).toBe('after a second');
    expect(at[1]! - at[0]!).toBeGreaterThanOrEqual(950);
    expect(at[1]! - at[0]!).toBeLessThan(5_000);
  });

  it('when every attempt gets it: the 429 reaches the SDK without retry-after: 0, x-should-retry false, and the SDK does not send it again', async () => {
    const g = await start({ primary: (_b, n) => limited(n) }, [{ provider: 'primary' }]);
    let sent = 0;
    const client = new OpenAI({
      baseURL: g.s.baseURL,
      apiKey: 'sk-client-not-a-provider-key',
      maxRetries: 2,
      fetch: async (url, init) => {
        sent++;
        return fetch(url, init);
      },
    });
    const err = await sdkError(client.chat.completions.create(ask));
    expect(err.status).toBe(429);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.headers?.get('retry-after')).not.toBe('0');
    expect(err.headers?.get('retry-after-ms')).not.toBe('0');
    expect(sent).toBe(1);
    expect(g.seen.primary).toHaveLength(2);
  });
});
