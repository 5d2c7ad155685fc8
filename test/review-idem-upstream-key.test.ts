// Review of idempotency keys (rev-idem): the Idempotency-Key a client sends is forwarded upstream "for providers that
// honour it", and a key belongs to the client key that sent it. Forwarded as sent, two teams that pick the same key
// reached a key-honouring tool as one caller (the gateway's credentials), and the tool handed team B team A's answer.
import OpenAI from 'openai';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { describe, expect, it } from 'vitest';
import { chatCompletion, useFakeProviders } from './helpers/fake-provider.ts';
import { useStacks } from './helpers/stack.ts';

const start = useStacks();
const startProvider = useFakeProviders();
const [AGENTS, BATCH] = ['sg-client-agents-key', 'sg-client-batch-key'];

/** A coupon tool that honours Idempotency-Key as Stripe does: a key it has seen gets that key's answer again. */
function couponTool(issued: string[], seenKeys: string[], answerAfterMs: (n: number) => number = () => 0) {
  const byKey = new Map<string, string>();
  return (req: IncomingMessage, res: ServerResponse) => {
    let text = '';
    req.on('data', (d: Buffer) => (text += d.toString()));
    req.on('end', () => {
      const key = String(req.headers['idempotency-key'] ?? '');
      seenKeys.push(key);
      let answer = byKey.get(key);
      if (answer === undefined) {
        const user = (JSON.parse(text) as { user: string }).user;
        issued.push(user);
        answer = chatCompletion(`coupon for ${user}`);
        byKey.set(key, answer);
      }
      const body = answer;
      setTimeout(() => res.writeHead(200, { 'content-type': 'application/json' }).end(body), answerAfterMs(seenKeys.length));
    });
  };
}

const config = (origin: string, timeoutMs = 10_000) => ({
  server: { host: '127.0.0.1', port: 0, logLevel: 'warn' as const },
  auth: { keys: { agents: AGENTS, batch: BATCH } },
  providers: { coupons: { family: 'openai' as const, baseUrl: `${origin}/v1`, apiKey: 'coupons-token', breaker: false as const } },
  routes: [{ name: 'coupon-tool', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'coupons', model: 'coupon-tool' }], retry: { retryOn: [429, 503] }, timeoutMs }],
});

const ask = (apiKey: string, baseURL: string, user: string, key: string) =>
  new OpenAI({ baseURL, apiKey, maxRetries: 0 }).chat.completions.create({ model: 'coupon-tool', messages: [{ role: 'user', content: 'coupon' }], user }, { headers: { 'Idempotency-Key': key } });

describe('the Idempotency-Key forwarded upstream, with auth', () => {
  it("two client keys under one Idempotency-Key reach a key-honouring tool as two calls: neither gets the other's answer", async () => {
    const issued: string[] = [];
    const seenKeys: string[] = [];
    const tool = await startProvider(couponTool(issued, seenKeys));
    const s = await start({ config: () => config(tool.origin) });
    const ofAgents = await ask(AGENTS, s.baseURL, 'alice', 'call-1');
    const ofBatch = await ask(BATCH, s.baseURL, 'bob', 'call-1');
    expect(ofAgents.choices[0]!.message.content).toBe('coupon for alice');
    expect(ofBatch.choices[0]!.message.content).toBe('coupon for bob');
    expect(issued).toEqual(['alice', 'bob']);
    expect(seenKeys[0]).not.toBe(seenKeys[1]);
    // A key the client chose never reaches the provider as it was sent: it is one of the client's, not the gateway's.
    expect(seenKeys).not.toContain('call-1');
  });

  it("one client's repeats under its key reach the tool under one key: a repeat the gateway runs again (the run before timed out) gets the tool's own replay", async () => {
    const issued: string[] = [];
    const seenKeys: string[] = [];
    // The tool commits at once but answers the first call after the route's timeout: the gateway gives the key back.
    const tool = await startProvider(couponTool(issued, seenKeys, (n) => (n === 1 ? 1_500 : 0)));
    const s = await start({ config: () => config(tool.origin, 1_000) });
    await expect(ask(AGENTS, s.baseURL, 'alice', 'call-2')).rejects.toMatchObject({ status: 504 });
    const again = await ask(AGENTS, s.baseURL, 'alice', 'call-2');
    expect(again.choices[0]!.message.content).toBe('coupon for alice');
    expect(seenKeys).toHaveLength(2);
    expect(seenKeys[0]).toBe(seenKeys[1]);
    expect(issued).toEqual(['alice']);
  });
});
