// Generates the config reference from the schema, so the README cannot drift from what the loader accepts.
// `npx tsx scripts/config-reference.ts --write` updates README.md (between the markers) and docs/config-reference.md;
// test/config-docs.test.ts fails when either is stale.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { z } from 'zod';
import { ConfigSchema } from '../src/config/schema.ts';

type JsonSchema = {
  type?: string;
  description?: string;
  properties?: Record<string, JsonSchema>;
  required?: string[];
  items?: JsonSchema;
  additionalProperties?: JsonSchema | boolean;
  anyOf?: JsonSchema[];
  default?: unknown;
  enum?: unknown[];
  format?: string;
  pattern?: string;
  minimum?: number;
  maximum?: number;
  exclusiveMinimum?: number;
  exclusiveMaximum?: number;
  const?: unknown;
  minItems?: number;
  minLength?: number;
};

/** One documented key: `routes[].retry.backoff.capMs`, its type in words, and its `.describe()` text. */
interface ConfigField {
  path: string;
  type: string;
  required: boolean;
  description: string | undefined;
  /** The schema's default (`.default()`), which the description states in its "Default: ..." sentence. */
  default?: unknown;
}

const START_MARKER = '<!-- config-reference:start -->';
const END_MARKER = '<!-- config-reference:end -->';
const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const README = resolve(ROOT, 'README.md');
export const DOCS_PAGE = resolve(ROOT, 'docs/config-reference.md');
export const WRITE_COMMAND = 'npx tsx scripts/config-reference.ts --write';

/** Every key of the config in file order, objects before their children. */
export function configFields(): ConfigField[] {
  const fields: ConfigField[] = [];
  const visit = (schema: JsonSchema, prefix: string) => {
    const required = new Set(schema.required ?? []);
    for (const [key, child] of Object.entries(schema.properties ?? {})) {
      const path = prefix ? `${prefix}.${key}` : key;
      fields.push({ path, type: typeOf(child), required: required.has(key), description: child.description, ...('default' in child && { default: child.default }) });
      visitChildren(child, path);
    }
  };
  const visitChildren = (schema: JsonSchema, path: string) => {
    if (schema.properties) visit(schema, path);
    // `false or object` (breaker), `string or object` (state.redis): the object's keys are documented too.
    for (const branch of schema.anyOf ?? []) visitChildren(branch, path);
    if (schema.items) visitChildren(schema.items, `${path}[]`);
    if (typeof schema.additionalProperties === 'object') {
      const value = schema.additionalProperties;
      fields.push({ path: `${path}.<name>`, type: typeOf(value), required: false, description: value.description });
      visitChildren(value, `${path}.<name>`);
    }
  };
  // io: 'input' documents what a user writes: keys with defaults are optional.
  visit(z.toJSONSchema(ConfigSchema, { io: 'input' }) as JsonSchema, '');
  return fields;
}

/** The Markdown reference table; the README holds it between the config-reference markers. */
export function renderConfigReference(): string {
  const rows = configFields().map(
    (f) => `| \`${f.path}\` | ${cell(f.type)} | ${f.required ? 'yes' : ''} | ${cell(f.description ?? '')} |`,
  );
  return [
    `<!-- Generated from src/config/schema.ts by \`${WRITE_COMMAND}\`; edit the schema, not this table. -->`,
    '',
    '| Key | Type | Required | Description |',
    '| --- | --- | --- | --- |',
    ...rows,
  ].join('\n');
}

/** The whole docs/config-reference.md page. */
export function renderDocsPage(): string {
  return [
    '# Configuration reference',
    '',
    'stormgate reads one YAML file (default `config/gateway.yaml`). Unknown keys are errors, and every error names',
    'the file, the line and the key path. `<name>` stands for a name you choose; `[]` for each item of a list.',
    '',
    'String values may use environment variables: `${VAR}` (an error when VAR is unset; an empty value stays empty),',
    '`${VAR:-default}` (the default when VAR is unset or empty) and `$${` for a literal `${`. Variables are',
    'substituted after the YAML is parsed, so a value never changes the structure of the file; an unquoted',
    'value such as `port: ${PORT:-8080}` is then read as a number, a quoted one stays a string.',
    '',
    renderConfigReference(),
    '',
  ].join('\n');
}

/** `readme` with the block between the markers replaced by `block`; throws when the markers are missing. */
export function replaceBlock(readme: string, block: string): string {
  const start = readme.indexOf(START_MARKER);
  const end = readme.indexOf(END_MARKER);
  if (start === -1 || end < start) throw new Error(`README.md needs the markers ${START_MARKER} and ${END_MARKER}`);
  return `${readme.slice(0, start + START_MARKER.length)}\n${block}\n${readme.slice(end)}`;
}

/** The text between the markers, or undefined when they are missing. */
export function extractBlock(readme: string): string | undefined {
  const start = readme.indexOf(START_MARKER);
  const end = readme.indexOf(END_MARKER);
  if (start === -1 || end < start) return undefined;
  return readme.slice(start + START_MARKER.length, end).trim();
}

function typeOf(s: JsonSchema): string {
  if (s.anyOf) return s.anyOf.map(typeOf).join(' or ');
  // z.literal(false): "false", not "boolean" (true is refused).
  if (s.const !== undefined) return `\`${String(s.const)}\``;
  if (s.enum) return s.enum.map((v) => `\`${String(v)}\``).join(' | ');
  switch (s.type) {
    case 'integer':
    case 'number':
      return `${s.type}${range(s)}`;
    case 'string':
      if (s.format === 'uri') return 'URL';
      if (s.format === 'starts_with' && s.pattern) return `string starting with \`${prefixOf(s.pattern)}\``;
      if (s.pattern) return `string matching \`${s.pattern}\``;
      return s.minLength ? 'non-empty string' : 'string';
    case 'array': {
      const item = s.items ? typeOf(s.items) : 'any';
      return `${s.minItems ? 'non-empty ' : ''}list of ${s.items?.anyOf ? `(${item})` : item}`;
    }
    case 'object':
      // A map's values say what it is: auth.keys maps names to strings, providers to objects.
      return typeof s.additionalProperties === 'object' ? `map of name to ${typeOf(s.additionalProperties)}` : 'object';
    default:
      return s.type ?? 'any';
  }
}

function range(s: JsonSchema): string {
  // zod bounds every int by Number.MAX_SAFE_INTEGER; that bound tells a reader nothing.
  const max = s.maximum !== undefined && s.maximum < Number.MAX_SAFE_INTEGER ? s.maximum : undefined;
  // For integers "> 0" is "≥ 1", which reads better next to a range like "1 to 20".
  const min = s.minimum ?? (s.exclusiveMinimum !== undefined && s.type === 'integer' ? s.exclusiveMinimum + 1 : undefined);
  if (min !== undefined && max !== undefined) return ` ${min} to ${max}`;
  const lower = min !== undefined ? `≥ ${min}` : s.exclusiveMinimum !== undefined ? `> ${s.exclusiveMinimum}` : undefined;
  const upper = max !== undefined ? `≤ ${max}` : s.exclusiveMaximum !== undefined ? `< ${s.exclusiveMaximum}` : undefined;
  const bounds = [lower, upper].filter((b) => b !== undefined);
  return bounds.length === 0 ? '' : ` ${bounds.join(' and ')}`;
}

// zod renders startsWith('/') as the pattern ^\/.*
function prefixOf(pattern: string): string {
  return pattern.replace(/^\^/, '').replace(/\.\*$/, '').replace(/\\(.)/g, '$1');
}

function cell(text: string): string {
  return text.replace(/\|/g, '\\|').replace(/\n/g, ' ');
}

function write(): void {
  const readme = existsSync(README) ? readFileSync(README, 'utf8') : `# stormgate\n\n${START_MARKER}\n${END_MARKER}\n`;
  writeFileSync(README, replaceBlock(readme, renderConfigReference()));
  mkdirSync(dirname(DOCS_PAGE), { recursive: true });
  writeFileSync(DOCS_PAGE, renderDocsPage());
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  if (process.argv.includes('--write')) write();
  else process.stdout.write(`${renderConfigReference()}\n`);
}
