// The places a model name takes at a route's fallback: made-up names the primary answers 404 must not use up the
// backup's (they were never sent there), while a real name the primary serves keeps its place for failover.
import OpenAI from 'openai';
import { describe, expect, it, vi } from 'vitest';
import { metricSum, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';
import type { MockServer } from '../src/mock/server.ts';
import { MAX_LEARNED_MODELS } from '../src/routing/target-keys.ts';
import { ConfigSchema } from '../src/config/schema.ts';
import { createLogger } from '../src/observability/logger.ts';
import { createMetrics } from '../src/observability/metrics.ts';
import type { TargetPlan } from '../src/pipeline/target-attempts.ts';
import { createRuntime } from '../src/runtime.ts';
import { testLogSink } from './helpers/stack.ts';
import { attempts, primaryAndBackupConfig, status } from './helpers/model-places.ts';

const start = useStacks();
const extraMock = useExtraMocks();

/** The stack's mock as the primary (no breaker, so each failure goes on to the backup) and a backup whose breaker opens at 2 failures in a row. */
async function primaryAndBackup(primaryFaults: Parameters<MockServer['setFaults']>[0], backup: MockServer): Promise<Stack> {
  return start({
    faults: primaryFaults,
    config: (mockUrl) => primaryAndBackupConfig(mockUrl, backup.url),
  });
}

describe('places at a fallback', () => {
  it('keeps made-up names the primary answers 404 from taking the backup\'s places: real models failing over keep breakers of their own', async () => {
    const backup = await extraMock({ faults: { models: { 'real-model-a': { errors: [{ status: 503 }] } } } });
    // The primary knows no model but the real ones, and those are down there: they fail over to the backup.
    const s = await primaryAndBackup(
      { errors: [{ status: 404, code: 'model_not_found' }], models: { 'real-model-a': { errors: [{ status: 503 }] }, 'real-model-b': { errors: [{ status: 503 }] } } },
      backup,
    );
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 });
    for (let i = 0; i < 40; i++) expect(await status(client, `made-up-${i}`)).toBe(404);
    // Several at once for one name: the first planned takes the backup's place, and whichever ends first gives it back.
    for (let i = 0; i < 10; i++) {
      for (const answered of await Promise.all([0, 1, 2].map(() => status(client, `made-up-together-${i}`)))) expect(answered).toBe(404);
    }
    expect(backup.stats().total).toBe(0);
    // real-model-a is down at the backup too: its breaker there opens, under its own key.
    for (let i = 0; i < 3; i++) expect(await status(client, 'real-model-a')).toBe(503);
    await vi.waitFor(async () => expect(await metricSum(s, 'stormgate_breaker_state{target="backup/real-model-a"}')).toBe(1));
    // real-model-b is served by the backup: its breaker is not real-model-a's.
    expect(await status(client, 'real-model-b')).toBe(200);
    expect(await attempts(s, 'backup/real-model-b', '2xx')).toBe(1);
    expect(await attempts(s, 'backup/other', '2xx')).toBe(0);
    // Nothing the made-up names were planned under at the backup is left behind.
    expect(await (await fetch(`${s.url}/metrics`)).text()).not.toContain('made-up-');
  });

  it('keeps the backup place of a real model the primary serves, for its failover', async () => {
    const backup = await extraMock({});
    const s = await primaryAndBackup({ errors: [{ status: 404, code: 'model_not_found' }], models: Object.fromEntries(['real-model-c', ...Array.from({ length: MAX_LEARNED_MODELS - 1 }, (_, i) => `filler-${i}`)].map((m) => [m, { errors: [] }])) }, backup);
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 });
    // Served by the primary: each takes a place at the backup too, all 32 of them.
    expect(await status(client, 'real-model-c')).toBe(200);
    for (let i = 0; i < MAX_LEARNED_MODELS - 1; i++) expect(await status(client, `filler-${i}`)).toBe(200);
    for (let i = 0; i < 5; i++) expect(await status(client, `made-up-${i}`)).toBe(404);
    expect(backup.stats().total).toBe(0);
    // The primary goes down: real-model-c fails over under its own key at the backup; a newcomer finds no place left.
    s.mock.setFaults({ errors: [{ status: 503 }] });
    expect(await status(client, 'real-model-c')).toBe(200);
    expect(await attempts(s, 'backup/real-model-c', '2xx')).toBe(1);
    expect(await status(client, 'newcomer')).toBe(200);
    expect(await attempts(s, 'backup/other', '2xx')).toBe(1);
  });

  it('drops a key given back from the weighted order a route of any model keeps for every key it ordered', async () => {
    const config = ConfigSchema.parse({
      server: { host: '127.0.0.1', port: 0, logLevel: 'silent' },
      providers: {
        p: { family: 'openai', baseUrl: 'http://127.0.0.1:9/v1', apiKey: 'p-key-0123456789' },
        q: { family: 'openai', baseUrl: 'http://127.0.0.1:9/v1', apiKey: 'q-key-0123456789' },
      },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, strategy: 'weighted', targets: [{ provider: 'p' }, { provider: 'q' }] }],
    });
    const runtime = await createRuntime(config, { logger: createLogger(config, testLogSink([])), metrics: createMetrics({ defaultMetrics: false }) });
    try {
      const { pipeline } = runtime;
      // Only what the picker reads of a plan (its availability: key, hold-off key, breaker).
      const planned = (key: string) => ({ key, holdOffKey: key, sharesHoldOffs: true, breaker: undefined, weight: 1 }) as unknown as TargetPlan;
      pipeline.weighted.order('chat', [planned('p/made-up'), planned('q/made-up')]);
      expect(pipeline.weighted.size).toBe(2);
      pipeline.onTargetForgotten!('p/made-up');
      pipeline.onTargetForgotten!('q/made-up');
      expect(pipeline.weighted.size).toBe(0);
    } finally {
      await runtime.close();
    }
  });
});
