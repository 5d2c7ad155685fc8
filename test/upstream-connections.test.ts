// The gateway's connections to a provider outlive one request: a stream whose answer is over ([DONE]) before its
// response is (the chunked body's last bytes come a moment later, as with real providers) must not close the
// connection, or every stream pays a new TCP and TLS handshake. A response that never ends is closed, not leaked.
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { once } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import { defaultConfig, RETRY_LOOP_ONLY, useStacks } from './helpers/stack.ts';

let upstream: Server | undefined;
const sockets: Socket[] = [];
afterEach(async () => {
  upstream?.closeAllConnections();
  await new Promise((resolve) => upstream?.close(resolve) ?? resolve(undefined));
  upstream = undefined;
  sockets.length = 0;
});

const chunk = (delta: Record<string, string>, finish: string | null) =>
  `data: ${JSON.stringify({ id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;

/** A provider that sends a whole answer and [DONE], then ends the response `endAfterMs` later (never, if undefined). */
async function provider(endAfterMs: number | undefined): Promise<string> {
  upstream = createServer((req, res: ServerResponse) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(chunk({ role: 'assistant', content: 'Hello' }, null) + chunk({}, 'stop') + 'data: [DONE]\n\n');
      if (endAfterMs !== undefined) setTimeout(() => res.end(), endAfterMs);
    });
  });
  upstream.on('connection', (socket: Socket) => sockets.push(socket));
  upstream.listen(0, '127.0.0.1');
  await once(upstream, 'listening');
  return `http://127.0.0.1:${(upstream.address() as { port: number }).port}/v1`;
}

const startStack = useStacks();

async function gatewayTo(url: string) {
  return startStack({
    config: (mockUrl) => {
      const base = defaultConfig(mockUrl, RETRY_LOOP_ONLY);
      return {
        ...base,
        providers: { ...base.providers, slow: { family: 'openai', baseUrl: url, apiKey: 'slow-key', breaker: false } },
        routes: base.routes.map((r) => ({ ...r, targets: [{ provider: 'slow' }] })),
      };
    },
  });
}

async function streamText(client: OpenAI): Promise<string> {
  let text = '';
  const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
  for await (const c of stream) text += c.choices[0]?.delta?.content ?? '';
  return text;
}

describe('connections to the provider', () => {
  it('keeps one connection for streams whose response ends a moment after their [DONE]', async () => {
    const s = await gatewayTo(await provider(30));
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    for (let i = 0; i < 5; i++) {
      expect(await streamText(client)).toBe('Hello');
      await sleep(150);
    }
    expect(sockets.length).toBe(1);
  });

  it('answers at once and then closes a response that never ends after its [DONE]', async () => {
    const s = await gatewayTo(await provider(undefined));
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    const started = Date.now();
    expect(await streamText(client)).toBe('Hello');
    expect(Date.now() - started).toBeLessThan(1_000);
    const closed = once(sockets[0]!, 'close');
    await closed;
    expect(Date.now() - started).toBeLessThan(3_000);
  });
});
