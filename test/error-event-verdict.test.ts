// An error event before any output that rejects the request itself (a content policy, an invalid prompt) is the
// provider's verdict: answered as its 400 with its reason, not retried three times and turned into a 502.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { baseResponse, cc, delta, fastRetries, rev, useScriptedGateway } from './helpers/scripted-provider.ts';

const gw = useScriptedGateway(fastRetries);

const msgs = [{ role: 'user' as const, content: 'hi' }];

describe('error events before output', () => {
  it('E1 responses: response.failed invalid_prompt before output', async () => {
    const { client, seen } = await gw(() => ({
      steps: [rev('response.created', { response: baseResponse('in_progress') }, 0), rev('response.in_progress', { response: baseResponse('in_progress') }, 1), rev('response.failed', { response: { ...baseResponse('failed'), error: { code: 'invalid_prompt', message: 'Invalid prompt: your prompt was flagged as potentially violating our usage policy.' } } }, 2)],
    }));
    const err = await client.responses.create({ model: 'gpt-4.1', input: 'hi', stream: true }).then(async (s) => { for await (const _ of s) void _; return 'ok'; }, (e: InstanceType<typeof OpenAI.APIError>) => `${e.status} ${e.code} ${e.message}`);
    expect(seen.length).toBe(1);
    expect(err).toMatch(/^400 invalid_prompt .*flagged/);
  });

  it('E2 chat: content filter error event before output', async () => {
    const { client, seen } = await gw(() => ({
      steps: [cc([delta({ role: 'assistant', content: '' })]), `data: ${JSON.stringify({ error: { message: 'The response was filtered due to the prompt triggering content management policy.', type: 'invalid_request_error', param: 'prompt', code: 'content_filter' } })}\n\n`],
    }));
    const err = await client.chat.completions.create({ model: 'gpt-4o', messages: msgs, stream: true }).then(async (s) => { for await (const _ of s) void _; return 'ok'; }, (e: InstanceType<typeof OpenAI.APIError>) => `${e.status} ${e.code} ${e.message}`);
    expect(seen.length).toBe(1);
    expect(err).toMatch(/^400 content_filter .*filtered/);
  });
  it('E3 chat: a server error event before output on every attempt: 502 whose message keeps the upstream code', async () => {
    const { client, seen } = await gw(() => ({
      steps: [cc([delta({ role: 'assistant', content: '' })]), `event: error\ndata: ${JSON.stringify({ error: { message: 'Overloaded', type: 'overloaded_error', code: 'overloaded' } })}\n\n`],
    }));
    const err = await client.chat.completions.create({ model: 'gpt-4o', messages: msgs, stream: true }).then(async (s) => { for await (const _ of s) void _; return 'ok'; }, (e: InstanceType<typeof OpenAI.APIError>) => `${e.status} ${e.code} ${e.message}`);
    expect(seen.length).toBeGreaterThan(1);
    expect(err).toMatch(/^502 upstream_bad_response .*error event before any output: overloaded/);
  });
});
