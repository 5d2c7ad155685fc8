// The mock's advertised quota (x-ratelimit-*-requests) follows a per-model `requestsPerMinute` override, as the fault
// spec says every field of `models` does, and counts that model's requests apart. A black-box run set one model's
// quota to 100 and saw the global 100000 advertised, so the gateway's quota hold (batch waits when at most 2% is
// left) could not be reproduced per model.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startMock, type MockServer } from '../src/mock/server.ts';

describe('the mock quota headers', () => {
  let mock: MockServer;
  beforeAll(async () => {
    mock = await startMock({ quiet: true, faults: { requestsPerMinute: 1_000, models: { small: { requestsPerMinute: 10 } } } });
  });
  afterAll(async () => {
    await mock.close();
  });
  const quota = async (model: string) => {
    const res = await fetch(`${mock.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model, messages: [{ role: 'user', content: 'x' }] }) });
    await res.arrayBuffer();
    return [res.headers.get('x-ratelimit-limit-requests'), Number(res.headers.get('x-ratelimit-remaining-requests'))] as const;
  };

  it('advertise a model\'s own requestsPerMinute and count its requests apart from the global quota', async () => {
    const [limit, first] = await quota('small');
    expect(limit).toBe('10');
    const [, second] = await quota('small');
    // The minute may turn between the two requests (then the count starts over at 9).
    expect([first - 1, 9]).toContain(second);
    const [globalLimit, globalLeft] = await quota('gpt-4o');
    expect(globalLimit).toBe('1000');
    expect(globalLeft).toBeGreaterThanOrEqual(998);
  });
});
