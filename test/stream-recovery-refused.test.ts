// streamRecovery: continue that did not continue a broken stream says why in the request's log line
// (`recoveryRefused`): a soak run saw 941 cut streams on such a route and 364 recovered, and the other lines named no
// reason (the next target's breaker, the budget, a tool call delivered, a continuation that failed or did not match).
import { describe, expect, it } from 'vitest';
import type OpenAI from 'openai';
import { cc, delta, recoveringToNext, useScriptedGateway, type ConfigShape, type Script } from './helpers/scripted-provider.ts';
import { requestLine } from './helpers/stack.ts';
import { args, opens, toolChunk } from './helpers/tool-stream.ts';

const cut = { destroy: true } as const;
const role = cc([delta({ role: 'assistant', content: '' })]);
const cutAfterHel: Script = { steps: [role, cc([delta({ content: 'Hel' })]), 30, cut] };
const hello: Script = { steps: [role, cc([delta({ content: 'Hello' })]), cc([delta({}, 'stop')]), 'data: [DONE]\n\n'] };
const other: Script = { steps: [role, cc([delta({ content: 'Good day' })]), cc([delta({}, 'stop')]), 'data: [DONE]\n\n'] };
const busy: Script = { status: 503, headers: { 'content-type': 'application/json' }, steps: ['{"error":{"message":"busy","type":"server_error"}}'] };

/** Reads the stream to its end or its error; the text it got. */
async function read(client: OpenAI, extra: Record<string, unknown> = {}): Promise<string> {
  let text = '';
  try {
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true, ...extra } as never);
    for await (const chunk of stream as unknown as AsyncIterable<OpenAI.ChatCompletionChunk>) text += chunk.choices[0]?.delta.content ?? '';
  } catch {
    // the stream's error event: what the client got before it is what counts here
  }
  return text;
}

const start = useScriptedGateway(recoveringToNext());
const startWithoutBudget = useScriptedGateway((c, origin) => {
  recoveringToNext()(c, origin);
  for (const r of c.routes) if (r.name === 'chat') r.budget = { ratio: 0, windowS: 10, minRetriesPerSecond: 0 };
});
const alone: ConfigShape = (c, origin) => {
  recoveringToNext()(c, origin);
  for (const r of c.routes) if (r.name === 'chat') r.targets = [{ provider: 'p' }];
};
const startAlone = useScriptedGateway(alone);

describe('a broken stream not continued says why in its log line', () => {
  it('a recovered one says nothing of it', async () => {
    const { client, s } = await start((_b, n) => (n === 1 ? cutAfterHel : hello));
    expect(await read(client)).toBe('Hello');
    const line = await requestLine(s);
    expect(line.streamEnd).toBe('recovered');
    expect(line.recoveryRefused).toBeUndefined();
  });

  it('the budget refused the retry', async () => {
    const { client, s } = await startWithoutBudget((_b, n) => (n === 1 ? cutAfterHel : hello));
    expect(await read(client)).toBe('Hel');
    expect((await requestLine(s)).recoveryRefused).toBe('budget');
  });

  it('the continuation failed, or began with other words than the client has', async () => {
    const failed = await start((_b, n) => (n === 1 ? cutAfterHel : busy));
    expect(await read(failed.client)).toBe('Hel');
    expect((await requestLine(failed.s)).recoveryRefused).toBe('failed');
    const unlike = await start((_b, n) => (n === 1 ? cutAfterHel : other));
    expect(await read(unlike.client)).toBe('Hel');
    expect((await requestLine(unlike.s)).recoveryRefused).toBe('no_match');
  });

  it('a tool call was on its way, n asked for two choices, or the route has no next target', async () => {
    const calling = await start((_b, n) => (n === 1 ? { steps: [role, toolChunk(opens(0, 'call_1')), toolChunk(args(0, '{"ci')), 30, cut] } : hello));
    await read(calling.client, { tools: [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object' } } }] });
    expect((await requestLine(calling.s)).recoveryRefused).toBe('not_plain_text');
    const two = await start((_b, n) => (n === 1 ? cutAfterHel : hello));
    await read(two.client, { n: 2 });
    expect((await requestLine(two.s)).recoveryRefused).toBe('several_choices');
    const only = await startAlone(() => cutAfterHel);
    expect(await read(only.client)).toBe('Hel');
    expect((await requestLine(only.s)).recoveryRefused).toBe('no_next_target');
  });
});
