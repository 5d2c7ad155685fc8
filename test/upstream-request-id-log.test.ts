// A developer quotes the request id their SDK shows (`err.requestID`, the `x-request-id` of the answer) to the team that
// runs the gateway. On an upstream error passed on, that id is the provider's: the request's log line must name it
// (`upstreamRequestId`), as it does for a success, or the id leads nowhere in the gateway's logs.
import { afterEach, describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { RETRY_LOOP_ONLY, startStack, TEST_KEY, type Stack } from './helpers/stack.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import type { ConfigInput } from '../src/config/schema.ts';

let stack: Stack | undefined;
afterEach(async () => {
  await stack?.close();
  stack = undefined;
});

async function failedCall(client: OpenAI, model = 'gpt-4o'): Promise<InstanceType<typeof OpenAI.APIError>> {
  try {
    await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }] });
  } catch (err) {
    if (err instanceof OpenAI.APIError) return err;
    throw err;
  }
  throw new Error('the call succeeded');
}

function lineOf(s: Stack, reqId: string | null): Record<string, unknown> {
  const line = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.reqId === reqId);
  if (!line) throw new Error(`no log line for ${reqId}`);
  return line;
}

describe('the request id an SDK shows for an upstream error', () => {
  it('is in the log line of a request whose upstream 503 was passed on after its retries', async () => {
    stack = await startStack({ faults: { errors: [{ status: 503 }] }, ...RETRY_LOOP_ONLY, route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 2, backoff: { baseMs: 1, capMs: 5 } } } });
    const client = new OpenAI({ baseURL: stack.baseURL, apiKey: TEST_KEY, maxRetries: 0 });
    const err = await failedCall(client);
    expect(err.status).toBe(503);
    expect(err.requestID).toMatch(/^req_/);
    const line = lineOf(stack, err.headers?.get('x-stormgate-request-id') ?? null);
    expect(line).toMatchObject({ outcome: 'upstream_error', status: 503, upstreamRequestId: err.requestID });
  });

  it('is in the log line of a request the provider refused as the client\'s fault', async () => {
    stack = await startStack({ faults: { errors: [{ status: 400, code: 'invalid_value', message: 'bad value' }] } });
    const client = new OpenAI({ baseURL: stack.baseURL, apiKey: TEST_KEY, maxRetries: 0 });
    const err = await failedCall(client);
    expect(err.status).toBe(400);
    expect(err.requestID).toMatch(/^req_/);
    const line = lineOf(stack, err.headers?.get('x-stormgate-request-id') ?? null);
    expect(line).toMatchObject({ status: 400, upstreamRequestId: err.requestID });
  });
});

describe("the provider's request id of a refused key, in the log line", () => {
  const startProvider = useFakeProviders();
  const OPENAI_KEY = 'sk-openai-key-0123456789';
  const ANTHROPIC_KEY = 'sk-ant-api03-key-0123456789';

  /** Refuses every request 401, with the key it was sent echoed in its request id header (`header`). */
  const refusing = (header: string, key: string, body: unknown) =>
    startProvider((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(401, { 'content-type': 'application/json', [header]: `req_${key}` });
        res.end(JSON.stringify(body));
      });
    });

  it("names OpenAI's x-request-id and Anthropic's request-id with the key taken out", async () => {
    const openai = await refusing('x-request-id', OPENAI_KEY, { error: { message: 'Incorrect API key provided', type: 'invalid_request_error', code: 'invalid_api_key' } });
    const claude = await refusing('request-id', ANTHROPIC_KEY, { type: 'error', error: { type: 'authentication_error', message: 'invalid x-api-key' } });
    stack = await startStack({
      config: () =>
        ({
          server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
          providers: {
            openai: { family: 'openai', baseUrl: `${openai.origin}/v1`, apiKey: OPENAI_KEY, breaker: false },
            claude: { family: 'anthropic', baseUrl: claude.origin, apiKey: ANTHROPIC_KEY, breaker: false },
          },
          routes: [
            { name: 'chat-claude', match: { path: '/v1/chat/completions', models: ['claude-*'] }, targets: [{ provider: 'claude' }], park: false },
            { name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'openai' }], park: false },
          ],
        }) as ConfigInput,
    });
    const client = new OpenAI({ baseURL: stack.baseURL, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0 });
    for (const model of ['gpt-4o', 'claude-3-5-haiku-20241022']) {
      const err = await failedCall(client, model);
      // The gateway's own credentials were refused: a 502 of the gateway's, the provider's headers not passed on.
      expect(err.status).toBe(502);
      const reqId = err.headers?.get('x-stormgate-request-id') ?? null;
      // A request's line follows its answer by a tick or two.
      await expect.poll(() => stack!.logs.some((l) => (JSON.parse(l) as Record<string, unknown>).reqId === reqId)).toBe(true);
      const line = lineOf(stack, reqId);
      expect(line.upstreamRequestId).toBe('req_[redacted]');
      expect(JSON.stringify(line)).not.toContain('key-0123456789');
    }
  });
});
