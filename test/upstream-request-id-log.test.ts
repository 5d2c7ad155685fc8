// A developer quotes the request id their SDK shows (`err.requestID`, the `x-request-id` of the answer) to the team that
// runs the gateway. On an upstream error passed on, that id is the provider's: the request's log line must name it
// (`upstreamRequestId`), as it does for a success, or the id leads nowhere in the gateway's logs.
import { afterEach, describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { RETRY_LOOP_ONLY, startStack, TEST_KEY, type Stack } from './helpers/stack.ts';

let stack: Stack | undefined;
afterEach(async () => {
  await stack?.close();
  stack = undefined;
});

async function failedCall(client: OpenAI): Promise<InstanceType<typeof OpenAI.APIError>> {
  try {
    await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
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
