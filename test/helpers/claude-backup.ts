// The cross-family failover the suites drive most: a chat route whose OpenAI primary (the stack's mock) fails over to
// an Anthropic backup (a second mock, its answers translated), both without breakers, so each test's faults alone
// decide who answers.
import type { ConfigInput } from '../../src/config/schema.ts';
import { TEST_KEY } from './stack.ts';

type Route = ConfigInput['routes'][number];

/** The config for `startStack({ config })`: `url` is the stack's mock, `claudeUrl` the Anthropic backup's. */
export function claudeBackupConfig(url: string, claudeUrl: string, route: Partial<Route> = {}): ConfigInput {
  return {
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    providers: {
      openai: { family: 'openai', baseUrl: `${url}/v1`, apiKey: TEST_KEY, breaker: false },
      claude: { family: 'anthropic', baseUrl: claudeUrl, apiKey: 'claude-key', breaker: false },
    },
    routes: [
      {
        name: 'chat',
        match: { path: '/v1/chat/completions' },
        targets: [{ provider: 'openai' }, { provider: 'claude', model: 'claude-sonnet-4-5' }],
        retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 10, capMs: 10 } },
        budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 },
        park: false,
        ...route,
      } as Route,
    ],
  };
}
