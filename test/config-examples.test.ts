// The configs in config/examples are what users copy: each one must load as shipped and do what its comments
// promise, against the bundled mock with the official openai SDK (and the Anthropic SDK for Anthropic's API).
import { readdirSync } from 'node:fs';
import { resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { Redis } from 'ioredis';
import { loadConfigFile } from '../src/config/load.ts';
import type { ConfigInput } from '../src/config/schema.ts';
import { TEST_KEY, useStacks } from './helpers/stack.ts';
import { freePort } from './helpers/free-port.ts';
import { startRedis, type RedisHandle } from './helpers/redis-server.ts';
import { eventually } from './helpers/redis-stores.ts';

const DIR = resolve(import.meta.dirname, '../config/examples');
const example = (name: string) => resolve(DIR, name);

/** Every variable the examples read, pointed at the test's mock (and Redis); keys are the mock's. */
function envFor(mockUrl: string, extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  return {
    OPENAI_BASE_URL: `${mockUrl}/v1`,
    OPENAI_API_KEY: TEST_KEY,
    ANTHROPIC_BASE_URL: mockUrl,
    ANTHROPIC_API_KEY: TEST_KEY,
    ...CLIENT_ENV,
    ...extra,
  };
}

const fromExample = (name: string, extra: (mockUrl: string) => Record<string, string> = () => ({})) => (mockUrl: string) =>
  // Config is ConfigInput with its defaults filled in; parsing it again changes nothing.
  loadConfigFile(example(name), envFor(mockUrl, extra(mockUrl))) as ConfigInput;

/** The client keys of the examples that need them; the others ignore what the client sends. */
const CLIENT_KEY = 'sg-client-agents-key';
const BATCH_KEY = 'sg-client-batch-key';
const CLIENT_ENV = { STORMGATE_API_KEY: CLIENT_KEY, STORMGATE_KEY_AGENTS: CLIENT_KEY, STORMGATE_KEY_BATCH: BATCH_KEY };
/** The variables some example requires (a provider key, Redis); the others have defaults or are optional. */
const REQUIRED_ENV = { OPENAI_API_KEY: 'sk-x', ANTHROPIC_API_KEY: 'sk-ant-x', REDIS_URL: 'redis://127.0.0.1:6390', ...CLIENT_ENV };
const client = (baseURL: string) => new OpenAI({ baseURL, apiKey: CLIENT_KEY, maxRetries: 0 });
const ask = (baseURL: string, model: string) =>
  client(baseURL).chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }] }).withResponse();

describe('config/examples', () => {
  const stack = useStacks();
  let redis: RedisHandle;
  beforeAll(async () => {
    redis = await startRedis();
  });
  afterAll(async () => {
    await redis?.stop();
  });

  it('every example loads as shipped, with only its required variables set', () => {
    const files = readdirSync(DIR).filter((f) => f.endsWith('.yaml'));
    expect(files.length).toBeGreaterThanOrEqual(4);
    for (const file of files) {
      expect(() => loadConfigFile(example(file), REQUIRED_ENV), file).not.toThrow();
    }
  });

  it('an example that listens beyond this machine needs client keys, as main.ts warns for one without', () => {
    for (const file of readdirSync(DIR).filter((f) => f.endsWith('.yaml'))) {
      const config = loadConfigFile(example(file), REQUIRED_ENV);
      if (!['127.0.0.1', 'localhost', '::1'].includes(config.server.host)) expect(config.auth?.keys, file).toBeDefined();
    }
  });

  it('openai-anthropic-failover: answers from Anthropic, in the OpenAI shape, while OpenAI fails', async () => {
    const s = await stack({ config: fromExample('openai-anthropic-failover.yaml') });
    s.mock.setFaults({ models: { 'gpt-4o': { errors: [{ status: 503 }] } } });
    const { data, response } = await ask(s.baseURL, 'gpt-4o');
    expect(data.choices[0]!.message.content).toBeTruthy();
    expect(response.headers.get('x-stormgate-target')).toBe('anthropic/claude-sonnet-4-6');
    const paths = s.mock.requests().map((r) => `${r.path} ${r.model}`);
    expect(paths).toContain('/v1/chat/completions gpt-4o');
    expect(paths).toContain('/v1/messages claude-sonnet-4-6');

    // The small-model route has its own backup.
    s.mock.setFaults({ models: { 'gpt-4o-mini': { errors: [{ status: 503 }] } } });
    const small = await ask(s.baseURL, 'gpt-4o-mini');
    expect(small.response.headers.get('x-stormgate-target')).toBe('anthropic/claude-haiku-4-5');
  });

  it('anthropic-agents: the Anthropic SDK is answered by the backup account while the first is overloaded', async () => {
    const s = await stack({ config: fromExample('anthropic-agents.yaml', (url) => ({ ANTHROPIC_UPSTREAM_URL: url, ANTHROPIC_BACKUP_UPSTREAM_URL: url, ANTHROPIC_BACKUP_API_KEY: TEST_KEY })) });
    // The first account's three attempts get 529; the backup's first is answered.
    s.mock.setFaults({ errors: [{ status: 529, times: 3 }] });
    const claude = new Anthropic({ baseURL: s.url, apiKey: 'unused', maxRetries: 0 });
    const { data, response } = await claude.messages.create({ model: 'claude-sonnet-4-6', max_tokens: 64, messages: [{ role: 'user', content: 'hi' }] }).withResponse();
    expect(data.content[0]!.type).toBe('text');
    expect(response.headers.get('x-stormgate-target')).toBe('anthropic-backup/claude-sonnet-4-6');
    expect(s.mock.stats().byStatus).toEqual({ 200: 1, 529: 3 });
    const counted = await claude.messages.countTokens({ model: 'claude-sonnet-4-6', messages: [{ role: 'user', content: 'hi' }] });
    expect(counted.input_tokens).toBeGreaterThan(0);
  });

  it('fleet-redis: serves through the shared Redis state', async () => {
    const prefix = `examples-${process.pid}`;
    const s = await stack({ config: fromExample('fleet-redis.yaml', () => ({ REDIS_URL: redis.url, STORMGATE_FLEET: prefix, STORMGATE_API_KEY: CLIENT_KEY })) });
    const { data, response } = await ask(s.baseURL, 'gpt-4o');
    expect(data.choices[0]!.message.content).toBeTruthy();
    expect(response.headers.get('x-stormgate-target')).toBe('openai/gpt-4o');
    // The request was counted in the fleet's keys (the store writes behind the request, so not at once).
    const keys = new Redis(redis.url);
    try {
      await eventually(async () => (await keys.keys(`${prefix}*`)).length > 0, 5_000);
    } finally {
      keys.disconnect();
    }
  });

  it('priority-pools: a batch model name reaches the provider as the real model', async () => {
    const s = await stack({ config: fromExample('priority-pools.yaml') });
    const { response } = await ask(s.baseURL, 'gpt-4o-mini-batch');
    expect(response.headers.get('x-stormgate-target')).toBe('openai/gpt-4o-mini');
    expect(s.mock.requests().at(-1)!.model).toBe('gpt-4o-mini');
    const models = await client(s.baseURL).models.list();
    expect(models.data.map((m) => m.id)).toContain('gpt-4o-mini-batch');
    // The batch team's key puts even its gpt-4o requests in the batch class.
    await new OpenAI({ baseURL: s.baseURL, apiKey: BATCH_KEY, maxRetries: 0 }).chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    const last = JSON.parse(s.logs.filter((l) => l.includes('"msg":"request"')).at(-1)!) as { client: string; route: string; priority: string };
    expect(last).toMatchObject({ client: 'batch-jobs', route: 'chat', priority: 'batch' });
  });

  it('self-hosted-with-cloud-backup: the cloud answers while the local server is down; files pass through', async () => {
    // Nothing listens on this port: the local server is down.
    const down = `http://127.0.0.1:${await freePort()}/v1`;
    const s = await stack({ config: fromExample('self-hosted-with-cloud-backup.yaml', () => ({ VLLM_BASE_URL: down })) });
    const { data, response } = await ask(s.baseURL, 'anything');
    expect(data.choices[0]!.message.content).toBeTruthy();
    expect(response.headers.get('x-stormgate-target')).toBe('openai/gpt-4o-mini');
    // Passthrough: the mock has no files API, so its own 404 proves the request was forwarded, with the key swapped.
    const files = await fetch(`${s.baseURL}/files`, { headers: { authorization: 'Bearer client-key' } });
    expect(files.status).toBe(404);
    expect(await files.text()).toMatch(/Invalid URL \(GET \/v1\/files\)/);
    expect(s.mock.requests().at(-1)!.headers.authorization).toBe(`Bearer ${TEST_KEY}`);
  });
});
