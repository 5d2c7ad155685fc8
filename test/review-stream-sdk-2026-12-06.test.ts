// Review of the streaming path with the official SDKs over real HTTP: a tool call's arguments broken by a malformed
// event must end the stream with an error the SDK raises (per choice with n > 1, and for a legacy function_call too),
// and a streamRecovery continuation whose client leaves is still billed to its target. The bundled mock sends every
// choice's finish together and has no `functions`, so the first two play a provider's exact stream (scripted-provider).
import OpenAI from 'openai';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { claudeBackupConfig } from './helpers/claude-backup.ts';
import { DONE, cc, delta, useScriptedGateway } from './helpers/scripted-provider.ts';
import { metricSum, requestLine, useExtraMocks, useStacks } from './helpers/stack.ts';

const scriptedGateway = useScriptedGateway();
const startStack = useStacks();
const extraMock = useExtraMocks();

const ask = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'hi' }] };

describe('a malformed event inside a tool call ends the stream with an error the SDK raises', () => {
  it('with n = 2, while choice 1 streams its arguments after choice 0 has finished', async () => {
    const call = (i: number, args: string, open = false) =>
      delta(open ? { role: 'assistant', tool_calls: [{ index: 0, id: `call_${i}`, type: 'function', function: { name: 'f', arguments: args } }] } : { tool_calls: [{ index: 0, function: { arguments: args } }] }, null, i);
    // Choice 1's `"b":2` is garbled on the wire, just after choice 0's finish: dropped, its arguments were `{"a":1,}`.
    const garbled = 'data: {"choices":[{"index":1,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\\"b\\":2\n\n';
    const { client } = await scriptedGateway(() => ({
      steps: [cc([call(0, '', true)]), cc([call(1, '', true)]), cc([call(0, '{"a":1}')]), cc([call(1, '{"a":1,')]), cc([delta({}, 'tool_calls', 0)]), garbled, cc([call(1, '}')]), cc([delta({}, 'tool_calls', 1)]), DONE],
    }));
    const err = await client.chat.completions.stream({ ...ask, n: 2, tools: [{ type: 'function', function: { name: 'f', parameters: {} } }] }).finalChatCompletion().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('stream_interrupted');
  });

  it('in a legacy function_call (the `functions` parameter)', async () => {
    const { client } = await scriptedGateway(() => ({
      steps: [
        cc([delta({ role: 'assistant', content: null, function_call: { name: 'f', arguments: '' } })]),
        cc([delta({ function_call: { arguments: '{"a":1,' } })]),
        'data: {"choices":[{"index":0,"delta":{"function_call":{"arguments":"\\"b\\":2\n\n',
        cc([delta({ function_call: { arguments: '}' } })]),
        cc([delta({}, 'function_call')]),
        DONE,
      ],
    }));
    const err = await client.chat.completions.stream({ ...ask, functions: [{ name: 'f', parameters: {} }] }).finalChatCompletion().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('stream_interrupted');
  });

  it('not for a function_call: null in every delta (text only), whose malformed event is dropped as any', async () => {
    const { client, s } = await scriptedGateway(() => ({
      steps: [cc([delta({ role: 'assistant', content: 'Hel', function_call: null })]), 'data: {not json\n\n', cc([delta({ content: 'lo', function_call: null })]), cc([delta({}, 'stop')]), DONE],
    }));
    const done = await client.chat.completions.stream(ask).finalChatCompletion();
    expect(done.choices[0]!.message.content).toBe('Hello');
    expect((await requestLine(s)).droppedMalformed).toBe(1);
  });
});

describe('a streamRecovery continuation whose client leaves', () => {
  it('is billed to its target: its usage is in stormgate_tokens_total and the log line', async () => {
    // The Anthropic backup tells its input tokens in its first event (message_start), long before its end.
    const claude = await extraMock({ apiKey: 'claude-key', faults: { stream: { chunks: 40, chunkDelayMs: 150 } } });
    const s = await startStack({
      faults: { stream: { chunks: 10, cutAfterChunks: 3 } },
      config: (url) => claudeBackupConfig(url, `${claude.url}/v1`, { streamRecovery: 'continue', retry: { maxAttempts: 1 } }),
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    const stream = await client.chat.completions.create({ ...ask, stream: true });
    let chunks = 0;
    // Three chunks from the primary, then a few of the continuation's, then the client goes.
    for await (const _ of stream) if (++chunks === 6) break;
    const line = await requestLine(s);
    expect(line.attempts).toHaveLength(2);
    expect(line.streamEnd).toBe('client-gone');
    expect(line.continuationUsage?.usage.prompt).toBeGreaterThan(0);
    expect(await metricSum(s, 'stormgate_tokens_total{route="chat",target="claude/claude-sonnet-4-5",kind="prompt"}')).toBe(line.continuationUsage.usage.prompt);
    // And its upstream request is given up at once.
    for (let i = 0; i < 50 && claude.stats().inflight > 0; i++) await sleep(20);
    expect(claude.stats().inflight).toBe(0);
  });
});
