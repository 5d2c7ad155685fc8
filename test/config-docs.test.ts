// The config reference is generated from the schema; these tests fail when the docs drift from it
// (the way fastify's test fails when an error code is missing from Errors.md).
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import {
  DOCS_PAGE,
  README,
  WRITE_COMMAND,
  configFields,
  extractBlock,
  renderConfigReference,
  renderDocsPage,
  replaceBlock,
} from '../scripts/config-reference.ts';

const stale = `the config reference is out of date with src/config/schema.ts; run \`${WRITE_COMMAND}\``;

describe('config reference', () => {
  it('README.md holds the reference generated from the schema', () => {
    const block = extractBlock(readFileSync(README, 'utf8'));
    expect(block, `README.md has no config-reference markers; ${stale}`).toBeDefined();
    expect(block, stale).toBe(renderConfigReference());
  });

  it('docs/config-reference.md is generated from the schema', () => {
    expect(readFileSync(DOCS_PAGE, 'utf8'), stale).toBe(renderDocsPage());
  });

  it('states every plain default in its description as the schema has it', () => {
    const plain = configFields().filter((f) => ['number', 'string', 'boolean'].includes(typeof f.default));
    expect(plain.length).toBeGreaterThan(40);
    const drifted = plain.filter((f) => !f.description?.includes(`Default: ${String(f.default)}`)).map((f) => `${f.path}: ${String(f.default)}`);
    expect(drifted, 'the "Default: ..." text of these keys differs from their .default()').toEqual([]);
  });

  it('every config key has a description', () => {
    const undocumented = configFields().filter((f) => !f.description?.trim()).map((f) => f.path);
    expect(undocumented, 'add .describe() to these keys in src/config/schema.ts').toEqual([]);
  });

  it('documents keys by their full path', () => {
    const paths = configFields().map((f) => f.path);
    expect(paths).toContain('routes[].retry.backoff.capMs');
    expect(paths).toContain('providers.<name>.timeouts.connectMs');
  });

  it('states the defaults that are not the schema\'s own: per-model breaker fields, a target\'s retry, a context-window fallback\'s weight', () => {
    const doc = (path: string) => configFields().find((f) => f.path === path)?.description ?? '';
    // A model's field left out is the provider's value (settingsForModel), not the provider field's default.
    const modelFields = configFields().filter((f) => f.path.startsWith('providers.<name>.breaker.models.<name>.'));
    expect(modelFields.length).toBeGreaterThan(5);
    for (const f of modelFields) expect(f.description, f.path).toMatch(/Default: the provider's breaker\.\w+\.$/);
    // A target's retry replaces the route's whole (plan-targets: target.retry ?? route.retry), it is not merged.
    expect(doc('routes[].targets[].retry')).toMatch(/as a whole, not merged/);
    expect(doc('routes[].contextWindowFallback.weight')).toMatch(/^Has no effect here/);
  });

  it('names what a map holds: client keys are strings, providers are objects', () => {
    const rows = renderConfigReference();
    expect(rows).toContain('| `auth.keys` | map of name to string |');
    expect(rows).toContain('| `providers` | map of name to object |');
  });

  it('replaces only the text between the markers', () => {
    const readme = 'intro\n<!-- config-reference:start -->\nold\n<!-- config-reference:end -->\noutro\n';
    expect(replaceBlock(readme, 'new')).toBe('intro\n<!-- config-reference:start -->\nnew\n<!-- config-reference:end -->\noutro\n');
  });
});
