// Tests that kill the mutants of src/routing/ and src/config/ that the existing tests let survive: the router's
// answer for a path no route serves, a configured model's own target key, what GET /v1/models lists (the routes of the
// paths a client can call, no disabled provider, a provider's list cached for its time and kept through a failure), and
// what a bad config says at start-up: the variables a value came from, a copied value's own complaint left out, each
// missing variable once, a list item's own line, the key meant (short and capitalised keys, a renamed provider key),
// an alias that no anchor above it sets, a quantity's text quoted, and the one-wait-rule warning at its boundary.
// Unit tests; a node:http provider on loopback for the models list, on a fake clock.
import type { RequestListener } from 'node:http';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { configWarnings } from '../src/config/warnings.ts';
import { configErrorOf, validConfigText } from './helpers/config-text.ts';
import { createProviderClients } from '../src/providers/provider-client.ts';
import { createModelsList } from '../src/routing/models-list.ts';
import { createRouter } from '../src/routing/router.ts';
import { MAX_LEARNED_MODELS, TargetKeys } from '../src/routing/target-keys.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';

const startProvider = useFakeProviders();

const provider = (baseUrl = 'http://127.0.0.1:9/v1') => ({ family: 'openai' as const, baseUrl, apiKey: 'k' });

describe('the router', () => {
  const config = ConfigSchema.parse({
    providers: { oa: provider() },
    routes: [{ name: 'chat', match: { path: '/v1/chat/completions', models: ['gpt-4o'] }, targets: [{ provider: 'oa' }] }],
  });

  it('answers unknown_url for a path no route serves, and model_not_found for a model the path\'s routes do not take', () => {
    const router = createRouter(config);
    expect(router.match('/v1/embeddings', 'gpt-4o')).toEqual({ error: 'unknown_url' });
    expect(router.match('/v1/chat/completions', 'gpt-5')).toEqual({ error: 'model_not_found' });
  });
});

describe('target keys', () => {
  it("give a target's configured model its own key though every learning place is taken", () => {
    const config = ConfigSchema.parse({
      providers: { oa: provider() },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'oa', model: 'pinned' }] }],
    });
    const keys = new TargetKeys(config);
    for (let i = 0; i < MAX_LEARNED_MODELS; i++) keys.key('oa', `m-${i}`);
    expect(keys.key('oa', 'late')).toBe('oa/other');
    expect(keys.key('oa', 'pinned')).toBe('oa/pinned');
  });
});

describe('GET /v1/models', () => {
  /** A provider whose listing answers from `models()` (an array of ids) or fails with 401 when it returns undefined. */
  async function listingProvider(models: () => string[] | undefined) {
    const handler: RequestListener = (req, res) => {
      req.resume();
      const ids = models();
      if (ids === undefined) return res.writeHead(401, { 'content-type': 'application/json' }).end('{"error":{"message":"no"}}');
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ object: 'list', data: ids.map((id) => ({ id, object: 'model', created: 1, owned_by: 'p' })) }));
    };
    return startProvider(handler);
  }

  function modelsOf(input: ConfigInput, now: () => number = Date.now) {
    const config = ConfigSchema.parse(input);
    const clients = createProviderClients(config);
    return { models: createModelsList(createRouter(config), clients, { now }), close: () => Promise.all([...clients.values()].map((c) => c.dispatcher.close())) };
  }

  it('lists to a client of one API only the models of the routes on the paths it can call', async () => {
    const { models, close } = modelsOf({
      providers: { oa: provider() },
      routes: [
        { name: 'chat', match: { path: '/v1/chat/completions', models: ['smart'] }, targets: [{ provider: 'oa', model: 'gpt-4o' }] },
        { name: 'embed', match: { path: '/v1/embeddings', models: ['text-embedding-3-small'] }, targets: [{ provider: 'oa' }] },
      ],
    });
    expect((await models.list(new Set(['/v1/embeddings']))).data.map((m) => m.id)).toEqual(['text-embedding-3-small']);
    expect(await models.retrieve('smart', new Set(['/v1/embeddings']))).toBeUndefined();
    expect((await models.list()).data.map((m) => m.id)).toEqual(['smart', 'text-embedding-3-small']);
    await close();
  });

  it('does not ask an optional provider left without a key, whose models no request can get', async () => {
    const p = await listingProvider(() => ['gpt-4o']);
    const { models, close } = modelsOf({
      providers: { oa: { ...provider(`${p.origin}/v1`), optional: true, apiKey: '' } },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'oa' }] }],
    });
    expect((await models.list()).data).toEqual([]);
    expect(p.hits()).toBe(0);
    await close();
  });

  it("keeps a provider's list for five minutes, but asks again 30 s after a failure", async () => {
    let answer: string[] | undefined = ['gpt-4o'];
    const p = await listingProvider(() => answer);
    let now = 0;
    const { models, close } = modelsOf({ providers: { oa: provider(`${p.origin}/v1`) }, routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'oa' }] }] }, () => now);
    expect((await models.list()).data.map((m) => m.id)).toEqual(['gpt-4o']);
    now = 4 * 60_000;
    expect((await models.list()).data.map((m) => m.id)).toEqual(['gpt-4o']);
    expect(p.hits()).toBe(1);
    // Past the five minutes the provider is asked again; it fails, and the last good list is still served.
    answer = undefined;
    now = 5 * 60_000 + 1;
    expect((await models.list()).data.map((m) => m.id)).toEqual(['gpt-4o']);
    expect(p.hits()).toBe(2);
    now += 20_000;
    await models.list();
    expect(p.hits()).toBe(2);
    answer = ['gpt-4o', 'gpt-4.1'];
    now += 10_001;
    expect((await models.list()).data.map((m) => m.id)).toEqual(['gpt-4o', 'gpt-4.1']);
    expect(p.hits()).toBe(3);
    await close();
  });
});

describe('a config error', () => {
  const env = { OPENAI_API_KEY: 'sk-test' };
  const lines = (text: string, e: NodeJS.ProcessEnv = env) => configErrorOf(text, e).message.split('\n');
  /** The valid text with `extra` under the openai provider, after its apiKey. */
  const withProvider = (extra: string) => validConfigText().replace('    apiKey: ${OPENAI_API_KEY}\n', `    apiKey: \${OPENAI_API_KEY}\n${extra}`);

  it('names every variable a wrong value was built from, not the text they hold', () => {
    const text = validConfigText().replace('https://api.openai.com/v1', '"${SCHEME}://${HOST}"');
    const message = configErrorOf(text, { ...env, SCHEME: 'ftp', HOST: 'internal-host' }).message;
    expect(message).toBe('gw.yaml:4: providers.openai.baseUrl: expected a URL such as https://api.example.com/v1, received the value of $SCHEME, $HOST');
  });

  it('says an unset variable once, not again where an alias copied the empty value it left', () => {
    const text = withProvider('').replace('    apiKey: ${OPENAI_API_KEY}\n', '    apiKey: &k "${MISSING_KEY}"\n  backup:\n    family: openai\n    baseUrl: https://b.example.com/v1\n    apiKey: *k\n');
    expect(lines(text, {})).toEqual(['gw.yaml:5: providers.openai.apiKey: environment variable MISSING_KEY is not set']);
  });

  it('lists each missing variable once for the CLI, however many values use it', () => {
    const text = validConfigText().replace('https://api.openai.com/v1', '"${OPENAI_API_KEY}"');
    const err = configErrorOf(text, {});
    expect(err.issues).toHaveLength(2);
    expect(err.missingEnv).toEqual(['OPENAI_API_KEY']);
  });

  it("points at a wrong list item's own line in a block list", () => {
    expect(lines(validConfigText('    retry:\n      retryOn:\n        - 429\n        - 700\n'))).toEqual(['gw.yaml:13: routes[0].retry.retryOn[1]: must be <= 599, got 700']);
  });

  it('guesses no key from the first two letters of an unknown one, nor from a short word three edits away', () => {
    for (const key of ['ti', 'tags']) {
      expect(lines(validConfigText(`    ${key}: 5\n`))).toEqual([expect.stringMatching(new RegExp(`^gw\\.yaml:10: routes\\[0\\]: unknown key "${key}"; valid keys: name, match, targets,`))]);
    }
  });

  it('guesses the key meant when it is written in capitals with a typo', () => {
    expect(lines(validConfigText('    TIMEOUTMZ: 5\n'))).toEqual(['gw.yaml:10: routes[0]: unknown key "TIMEOUTMZ"; did you mean "timeoutMs"?']);
  });

  it("says a provider's renamed timeouts key was renamed, under any provider name", () => {
    expect(lines(withProvider('    timeouts: { connect: 5 }\n'))).toEqual(['gw.yaml:6: providers.openai.timeouts: unknown key "connect"; it was renamed to "connectMs"']);
  });

  it('quotes the text found where a rate belongs: a key named for tokens holds no secret', () => {
    expect(lines(withProvider('    pools: { tokensPerMinute: lots }\n'))).toEqual(['gw.yaml:6: providers.openai.pools.tokensPerMinute: expected number, received string ("lots")']);
  });

  it('suggests no anchor for an alias when the only close one is set below it', () => {
    expect(lines(`x-a: *timeoutz\nx-b: &timeouts { connectMs: 1 }\n${validConfigText()}`)).toEqual(['gw.yaml:1: x-a: alias *timeoutz names no anchor set above it']);
  });
});

describe('the start-up warning about a deadline too short to wait', () => {
  it('is given when the time left after the margin is exactly minAttemptMs', () => {
    const config = ConfigSchema.parse({
      providers: { p: provider() },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'p' }], timeoutMs: 1500, deadlineMarginMs: 500, minAttemptMs: 1000 }],
    });
    expect(configWarnings(config)).toEqual([expect.stringMatching(/^route chat: timeoutMs 1500 leaves 1000 ms after its deadline margin, no more than minAttemptMs 1000: no wait is ever taken/)]);
  });
});
