// A credential hold is shared by a fleet through Redis, like a hold-off, but read as its own kind: a gateway that
// never saw the 401 itself skips the target at once with 502 upstream_auth_error, never parks, never answers 429.
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { defaultConfig, TEST_KEY, useExtraMocks, useGateways } from './helpers/stack.ts';
import { useRedisServer } from './helpers/redis-server.ts';

const redisServer = useRedisServer();

const startGateway = useGateways();
const startMock = useExtraMocks();

async function chat(url: string) {
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-stormgate-timeout-ms': '2000' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
  });
  const body = (await res.json()) as { error?: { code: string } };
  return { status: res.status, code: body.error?.code, shouldRetry: res.headers.get('x-should-retry') };
}

describe('a credential hold across a fleet on one Redis', () => {
  it('makes the other gateway answer 502 upstream_auth_error at once, without sending anything upstream', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 401 }] }, quiet: true, apiKey: TEST_KEY });
    // A generous command timeout: a busy machine's slow first command must not put the first instance on local state.
    const input: ConfigInput = { ...defaultConfig(mock.url), state: { redis: redisServer().url, keyPrefix: `cred${process.pid}`, commandTimeoutMs: 1000 } };
    const config = ConfigSchema.parse(input);
    const urls = [await startGateway(config), await startGateway(config)];
    expect(await chat(urls[0]!)).toMatchObject({ status: 502, code: 'upstream_auth_error' });
    await sleep(200); // the hold reaches the other instance by pub/sub
    const started = Date.now();
    expect(await chat(urls[1]!)).toEqual({ status: 502, code: 'upstream_auth_error', shouldRetry: 'false' });
    expect(Date.now() - started).toBeLessThan(500);
    expect(mock.stats().total).toBe(1);
  });
});
