// Adversarial review of the HTTP front door (2026-12-06): what a hostile or careless client does to the connection
// itself (pipelining, bytes after its last request), over raw sockets.
import { connect } from 'node:net';
import { describe, expect, it } from 'vitest';
import { chatCompletion, useFakeProviders } from './helpers/fake-provider.ts';
import { configFor } from './helpers/one-provider.ts';
import { parseAnswer, type RawAnswer } from './helpers/raw-http.ts';
import { useStacks } from './helpers/stack.ts';

const startStack = useStacks();
const startProvider = useFakeProviders();

const BODY = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });

/** A chat request as written, with `extra` headers. */
function chat(extra: Record<string, string> = {}): string {
  const head = { host: '127.0.0.1', 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(BODY)), ...extra };
  return `POST /v1/chat/completions HTTP/1.1\r\n${Object.entries(head).map(([k, v]) => `${k}: ${v}\r\n`).join('')}\r\n${BODY}`;
}

/** Writes `bytes` on a connection of its own and reads until the gateway closes it (or `waitMs` pass): every answer on it, in order. */
function answersTo(url: string, bytes: string, waitMs = 8_000): Promise<{ answers: RawAnswer[]; closed: boolean }> {
  const { port } = new URL(url);
  return new Promise((resolve) => {
    const socket = connect(Number(port), '127.0.0.1');
    let text = '';
    let closed = false;
    socket.on('data', (d: Buffer) => (text += d.toString('latin1')));
    socket.on('error', () => undefined);
    const timer = setTimeout(() => socket.destroy(), waitMs);
    socket.on('close', () => {
      clearTimeout(timer);
      closed = true;
      const answers: RawAnswer[] = [];
      for (let rest = text; rest.startsWith('HTTP/1.1 '); ) {
        const answer = parseAnswer(rest, true)!;
        answers.push(answer);
        const next = rest.indexOf('HTTP/1.1 ', rest.indexOf('\r\n\r\n') + 4 + Buffer.byteLength(answer.body));
        if (next < 0) break;
        rest = rest.slice(next);
      }
      resolve({ answers, closed });
    });
    socket.write(bytes);
  });
}

describe('a malformed request on a connection whose earlier request is still being answered', () => {
  // Node hands the parse error to clientErrorHandler while the earlier request waits on its provider: answered on the
  // raw socket there, its 400 went out first, so the client read it as the earlier request's answer (a request it
  // would not retry: x-should-retry false), though that request had gone upstream and been billed; its real answer
  // was then written into a closed connection.
  it('does not take the place of that request\'s answer: the provider\'s answer comes, then the connection closes', async () => {
    const provider = await startProvider((req, res) => {
      req.resume();
      setTimeout(() => res.writeHead(200, { 'content-type': 'application/json' }).end(chatCompletion('billed')), 200);
    });
    const stack = await startStack({ config: configFor(provider.origin, {}) });
    const { answers, closed } = await answersTo(stack.url, `${chat()}GARBAGE\r\n\r\n`);
    expect(provider.hits()).toBe(1);
    expect(answers.map((a) => a.status)).toEqual([200]);
    expect(JSON.parse(answers[0]!.body).choices[0].message.content).toBe('billed');
    expect(closed).toBe(true);
  });

  it('lets every request pipelined before it have its own answer, in order', async () => {
    let n = 0;
    const provider = await startProvider((req, res) => {
      req.resume();
      const content = `answer ${++n}`;
      setTimeout(() => res.writeHead(200, { 'content-type': 'application/json' }).end(chatCompletion(content)), 100);
    });
    const stack = await startStack({ config: configFor(provider.origin, {}) });
    const { answers } = await answersTo(stack.url, `${chat()}${chat()}GARBAGE\r\n\r\n`);
    expect(answers.map((a) => a.status)).toEqual([200, 200]);
    expect(answers.map((a) => JSON.parse(a.body).choices[0].message.content)).toEqual(['answer 1', 'answer 2']);
  });

  it('after a request that asked `connection: close`: its bytes are ignored and the request is answered (was 400 HPE_CLOSED_CONNECTION)', async () => {
    const provider = await startProvider((req, res) => {
      req.resume();
      setTimeout(() => res.writeHead(200, { 'content-type': 'application/json' }).end(chatCompletion('billed')), 100);
    });
    const stack = await startStack({ config: configFor(provider.origin, {}) });
    const { answers, closed } = await answersTo(stack.url, `${chat({ connection: 'close' })}GARBAGE\r\n\r\n`);
    expect(answers.map((a) => a.status)).toEqual([200]);
    expect(closed).toBe(true);
  });

  it('is still answered 400 in the OpenAI shape when it is the only request on its connection', async () => {
    const stack = await startStack();
    const { answers, closed } = await answersTo(stack.url, 'GARBAGE\r\n\r\n');
    expect(answers.map((a) => a.status)).toEqual([400]);
    expect(JSON.parse(answers[0]!.body).error.code).toBe('bad_request');
    expect(closed).toBe(true);
  });
});

describe('a malformed request pipelined behind a stream being answered', () => {
  it('does not cut the stream: it runs to [DONE], then the connection closes', async () => {
    const provider = await startProvider((req, res) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const chunk = (content: string, finish: string | null) =>
        `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta: { content }, finish_reason: finish }] })}\n\n`;
      res.write(chunk('one ', null));
      setTimeout(() => res.end(`${chunk('two', 'stop')}data: [DONE]\n\n`), 400);
    });
    const stack = await startStack({ config: configFor(provider.origin, {}) });
    const streamed = JSON.stringify({ model: 'gpt-4o', stream: true, messages: [{ role: 'user', content: 'hi' }] });
    const request = `POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: ${streamed.length}\r\n\r\n${streamed}`;
    const { port } = new URL(stack.url);
    const socket = connect(Number(port), '127.0.0.1');
    let text = '';
    socket.on('data', (d: Buffer) => (text += d.toString('latin1')));
    socket.write(request);
    // The junk goes once the stream's head is out.
    await expect.poll(() => text.includes('one '), { timeout: 5_000 }).toBe(true);
    socket.write('GARBAGE\r\n\r\n');
    await new Promise((resolve) => socket.once('close', resolve));
    expect(text).toMatch(/^HTTP\/1\.1 200/);
    expect(text).toContain('data: [DONE]');
    expect(text).not.toContain('HTTP/1.1 400');
  });
});

describe('a request pipelined behind one waiting on its provider, that stops arriving', () => {
  // Node's request timeout fired for the second request, whose head never completed; the 408 went through the reply of
  // the request being answered (the one Node's socket holds), which was complete and upstream: it got the 408 instead
  // of its provider's answer.
  it('times out itself: the first request still gets its provider\'s answer', async () => {
    const provider = await startProvider((req, res) => {
      req.resume();
      setTimeout(() => res.writeHead(200, { 'content-type': 'application/json' }).end(chatCompletion('billed')), 2_500);
    });
    const stack = await startStack({ config: () => ({ ...configFor(provider.origin, {})(), server: { host: '127.0.0.1', port: 0, requestTimeoutMs: 1_000 } }) });
    const { answers, closed } = await answersTo(stack.url, `${chat()}POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n`, 10_000);
    expect(provider.hits()).toBe(1);
    expect(answers.map((a) => a.status)).toEqual([200]);
    expect(JSON.parse(answers[0]!.body).choices[0].message.content).toBe('billed');
    expect(closed).toBe(true);
  });
});
