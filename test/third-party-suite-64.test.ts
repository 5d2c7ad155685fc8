// Third-party failure-scenario suite 64: an outside team's CONFIG FUZZ suite, written from the README's "Configuration
// reference" (its prose and its generated table, which this file parses for each key's type, range, enum and whether
// it is required) and the shipped configs (config/*.yaml, config/examples/*.yaml, the README's whole YAML configs).
//  1. Invalid configs: seeded random mutations of the shipped configs (a required key deleted, a wrong type, a number
//     out of its range, a misspelt key, a bad enum value, broken YAML, a bad ${VAR}, a duplicate route name, an unknown
//     provider, a target whose provider is gone, negative durations, huge numbers, empty strings, unicode, deeply nested
//     junk, a secret from the environment put where it does not belong), each loaded as the gateway loads it at
//     start-up (parseConfig, the text loadConfigFile reads): refused (or, where the README says the result is still
//     valid, accepted) with the file, the YAML path, the line and what was expected; an unknown key with the closest
//     valid one; never a stack trace, never a value of an environment variable holding a key, never anything thrown
//     but ConfigError. A few go through a real `src/main.ts --config` process: exit 2, `stormgate: invalid config`.
//  2. Valid configs: seeded random configs built from the README's fields (routes, an OpenAI primary and an Anthropic
//     backup, retry and backoff strategies, budgets, breakers, pools and classes, timeouts, client keys) that load as
//     written; a sample of them started in-process against the bundled mock, where a chat completion and a stream
//     through the openai 6.x SDK succeed, /metrics and /readyz answer, and close() is clean.
// Every failure message names the seed and prints the mutant; FUZZ_SEED=<n> runs another draw, FUZZ_PER_KIND,
// FUZZ_VALID and FUZZ_STARTED size it, FUZZ_BRIEF=1 leaves the mutants' text out of the report.
// Found here (each with a test under "found by the fuzzer", and fixed in src/config/):
//  - a contextWindowFallback naming a provider not under `providers` loaded, and every request of its route then
//    failed on the missing provider (schema.ts: refused as a target's is, at its line, naming the providers);
//  - `match.path: "${OPENAI_API_KEY}"` was refused naming the variable, then printed its value whole in the hint
//    `write "/<the key>"` (load.ts: the hint goes for a value from the environment);
//  - a client key written `$STORMGATE_KEY` (shell style) loaded as that text, a key anyone reading the config holds,
//    where a provider's apiKey so written is refused with the fix (schema.ts: the same refusal for auth.keys);
//  - brackets nested thousands of levels deep were reported as "Maximum call stack size exceeded" (load.ts: says the
//    value nests too deeply, at the same line).
import { readdirSync, readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isMap, isScalar, isSeq, LineCounter, parse, parseDocument, stringify } from 'yaml';
import { referencedEnvVars } from '../src/config/interpolate.ts';
import { ConfigError, loadConfigFile, parseConfig } from '../src/config/load.ts';
import type { Config } from '../src/config/schema.ts';
import { startMock, type MockServer } from '../src/mock/server.ts';
import { createLogger } from '../src/observability/logger.ts';
import { createMetrics } from '../src/observability/metrics.ts';
import { buildServer } from '../src/server.ts';
import { useGatewayProcesses } from './helpers/gateway-process.ts';
import { chance, int, pick, prng, type Rng } from './helpers/seeded-draws.ts';
import { testLogSink } from './helpers/stack.ts';

const ROOT = resolve(import.meta.dirname, '..');
const BASE_SEED = Number(process.env.FUZZ_SEED ?? 64_064);
const FILE = 'gw.yaml';

// ---------------------------------------------------------------------------------------------------------------
// What the README says about each key: its configuration reference table, read as a user reads it.

interface KeySpec {
  key: string;
  type: string;
  required: boolean;
  kind: 'integer' | 'number' | 'boolean' | 'enum' | 'string' | 'other';
  min?: number;
  minExclusive?: boolean;
  max?: number;
  maxExclusive?: boolean;
  values?: string[];
  nonEmpty?: boolean;
}

const README = readFileSync(resolve(ROOT, 'README.md'), 'utf8');

function readmeKeys(): Map<string, KeySpec> {
  const table = README.slice(README.indexOf('<!-- config-reference:start -->'), README.indexOf('<!-- config-reference:end -->'));
  const specs = new Map<string, KeySpec>();
  for (const row of table.split('\n')) {
    const m = /^\| `([^`]+)` \| (.*?) \| (yes)? \| /.exec(row);
    if (!m) continue;
    const type = m[2]!.replaceAll('\\|', '|');
    const spec: KeySpec = { key: m[1]!, type, required: m[3] === 'yes', kind: 'other' };
    let r: RegExpExecArray | null;
    if ((r = /^(integer|number) (-?[\d.]+) to (-?[\d.]+)$/.exec(type))) Object.assign(spec, { kind: r[1], min: Number(r[2]), max: Number(r[3]) });
    else if ((r = /^(integer|number) ≥ (-?[\d.]+)$/.exec(type))) Object.assign(spec, { kind: r[1], min: Number(r[2]) });
    else if ((r = /^(integer|number) > (-?[\d.]+) and (≤|<) ([\d.]+)$/.exec(type))) Object.assign(spec, { kind: r[1], min: Number(r[2]), minExclusive: true, max: Number(r[4]), maxExclusive: r[3] === '<' });
    else if (type === 'boolean') spec.kind = 'boolean';
    else if (/^`[^`]+`( \| `[^`]+`)+$/.test(type)) Object.assign(spec, { kind: 'enum', values: [...type.matchAll(/`([^`]+)`/g)].map((v) => v[1]!) });
    else if ((r = /^string matching `(.+)`/.exec(type))) Object.assign(spec, { kind: 'string', nonEmpty: !new RegExp(r[1]!).test('') });
    else if (/^(non-empty string|string|URL|string starting)/.test(type)) Object.assign(spec, { kind: 'string', nonEmpty: type !== 'string' });
    specs.set(spec.key, spec);
  }
  return specs;
}
const KEYS = readmeKeys();

/** A data path in the README's notation: `providers.<name>.pools.classes.<name>.minShare`, `routes[].retry`. */
function generic(path: ReadonlyArray<string | number>): string {
  let out = '';
  path.forEach((seg, i) => {
    const parent = path[i - 1];
    const named =
      (i === 1 && parent === 'providers') ||
      (i === 2 && path[0] === 'auth' && (parent === 'keys' || parent === 'priority' || parent === 'limits')) ||
      (parent === 'classes' && path[i - 2] === 'pools') ||
      (parent === 'models' && path[i - 2] === 'breaker');
    if (typeof seg === 'number') out += '[]';
    else out += `${out ? '.' : ''}${named ? '<name>' : seg}`;
  });
  return out;
}

/** `['routes', 0, 'retry']` -> `routes[0].retry`, as the README writes paths. */
function dotted(path: ReadonlyArray<string | number>): string {
  let out = '';
  for (const seg of path) {
    if (typeof seg === 'number') out += `[${seg}]`;
    else if (/^[A-Za-z_][A-Za-z0-9_-]*$/.test(seg)) out += out ? `.${seg}` : seg;
    else out += `[${JSON.stringify(seg)}]`;
  }
  return out;
}

/** The line of the deepest part of `path` the text has: a map key's line, a list item's line (the parent's, for a key left out). */
function lineOf(text: string, path: ReadonlyArray<string | number>): number {
  const lc = new LineCounter();
  const doc = parseDocument(text, { lineCounter: lc });
  let node: unknown = doc.contents;
  let line = 1;
  for (const seg of path) {
    if (isMap(node)) {
      const pair = node.items.find((p) => isScalar(p.key) && String(p.key.value) === String(seg));
      if (!pair || !isScalar(pair.key) || !pair.key.range) break;
      line = lc.linePos(pair.key.range[0]).line;
      node = pair.value;
    } else if (isSeq(node) && typeof seg === 'number' && node.items[seg]) {
      const item = node.items[seg] as { range?: [number, number, number] };
      if (item.range) line = lc.linePos(item.range[0]).line;
      node = item;
    } else break;
  }
  return line;
}

// ---------------------------------------------------------------------------------------------------------------
// The shipped configs, and an environment whose keys are secrets that must never be echoed.

const SECRET = (name: string) => `sk-fuzz-SECRET-${name}-7f3a9c`;

function envFor(text: string): Record<string, string> {
  const env: Record<string, string> = {};
  for (const name of referencedEnvVars(parseDocument(text))) {
    if (/KEY|TOKEN|SECRET|PASSWORD/.test(name)) env[name] = SECRET(name);
    else if (/REDIS/.test(name)) env[name] = 'redis://127.0.0.1:1';
    else if (/ENDPOINT/.test(name)) env[name] = 'https://example.openai.azure.com';
  }
  return env;
}

interface Source {
  name: string;
  data: Record<string, any>;
  env: Record<string, string>;
}

function sources(): Source[] {
  const files = [
    ...readdirSync(resolve(ROOT, 'config')).filter((f) => f.endsWith('.yaml')).map((f) => `config/${f}`),
    ...readdirSync(resolve(ROOT, 'config/examples')).filter((f) => f.endsWith('.yaml')).map((f) => `config/examples/${f}`),
  ];
  const texts = files.map((f) => ({ name: f, text: readFileSync(resolve(ROOT, f), 'utf8') }));
  [...README.matchAll(/```ya?ml\n([\s\S]*?)```/g)].forEach((m, i) => {
    let data: unknown;
    try {
      data = parse(m[1]!, { merge: true });
    } catch {
      return;
    }
    if (data && typeof data === 'object' && 'providers' in data && 'routes' in data) texts.push({ name: `README yaml block ${i}`, text: m[1]! });
  });
  // Mutants are written back as YAML: anchors are resolved first (a merge key has no place in plain data).
  return texts.map(({ name, text }) => {
    const data = parse(text, { merge: true }) as Record<string, any>;
    for (const key of Object.keys(data)) if (key.startsWith('x-')) delete data[key];
    return { name, data, env: envFor(text) };
  });
}

const SOURCES = sources();
const clone = <T>(v: T): T => structuredClone(v);

// ---------------------------------------------------------------------------------------------------------------
// Mutations. Each says which issue (path, and the words that say what was expected) the loader must report.

interface Mutant {
  kind: string;
  source: string;
  what: string;
  text: string;
  env: Record<string, string>;
  /** `refuse`: must fail with `issue`; `either`: the README allows both (the invariants still hold). */
  expect: 'refuse' | 'either';
  /** `path` null: any path (a YAML syntax error has none, a duplicate key its map's). */
  issue?: { path: ReadonlyArray<string | number> | null; words: Array<string | RegExp>; line?: number | 'any' };
}

type Leaf = { path: Array<string | number>; value: unknown; spec?: KeySpec };

function leaves(data: unknown, path: Array<string | number> = []): Leaf[] {
  if (data === null || typeof data !== 'object') return [{ path, value: data, spec: KEYS.get(generic(path)) }];
  const here: Leaf[] = path.length > 0 ? [{ path, value: data, spec: KEYS.get(generic(path)) }] : [];
  const entries = Array.isArray(data) ? data.map((v, i) => [i, v] as const) : Object.entries(data);
  return [...here, ...entries.flatMap(([k, v]) => leaves(v, [...path, k]))];
}

function setAt(data: any, path: ReadonlyArray<string | number>, value: unknown): void {
  let node = data;
  for (const seg of path.slice(0, -1)) node = node[seg];
  node[path.at(-1)!] = value;
}
function deleteAt(data: any, path: ReadonlyArray<string | number>): void {
  let node = data;
  for (const seg of path.slice(0, -1)) node = node[seg];
  delete node[path.at(-1)!];
}

/** A key one edit away from `key` that is no other key of the same level. */
function typo(r: Rng, key: string, siblings: string[]): string {
  for (let tries = 0; tries < 20; tries++) {
    const i = int(r, 1, key.length - 1);
    const edits = [
      key.slice(0, i) + key[i] + key.slice(i), // a doubled letter
      key.slice(0, i - 1) + key[i] + key[i - 1] + key.slice(i + 1), // two letters swapped
      key.slice(0, i) + key.slice(i + 1), // a letter left out
      key.slice(0, i) + 'x' + key.slice(i + 1), // a letter replaced
      key.slice(0, i) + 'ï' + key.slice(i + 1), // a letter replaced by one beyond ASCII
    ];
    const t = pick(r, edits);
    if (t !== key && !siblings.includes(t) && !KEYS.has(t)) return t;
  }
  return `${key}z`;
}

/** Words that say what range or type was expected: a bound (`must be > 0`, `must be <= 20`), or the kind of number. */
const RANGE_WORDS = /must be [<>]=? ?-?\d|expected (an? )?(integer|number)/;
const isDuration = (path: ReadonlyArray<string | number>) => /(Ms|S)$/.test(String(path.at(-1)));

/** No such value in this source: the mutation does not apply to it. */
class NotApplicable extends Error {}
const some = <T>(r: Rng, xs: readonly T[]): T => {
  if (xs.length === 0) throw new NotApplicable();
  return pick(r, xs);
};

function mutate(seed: number, kind: string): Mutant | undefined {
  try {
    return mutateOrThrow(seed, kind);
  } catch (e) {
    if (e instanceof NotApplicable) return undefined;
    throw e;
  }
}

function mutateOrThrow(seed: number, kind: string): Mutant | undefined {
  const r = prng(seed);
  const source = pick(r, SOURCES);
  const data = clone(source.data);
  const env = { ...source.env };
  const all = leaves(data);
  const finish = (what: string, rest: Omit<Mutant, 'kind' | 'source' | 'what' | 'text' | 'env'>, over?: (text: string) => string): Mutant => {
    const written = stringify(data, { lineWidth: 0 });
    return { kind, source: source.name, what, text: over ? over(written) : written, env, ...rest };
  };
  const scalars = (pred: (l: Leaf) => boolean) => all.filter((l) => l.spec && (l.value === null || typeof l.value !== 'object') && pred(l));
  const numeric = (l: Leaf) => l.spec!.kind === 'integer' || l.spec!.kind === 'number';
  switch (kind) {
    case 'delete-required': {
      const options = all.filter((l) => l.spec?.required && l.path.length > 0);
      const l = some(r, options);
      deleteAt(data, l.path);
      // A provider that is optional runs without its key (README: "Required unless the provider is optional").
      const parent = l.path.slice(0, -1);
      const key = String(l.path.at(-1));
      const optional = key === 'apiKey' && (data as any).providers?.[parent[1]!]?.optional === true;
      return finish(`deleted ${dotted(l.path)}`, {
        expect: optional ? 'either' : 'refuse',
        issue: { path: parent, words: [`missing required key "${key}"`, /expected/] },
      });
    }
    case 'wrong-type': {
      const l = some(r, scalars((x) => numeric(x) || x.spec!.kind === 'boolean' || x.spec!.kind === 'enum' || x.spec!.kind === 'string'));
      const spec = l.spec!;
      const bad = numeric(l) ? pick(r, ['ten', true, [1, 2], { n: 1 }]) : spec.kind === 'boolean' ? pick(r, ['maybe', 1, [true]]) : pick(r, [[String(l.value)], { value: l.value }, 42.5]);
      setAt(data, l.path, bad);
      // A number where text goes: YAML writes it bare, and the key's own words say what it takes.
      const either = (spec.kind === 'string' && !spec.nonEmpty && typeof bad === 'number') || spec.type.includes(' or ');
      return finish(`${dotted(l.path)} (${spec.type}) = ${JSON.stringify(bad)}`, { expect: either ? 'either' : 'refuse', issue: either ? undefined : { path: l.path, words: [/expected|must/] } });
    }
    case 'out-of-range': {
      const l = some(r, scalars((x) => numeric(x) && (x.spec!.min !== undefined || x.spec!.max !== undefined)));
      const s = l.spec!;
      const options: number[] = [];
      if (s.min !== undefined) options.push(s.minExclusive ? s.min : s.min - 1);
      if (s.max !== undefined) options.push(s.maxExclusive ? s.max : s.kind === 'integer' ? s.max + 1 : s.max + 0.5);
      if (s.kind === 'integer') options.push((s.min ?? 0) + 1.5 <= (s.max ?? Infinity) ? (s.min ?? 0) + 1.5 : s.min! + 0.5);
      const bad = some(r, options);
      setAt(data, l.path, bad);
      return finish(`${dotted(l.path)} (${s.type}) = ${bad}`, { expect: 'refuse', issue: { path: l.path, words: [RANGE_WORDS] } });
    }
    case 'misspelt-key': {
      const l = some(r, all.filter((x) => x.spec && typeof x.path.at(-1) === 'string' && !x.spec.key.endsWith('<name>')));
      const parent = l.path.slice(0, -1);
      let holder: any = data;
      for (const seg of parent) holder = holder[seg];
      const key = String(l.path.at(-1));
      const bad = typo(r, key, Object.keys(holder));
      // Re-insert in place, so the line of the key stays where it was.
      const entries = Object.entries(holder).map(([k, v]) => [k === key ? bad : k, v] as const);
      for (const k of Object.keys(holder)) delete holder[k];
      Object.assign(holder, Object.fromEntries(entries));
      return finish(`${dotted(l.path)} written "${bad}"`, {
        expect: 'refuse',
        issue: { path: parent, words: [`unknown key "${bad}"`, new RegExp(`did you mean "?([A-Za-z.]*\\.)?${key}"?\\?`)], line: lineOf(stringify(data, { lineWidth: 0 }), [...parent, bad]) },
      });
    }
    case 'bad-enum': {
      const l = some(r, scalars((x) => x.spec!.kind === 'enum' && typeof x.value === 'string' && !/^(true|false)$/.test(String(x.value))));
      const v = String(l.value);
      const bad = pick(r, [v.toUpperCase(), v.replaceAll('-', '_'), `${v}s`, v.slice(0, -1), `${v} `.trim() + '-v2'].filter((b) => !l.spec!.values!.includes(b)));
      setAt(data, l.path, bad);
      return finish(`${dotted(l.path)} = ${JSON.stringify(bad)}`, { expect: 'refuse', issue: { path: l.path, words: [new RegExp(l.spec!.values!.filter((x) => x !== 'false').map((x) => x.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('|'))] } });
    }
    case 'bad-interpolation': {
      const l = some(r, scalars((x) => typeof x.value === 'string'));
      const [bad, words] = pick(r, [
        ['${OPENAI_API_KEY', /\$\{|unterminated|closing|}/i],
        ['${}', /\$\{|name|empty/i],
        ['${1NOT_A_NAME}', /\$\{|name/i],
        ['${FUZZ_UNSET_VARIABLE_64}', /environment variable FUZZ_UNSET_VARIABLE_64 is not set/],
        ['${FUZZ_UNSET_A:-${FUZZ_UNSET_B}}', /environment variable FUZZ_UNSET_B is not set/],
        ['prefix-${FUZZ_UNSET_VARIABLE_64}-suffix', /environment variable FUZZ_UNSET_VARIABLE_64 is not set/],
      ] as Array<[string, RegExp]>);
      setAt(data, l.path, bad);
      return finish(`${dotted(l.path)} = ${JSON.stringify(bad)}`, { expect: 'refuse', issue: { path: l.path, words: [words] } });
    }
    case 'duplicate-route-name': {
      const routes = data.routes as Array<Record<string, unknown>>;
      if (routes.length < 2) return undefined;
      const k = int(r, 1, routes.length - 1);
      routes[k]!.name = routes[int(r, 0, k - 1)]!.name;
      return finish(`routes[${k}].name = ${JSON.stringify(routes[k]!.name)}`, { expect: 'refuse', issue: { path: ['routes', k, 'name'], words: [/used twice/] } });
    }
    case 'unknown-provider': {
      const refs = all.filter((x) => x.spec?.key.endsWith('.provider') || x.spec?.key === 'passthrough.provider').filter((x) => typeof x.value === 'string');
      const l = some(r, refs);
      const bad = typo(r, String(l.value), Object.keys(data.providers));
      setAt(data, l.path, bad);
      return finish(`${dotted(l.path)} = ${JSON.stringify(bad)}`, { expect: 'refuse', issue: { path: l.path, words: [`unknown provider "${bad}"`, String(l.value)] } });
    }
    case 'missing-provider': {
      const refs = all.filter((x) => x.spec?.key.endsWith('.provider') || x.spec?.key === 'passthrough.provider').filter((x) => typeof x.value === 'string');
      const l = some(r, refs);
      delete data.providers[String(l.value)];
      return finish(`providers.${String(l.value)} deleted`, { expect: 'refuse', issue: { path: l.path, words: [`unknown provider "${String(l.value)}"`] } });
    }
    case 'negative-duration': {
      const l = some(r, scalars((x) => numeric(x) && isDuration(x.path)));
      const bad = pick(r, [-1, -500, -0.5, -2147483648]);
      setAt(data, l.path, bad);
      return finish(`${dotted(l.path)} = ${bad}`, { expect: 'refuse', issue: { path: l.path, words: [RANGE_WORDS] } });
    }
    case 'huge-number': {
      const l = some(r, scalars(numeric));
      const bad = pick(r, [1e308, 2 ** 53 + 2, Infinity, 2147483648, 1e21]);
      setAt(data, l.path, bad);
      // Within the README's bounds (a number with no maximum), a huge value is valid.
      const s = l.spec!;
      const fits = Number.isFinite(bad) && (s.max === undefined || bad <= s.max) && (s.kind === 'number' || Number.isSafeInteger(bad));
      return finish(`${dotted(l.path)} (${s.type}) = ${bad}`, { expect: fits ? 'either' : 'refuse', issue: fits ? undefined : { path: l.path, words: [RANGE_WORDS] } });
    }
    case 'empty-string': {
      const l = some(r, scalars((x) => typeof x.value === 'string' && x.spec!.kind !== 'other'));
      setAt(data, l.path, '');
      // A plain `string` may be empty, except an apiKey (not of an optional provider) and a client key.
      const s = l.spec!;
      const isKey = s.key.endsWith('.apiKey') && data.providers?.[l.path[1]!]?.optional !== true;
      const refuse = s.nonEmpty || s.kind === 'enum' || isKey || s.key === 'auth.keys.<name>' || s.key === 'routes[].priority' || s.key === 'auth.priority.<name>';
      return finish(`${dotted(l.path)} = ""`, { expect: refuse ? 'refuse' : 'either', issue: refuse ? { path: l.path, words: [/empty|expected|must|not/] } : undefined });
    }
    case 'unicode': {
      const l = some(r, scalars((x) => typeof x.value === 'string'));
      const bad = `${String(l.value)}${pick(r, ['🚀', 'ü', '\u200b', 'чат', '\u202e'])}`;
      setAt(data, l.path, bad);
      // A name of letters, digits and punctuation (a pattern the README gives), and a key (ASCII: a header's bytes),
      // take none of these; free text (a model, a provider's name) may, and so may a URL (its path is percent-encoded,
      // its host may be an international name).
      const s = l.spec!;
      const pattern = /^string matching `(.+)`/.exec(s.type)?.[1];
      const refuse = (pattern !== undefined && !new RegExp(pattern).test(bad)) || s.key.endsWith('.apiKey') || s.key === 'auth.keys.<name>' || s.kind === 'enum';
      return finish(`${dotted(l.path)} = ${JSON.stringify(bad)}`, refuse ? { expect: 'refuse', issue: { path: l.path, words: [/expected|must|beyond ASCII|not|unknown/] } } : { expect: 'either' });
    }
    case 'nested-junk': {
      const depth = int(r, 20, 400);
      let junk: unknown = pick(r, ['x', 1, null]);
      for (let i = 0; i < depth; i++) junk = chance(r, 0.5) ? { a: junk } : [junk];
      const maps = all.filter((x) => x.spec && x.value !== null && typeof x.value === 'object' && !Array.isArray(x.value) && !x.spec.type.startsWith('map of'));
      const l = some(r, maps);
      if (chance(r, 0.5)) {
        const key = pick(r, ['junk', 'extra', 'nested']);
        setAt(data, [...l.path, key], junk);
        return finish(`${dotted(l.path)}.${key} = junk ${depth} deep`, { expect: 'refuse', issue: { path: l.path, words: [`unknown key "${key}"`], line: lineOf(stringify(data, { lineWidth: 0 }), [...l.path, key]) } });
      }
      const target = some(r, scalars(() => true));
      setAt(data, target.path, junk);
      return finish(`${dotted(target.path)} = junk ${depth} deep`, { expect: 'refuse', issue: { path: target.path, words: [/expected|must|needs/] } });
    }
    case 'secret-misplaced': {
      // A key from the environment in a field that refuses it (`baseUrl: ${OPENAI_API_KEY}`), or a literal key of the
      // wrong type: the message names the variable or the key's place, never the key.
      const varName = pick(r, Object.keys(env).filter((n) => env[n]!.startsWith('sk-fuzz')).concat('FUZZ_PROVIDER_KEY'));
      env[varName] = SECRET(varName);
      const candidates = scalars((x) => (x.spec!.nonEmpty === true || x.spec!.kind === 'enum' || numeric(x)) && !x.spec!.key.endsWith('.provider') && x.spec!.key !== 'server.host');
      if (chance(r, 0.7)) {
        const l = some(r, candidates);
        setAt(data, l.path, `\${${varName}}`);
        return finish(`${dotted(l.path)} = \${${varName}}`, { expect: 'either' });
      }
      const keys = all.filter((x) => x.spec?.key.endsWith('.apiKey') || x.spec?.key === 'auth.keys.<name>');
      const l = some(r, keys);
      const literal = SECRET('LITERAL');
      env.__LITERAL__ = literal;
      const bad = pick(r, [[literal], { key: literal }, `Bearer ${literal}`, `$${varName}`]);
      setAt(data, l.path, bad);
      // "Bearer " is refused in a provider's apiKey (the gateway writes the scheme itself); a client key may hold it.
      const either = typeof bad === 'string' && bad.startsWith('Bearer ') && l.spec!.key === 'auth.keys.<name>';
      return finish(`${dotted(l.path)} = ${typeof bad === 'string' && bad.startsWith('$') ? JSON.stringify(bad) : 'a literal key of the wrong shape'}`, {
        expect: either ? 'either' : 'refuse',
        issue: either ? undefined : { path: l.path, words: [/expected|Bearer|write \$\{|is "/] },
      });
    }
    case 'broken-yaml': {
      const l = some(r, scalars(() => true));
      const written = stringify(data, { lineWidth: 0 });
      const lines = written.split('\n');
      const line = lineOf(written, l.path);
      const at = line - 1;
      const [how, expectLine] = pick(r, [
        ['tab in the indentation', true],
        ['an unclosed [', false],
        ['an unclosed quote', false],
        ['a second mapping on the line', true],
        ['the key written twice', true],
        ['a second document', true],
        ['an unquoted ${VAR} in a flow mapping', true],
      ] as Array<[string, boolean]>);
      const indent = /^\s*/.exec(lines[at]!)![0];
      switch (how) {
        case 'tab in the indentation':
          if (indent.length === 0) return undefined;
          lines[at] = `\t${lines[at]!.slice(1)}`;
          break;
        case 'an unclosed [':
          lines[at] = `${lines[at]}, [1, 2`;
          lines[at] = lines[at]!.replace(/: (.*), \[1, 2$/, ': [$1, [1, 2');
          break;
        case 'an unclosed quote':
          lines[at] = lines[at]!.replace(/: (.*)$/, ': "$1');
          break;
        case 'a second mapping on the line':
          lines[at] = `${lines[at]}: other: 1`.replace(/: (.*): other: 1$/, ': a: b: c');
          break;
        case 'the key written twice':
          if (!/^\s*[A-Za-z]+: \S/.test(lines[at]!)) return undefined;
          lines.splice(at + 1, 0, lines[at]!);
          break;
        case 'a second document':
          lines.splice(at + 1, 0, '---', 'routes: []');
          break;
        case 'an unquoted ${VAR} in a flow mapping':
          lines.splice(at + 1, 0, `${indent}fuzzFlow: { port: \${FUZZ_PORT} }`);
          break;
      }
      const errorLine = how === 'tab in the indentation' || how === 'a second mapping on the line' ? line : line + 1;
      return finish(`${how} at line ${line}`, { expect: 'refuse', issue: { path: null, words: [/./], line: expectLine ? errorLine : 'any' } }, () => lines.join('\n'));
    }
  }
  throw new Error(`unknown kind ${kind}`);
}

const KINDS = [
  'delete-required',
  'wrong-type',
  'out-of-range',
  'misspelt-key',
  'bad-enum',
  'broken-yaml',
  'bad-interpolation',
  'duplicate-route-name',
  'unknown-provider',
  'missing-provider',
  'negative-duration',
  'huge-number',
  'empty-string',
  'unicode',
  'nested-junk',
  'secret-misplaced',
] as const;

const PER_KIND = Number(process.env.FUZZ_PER_KIND ?? 24);

/** What is wrong with how the loader treated `m` (empty: nothing). */
function judge(m: Mutant): string[] {
  const problems: string[] = [];
  let err: unknown;
  try {
    parseConfig(m.text, FILE, m.env);
  } catch (e) {
    err = e;
  }
  if (err === undefined) {
    if (m.expect === 'refuse') problems.push('loaded, but the README says it is invalid');
    return problems;
  }
  if (!(err instanceof ConfigError)) return [`threw ${(err as Error)?.name ?? typeof err}, not ConfigError: ${(err as Error)?.stack ?? String(err)}`];
  const message = err.message;
  const secrets = Object.values(m.env).filter((v) => v.includes('SECRET'));
  for (const s of secrets) if (message.includes(s)) problems.push(`echoes a secret value (${s})`);
  if (/\n\s+at .+:\d+:\d+\)?/.test(message) || /TypeError|RangeError|ReferenceError|Cannot read prop/.test(message)) problems.push('a stack trace or a JS error reaches the user');
  for (const line of message.split('\n')) if (!line.startsWith(`${FILE}`)) problems.push(`a line does not name the file: ${JSON.stringify(line)}`);
  if (message.length > 20_000) problems.push(`a message of ${message.length} characters`);
  for (const issue of err.issues) if (issue.line === undefined) problems.push(`an issue without a line: ${issue.path}: ${issue.message}`);
  if (m.issue) {
    const path = m.issue.path === null ? null : dotted(m.issue.path);
    const found = err.issues.filter((i) => path === null || i.path === path);
    if (found.length === 0) problems.push(`no issue at ${JSON.stringify(path)}`);
    else {
      const line = m.issue.line ?? lineOf(m.text, m.issue.path ?? []);
      const matching = found.filter((i) => m.issue!.words.every((w) => (typeof w === 'string' ? i.message.includes(w) : w.test(i.message))));
      if (matching.length === 0) problems.push(`the issue at ${JSON.stringify(path)} does not say ${m.issue.words.map(String).join(' and ')}`);
      else if (line !== 'any' && !matching.some((i) => i.line === line)) problems.push(`the issue at ${JSON.stringify(path)} is on line ${matching.map((i) => i.line).join(',')}, expected ${line}`);
      if (!message.split('\n').some((l) => l.startsWith(`${FILE}:`) && (path === null || path === '' || l.includes(`: ${path}: `)))) problems.push(`no line of the message reads "${FILE}:<line>: ${path}: ..."`);
    }
  }
  return problems;
}

const report = (seed: number, m: Mutant, problems: string[]) =>
  `seed ${seed} [${m.kind}] ${m.source}: ${m.what}\n  ${problems.join('\n  ')}\n  --- loader said:\n${indent(messageOf(m))}` +
  (process.env.FUZZ_BRIEF ? '' : `\n  --- mutant:\n${indent(m.text.length > 4000 ? `${m.text.slice(0, 4000)}...` : m.text)}`);
const indent = (s: string) =>
  s
    .split('\n')
    .map((l) => `    ${l}`)
    .join('\n');
function messageOf(m: Mutant): string {
  try {
    parseConfig(m.text, FILE, m.env);
    return '(loaded)';
  } catch (e) {
    return (e as Error).message.slice(0, 3000);
  }
}

describe('half 1: invalid configs from the shipped ones, mutated', () => {
  it('reads every shipped config and README config the fuzzer starts from, as written and as written back', () => {
    expect(SOURCES.length).toBeGreaterThanOrEqual(9);
    for (const s of SOURCES) {
      const text = stringify(s.data, { lineWidth: 0 });
      expect(() => parseConfig(text, FILE, s.env), s.name).not.toThrow();
    }
    // The README's table is what the mutations are drawn from: it must describe the keys the configs use.
    expect(KEYS.size).toBeGreaterThan(150);
    const undocumented = SOURCES.flatMap((s) => leaves(s.data).filter((l) => !l.spec && typeof l.path.at(-1) !== 'number').map((l) => `${s.name}: ${generic(l.path)}`));
    expect(undocumented).toEqual([]);
  });

  it.each(KINDS)('%s: refused with the file, the YAML path, the line and what was expected; no crash, stack or secret', (kind) => {
    const failures: string[] = [];
    let tried = 0;
    const offset = KINDS.indexOf(kind) * 100_000;
    for (let i = 0; tried < PER_KIND && i < PER_KIND * 4; i++) {
      const seed = BASE_SEED + offset + i;
      let m: Mutant | undefined;
      try {
        m = mutate(seed, kind);
      } catch (e) {
        failures.push(`seed ${seed} [${kind}]: the fuzzer itself failed: ${(e as Error).stack}`);
        continue;
      }
      if (!m) continue;
      tried++;
      const problems = judge(m);
      if (problems.length > 0) failures.push(report(seed, m, problems));
    }
    expect(tried).toBeGreaterThanOrEqual(Math.min(PER_KIND, 10));
    expect(failures.slice(0, Number(process.env.FUZZ_SHOW ?? 3)).join('\n\n'), `${failures.length} of ${tried} mutants`).toBe('');
  });

  it('a config file read from disk names its own path in every line (loadConfigFile, as start-up does)', async () => {
    const { mkdtempSync, writeFileSync, rmSync } = await import('node:fs');
    const { tmpdir } = await import('node:os');
    const dir = mkdtempSync(resolve(tmpdir(), 'suite64-'));
    try {
      const m = mutate(BASE_SEED, 'misspelt-key')!;
      const file = resolve(dir, 'gateway config.yaml');
      writeFileSync(file, m.text);
      let err: unknown;
      try {
        loadConfigFile(file, m.env);
      } catch (e) {
        err = e;
      }
      expect(err, report(BASE_SEED, m, ['not refused'])).toBeInstanceOf(ConfigError);
      for (const line of (err as Error).message.split('\n')) expect(line.startsWith(`${file}:`), line).toBe(true);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  describe('through a real gateway process (`src/main.ts --config`)', () => {
    const spawn = useGatewayProcesses();
    it('exits 2 under "stormgate: invalid config" with the file and line, no stack trace and no secret', async () => {
      const picks: Array<[number, (typeof KINDS)[number]]> = [
        [BASE_SEED + 7, 'misspelt-key'],
        [BASE_SEED + 11, 'broken-yaml'],
        [BASE_SEED + 3, 'secret-misplaced'],
        [BASE_SEED + 5, 'out-of-range'],
      ];
      const mutants = picks.map(([seed, kind]) => {
        for (let s = seed; ; s++) {
          const m = mutate(s, kind);
          if (m && m.expect === 'refuse') return { seed: s, m };
        }
      });
      const runs = mutants.map(({ seed, m }, i) => ({ seed, m, g: spawn(`mutant-${i}`, m.text, m.env) }));
      for (const { seed, m, g } of runs) {
        const code = await g.exited;
        const out = g.output();
        const where = report(seed, m, [`exit ${code}`, out]);
        expect(code, where).toBe(2);
        expect(out.startsWith('stormgate: invalid config\n'), where).toBe(true);
        expect(out, where).toContain(`${g.file}:`);
        expect(out, where).toMatch(new RegExp(`${g.file.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}:\\d+`));
        expect(out, where).not.toMatch(/\n\s+at .+:\d+:\d+/);
        for (const v of Object.values(m.env)) if (v.includes('SECRET')) expect(out, where).not.toContain(v);
      }
    }, 60_000);
  });
});

describe('found by the fuzzer', () => {
  const base = `providers:
  openai:
    family: openai
    baseUrl: https://api.openai.com/v1
    apiKey: "\${OPENAI_API_KEY}"
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: openai } ]
`;
  const env = { OPENAI_API_KEY: SECRET('OPENAI_API_KEY') };
  const errorOf = (text: string): ConfigError => {
    try {
      parseConfig(text, FILE, env);
    } catch (e) {
      expect(e).toBeInstanceOf(ConfigError);
      return e as ConfigError;
    }
    throw new Error(`loaded:\n${text}`);
  };

  // Seeds 864080, 964073: the README's contextWindowFallback.provider is "Name of a provider under `providers`", yet a
  // typo there loaded, and every request on the route then failed on the provider that is not there.
  it('refuses a contextWindowFallback whose provider is not under providers, at its line, naming the providers', () => {
    const err = errorOf(`${base}    contextWindowFallback: { provider: openaii, model: gpt-4.1 }\n`);
    expect(err.message).toBe(`${FILE}:10: routes[0].contextWindowFallback.provider: unknown provider "openaii"; expected one of: openai`);
  });

  // Seeds 1564073, 1564077: a key from the environment where a path belongs was named as its variable, and then
  // printed whole in the hint that followed (`write "/<the key>"`).
  it('names the variable, never its value, when match.path comes from the environment and lacks its "/"', () => {
    const err = errorOf(base.replace('path: /v1/chat/completions', 'path: "\${OPENAI_API_KEY}"'));
    expect(err.message).not.toContain(env.OPENAI_API_KEY);
    expect(err.message).toBe(`${FILE}:8: routes[0].match.path: must start with "/", received the value of $OPENAI_API_KEY`);
    // Written in the file, the hint stays: the text is the user's own, not a secret.
    expect(errorOf(base.replace('path: /v1/chat/completions', 'path: v1/chat/completions')).message).toContain('write "/v1/chat/completions"');
  });

  // Seed 1600017 (FUZZ_SEED=99991): README, "Configuration reference": `apiKey: $OPENAI_API_KEY`, "which would send the
  // variable's name as the key", is refused with the fix. A client key written so loaded, and the gateway's key for
  // that client was the variable's name: a key anyone who reads the config, or guesses the name, holds.
  it('refuses a client key written as $VAR (shell style) with the fix, as it refuses a provider apiKey so written', () => {
    const err = errorOf(`${base}auth:\n  keys:\n    agents: $STORMGATE_KEY_AGENTS\n`);
    expect(err.message).toBe(`${FILE}:12: auth.keys.agents: is "$STORMGATE_KEY_AGENTS", which is text, not a reference to the variable: write \${STORMGATE_KEY_AGENTS}`);
    // A key that holds a "$" elsewhere is a key like any other.
    expect(() => parseConfig(`${base}auth:\n  keys:\n    agents: "k$ey-1"\n`, FILE, env)).not.toThrow();
  });

  // Nested junk thousands of levels deep (a generated file gone wrong) overflowed the YAML parser's stack, and the user
  // read the engine's words, "Maximum call stack size exceeded", at a column of line 10.
  it('says a value nests too deeply, at its line, when brackets nest thousands of levels deep', () => {
    for (const [open, close] of [['[', ']'], ['{ a: ', ' }']] as const) {
      const err = errorOf(`${base}    junk: ${open.repeat(3000)}1${close.repeat(3000)}\n`);
      expect(err.message).not.toMatch(/call stack|Maximum/);
      expect(err.message).toMatch(new RegExp(`^${FILE}:10:\\d+: nests too deeply`));
    }
  });
});

// ---------------------------------------------------------------------------------------------------------------
// Half 2: valid configs from the README's fields.

const CLASS_SETS: Array<Record<string, { minShare?: number; maxShare?: number; maxQueue?: number }>> = [
  { online: { minShare: 0.5, maxQueue: 1000 }, batch: { minShare: 0.1, maxQueue: 10_000 } },
  { critical: { minShare: 0.3 }, online: { minShare: 0.4, maxShare: 0.9 }, batch: { minShare: 0.1, maxShare: 0.5, maxQueue: 50 } },
  { online: { minShare: 1 } },
];
const STRATEGIES = ['full-jitter', 'equal-jitter', 'decorrelated-jitter', 'exponential', 'fixed'] as const;

interface ValidCase {
  seed: number;
  text: string;
  env: Record<string, string>;
  clientKey?: string;
  expected: { maxAttempts: number; strategy: string; priority: string; timeoutMs: number };
}

/** A valid config from the README's fields, as YAML with keys from the environment; `mock` serves both families. */
function validCase(seed: number, mock: string): ValidCase {
  const r = prng(seed);
  const classes = pick(r, CLASS_SETS);
  const priority = pick(r, Object.keys(classes));
  const pools = (connections: number) =>
    chance(r, 0.6)
      ? {
          maxConcurrent: int(r, 4, connections),
          ...(chance(r, 0.5) && { maxConcurrentRetries: int(r, 1, 8) }),
          classes,
          decrease: pick(r, [0.5, 0.8, 0.9, 0.95]),
          minLimit: int(r, 1, 3),
          ...(chance(r, 0.4) && { requestsPerMinute: 60_000, burst: int(r, 10, 1000) }),
          ...(chance(r, 0.3) && { tokensPerMinute: 10_000_000, tokenBurst: 1_000_000 }),
        }
      : { classes };
  const breaker = () =>
    chance(r, 0.25)
      ? false
      : {
          failureRate: pick(r, [0.25, 0.5, 1]),
          windowS: int(r, 1, 300),
          minRequests: int(r, 1, 50),
          consecutiveFailures: int(r, 1, 10),
          slowCallMs: int(r, 100, 10_000),
          openS: pick(r, [0.5, 5, 30]),
          halfOpenProbes: int(r, 1, 5),
          closeAfter: int(r, 1, 5),
          ...(chance(r, 0.3) && { models: { 'gpt-4o': { failureRate: 0.9, openS: 2 } } }),
        };
  const timeouts = () => ({
    connectMs: int(r, 500, 5000),
    firstTokenMs: int(r, 5000, 30_000),
    idleMs: int(r, 5000, 30_000),
    ...(chance(r, 0.3) && { responseMs: int(r, 10_000, 60_000) }),
    ...(chance(r, 0.3) && { keepAliveMs: int(r, 500, 4000) }),
  });
  const baseMs = int(r, 1, 500);
  const retry = () => ({
    maxAttempts: int(r, 1, 5),
    backoff: { strategy: pick(r, STRATEGIES), baseMs, capMs: baseMs + int(r, 0, 3000) },
    ...(chance(r, 0.5) && { retryOn: pick(r, [[429, 503], [429, 500, 502, 503, 504, 529, 'network', 'timeout'], ['network']]) }),
    maxWaitHintMs: int(r, 0, 20_000),
  });
  const openaiConnections = int(r, 8, 128);
  const routeRetry = retry();
  const timeoutMs = int(r, 5000, 120_000);
  const auth = chance(r, 0.5);
  const claudeModel = pick(r, ['claude-sonnet-4-5', 'claude-haiku-4-5', 'claude-3-7-sonnet-latest']);
  const config = {
    server: {
      host: '127.0.0.1',
      port: 0,
      logLevel: pick(r, ['warn', 'error', 'silent', 'info']),
      ...(chance(r, 0.5) && { bodyLimitBytes: int(r, 65_536, 10_485_760) }),
      ...(chance(r, 0.5) && { requestTimeoutMs: int(r, 5000, 60_000), keepAliveTimeoutMs: int(r, 1000, 72_000) }),
      ...(chance(r, 0.3) && { logSuccessRate: pick(r, [0, 0.5, 1]) }),
    },
    providers: {
      openai: {
        family: 'openai',
        baseUrl: '${FUZZ_MOCK_URL}/v1',
        apiKey: '${FUZZ_OPENAI_KEY}',
        timeouts: timeouts(),
        maxConnections: openaiConnections,
        pools: pools(openaiConnections),
        breaker: breaker(),
        ...(chance(r, 0.3) && { streamUsage: true }),
        ...(chance(r, 0.3) && { authHoldS: pick(r, [1, 60, 0.5]) }),
      },
      claude: {
        family: 'anthropic',
        baseUrl: '${FUZZ_MOCK_URL}',
        apiKey: chance(r, 0.5) ? '${FUZZ_ANTHROPIC_KEY}' : '${FUZZ_ANTHROPIC_KEY:-}',
        optional: chance(r, 0.5),
        sampling: pick(r, ['drop', 'forward', 'refuse']),
        defaultMaxTokens: int(r, 256, 8192),
        ...(chance(r, 0.3) && { thinking: chance(r, 0.5) ? false : { low: 1024, medium: 2048, high: 8192, xhigh: 16_384 } }),
        timeouts: timeouts(),
        maxConnections: 32,
        pools: pools(32),
        breaker: breaker(),
      },
    },
    routes: [
      {
        name: pick(r, ['chat', 'chat.v1', 'agents_chat', 'chat-main']),
        match: { path: '/v1/chat/completions', ...(chance(r, 0.3) && { models: ['gpt-4o', 'gpt-4o-*'] }) },
        targets: [
          { provider: 'openai', ...(chance(r, 0.3) && { retry: retry() }), ...(chance(r, 0.3) && { weight: int(r, 1, 5) }) },
          { provider: 'claude', model: claudeModel, ...(chance(r, 0.3) && { weight: int(r, 1, 5) }) },
        ],
        strategy: pick(r, ['fallback', 'weighted']),
        retry: routeRetry,
        priority,
        timeoutMs,
        minAttemptMs: int(r, 0, 1000),
        ...(chance(r, 0.4) && { deadlineMarginMs: int(r, 0, 500) }),
        budget: {
          ratio: pick(r, [0, 0.1, 0.5, 10]),
          windowS: int(r, 1, 300),
          minRetriesPerSecond: pick(r, [0, 1, 10, 2.5]),
          ...(chance(r, 0.4) && { repeats: { windowS: int(r, 0, 600), countAsRetries: chance(r, 0.5) } }),
        },
        park: chance(r, 0.3) ? false : { maxQueue: int(r, 1, 10_000), ...(chance(r, 0.5) && { maxWaitMs: int(r, 100, 10_000) }) },
        ...(chance(r, 0.3) && { streamRecovery: pick(r, ['off', 'continue']) }),
        ...(chance(r, 0.3) && { contextWindowFallback: { provider: 'claude', model: 'claude-sonnet-4-5' } }),
        ...(chance(r, 0.2) && { degraded: { message: 'The assistant is busy; try again in a minute.' } }),
      },
      { name: 'embeddings', match: { path: '/v1/embeddings' }, targets: [{ provider: 'openai' }], priority: pick(r, Object.keys(classes)) },
    ],
    ...(auth && {
      auth: {
        keys: { app: '${FUZZ_CLIENT_KEY}', ...(chance(r, 0.5) && { other: '${FUZZ_CLIENT_KEY_2}' }) },
        ...(chance(r, 0.5) && { limits: { '*': { requestsPerMinute: 60_000, ...(chance(r, 0.5) && { tokensPerMinute: 10_000_000 }) } } }),
      },
    }),
    ...(chance(r, 0.4) && { drain: { preStopMs: int(r, 0, 5000), graceMs: int(r, 0, 30_000) } }),
    ...(chance(r, 0.4) && { idempotency: { enabled: chance(r, 0.7), ttlMs: int(r, 1000, 600_000), maxAnswerBytes: int(r, 1024, 1_048_576) } }),
  };
  const env = {
    FUZZ_MOCK_URL: mock,
    FUZZ_OPENAI_KEY: SECRET('FUZZ_OPENAI_KEY'),
    FUZZ_ANTHROPIC_KEY: SECRET('FUZZ_ANTHROPIC_KEY'),
    FUZZ_CLIENT_KEY: SECRET('FUZZ_CLIENT_KEY'),
    FUZZ_CLIENT_KEY_2: SECRET('FUZZ_CLIENT_KEY_2'),
  };
  return {
    seed,
    text: stringify(config, { lineWidth: 0 }),
    env,
    clientKey: auth ? env.FUZZ_CLIENT_KEY : undefined,
    expected: { maxAttempts: routeRetry.maxAttempts, strategy: routeRetry.backoff.strategy, priority, timeoutMs },
  };
}

describe('half 2: valid configs from the README fields', () => {
  let mock: MockServer;
  beforeAll(async () => {
    mock = await startMock({ quiet: true });
  });
  afterAll(async () => {
    await mock?.close();
  });

  const VALID = Number(process.env.FUZZ_VALID ?? 40);
  const STARTED = Number(process.env.FUZZ_STARTED ?? 8);

  it(`loads ${VALID} seeded valid configs as written, keeping what they set`, () => {
    const failures: string[] = [];
    for (let i = 0; i < VALID; i++) {
      const c = validCase(BASE_SEED + 500_000 + i, mock.url);
      try {
        const config = parseConfig(c.text, FILE, c.env);
        const route = config.routes[0]!;
        expect(route.retry.maxAttempts).toBe(c.expected.maxAttempts);
        expect(route.retry.backoff.strategy).toBe(c.expected.strategy);
        expect(route.priority).toBe(c.expected.priority);
        expect(route.timeoutMs).toBe(c.expected.timeoutMs);
        expect(config.providers.openai!.apiKey).toBe(c.env.FUZZ_OPENAI_KEY);
      } catch (e) {
        failures.push(`seed ${c.seed}: ${(e as Error).message}\n${indent(c.text)}`);
      }
    }
    expect(failures.slice(0, 3).join('\n\n'), `${failures.length} of ${VALID}`).toBe('');
  });

  it(`starts ${STARTED} of them in-process: a chat completion and a stream through the openai SDK, /metrics, /readyz, a clean close`, async () => {
    for (let i = 0; i < STARTED; i++) {
      const c = validCase(BASE_SEED + 500_000 + i, mock.url);
      const where = `seed ${c.seed}:\n${indent(c.text)}`;
      const config: Config = parseConfig(c.text, FILE, c.env);
      const logs: string[] = [];
      const app = await buildServer(config, { logger: createLogger(config, testLogSink(logs)), metrics: createMetrics({ defaultMetrics: false }) });
      let closed = false;
      try {
        const url = await app.listen({ host: '127.0.0.1', port: 0 });
        // Every other config meets an OpenAI primary that answers 503 to gpt-4o: the Anthropic backup answers instead.
        const primaryDown = i % 2 === 0;
        mock.setFaults(primaryDown ? { models: { 'gpt-4o': { errors: [{ status: 503 }] } } } : {});
        const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: c.clientKey ?? 'unused', maxRetries: 0, timeout: 20_000 });
        const { data: answer, response } = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: `hello ${i}` }] }).withResponse();
        expect(answer.choices[0]?.message.content, where).toBeTruthy();
        if (primaryDown) expect(response.headers.get('x-stormgate-target'), where).toMatch(/^claude\//);
        const stream = await client.chat.completions.create({ model: 'gpt-4o', stream: true, messages: [{ role: 'user', content: `stream ${i}` }] });
        let text = '';
        let finish: string | null | undefined;
        for await (const chunk of stream) {
          text += chunk.choices[0]?.delta?.content ?? '';
          finish = chunk.choices[0]?.finish_reason ?? finish;
        }
        expect(text.length, where).toBeGreaterThan(0);
        expect(finish, where).toBe('stop');
        const metrics = await fetch(`${url}/metrics`);
        expect(metrics.status, where).toBe(200);
        expect(await metrics.text(), where).toContain('stormgate_requests_total');
        const ready = await fetch(`${url}/readyz`);
        expect(ready.status, where).toBe(200);
        await ready.arrayBuffer();
        await app.close();
        closed = true;
        await expect(fetch(`${url}/readyz`), where).rejects.toThrow();
        const text2 = logs.join('');
        for (const v of Object.values(c.env)) if (v.includes('SECRET')) expect(text2, where).not.toContain(v);
      } finally {
        mock.setFaults({});
        if (!closed) await app.close();
      }
    }
  }, 60_000);
});
