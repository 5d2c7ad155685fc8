// Review of the places a model name takes at a route's fallbacks (TargetKeys' untried places, release, givenBack;
// forgetUnknownModels in handle-request.ts), with tests that kill hand mutations of those lines.
import OpenAI from 'openai';
import { describe, expect, it, vi } from 'vitest';
import { metricSum, TEST_KEY, useExtraMocks, useStacks } from './helpers/stack.ts';
import { ConfigSchema } from '../src/config/schema.ts';
import { LEARNED_IDLE_MS, MAX_LEARNED_MODELS, TargetKeys } from '../src/routing/target-keys.ts';
import { attempts, primaryAndBackupConfig, status } from './helpers/model-places.ts';
import { WatchingStore } from './helpers/watching-store.ts';

const start = useStacks();
const extraMock = useExtraMocks();

const config = ConfigSchema.parse({
  providers: {
    openai: { family: 'openai', baseUrl: 'http://127.0.0.1:9/v1', apiKey: 'k-0123456789' },
    backup: { family: 'openai', baseUrl: 'http://127.0.0.1:9/v1', apiKey: 'k-0123456789' },
  },
  routes: [{ name: 'chat', match: { path: '/v1/chat/completions', models: ['gpt-4o'] }, targets: [{ provider: 'openai' }, { provider: 'backup' }] }],
});

describe('places a name takes at a route\'s fallbacks', () => {
  it('keeps the backup place of a real model when the 404 was for the operator\'s own model of another target, not for the name', async () => {
    const backup = await extraMock({});
    const fillers = Array.from({ length: MAX_LEARNED_MODELS }, (_, i) => `filler-${i}`);
    // The first target sends a model of its own that the provider retired (404): the next target, with the client's
    // name, serves the request. The fillers are down at the primary and fail over to the backup.
    const s = await start({
      faults: { models: { 'retired-model': { errors: [{ status: 404, code: 'model_not_found' }] }, ...Object.fromEntries(fillers.map((m) => [m, { errors: [{ status: 503 }] }])) } },
      config: (mockUrl) => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: {
          mock: { family: 'openai', baseUrl: `${mockUrl}/v1`, apiKey: TEST_KEY, breaker: false },
          backup: { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: TEST_KEY, breaker: false },
        },
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock', model: 'retired-model' }, { provider: 'mock' }, { provider: 'backup' }], retry: { maxAttempts: 1 }, park: false }],
      }),
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 });
    // Served by the primary's second target: the name took a place at the backup, for its failover.
    expect(await status(client, 'real-model-c')).toBe(200);
    expect(backup.stats().total).toBe(0);
    // Names failing over to the backup take the places left there.
    for (const m of fillers) expect(await status(client, m)).toBe(200);
    // The primary goes down for real-model-c: it fails over under its own key at the backup, not under `other`.
    s.mock.setFaults({ models: { 'retired-model': { errors: [{ status: 404, code: 'model_not_found' }] }, 'real-model-c': { errors: [{ status: 503 }] } } });
    expect(await status(client, 'real-model-c')).toBe(200);
    expect(await attempts(s, 'backup/real-model-c', '2xx')).toBe(1);
  });

  it('gives back the places a made-up name took at a route\'s context-window fallback when the primary answers 404', async () => {
    const backup = await extraMock({ faults: { errors: [{ status: 404, code: 'model_not_found' }], models: { 'long-model': { errors: [] } } } });
    const s = await start({
      faults: { errors: [{ status: 404, code: 'model_not_found' }], models: { 'long-model': { errors: [{ status: 400, code: 'context_length_exceeded' }] } } },
      config: (mockUrl) => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: {
          mock: { family: 'openai', baseUrl: `${mockUrl}/v1`, apiKey: TEST_KEY, breaker: false },
          backup: { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: TEST_KEY, breaker: false },
        },
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }], contextWindowFallback: { provider: 'backup' }, retry: { maxAttempts: 1 }, park: false }],
      }),
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 });
    for (let i = 0; i < MAX_LEARNED_MODELS + 8; i++) expect(await status(client, `made-up-${i}`)).toBe(404);
    expect(backup.stats().total).toBe(0);
    // A prompt too long for the primary goes to the wider window under its own key there: the places were not used up.
    expect(await status(client, 'long-model')).toBe(200);
    expect(await attempts(s, 'backup/long-model', '2xx')).toBe(1);
    expect(await attempts(s, 'backup/other', '2xx')).toBe(0);
  });

  it('forgets the keys a weighted route looked up for a made-up name\'s untried places (the Redis store would watch them for good)', async () => {
    // A store that notes which keys the gateway asked about, as guards-http.test.ts's: the weighted picker asks about
    // every target of the route when it orders them, the one the request never went to included.
    const store = new WatchingStore();
    const backup = await extraMock({ faults: { errors: [{ status: 404, code: 'model_not_found' }] } });
    const s = await start({
      faults: { errors: [{ status: 404, code: 'model_not_found' }] },
      deps: { store },
      config: (mockUrl) => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: {
          mock: { family: 'openai', baseUrl: `${mockUrl}/v1`, apiKey: TEST_KEY },
          backup: { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: TEST_KEY },
        },
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, strategy: 'weighted', targets: [{ provider: 'mock' }, { provider: 'backup' }], retry: { maxAttempts: 1 }, park: false }],
      }),
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 });
    for (let i = 0; i < 10; i++) expect(await status(client, `made-up-${i}`)).toBe(404);
    // Each went to one of the two; the other's key was only planned, and asked about by the picker.
    expect(s.mock.stats().total + backup.stats().total).toBe(10);
    expect([...store.asked].filter((k) => k.startsWith('backup/made-up-')).length).toBeGreaterThan(0);
    expect([...store.asked].filter((k) => k.startsWith('mock/made-up-')).length).toBeGreaterThan(0);
    expect([...store.asked].filter((k) => k.includes('made-up-') && !store.forgotten.has(k))).toEqual([]);
  });
});

describe('places a name has been tried at', () => {
  it('keeps the breaker a name opened at the backup when the primary later answers 404 for it', async () => {
    const backup = await extraMock({ faults: { models: { 'moving-model': { errors: [{ status: 503 }] } } } });
    const s = await start({
      faults: { models: { 'moving-model': { errors: [{ status: 503 }] } } },
      config: (mockUrl) => primaryAndBackupConfig(mockUrl, backup.url),
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 });
    // Down at both: it fails over, and its breaker at the backup opens under its own key.
    for (let i = 0; i < 3; i++) expect(await status(client, 'moving-model')).toBe(503);
    await vi.waitFor(async () => expect(await metricSum(s, 'stormgate_breaker_state{target="backup/moving-model"}')).toBe(1));
    // The primary now says it has no such model: its request ends there, and the backup's breaker, tried, stays open.
    s.mock.setFaults({ models: { 'moving-model': { errors: [{ status: 404, code: 'model_not_found' }] } } });
    expect(await status(client, 'moving-model')).toBe(404);
    expect(await metricSum(s, 'stormgate_breaker_state{target="backup/moving-model"}')).toBe(1);
    expect(await (await fetch(`${s.url}/metrics`)).text()).toContain('target="backup/moving-model"');
  });
});

describe('TargetKeys: untried places', () => {
  it('does not give back, as only planned, a place its name was refused or evicted from', () => {
    let now = 0;
    const keys = new TargetKeys(config, () => now);
    // Refused (404): its place and its untried mark both go; a release later finds nothing to give.
    expect(keys.key('backup', 'made-up')).toBe('backup/made-up');
    expect(keys.forget('backup', 'made-up')).toBe('backup/made-up');
    expect(keys.release('backup', 'made-up')).toBeUndefined();
    // Evicted for a new name after an idle hour: not learned any more, so nothing to release.
    for (let i = 0; i < MAX_LEARNED_MODELS; i++) keys.key('backup', `idle-${i}`);
    now = LEARNED_IDLE_MS;
    expect(keys.key('backup', 'newcomer')).toBe('backup/newcomer');
    expect(keys.release('backup', 'idle-0')).toBeUndefined();
    expect(keys.givenBack('backup', 'idle-0', 'backup/idle-0')).toBe(true);
  });

  it('keeps the place of a name once tried, however often it is planned again', () => {
    const keys = new TargetKeys(config);
    expect(keys.key('backup', 'real-model')).toBe('backup/real-model');
    keys.tried('backup/real-model');
    // Planned again by later requests that the primary answers: still tried at the backup once.
    expect(keys.key('backup', 'real-model')).toBe('backup/real-model');
    expect(keys.release('backup', 'real-model')).toBeUndefined();
    expect(keys.givenBack('backup', 'real-model', 'backup/real-model')).toBe(false);
    // Released, then learned again: only planned again, until tried.
    keys.key('backup', 'planned');
    expect(keys.release('backup', 'planned')).toBe('backup/planned');
    expect(keys.key('backup', 'planned')).toBe('backup/planned');
    expect(keys.release('backup', 'planned')).toBe('backup/planned');
  });
});
