// Client keys (auth.keys): with them, only a request that carries one spends the providers' keys; the SDKs see the
// OpenAI-shaped 401 they raise as an authentication error, and the key never reaches a log or the provider.
import { describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { parseConfig, ConfigError } from '../src/config/load.ts';
import { clientAuth } from '../src/http/client-auth.ts';
import { defaultConfig, TEST_KEY, useStacks, type Stack } from './helpers/stack.ts';
import { expectOpenAIError } from './helpers/openai-error.ts';
import { TEST_SECRETS } from './helpers/test-secrets.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';

const [AGENTS_KEY, BATCH_KEY, WRONG_KEY] = TEST_SECRETS.slice(-3) as [string, string, string];
const KEYS = { agents: AGENTS_KEY, 'batch-jobs': BATCH_KEY };

const startStack = useStacks();
const guarded = (): Promise<Stack> =>
  startStack({
    config: (mockUrl) => ({ ...defaultConfig(mockUrl), auth: { keys: KEYS }, passthrough: { provider: 'mock', paths: ['/v1/files'], methods: ['GET'] } }),
  });
const sdk = (s: Stack, apiKey: string) => new OpenAI({ baseURL: s.baseURL, apiKey, maxRetries: 2 });
const messages = [{ role: 'user' as const, content: 'hi' }];

describe('client keys', () => {
  it('serves a client that sends one of the keys, logs its name, and sends the provider its own key', async () => {
    const s = await guarded();
    const answer = await sdk(s, AGENTS_KEY).chat.completions.create({ model: 'gpt-4o', messages });
    expect(answer.choices[0]!.message.content).toBeTruthy();
    let text = '';
    for await (const chunk of await sdk(s, BATCH_KEY).chat.completions.create({ model: 'gpt-4o', messages, stream: true })) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text).not.toBe('');
    expect(s.mock.requests().map((r) => r.headers.authorization)).toEqual([`Bearer ${TEST_KEY}`, `Bearer ${TEST_KEY}`]);
    const lines = s.logs.filter((l) => l.includes('"msg":"request"')).map((l) => JSON.parse(l) as { client?: string });
    expect(lines.map((l) => l.client)).toEqual(['agents', 'batch-jobs']);
    expect(s.logs.join('')).not.toContain(AGENTS_KEY);
  });

  it('answers a wrong key 401 invalid_api_key, which the SDK does not retry, and nothing goes upstream', async () => {
    const s = await guarded();
    const err = await sdk(s, WRONG_KEY).chat.completions.create({ model: 'gpt-4o', messages }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.AuthenticationError);
    const e = err as InstanceType<typeof OpenAI.AuthenticationError>;
    expect(e.status).toBe(401);
    expect(e.code).toBe('invalid_api_key');
    expect(e.message).not.toContain(WRONG_KEY);
    expect(e.headers?.get('www-authenticate')).toBe('Bearer realm="stormgate"');
    expect(e.headers?.get('x-should-retry')).toBe('false');
    expect(s.mock.requests()).toHaveLength(0);
    // One line for the one HTTP request: the SDK (maxRetries 2) made no retry.
    expect(s.logs.filter((l) => l.includes('"status":401'))).toHaveLength(1);
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toMatch(/^stormgate_requests_total\{route="none",target="none",priority="none",outcome="rejected"\} 1$/m);
  });

  it('reads the key from x-api-key and api-key too, and names a missing key as missing', async () => {
    const s = await guarded();
    const post = (headers: Record<string, string>) =>
      fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify({ model: 'gpt-4o', messages }) });
    expect((await post({ 'x-api-key': AGENTS_KEY })).status).toBe(200);
    expect((await post({ 'api-key': BATCH_KEY })).status).toBe(200);
    for (const headers of [{}, { authorization: 'Bearer ' }, { authorization: `Basic ${AGENTS_KEY}` }] as Array<Record<string, string>>) {
      const res = await post(headers);
      expect(res.status).toBe(401);
      const body = expectOpenAIError(await res.json(), 'invalid_api_key');
      expect(String(body.message)).toMatch(/needs a client key: .*Authorization: Bearer <key>, x-api-key or api-key/);
    }
    const wrong = await post({ authorization: `Bearer ${WRONG_KEY}` });
    expect(String(expectOpenAIError(await wrong.json(), 'invalid_api_key').message)).toMatch(/not one of this gateway's keys/);
  });

  it('guards every path but the ops endpoints: models, passthrough and unknown paths need a key; health and metrics do not', async () => {
    const s = await guarded();
    for (const path of ['/v1/models', '/v1/models/gpt-4o', '/v1/files', '/v1/nothing-here']) {
      expect((await fetch(`${s.url}${path}`)).status, path).toBe(401);
    }
    expect((await fetch(`${s.url}/v1/models`, { headers: { authorization: `Bearer ${AGENTS_KEY}` } })).status).toBe(200);
    expect((await fetch(`${s.url}/v1/nothing-here`, { headers: { authorization: `Bearer ${AGENTS_KEY}` } })).status).toBe(404);
    for (const path of ['/healthz', '/readyz', '/metrics']) expect((await fetch(`${s.url}${path}`)).status, path).toBe(200);
    // The passthrough request was refused before it was forwarded.
    expect(s.mock.requests().filter((r) => r.path === '/v1/files')).toHaveLength(0);
  });

  it("puts a client's requests in the class its key names (auth.priority), which its header can lower but not raise", async () => {
    const s = await startStack({
      config: (mockUrl) => ({ ...defaultConfig(mockUrl), auth: { keys: KEYS, priority: { 'batch-jobs': 'batch' } } }),
    });
    const ask = (key: string, headers: Record<string, string> = {}) =>
      sdk(s, key).chat.completions.create({ model: 'gpt-4o', messages }, { headers });
    await ask(BATCH_KEY);
    await ask(BATCH_KEY, { 'x-stormgate-priority': 'online' });
    await ask(AGENTS_KEY);
    await ask(AGENTS_KEY, { 'x-stormgate-priority': 'batch' });
    const lines = s.logs.filter((l) => l.includes('"msg":"request"')).map((l) => JSON.parse(l) as { client: string; priority: string });
    expect(lines.map((l) => `${l.client} ${l.priority}`)).toEqual(['batch-jobs batch', 'batch-jobs batch', 'agents online', 'agents batch']);
  });

  it('matches keys by their hash, exactly: no prefix, no other case', () => {
    const check = clientAuth(KEYS)!;
    expect(check({ authorization: `Bearer ${AGENTS_KEY}` })).toEqual({ ok: true, client: 'agents' });
    expect(check({ authorization: `bearer ${AGENTS_KEY}  ` })).toEqual({ ok: true, client: 'agents' });
    expect(check({ authorization: `Bearer ${AGENTS_KEY.slice(0, -1)}` })).toEqual({ ok: false, reason: 'invalid' });
    expect(check({ authorization: `Bearer ${AGENTS_KEY.toUpperCase()}` })).toEqual({ ok: false, reason: 'invalid' });
    expect(check({})).toEqual({ ok: false, reason: 'missing' });
    // An authorization of another scheme (a proxy's Basic credentials), or an empty one, leaves the other headers read.
    expect(check({ authorization: 'Basic dXNlcjpwdw==', 'x-api-key': AGENTS_KEY })).toEqual({ ok: true, client: 'agents' });
    expect(check({ authorization: '', 'api-key': BATCH_KEY })).toEqual({ ok: true, client: 'batch-jobs' });
    expect(check({ authorization: 'Basic dXNlcjpwdw==' })).toEqual({ ok: false, reason: 'missing' });
    expect(clientAuth(undefined)).toBeUndefined();
  });
});

describe('a client key in the query string', () => {
  const startProvider = useFakeProviders();

  it('is taken out of the URL the provider gets, on a managed path and a passthrough one; the other parameters go on', async () => {
    const urls: string[] = [];
    const provider = await startProvider((req, res) => {
      urls.push(req.url ?? '');
      res.setHeader('content-type', 'application/json');
      if (req.url?.startsWith('/v1/files')) res.end(JSON.stringify({ object: 'list', data: [] }));
      else res.end(JSON.stringify({ id: 'c1', object: 'chat.completion', created: 1, model: 'gpt-4o', choices: [{ index: 0, message: { role: 'assistant', content: 'hi' }, finish_reason: 'stop' }] }));
    });
    const s = await startStack({
      config: () => ({ ...defaultConfig(provider.origin), auth: { keys: KEYS }, passthrough: { provider: 'mock', paths: ['/v1/files'], methods: ['GET'] } }),
    });
    const chat = await fetch(`${s.baseURL}/chat/completions?key=${AGENTS_KEY}&trace=1`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${AGENTS_KEY}` },
      body: JSON.stringify({ model: 'gpt-4o', messages }),
    });
    expect(chat.status).toBe(200);
    const files = await fetch(`${s.baseURL}/files?api-key=${encodeURIComponent(AGENTS_KEY)}&limit=2`, { headers: { 'x-api-key': AGENTS_KEY } });
    expect(files.status).toBe(200);
    const only = await fetch(`${s.baseURL}/files?key=${AGENTS_KEY}`, { headers: { 'x-api-key': AGENTS_KEY } });
    expect(only.status).toBe(200);
    expect(urls).toEqual(['/v1/chat/completions?trace=1', '/v1/files?limit=2', '/v1/files']);
    expect(urls.join('')).not.toContain(AGENTS_KEY);
  });
});

describe('auth config', () => {
  const base = 'providers: { p: { family: openai, baseUrl: "http://127.0.0.1:1/v1", apiKey: k } }\nroutes: [ { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: p } ] } ]\n';
  const error = (text: string, env: NodeJS.ProcessEnv = {}) => {
    try {
      parseConfig(base + text, 'gw.yaml', env);
    } catch (err) {
      expect(err).toBeInstanceOf(ConfigError);
      return (err as Error).message;
    }
    throw new Error('the config loaded');
  };

  it('refuses an empty key, naming the client, the line and the variable', () => {
    expect(error('auth: { keys: { agents: "${AGENTS_KEY:-}" } }\n')).toMatch(/gw\.yaml:3: auth\.keys\.agents: is empty/);
    expect(error('auth: { keys: { agents: "${AGENTS_KEY}" } }\n')).toMatch(/environment variable AGENTS_KEY is not set/);
  });

  it('refuses a key beyond ASCII, which one client sends as Latin-1 and another as UTF-8', () => {
    expect(error('auth: { keys: { agents: "clé-secrète-1234" } }\n')).toMatch(/gw\.yaml:3: auth\.keys\.agents: holds a character beyond ASCII/);
    expect(parseConfig(`${base}auth: { keys: { agents: "key with spaces_1.-~!" } }\n`, 'gw.yaml', {}).auth?.keys.agents).toBe('key with spaces_1.-~!');
  });

  it('refuses a client priority for a client or a class that does not exist', () => {
    expect(error('auth: { keys: { a: key-a-1234 }, priority: { b: batch } }\n')).toMatch(/auth\.priority\.b: no client "b" in auth\.keys; expected one of: a/);
    expect(error('auth: { keys: { a: key-a-1234 }, priority: { a: bulk } }\n')).toMatch(/auth\.priority\.a: "bulk" is not a priority class of any provider; expected one of: online, batch/);
  });

  it('refuses one key under two names, and an auth without keys', () => {
    expect(error('auth: { keys: { a: same-key-1234, b: same-key-1234 } }\n')).toMatch(/auth\.keys\.b: is the same key as client "a"/);
    expect(error('auth: { keys: {} }\n')).toMatch(/auth\.keys: lists no client/);
    expect(error('auth: { key: x }\n')).toMatch(/auth: unknown key "key"; did you mean "keys"\?/);
  });

  it('leaves the gateway open without auth', () => {
    expect(parseConfig(base, 'gw.yaml', {}).auth).toBeUndefined();
  });
});
