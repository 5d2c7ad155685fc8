// The model listing answers a client that sends anthropic-version (the Anthropic SDKs' models.list/retrieve) in
// Anthropic's shape; its errors (a model not found, a client key refused) are in that shape too, as on /v1/messages.
import Anthropic from '@anthropic-ai/sdk';
import { describe, expect, it } from 'vitest';
import { TEST_KEY, useStacks } from './helpers/stack.ts';

const startStack = useStacks();

describe('GET /v1/models errors for an Anthropic client', () => {
  it('are Anthropic-shaped when anthropic-version is sent, OpenAI-shaped otherwise', async () => {
    const s = await startStack({
      config: (url) => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        auth: { keys: { agents: 'sg-agents-key' } },
        providers: { claude: { family: 'anthropic', baseUrl: url, apiKey: TEST_KEY, breaker: false } },
        routes: [{ name: 'messages', match: { path: '/v1/messages', models: ['claude-sonnet-4-6'] }, targets: [{ provider: 'claude' }] }],
      }),
    });
    const client = new Anthropic({ baseURL: s.url, apiKey: 'sg-agents-key', maxRetries: 0 });
    const missing = await client.models.retrieve('claude-nope').then(() => undefined, (e: unknown) => e as InstanceType<typeof Anthropic.APIError>);
    expect(missing).toBeInstanceOf(Anthropic.NotFoundError);
    expect(missing!.error).toMatchObject({ type: 'error', error: { type: 'not_found_error', code: 'model_not_found' } });
    expect(missing!.requestID).toBeTruthy();

    const refused = new Anthropic({ baseURL: s.url, apiKey: 'wrong', maxRetries: 0 });
    const denied = await refused.models.list().then(() => undefined, (e: unknown) => e as InstanceType<typeof Anthropic.APIError>);
    expect(denied).toBeInstanceOf(Anthropic.AuthenticationError);
    expect(denied!.error).toMatchObject({ type: 'error', error: { type: 'authentication_error', code: 'invalid_api_key' } });

    const plain = await fetch(`${s.url}/v1/models/claude-nope`, { headers: { authorization: 'Bearer sg-agents-key' } });
    expect(plain.status).toBe(404);
    const body = (await plain.json()) as Record<string, unknown>;
    expect(body.type).toBeUndefined();
    expect(body.error).toMatchObject({ type: 'invalid_request_error', code: 'model_not_found' });
  });
});
