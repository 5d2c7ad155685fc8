// Adversarial review of the streaming path (2026-12-05): each case drives the gateway over real HTTP with a scripted
// upstream playing a provider's exact bytes and timing.
import { request as httpRequest, type IncomingMessage } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { cc, delta, DONE, useScriptedGateway, type Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';
import { configServedBy, metricSum, requestLine, useStacks } from './helpers/stack.ts';

const gw = useScriptedGateway();
const msgs = [{ role: 'user' as const, content: 'hi' }];

const ttftCount = (s: Parameters<typeof metricSum>[0]) => metricSum(s, 'stormgate_ttft_seconds_count{route="chat"}');

describe('the streaming path under review', () => {
  it('counts the time to first token of an answer whose first output chunk also carries its finish_reason', async () => {
    // Gemini's OpenAI-compatible API and others send a short answer as one chunk: its text and finish_reason together.
    const { client, s } = await gw(() => ({ steps: [cc([delta({ role: 'assistant', content: 'Hello there' }, 'stop')]), DONE] }));
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: msgs, stream: true });
    let text = '';
    for await (const c of stream) text += c.choices[0]?.delta.content ?? '';
    expect(text).toBe('Hello there');
    const line = await requestLine(s);
    expect(line.streamEnd).toBe('complete');
    expect(typeof line.ttftMs).toBe('number');
    expect(await ttftCount(s)).toBe(1);
  });
});

const startProvider = useFakeProviders();
const startStack = useStacks();

/** A chat stream request whose response the test reads (or does not) by hand. */
function openStream(url: string): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' } }, resolve);
    req.on('error', reject);
    req.end(JSON.stringify({ model: 'gpt-4o', messages: msgs, stream: true }));
  });
}

describe('backpressure and disconnects', () => {
  it('a client that stops reading pauses the upstream: the gateway does not buffer the answer without bound', async () => {
    const written = { bytes: 0, closed: false };
    const piece = cc([delta({ content: 'x'.repeat(8_000) })]);
    const p = await startProvider((req, res) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.on('close', () => (written.closed = true));
      void (async () => {
        res.write(cc([delta({ role: 'assistant', content: '' })]));
        while (written.bytes < 64 * 1024 * 1024 && !res.destroyed) {
          written.bytes += piece.length;
          if (!res.write(piece)) await new Promise((r) => res.once('drain', r));
        }
        res.end(cc([delta({}, 'stop')]) + DONE);
      })();
    });
    const s = await startStack({ config: (mockUrl) => configServedBy(mockUrl, 'p', `${p.origin}/v1`) });
    const res = await openStream(s.url);
    res.pause();
    await sleep(1_500);
    // Socket buffers on both sides and undici's body buffer: a few MB at most, not the 64 MB the upstream has.
    expect(written.bytes).toBeLessThan(24 * 1024 * 1024);
    let got = 0;
    res.on('data', (d: Buffer) => (got += d.length));
    res.resume();
    await new Promise((r) => res.on('end', r));
    expect(got).toBeGreaterThan(64 * 1024 * 1024);
  });

  it('a client that leaves between two writes ends the upstream request, logged as client_gone', async () => {
    const up = { closed: false };
    const p = await startProvider((req, res) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.on('close', () => (up.closed = true));
      res.write(cc([delta({ role: 'assistant', content: '' })]) + cc([delta({ content: 'one' })]));
      const timer = setInterval(() => res.write(cc([delta({ content: ' more' })])), 50);
      res.on('close', () => clearInterval(timer));
    });
    const s = await startStack({ config: (mockUrl) => configServedBy(mockUrl, 'p', `${p.origin}/v1`) });
    const res = await openStream(s.url);
    await new Promise((r) => res.once('data', r));
    await sleep(120);
    res.destroy();
    const until = Date.now() + 3_000;
    while (!up.closed && Date.now() < until) await sleep(20);
    expect(up.closed).toBe(true);
    const line = await requestLine(s);
    expect(line.streamEnd).toBe('client-gone');
    expect(line.outcome).toBe('client_gone');
  });
});

const startUpstreams = useScriptedUpstreams();
const aev = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
/** An Anthropic answer up to its message_delta (its finish and usage), without the message_stop that ends it. */
const anthropicUntilFinish = [
  aev('message_start', { message: { id: 'msg_1', type: 'message', role: 'assistant', model: 'claude-x', content: [], stop_reason: null, usage: { input_tokens: 11, output_tokens: 1 } } }),
  aev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
  aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Hello' } }),
  aev('content_block_stop', { index: 0 }),
  aev('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 5 } }),
];

describe('a chat stream translated from Anthropic whose client asked for its usage', () => {
  const endings: Array<[string, Script]> = [
    ['goes quiet', { steps: anthropicUntilFinish, hold: true }],
    ['is reset', { steps: [...anthropicUntilFinish, 50, { destroy: true }] }],
  ];
  for (const [how, script] of endings) {
    it(`gets its usage chunk and [DONE] a moment after the finish when the upstream ${how} before message_stop`, async () => {
      const { s } = await startUpstreams({ a: { answer: () => script, family: 'anthropic' } }, [{ provider: 'a', model: 'claude-x' }], {
        provider: { timeouts: { connectMs: 1_000, firstTokenMs: 10_000, idleMs: 10_000 } },
      });
      const startedAt = Date.now();
      const res = await fetch(`${s.baseURL}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'gpt-4o', messages: msgs, stream: true, stream_options: { include_usage: true } }),
      });
      const body = await res.text();
      // The second after a finish, not the whole idleMs: the usage the client asked for is the translator's, known already.
      expect(Date.now() - startedAt).toBeLessThan(6_000);
      const datas = body.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
      expect(datas.at(-1)).toBe('[DONE]');
      const usageChunk = JSON.parse(datas.at(-2)!) as { choices: unknown[]; usage: { prompt_tokens: number; completion_tokens: number } };
      expect(usageChunk.choices).toEqual([]);
      expect(usageChunk.usage).toMatchObject({ prompt_tokens: 11, completion_tokens: 5 });
      // A provider that leaves [DONE] out ended its stream well: a plain request line, not a warning each time.
      expect(await requestLine(s)).toMatchObject({ streamEnd: 'done-added', msg: 'request', level: 30 });
    });
  }
});
