// The gateway's connections to a provider outlive one request: a stream whose answer is over ([DONE]) before its
// response is (the chunked body's last bytes come a moment later, as with real providers) must not close the
// connection, or every stream pays a new TCP and TLS handshake. A response that never ends is closed, not leaked.
import { once } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { chatChunk as chunk, eventStream, useFakeProviders, type FakeProvider } from './helpers/fake-provider.ts';
import { configServedBy, useStacks } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();

/** A provider that sends a whole answer and [DONE], then ends the response `endAfterMs` later (never, if undefined). */
function provider(endAfterMs: number | undefined): Promise<FakeProvider> {
  return startProvider(
    eventStream((res) => {
      res.write(chunk({ role: 'assistant', content: 'Hello' }, null) + chunk({}, 'stop') + 'data: [DONE]\n\n');
      if (endAfterMs !== undefined) setTimeout(() => res.end(), endAfterMs);
    }),
  );
}

const gatewayTo = (p: FakeProvider) => startStack({ config: (mockUrl) => configServedBy(mockUrl, 'slow', `${p.origin}/v1`) });

async function streamText(client: OpenAI): Promise<string> {
  let text = '';
  const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
  for await (const c of stream) text += c.choices[0]?.delta?.content ?? '';
  return text;
}

describe('connections to the provider', () => {
  it('keeps one connection for streams whose response ends a moment after their [DONE]', async () => {
    const p = await provider(30);
    const s = await gatewayTo(p);
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    for (let i = 0; i < 5; i++) {
      expect(await streamText(client)).toBe('Hello');
      await sleep(150);
    }
    expect(p.sockets.length).toBe(1);
  });

  it('answers at once and then closes a response that never ends after its [DONE]', async () => {
    const p = await provider(undefined);
    const s = await gatewayTo(p);
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    const started = Date.now();
    expect(await streamText(client)).toBe('Hello');
    expect(Date.now() - started).toBeLessThan(1_000);
    const closed = once(p.sockets[0]!, 'close');
    await closed;
    expect(Date.now() - started).toBeLessThan(3_000);
  });

  it('reads a connection lost after a stream began, before its first output, as a broken stream, not an unreachable provider', async () => {
    // Cut in the middle of its first event (a token and the cut that arrive together lose the token the same way:
    // the body's error discards what it had buffered).
    const p = await startProvider(eventStream((res) => res.write(chunk({ role: 'assistant', content: 'Hel' }, null).slice(0, 40), () => res.socket?.destroy())));
    const s = await gatewayTo(p);
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    const err = (await streamText(client).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err.status).toBe(502);
    expect((err.error as { code: string }).code).toBe('upstream_bad_response');
    expect(err.message).toMatch(/broke before its first output/);
  });

  it('keeps an idle connection for keepAliveMs, no longer: below a provider\'s own idle timeout, none is reused as it closes', async () => {
    const p = await provider(0);
    const s = await startStack({
      config: (mockUrl) => {
        const c = configServedBy(mockUrl, 'slow', `${p.origin}/v1`);
        c.providers.slow!.timeouts = { keepAliveMs: 200 };
        return c;
      },
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    expect(await streamText(client)).toBe('Hello');
    await sleep(100);
    expect(await streamText(client)).toBe('Hello');
    expect(p.sockets.length).toBe(1);
    // Idle past keepAliveMs: the gateway closed it, the next request opens its own.
    await sleep(600);
    expect(await streamText(client)).toBe('Hello');
    expect(p.sockets.length).toBe(2);
  });
});
