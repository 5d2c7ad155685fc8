// A request body nested thousands deep is valid JSON (JSON.parse takes it) that the gateway's own recursion cannot
// follow: translating it for an Anthropic target, or writing it again with a target's model, overflowed the stack.
// That is the client's request to fix (400), not a gateway failure (a 500 the SDKs retry).
import { describe, expect, it } from 'vitest';
import { defaultConfig, TEST_KEY, useStacks } from './helpers/stack.ts';

const startStack = useStacks();
const DEPTH = 20_000;
const deepSchema = `${'{"type":"array","items":'.repeat(DEPTH)}{"type":"string"}${'}'.repeat(DEPTH)}`;
const deepList = `${'['.repeat(DEPTH)}"x"${']'.repeat(DEPTH)}`;

async function post(url: string, body: string): Promise<{ status: number; code: string | null; shouldRetry: string | null }> {
  const res = await fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
  const json = (await res.json()) as { error: { code: string | null } };
  return { status: res.status, code: json.error.code, shouldRetry: res.headers.get('x-should-retry') };
}

describe('deeply nested request bodies', () => {
  it('a tool schema nested 20,000 deep for an Anthropic target: 400 invalid_body, not 500', async () => {
    const s = await startStack({
      config: (url) => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: { claude: { family: 'anthropic', baseUrl: url, apiKey: TEST_KEY, breaker: false } },
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'claude', model: 'claude-sonnet-4-5' }] }],
      }),
    });
    const body = `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":${deepSchema}}}}}]}`;
    expect(await post(s.url, body)).toEqual({ status: 400, code: 'invalid_body', shouldRetry: 'false' });
    expect(s.mock.stats().total).toBe(0);
  });

  it('a metadata value nested 20,000 deep for an OpenAI target that swaps the model: 400 invalid_body, not 500', async () => {
    const s = await startStack({
      config: (url) => {
        const c = defaultConfig(url);
        return { ...c, routes: c.routes.map((r) => ({ ...r, targets: [{ provider: 'mock', model: 'gpt-4o-mini' }] })) };
      },
    });
    const body = `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"metadata":${deepList}}`;
    expect(await post(s.url, body)).toEqual({ status: 400, code: 'invalid_body', shouldRetry: 'false' });
  });
});
