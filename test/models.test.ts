// GET /v1/models and GET /v1/models/{model}: only models a client can request, provider lists fetched once, in
// parallel and cached (failures too), and the SDK's models.list() and models.retrieve() over real HTTP.
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import { startMock, type MockServer } from '../src/mock/server.ts';
import { TEST_KEY, useStacks, type Stack } from './helpers/stack.ts';
import type { ConfigInput } from '../src/config/schema.ts';
import { asAnthropicPage } from '../src/routing/models-list.ts';

const startStack = useStacks();
let stack: Stack;
let extra: MockServer | undefined;

afterEach(async () => {
  await extra?.close();
  extra = undefined;
});

const messages = [{ role: 'user' as const, content: 'hi' }];

function sdk(s: Stack): OpenAI {
  return new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 });
}

/** The repro's config: a glob route whose Anthropic fallback names its own model, plus an exact route. */
function fallbackConfig(mockUrl: string): ConfigInput {
  return {
    server: { host: '127.0.0.1', port: 0 },
    providers: {
      openai: { family: 'openai', baseUrl: `${mockUrl}/v1`, apiKey: TEST_KEY },
      anthropic: { family: 'anthropic', baseUrl: mockUrl, apiKey: TEST_KEY },
    },
    routes: [
      {
        name: 'chat',
        match: { path: '/v1/chat/completions', models: ['gpt-4o*'] },
        targets: [{ provider: 'openai' }, { provider: 'anthropic', model: 'claude-sonnet-4-5' }],
      },
      { name: 'llama', match: { path: '/v1/chat/completions', models: ['meta-llama/Llama-3-8b'] }, targets: [{ provider: 'openai', model: 'gpt-4.1' }] },
      { name: 'embeddings', match: { path: '/v1/embeddings', models: ['text-embedding-3-small'] }, targets: [{ provider: 'openai' }] },
    ],
  };
}

describe('GET /v1/models lists what a client can request', () => {
  it('leaves out a model only a fallback target names, and every listed model can be requested', async () => {
    stack = await startStack({ config: fallbackConfig });
    const client = sdk(stack);
    const ids: string[] = [];
    for await (const m of client.models.list()) ids.push(m.id);
    expect(ids.sort()).toEqual(['gpt-4o', 'gpt-4o-mini', 'meta-llama/Llama-3-8b', 'text-embedding-3-small']);
    expect(ids).not.toContain('claude-sonnet-4-5');
    await expect(client.chat.completions.create({ model: 'claude-sonnet-4-5', messages })).rejects.toBeInstanceOf(OpenAI.NotFoundError);
    for (const model of ids.filter((id) => id.startsWith('text-') === false)) {
      const answer = await client.chat.completions.create({ model, messages });
      expect(answer.choices[0]!.message.content, model).toBeTruthy();
    }
  });

  it("lists the model that answers a route for any model whose every target sends its own (a self-hosted model with a cloud fallback), not nothing", async () => {
    // config/examples/self-hosted-with-cloud-backup.yaml: any name is accepted and the first target's model answers it.
    // Before, models.list() came back empty, and a client that picks its model from the list had none to pick.
    stack = await startStack({
      config: (url) => ({
        server: { host: '127.0.0.1', port: 0 },
        providers: { vllm: { family: 'openai', baseUrl: `${url}/v1`, apiKey: TEST_KEY }, openai: { family: 'openai', baseUrl: `${url}/v1`, apiKey: TEST_KEY } },
        routes: [
          { name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'vllm', model: 'meta-llama/Llama-3.1-8B-Instruct' }, { provider: 'openai', model: 'gpt-4o-mini' }] },
          // A glob the first target's model does not match: that name could not be requested, so it is not listed.
          { name: 'other', match: { path: '/v1/completions', models: ['davinci*'] }, targets: [{ provider: 'openai', model: 'gpt-3.5-turbo-instruct' }] },
        ],
      }),
    });
    const client = sdk(stack);
    const ids: string[] = [];
    for await (const m of client.models.list()) ids.push(m.id);
    expect(ids).toEqual(['meta-llama/Llama-3.1-8B-Instruct']);
    // The fallback's model is not listed: asked for by name, it would be answered by the first target's model.
    const model = await client.models.retrieve('meta-llama/Llama-3.1-8B-Instruct');
    expect(model).toMatchObject({ id: 'meta-llama/Llama-3.1-8B-Instruct', object: 'model', owned_by: 'vllm' });
    const answer = await client.chat.completions.create({ model: ids[0]!, messages });
    expect(answer.choices[0]!.message.content).toBeTruthy();
  });

  it('lists a provider\'s models though its first answer to the listing is a passing 503 (as from a flaky provider)', async () => {
    stack = await startStack({ faults: { errors: [{ status: 503, rate: 1, times: 1 }] } });
    const ids: string[] = [];
    for await (const m of sdk(stack).models.list()) ids.push(m.id);
    expect(ids).toContain('gpt-4o');
    expect(stack.mock.requests().map((r) => r.status)).toEqual([503, 200]);
  });

  it('answers 502 upstream_unavailable, not an empty list or a 404, while the only provider to ask cannot list its models', async () => {
    // Every listing answered 503 (the undici retry's two more included): nothing to stand in for the list.
    stack = await startStack({ faults: { errors: [{ status: 503, rate: 1 }] } });
    const client = sdk(stack);
    for (const call of [() => client.models.list(), () => client.models.retrieve('gpt-4o')]) {
      const err = await call().catch((e: unknown) => e);
      expect(err).toBeInstanceOf(OpenAI.APIError);
      const e = err as InstanceType<typeof OpenAI.APIError>;
      expect(e.status).toBe(502);
      expect(e.code).toBe('upstream_unavailable');
      expect(e.message).toContain('`mock`');
      expect(e.headers?.get('x-should-retry')).toBe('false');
    }
    // The failure is cached: the second call asked the provider nothing.
    expect(stack.mock.stats().total).toBe(3);
    // Back, the provider is asked again once the failure expires (30 s); its last good list stands in after that.
  });

  it('lists the models it knows when one of two providers cannot list its own', async () => {
    stack = await startStack({ config: fallbackConfig, faults: { errors: [{ status: 503, rate: 1 }] } });
    const ids: string[] = [];
    const client = sdk(stack);
    for await (const m of client.models.list()) ids.push(m.id);
    expect(ids.sort()).toEqual(['meta-llama/Llama-3-8b', 'text-embedding-3-small']);
    // A name the failed provider may serve is not known to be missing; one no route takes is.
    await expect(client.models.retrieve('gpt-4o')).rejects.toMatchObject({ status: 502, code: 'upstream_unavailable' });
    await expect(client.models.retrieve('nope')).rejects.toBeInstanceOf(OpenAI.NotFoundError);
  });

  it('retrieves a listed model with the SDK, and answers 404 model_not_found for one it does not list', async () => {
    stack = await startStack({ config: fallbackConfig });
    const client = sdk(stack);
    const model = await client.models.retrieve('gpt-4o-mini');
    // The provider's own object: apps sort and filter models by `created`.
    expect(model).toEqual({ id: 'gpt-4o-mini', object: 'model', created: 1_715_367_049, owned_by: 'system' });
    // A name only the config gives is the gateway's own entry.
    expect(await client.models.retrieve('meta-llama/Llama-3-8b')).toMatchObject({ object: 'model', created: 0, owned_by: 'openai' });
    expect((await client.models.retrieve('meta-llama/Llama-3-8b')).id).toBe('meta-llama/Llama-3-8b');
    for (const id of ['claude-sonnet-4-5', 'gpt-4o-unlisted', 'nope']) {
      const err = await client.models.retrieve(id).catch((e: unknown) => e);
      expect(err, id).toBeInstanceOf(OpenAI.NotFoundError);
      const e = err as InstanceType<typeof OpenAI.NotFoundError>;
      expect(e.code).toBe('model_not_found');
      expect(e.param).toBe('model');
      expect(e.headers.get('x-should-retry')).toBe('false');
    }
  });

  it('leaves out a model whose every target is a disabled provider (optional, no key): asked for, it gets 503 no_target', async () => {
    stack = await startStack({
      config: (url) => ({
        server: { host: '127.0.0.1', port: 0 },
        providers: {
          openai: { family: 'openai', baseUrl: `${url}/v1`, apiKey: TEST_KEY },
          spare: { family: 'openai', baseUrl: `${url}/v1`, apiKey: '', optional: true },
        },
        routes: [
          { name: 'spare-only', match: { path: '/v1/chat/completions', models: ['spare-model'] }, targets: [{ provider: 'spare' }] },
          // Routing takes the first match: gpt-4o-mini goes here, not to the open route below whose provider lists it.
          { name: 'spare-mini', match: { path: '/v1/chat/completions', models: ['gpt-4o-mini'] }, targets: [{ provider: 'spare' }] },
          // Its disabled target leaves the other to answer.
          { name: 'mixed', match: { path: '/v1/chat/completions', models: ['mixed-model'] }, targets: [{ provider: 'spare' }, { provider: 'openai' }] },
          { name: 'chat', match: { path: '/v1/chat/completions', models: ['gpt-4o*'] }, targets: [{ provider: 'openai' }] },
          // Any name answered by the first target's own model, which no enabled target serves.
          { name: 'spare-any', match: { path: '/v1/completions' }, targets: [{ provider: 'spare', model: 'spare-llama' }] },
        ],
      }),
    });
    const client = sdk(stack);
    for (const model of ['spare-model', 'gpt-4o-mini']) {
      const err = await client.chat.completions.create({ model, messages }).catch((e: unknown) => e);
      expect(err, model).toBeInstanceOf(OpenAI.InternalServerError);
      expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(503);
      expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('no_target');
    }
    const ids: string[] = [];
    for await (const m of client.models.list()) ids.push(m.id);
    expect(ids.sort()).toEqual(['gpt-4o', 'mixed-model']);
    for (const model of ids) expect((await client.chat.completions.create({ model, messages })).choices[0]!.message.content, model).toBeTruthy();
    // Described by the provider that gets it, not by the disabled one listed first.
    expect(await client.models.retrieve('mixed-model')).toMatchObject({ id: 'mixed-model', owned_by: 'openai' });
    for (const id of ['spare-model', 'gpt-4o-mini', 'spare-llama']) await expect(client.models.retrieve(id), id).rejects.toBeInstanceOf(OpenAI.NotFoundError);
  });
});

describe('GET /v1/models with a slow provider', () => {
  it('asks each provider once, in parallel, with a short timeout, and keeps a failure for a while', async () => {
    extra = await startMock({ quiet: true, apiKey: TEST_KEY, faults: { latencyMs: 20_000 } });
    const slowUrl = extra.url;
    stack = await startStack({
      config: (fastUrl) => ({
        server: { host: '127.0.0.1', port: 0 },
        providers: {
          fast: { family: 'openai', baseUrl: `${fastUrl}/v1`, apiKey: TEST_KEY },
          slow: { family: 'openai', baseUrl: `${slowUrl}/v1`, apiKey: TEST_KEY },
        },
        // Three routes on each provider: the old listing asked the slow one three times in a row, at every listing.
        routes: ['/v1/chat/completions', '/v1/embeddings', '/v1/completions'].flatMap((path, i) => [
          { name: `fast-${i}`, match: { path, models: ['gpt-4o*'] }, targets: [{ provider: 'fast' }] },
          { name: `slow-${i}`, match: { path, models: ['gpt-4.1*'] }, targets: [{ provider: 'slow' }] },
        ]),
      }),
    });
    const started = Date.now();
    const listings = await Promise.all([1, 2, 3].map(() => sdk(stack).models.list()));
    expect(Date.now() - started).toBeLessThan(4_000);
    for (const page of listings) expect(page.data.map((m) => m.id).sort()).toEqual(['gpt-4o', 'gpt-4o-mini']);
    expect(extra.stats().byPath['/v1/models']).toBe(1);
    expect(stack.mock.stats().byPath['/v1/models']).toBe(1);
    // The failure is cached: the next listing is immediate (well within the listing's 2 s timeout, room for a loaded
    // machine's lag) and the slow provider is not asked again.
    const again = Date.now();
    await sdk(stack).models.list();
    expect(Date.now() - again).toBeLessThan(1_500);
    expect(extra.stats().byPath['/v1/models']).toBe(1);
    expect(stack.mock.stats().byPath['/v1/models']).toBe(1);
  });
});

describe('GET /v1/models in Anthropic\'s shape', () => {
  it('lists a model whose `created` no date can hold (µs, or garbage, from an OpenAI-compatible server) instead of failing the listing', () => {
    const page = asAnthropicPage({ data: [{ id: 'fine', object: 'model', created: 1_700_000_000, owned_by: 'p' }, { id: 'odd', object: 'model', created: 1.7e15, owned_by: 'p' }] });
    expect(page.data.map((m) => m.created_at)).toEqual(['2023-11-14T22:13:20.000Z', '1970-01-01T00:00:00.000Z']);
    expect(page.last_id).toBe('odd');
  });
});
