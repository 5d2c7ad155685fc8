// Mutation tests over src/pipeline/stream-recovery.ts (streamRecovery: continue): mutants the recovery's own tests
// left alive. A fresh answer that does not begin with the delivered text is let go of (its upstream request aborted,
// its pool slot given back) rather than left running at the backup unread; a continuation the backup refuses gives its
// slot back; a fresh answer that reaches exactly the delivered text, its finish and [DONE] in the same read, is spliced
// on with them; a next target held off or with its credentials on hold is sent no continuation (nor charged a retry);
// a prefill continuation loses only its first text's leading whitespace, and only when the prefill lost some. Over real
// HTTP with the openai SDK as the client; the providers are one scripted server (p, then q, told by the key).
import type { IncomingMessage, ServerResponse } from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { cc, delta, DONE, json, recoveringToNext, useScriptedGateway, type ConfigShape, type Script } from './helpers/scripted-provider.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { configServedBy, metricSum, useStacks, type Stack } from './helpers/stack.ts';
import { streamedText } from './helpers/chat-stream.ts';

const SSE = { 'content-type': 'text/event-stream' };
const role = cc([delta({ role: 'assistant', content: '' })]);

/** How q answers a continuation, on its response; `gate` opens when the test ends. */
type QAnswer = (res: ServerResponse, gate: Promise<void>) => void;

/** Polls `check` until it holds, for up to `ms`. */
async function until(check: () => boolean | Promise<boolean>, ms = 5_000): Promise<boolean> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await check()) return true;
    await new Promise((r) => setTimeout(r, 20));
  }
  return check();
}

describe('streamRecovery: a fresh answer spliced on after the delivered text', () => {
  const startProvider = useFakeProviders();
  const startStack = useStacks();
  // Registered after the stacks' clean-up, so it runs first: a q answer still held would keep the gateway's close waiting.
  let release: (() => void) | undefined;
  afterEach(() => release?.());

  /** p answers "Hello wor" and is reset; q answers as `q` says. */
  async function start(q: QAnswer): Promise<{ client: OpenAI; s: Stack; fromQ: Array<{ closed: boolean }> }> {
    let open!: () => void;
    const gate = new Promise<void>((resolve) => (open = resolve));
    release = open;
    const fromQ: Array<{ closed: boolean }> = [];
    const p = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      req.on('end', () => {
        if (req.headers.authorization === 'Bearer q-key') {
          const entry = { closed: false };
          fromQ.push(entry);
          res.on('close', () => (entry.closed = true));
          q(res, gate);
          return;
        }
        res.writeHead(200, SSE);
        res.write(role + cc([delta({ content: 'Hello wor' })]));
        setTimeout(() => res.socket?.destroy(), 30);
      });
    });
    const s = await startStack({
      config: (mockUrl) => {
        const c = configServedBy(mockUrl, 'p', `${p.origin}/v1`);
        (c.providers.p as Record<string, unknown>).timeouts = { connectMs: 2000, firstTokenMs: 30000, idleMs: 30000 };
        recoveringToNext()(c, p.origin);
        (c.providers.q as Record<string, unknown>).timeouts = { connectMs: 2000, firstTokenMs: 30000, idleMs: 30000 };
        return c;
      },
    });
    return { client: new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 }), s, fromQ };
  }

  const ask = (client: OpenAI) => client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });

  it('that says something else is let go of: its upstream request aborted and its slot given back, the client told of the cut', async () => {
    // q's answer differs, and goes on (held open) after the part that shows it: nothing reads it any more.
    const { client, s, fromQ } = await start((res, gate) => {
      res.writeHead(200, SSE);
      res.write(role + cc([delta({ content: 'Goodbye, cruel world' })]));
      void gate.then(() => res.end(cc([delta({}, 'stop')]) + DONE));
    });
    const { text, err } = await streamedText(await ask(client));
    expect(text).toBe('Hello wor');
    expect(String(err)).toMatch(/cut/);
    expect(fromQ).toHaveLength(1);
    // Left running, the answer nobody reads held q's connection and its pool slot until q finished it.
    expect(await until(() => fromQ[0]!.closed)).toBe(true);
    expect(await until(async () => (await metricSum(s, 'stormgate_pool_in_use{provider="q"')) === 0)).toBe(true);
  });

  it('that q refuses (a 503) gives q\'s pool slot back at once: the client gets the cut', async () => {
    const { client, s, fromQ } = await start((res) => {
      res.writeHead(503, { 'content-type': 'application/json' });
      res.end('{"error":{"message":"busy","type":"server_error"}}');
    });
    const { text, err } = await streamedText(await ask(client));
    expect(text).toBe('Hello wor');
    expect(String(err)).toMatch(/cut/);
    expect(fromQ).toHaveLength(1);
    // Kept, every refused continuation took one of q's slots for good.
    expect(await until(async () => (await metricSum(s, 'stormgate_pool_in_use{provider="q"')) === 0)).toBe(true);
  });

  it('that reaches exactly the delivered text, its finish and [DONE] in the same read, ends whole with its finish', async () => {
    // The chunk that completes "Hello wor" comes with the finish chunk and [DONE] in one write.
    const { client } = await start((res) => {
      res.writeHead(200, SSE);
      res.write(role + cc([delta({ content: 'Hello ' })]));
      setTimeout(() => res.end(cc([delta({ content: 'wor' })]) + cc([delta({}, 'stop')]) + DONE), 30);
    });
    const stream = await ask(client);
    let text = '';
    let finish: string | null = null;
    for await (const c of stream) {
      text += c.choices[0]?.delta.content ?? '';
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    expect(text).toBe('Hello wor');
    expect(finish).toBe('stop');
  });
});

describe('streamRecovery: a next target that may not be asked', () => {
  const recovering = useScriptedGateway(recoveringToNext());
  const busy = json(503, { error: { message: 'busy', type: 'server_error' } });
  const refusals: Array<[string, Script]> = [
    ['it is held off (its 429 with retry-after)', json(429, { error: { message: 'slow down', type: 'rate_limit_error', code: 'rate_limit_exceeded' } }, { 'retry-after': '60' })],
    ['its credentials are on hold (its 401)', json(401, { error: { message: 'Incorrect API key provided', type: 'invalid_request_error', code: 'invalid_api_key' } })],
  ];
  for (const [what, refusal] of refusals) {
    it(`is sent no continuation while ${what}: the client gets the cut, no retry spent`, async () => {
      // 1: p's 503 sends a whole request on to q; 2: q refuses it; 3: p's stream is cut after "Hel".
      const { client, seen, s } = await recovering((_body, n) =>
        n === 1 ? busy : n === 2 ? refusal : n === 3 ? { steps: [role, cc([delta({ content: 'Hel' })]), 30, { destroy: true }] } : { steps: [role, cc([delta({ content: 'Hello' })]), cc([delta({}, 'stop')]), DONE] },
      );
      await expect(client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] })).rejects.toThrow();
      expect(seen).toHaveLength(2);
      const { text, err } = await streamedText(await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true }));
      expect(text).toBe('Hel');
      expect(String(err)).toMatch(/cut/);
      expect(seen).toHaveLength(3);
      expect(await metricSum(s, 'stormgate_retry_count_total{route="chat",target="q/gpt-4o"')).toBe(0);
    });
  }
});

describe('streamRecovery: a continuation by prefill', () => {
  /** q as a provider whose models continue a prefill. */
  const prefilling: ConfigShape = (c, origin) => {
    recoveringToNext()(c, origin);
    (c.providers.q as Record<string, unknown>).prefill = true;
  };
  const start = useScriptedGateway(prefilling);

  it('keeps the leading space of a continuation whose prefill lost no whitespace: the words stay apart', async () => {
    // p is cut right after a word; q, prefilled with "Hello", goes on with " world.".
    const { client, seen } = await start((_b, n) =>
      n === 1 ? { steps: [role, cc([delta({ content: 'Hello' })]), 30, { destroy: true }] } : { steps: [role, cc([delta({ content: ' world.' })]), cc([delta({}, 'stop')]), DONE] },
    );
    const { text, err } = await streamedText(await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true }));
    expect(err).toBeUndefined();
    expect((seen[1]!.body.messages as unknown[]).at(-1)).toEqual({ role: 'assistant', content: 'Hello' });
    expect(text).toBe('Hello world.');
  });

  it('drops the leading whitespace of the continuation\'s first text only: later chunks keep their spaces', async () => {
    // p is cut after "Hello " (the prefill goes without the space); q goes on with "world", then " again.".
    const { client, seen } = await start((_b, n) =>
      n === 1
        ? { steps: [role, cc([delta({ content: 'Hello ' })]), 30, { destroy: true }] }
        : { steps: [role, cc([delta({ content: ' world' })]), cc([delta({ content: ' again.' })]), cc([delta({}, 'stop')]), DONE] },
    );
    const { text, err } = await streamedText(await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true }));
    expect(err).toBeUndefined();
    expect((seen[1]!.body.messages as unknown[]).at(-1)).toEqual({ role: 'assistant', content: 'Hello' });
    expect(text).toBe('Hello world again.');
  });

  /** The same, q's target naming a model of its own. */
  const toBackupModel = useScriptedGateway((c, origin) => {
    prefilling(c, origin);
    for (const r of c.routes) if (r.name === 'chat') r.targets = [{ provider: 'p' }, { provider: 'q', model: 'backup-model' }];
  });

  it("asks for the next target's own model, not the one the client named", async () => {
    const { client, seen } = await toBackupModel((_b, n) =>
      n === 1 ? { steps: [role, cc([delta({ content: 'Hello' })]), 30, { destroy: true }] } : { steps: [role, cc([delta({ content: ' world.' })]), cc([delta({}, 'stop')]), DONE] },
    );
    const { text, err } = await streamedText(await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true }));
    expect(err).toBeUndefined();
    expect(text).toBe('Hello world.');
    expect(seen[1]!.body).toMatchObject({ model: 'backup-model', messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: 'Hello' }] });
  });
});
