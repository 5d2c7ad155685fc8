import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { afterAll, beforeAll, beforeEach } from 'vitest';
import { startMock, type MockServer } from '../../src/mock/server.ts';

export interface MockSdks {
  mock: MockServer;
  openai: OpenAI;
  anthropic: Anthropic;
}

/**
 * The mock with both official SDKs pointed at it (no retries of their own), for one describe block: started once,
 * closed after it, its faults, brownout and counts cleared before each test. Filled in by its beforeAll.
 */
export function mockWithSdks(): MockSdks {
  const s = {} as MockSdks;
  beforeAll(async () => {
    s.mock = await startMock({ quiet: true });
    s.openai = new OpenAI({ baseURL: `${s.mock.url}/v1`, apiKey: 'k', maxRetries: 0, logLevel: 'off' });
    s.anthropic = new Anthropic({ baseURL: s.mock.url, apiKey: 'k', maxRetries: 0, logLevel: 'off' });
  });
  afterAll(async () => {
    await s.mock?.close();
  });
  beforeEach(() => {
    s.mock.brownout('503', 0);
    s.mock.setFaults({});
    s.mock.reset();
  });
  return s;
}
