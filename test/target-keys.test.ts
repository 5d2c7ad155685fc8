// Which key (breaker, hold-off, budget, metric label) a provider and model get.
import { describe, expect, it } from 'vitest';
import { ConfigSchema } from '../src/config/schema.ts';
import { LEARNED_IDLE_MS, MAX_LEARNED_MODELS, TargetKeys } from '../src/routing/target-keys.ts';

const config = ConfigSchema.parse({
  providers: { openai: { family: 'openai', baseUrl: 'http://127.0.0.1:1/v1', apiKey: 'k' } },
  routes: [{ name: 'chat', match: { path: '/v1/chat/completions', models: ['gpt-4o'] }, targets: [{ provider: 'openai' }] }],
});

describe('target keys', () => {
  it('names configured models, and learns others as clients send them', () => {
    const keys = new TargetKeys(config);
    expect(keys.key('openai', 'gpt-4o')).toBe('openai/gpt-4o');
    expect(keys.key('openai', 'o3-mini')).toBe('openai/o3-mini');
    expect(keys.key('openai', 'meta-llama/Llama-3.1-8B')).toBe('openai/meta-llama/Llama-3.1-8B');
    expect(keys.key('openai', undefined)).toBe('openai/other');
  });

  it(`learns at most ${MAX_LEARNED_MODELS} models per provider; past that, and for unfit names, models share <provider>/other`, () => {
    const keys = new TargetKeys(config);
    for (let i = 0; i < MAX_LEARNED_MODELS; i++) expect(keys.key('openai', `model-${i}`)).toBe(`openai/model-${i}`);
    expect(keys.key('openai', 'one-too-many')).toBe('openai/other');
    // Learned and configured ones keep their keys; another provider has its own allowance.
    expect(keys.key('openai', 'model-0')).toBe('openai/model-0');
    expect(keys.key('openai', 'gpt-4o')).toBe('openai/gpt-4o');
    expect(keys.key('backup', 'one-too-many')).toBe('backup/one-too-many');
    const fresh = new TargetKeys(config);
    expect(fresh.key('openai', 'gpt-4o\u202e<script>')).toBe('openai/other');
    expect(fresh.key('openai', 'x'.repeat(101))).toBe('openai/other');
    expect(fresh.key('openai', 'other')).toBe('openai/other');
  });

  it('gives back the place of a name the provider does not know (404), so made-up names cannot use the places up', () => {
    const keys = new TargetKeys(config);
    for (let i = 0; i < 100; i++) {
      keys.key('openai', `made-up-${i}`);
      keys.forget('openai', `made-up-${i}`);
    }
    expect(keys.key('openai', 'gpt-4.1')).toBe('openai/gpt-4.1');
    // A refused name is not learned again.
    expect(keys.key('openai', 'made-up-0')).toBe('openai/other');
    // A configured model is never forgotten.
    keys.forget('openai', 'gpt-4o');
    expect(keys.key('openai', 'gpt-4o')).toBe('openai/gpt-4o');
  });

  it('gives the place of a learned model unused for an hour to a new name, and says which key went', () => {
    let now = 0;
    const keys = new TargetKeys(config, () => now);
    const evicted: string[] = [];
    keys.onEvicted = (key) => evicted.push(key);
    for (let i = 0; i < MAX_LEARNED_MODELS; i++) keys.key('openai', `model-${i}`);
    now = LEARNED_IDLE_MS - 1;
    // Not idle long enough: the new name shares `other`, and nothing is evicted.
    expect(keys.key('openai', 'gpt-5')).toBe('openai/other');
    expect(evicted).toEqual([]);
    // model-0 was asked for again; model-1 is now the longest unused.
    keys.key('openai', 'model-0');
    now = LEARNED_IDLE_MS;
    expect(keys.key('openai', 'gpt-5')).toBe('openai/gpt-5');
    expect(evicted).toEqual(['openai/model-1']);
    expect(keys.key('openai', 'model-0')).toBe('openai/model-0');
    // model-1 comes back later as a new name: it takes the next idle place (model-2's).
    now += 1;
    expect(keys.key('openai', 'model-1')).toBe('openai/model-1');
    expect(evicted).toEqual(['openai/model-1', 'openai/model-2']);
    // Configured models are never learned, so never evicted.
    expect(keys.key('openai', 'gpt-4o')).toBe('openai/gpt-4o');
  });

  it('gives back, without refusing it, the place a name took at a provider no request has tried it at', () => {
    const keys = new TargetKeys(config);
    // A made-up name takes a place at the backup too when it is planned; the primary's 404 ends its request.
    for (let i = 0; i < 40; i++) {
      expect(keys.key('backup', `made-up-${i}`)).toBe(`backup/made-up-${i}`);
      expect(keys.release('backup', `made-up-${i}`)).toBe(`backup/made-up-${i}`);
    }
    expect(keys.key('backup', 'real-model-b')).toBe('backup/real-model-b');
    // Not refused: the backup may serve the name, and learns it again when a request brings it back.
    expect(keys.key('backup', 'made-up-0')).toBe('backup/made-up-0');
    // A name some request has tried at the provider keeps its place there; so do configured names and `other`.
    keys.tried('backup/made-up-0');
    expect(keys.release('backup', 'made-up-0')).toBeUndefined();
    expect(keys.key('backup', 'made-up-0')).toBe('backup/made-up-0');
    expect(keys.release('openai', 'gpt-4o')).toBeUndefined();
    expect(keys.release('openai', 'never-seen')).toBeUndefined();
    // Given back once: a second release (a request in flight at once) finds nothing to give.
    keys.key('backup', 'made-up-twice');
    expect(keys.release('backup', 'made-up-twice')).toBe('backup/made-up-twice');
    expect(keys.release('backup', 'made-up-twice')).toBeUndefined();
  });

  it('says when the key a request planned under no longer holds its place, however it was given back', () => {
    const keys = new TargetKeys(config);
    const planned = keys.key('backup', 'made-up');
    expect(keys.givenBack('backup', 'made-up', planned)).toBe(false);
    keys.release('backup', 'made-up');
    expect(keys.givenBack('backup', 'made-up', planned)).toBe(true);
    // Learned again by another request since: the key is held again, nothing to drop.
    keys.key('backup', 'made-up');
    expect(keys.givenBack('backup', 'made-up', planned)).toBe(false);
    keys.forget('backup', 'made-up');
    expect(keys.givenBack('backup', 'made-up', planned)).toBe(true);
    // A request counted under `other` kept nothing under the name, and configured names hold their places.
    expect(keys.givenBack('backup', 'made-up', 'backup/other')).toBe(false);
    expect(keys.givenBack('openai', 'gpt-4o', 'openai/gpt-4o')).toBe(false);
  });
});
