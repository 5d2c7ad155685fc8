// An upstream 401 or 402 is the gateway's key or billing, whatever code its body names. Only a 403 can be a content
// decision (OpenRouter's moderation flag): a 401 or 402 whose body carries a content-policy code or type (a proxy in
// front of the provider that tags every refusal `content_filter`) must not pass its body, which quotes the gateway's
// key in part, to the client, nor keep the backup from answering.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import { classify } from '../src/policy/outcome.ts';
import { errorCodeOf } from '../src/providers/error-outcome.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { scripted, type Script, type Seen } from './helpers/scripted-provider.ts';
import { useStacks } from './helpers/stack.ts';

const startStack = useStacks();
const startProvider = useFakeProviders();

const messages = [{ role: 'user' as const, content: 'Draft the release note.' }];
const json = (status: number, body: unknown): Script => ({ status, headers: { 'content-type': 'application/json' }, steps: [JSON.stringify(body)] });
const completion = (content: string): Script =>
  json(200, {
    id: 'chatcmpl-1',
    object: 'chat.completion',
    created: 1741290958,
    model: 'gpt-4o',
    choices: [{ index: 0, message: { role: 'assistant', content }, logprobs: null, finish_reason: 'stop' }],
    usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 },
  });

/** A refused key, as a proxy that names every refusal a content filter answers it: the key's ends quoted. */
const keyRefused = (status: number) =>
  json(status, { error: { message: 'Incorrect API key provided: prim****6789. You can find your API key at https://example.test/keys.', type: 'content_filter', param: null, code: 'content_policy_violation' } });

/** A gateway whose route tries `primary` (played by `answer` on each request), then, `withBackup`, a healthy backup. */
async function gateway(answer: () => Script, withBackup: boolean) {
  const seen: Record<string, Seen[]> = { primary: [], backup: [] };
  const providers: ConfigInput['providers'] = {};
  const answers: Record<string, () => Script> = { primary: answer, ...(withBackup && { backup: () => completion('from the backup') }) };
  for (const [name, answer] of Object.entries(answers)) {
    const p = await startProvider(scripted(answer, seen[name]));
    providers[name] = { family: 'openai', baseUrl: `${p.origin}/v1`, apiKey: `${name}-key-0123456789`, breaker: false };
  }
  const s = await startStack({
    config: () => ({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers,
      routes: [
        {
          name: 'chat',
          match: { path: '/v1/chat/completions' },
          targets: withBackup ? [{ provider: 'primary' }, { provider: 'backup' }] : [{ provider: 'primary' }],
          retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } },
          park: false,
        },
      ],
    }),
  });
  return { s, seen, client: new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0 }) };
}

describe('an upstream 401 or 402 with a content-policy code', () => {
  it('is classified as the credentials it is; a 403 with the same code stays a content-policy decision', () => {
    for (const status of [401, 402]) {
      const body = Buffer.from(JSON.stringify({ error: { message: 'refused', type: 'content_filter', param: null, code: 'content_policy_violation' } }));
      expect(classify({ kind: 'http', status, errorCode: errorCodeOf(status, body), hint: undefined }).cls).toBe('credentials');
    }
    expect(classify({ kind: 'http', status: 403, errorCode: 'content_policy_violation', hint: undefined }).cls).toBe('content-policy');
  });

  for (const status of [401, 402]) {
    it(`fails a ${status} over to the backup with the credentials reason, the primary asked once`, async () => {
      const g = await gateway(() => keyRefused(status), true);
      const res = await g.client.chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
      expect(res.data.choices[0]!.message.content).toBe('from the backup');
      expect(res.response.headers.get('x-stormgate-fallback')).toBe('credentials');
      expect(g.seen.primary).toHaveLength(1);
    });

    it(`answers a lone ${status} with 502 upstream_auth_error, never the body that quotes the key`, async () => {
      const g = await gateway(() => keyRefused(status), false);
      const res = await fetch(`${g.s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages }) });
      expect(res.status).toBe(502);
      const text = await res.text();
      expect(text).toContain('upstream_auth_error');
      expect(text).not.toContain('prim****6789');
    });
  }
});

// xAI answers a request its usage guidelines refuse with a 403 whose code, `permission-denied`, it also gives a team
// refused the endpoint: only the words tell. Read as the gateway's key, one user's prompt was routed around the safety
// decision to the backup and took xAI away from every request for authHoldS.
const XAI_CONTENT_403 = { code: 'permission-denied', error: 'Content violates usage guidelines. ' };
const XAI_ACCESS_403 = { code: 'permission-denied', error: 'Access to the chat endpoint is denied' };

describe("xAI's 403 for content its usage guidelines refuse", () => {
  it('is a content-policy decision: passed on, the backup never asked, xAI not held for the next request', async () => {
    let refuse = true;
    const g = await gateway(() => (refuse ? json(403, XAI_CONTENT_403) : completion('from xai')), true);
    const err = await g.client.chat.completions.create({ model: 'grok-3', messages }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(403);
    expect((err as InstanceType<typeof OpenAI.APIError>).message).toContain('usage guidelines');
    expect(g.seen.backup).toHaveLength(0);
    expect(g.seen.primary).toHaveLength(1);
    refuse = false;
    const next = await g.client.chat.completions.create({ model: 'grok-3', messages });
    expect(next.choices[0]!.message.content).toBe('from xai');
    expect(g.seen.backup).toHaveLength(0);
  });

  it('is told by its words only: the same code refusing the endpoint stays the gateway\'s credentials', () => {
    const code = (body: unknown) => errorCodeOf(403, Buffer.from(JSON.stringify(body)));
    expect(classify({ kind: 'http', status: 403, errorCode: code(XAI_CONTENT_403), hint: undefined }).cls).toBe('content-policy');
    expect(classify({ kind: 'http', status: 403, errorCode: code(XAI_ACCESS_403), hint: undefined }).cls).toBe('credentials');
    // Quoted, not said: a message that merely contains the words is no refusal of the request.
    expect(classify({ kind: 'http', status: 403, errorCode: code({ error: 'team t1 is blocked. Content violates usage guidelines.' }), hint: undefined }).cls).toBe('credentials');
    // Only a 403: a 401 in those words is still the key.
    expect(classify({ kind: 'http', status: 401, errorCode: errorCodeOf(401, Buffer.from(JSON.stringify(XAI_CONTENT_403))), hint: undefined }).cls).toBe('credentials');
  });
});
