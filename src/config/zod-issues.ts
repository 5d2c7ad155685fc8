// Turns zod's issues into plain sentences about the YAML file: what was expected, what was found.
import type { core } from 'zod';
import { mapValueKind } from './schema-walk.ts';
import { closest, explainUnknownKey } from './unknown-key.ts';

/**
 * A zod issue restated for a config file. `path` is the data path the message is about; `at`, when set, is a
 * more precise place to point at (the unknown key itself rather than the object that holds it).
 */
interface PlainIssue {
  path: PropertyKey[];
  at?: PropertyKey[];
  message: string;
}

// Values at these keys may be credentials, so messages never repeat them. Not a key named for a quantity
// (tokensPerMinute, firstTokenMs, defaultMaxTokens, tokenBurst): it holds a number, and the text found there is what
// to fix. A client's `burst` (auth.limits) is one too.
const SECRET_KEY = /key|token|secret|password|credential/i;
const QUANTITY_KEY = /(Ms|PerMinute|Tokens|Burst)$|^burst$/;
const isSecretKey = (key: PropertyKey | undefined): boolean => SECRET_KEY.test(String(key)) && !QUANTITY_KEY.test(String(key));

export function describeZodIssues(root: core.$ZodType, issues: readonly core.$ZodIssue[], data: unknown): PlainIssue[] {
  // zod's own bound on every integer (the safe range) says nothing a key's own maximum does not say better.
  const bounded = new Set(issues.filter((i) => i.code === 'too_big' && i.origin !== 'int').map((i) => i.path.join('\0')));
  const own = issues.filter((i) => !(i.code === 'too_big' && i.origin === 'int' && bounded.has(i.path.join('\0'))));
  return own.flatMap((issue) => describe(root, issue, [], data));
}

function describe(root: core.$ZodType, issue: core.$ZodIssue, base: PropertyKey[], data: unknown): PlainIssue[] {
  const path = [...base, ...issue.path];
  const value = valueAt(data, path);
  switch (issue.code) {
    case 'unrecognized_keys':
      return issue.keys.map((key) => ({ path, at: [...path, key], message: explainUnknownKey(root, path, key) }));
    case 'invalid_union':
      return describeUnion(root, issue, path, data);
    case 'invalid_key':
      return [{ path, message: `invalid name "${String(path.at(-1))}": ${issue.issues.map((i) => briefly(i, undefined, [])).join('; ')}` }];
    default:
      return describePlain(root, issue, value, path);
  }
}

function describePlain(root: core.$ZodType, issue: core.$ZodIssue, value: unknown, path: PropertyKey[]): PlainIssue[] {
  // Most maps are of objects (providers); auth.keys and auth.priority map names to strings.
  const mapOf = issue.code === 'invalid_type' && issue.expected === 'record' ? mapValueKind(root, path) : undefined;
  if (issue.code === 'invalid_type' && value === undefined && path.length > 0) {
    return [{ path: path.slice(0, -1), message: `missing required key "${String(path.at(-1))}" (expected ${typeName(issue.expected, mapOf)})` }];
  }
  // A key of a fixed set of values (family) that is left out fails as a value, not as a type.
  if (issue.code === 'invalid_value' && value === undefined && path.length > 0) {
    return [{ path: path.slice(0, -1), message: `missing required key "${String(path.at(-1))}" (expected one of: ${issue.values.map(String).join(', ')})` }];
  }
  return [{ path, message: briefly(issue, value, path, mapOf) }];
}

// A union lists what each option wanted, unless the value had the right type for exactly one option:
// then that option's complaint is the useful one (`600` in retryOn is a number, so "must be <= 599"). A union whose
// schema says in its own words what it takes (retryOn's entries) says that instead, but for a number out of bounds:
// `5xx` is text, and the words' option alone named the words only, not the statuses.
function describeUnion(
  root: core.$ZodType,
  issue: core.$ZodIssueInvalidUnion,
  path: PropertyKey[],
  data: unknown,
): PlainIssue[] {
  const value = valueAt(data, path);
  const typed = issue.errors.filter((branch) => branch.every((i) => i.path.length > 0 || fitsType(i, value)));
  const whole = issue.message.startsWith('Invalid') ? undefined : issue.message;
  const outOfBounds = typed.length === 1 && typed[0]!.every((i) => i.code === 'too_small' || i.code === 'too_big');
  if (typed.length === 1 && (whole === undefined || outOfBounds)) return typed[0]!.flatMap((i) => describe(root, i, path, data));
  if (whole !== undefined) return [{ path, message: `${whole}${received(value, path)}${unionHint(issue, value)}` }];
  const wanted = issue.errors.map((branch) => {
    const first = branch[0];
    if (first?.code === 'invalid_type') return typeName(first.expected);
    if (first?.code === 'invalid_value') return `one of: ${first.values.map(String).join(', ')}`;
    return first ? briefly(first, undefined, []) : 'something else';
  });
  return [{ path, message: `expected ${wanted.join(' or ')}${received(value, path)}` }];
}

/** A word near one of the union's (`netwrk`), or digits written in quotes (`"503"`, text in YAML). */
function unionHint(issue: core.$ZodIssueInvalidUnion, value: unknown): string {
  if (typeof value !== 'string') return '';
  if (/^\s*\d+\s*$/.test(value)) return '; write it without quotes so YAML reads it as a number';
  const words = issue.errors.flat().flatMap((i) => (i.code === 'invalid_value' && i.path.length === 0 ? i.values.map(String) : []));
  const guess = closest(value, words);
  return guess ? `; did you mean "${guess}"?` : '';
}

// Whether a root-level issue means "right type, wrong value" rather than "wrong type".
function fitsType(issue: core.$ZodIssue, value: unknown): boolean {
  if (issue.code === 'invalid_type') return false;
  if (issue.code === 'invalid_value') return issue.values.some((v) => typeof v === typeof value);
  return true;
}

/** `mapOf`: what a map's values are, when the issue is about a map (typeName). */
function briefly(issue: core.$ZodIssue, value: unknown, path: PropertyKey[], mapOf?: string): string {
  switch (issue.code) {
    case 'invalid_type': {
      const hint = `${quotedHint(issue.expected, value)}${durationHint(issue.expected, value, path)}${typedHint(issue.expected, value)}`;
      // A hint that quotes the text found says it once; "received string" alone leaves the reader to find which.
      const found = hint.startsWith(' (') ? '' : quotedText(value, path);
      return `expected ${typeName(issue.expected, mapOf)}, received ${kindOf(value)}${found}${hint}`;
    }
    case 'invalid_value': {
      const options = issue.values.map(String);
      const guess = typeof value === 'string' ? closest(value, options) : undefined;
      return `expected one of: ${options.join(', ')}${received(value, path)}${guess ? `; did you mean "${guess}"?` : ''}`;
    }
    case 'too_small':
    case 'too_big':
      return bound(issue, value);
    case 'invalid_format':
      return invalidFormat(issue, value, path);
    default:
      return stripPrefix(issue.message);
  }
}

function bound(issue: core.$ZodIssueTooSmall | core.$ZodIssueTooBig, value: unknown): string {
  const small = issue.code === 'too_small';
  const limit = Number(small ? issue.minimum : issue.maximum);
  const op = small ? (issue.inclusive ? '>=' : '>') : issue.inclusive ? '<=' : '<';
  if (issue.origin === 'array') return small ? `needs at least ${limit} item${limit === 1 ? '' : 's'}` : `takes at most ${limit} items`;
  if (issue.origin === 'string') return small && limit === 1 ? 'must not be empty' : `length must be ${op} ${limit}`;
  if (issue.origin === 'number' || issue.origin === 'int') return `must be ${op} ${limit}, got ${String(value)}`;
  return stripPrefix(issue.message);
}

function invalidFormat(issue: core.$ZodIssueInvalidStringFormat, value: unknown, path: PropertyKey[]): string {
  const got = received(value, path);
  if (issue.format === 'url' && path.at(-1) === 'proxy') return `expected an http:// or https:// proxy URL such as http://proxy.example.com:3128 (SOCKS is not supported), or "" for none${got}`;
  if (issue.format === 'url') return `expected a URL such as https://api.example.com/v1${got}`;
  if (issue.format === 'starts_with' && 'prefix' in issue) return `must start with "${String(issue.prefix)}"${got}${pathHint(issue.prefix, value)}`;
  // A regex with its own message ("letters, digits...") says what is allowed; zod's default only says "Invalid".
  if (issue.format === 'regex' && !issue.message.startsWith('Invalid')) return `expected ${issue.message}${got}`;
  return `${stripPrefix(issue.message)}${got}`;
}

/**
 * A path without its leading "/" (`v1/embeddings`): what to write, when that is a plain path the config takes (no
 * parameter, wildcard, query or space, which schema.ts refuses once the "/" is there).
 */
function pathHint(prefix: unknown, value: unknown): string {
  return prefix === '/' && typeof value === 'string' && /^[^\s:*?#/][^\s:*?#]*$/.test(value) ? `; write "/${value}"` : '';
}

function received(value: unknown, path: PropertyKey[]): string {
  if (value === undefined) return '';
  if (typeof value === 'string' && isSecretKey(path.at(-1))) return ', received a string';
  if (typeof value === 'string') return `, received ${JSON.stringify(withoutPassword(value))}`;
  if (typeof value === 'number' || typeof value === 'boolean') return `, received ${JSON.stringify(value)}`;
  return `, received ${kindOf(value)}`;
}

/**
 * The text found, in quotes, where another type belongs; never a credential's (load.ts names a variable's instead): not
 * at a secret's key, nor anywhere in `auth`, whose strings are client keys (`auth: sk-...` for `auth: { keys: ... }`),
 * but for a quantity of a client's limits (auth.limits.<client>.requestsPerMinute), which holds a number as pools' do.
 * A number is shown too (`tokenBurst: 1500.5` where a whole number belongs): "received number" alone names no value.
 */
function quotedText(value: unknown, path: PropertyKey[]): string {
  if (value === '' || (path[0] === 'auth' && !isClientRate(path)) || isSecretKey(path.at(-1))) return '';
  if (typeof value === 'number') return Number.isFinite(value) ? ` (${String(value)})` : '';
  if (typeof value !== 'string') return '';
  return ` (${JSON.stringify(withoutPassword(value))})`;
}

const isClientRate = (path: PropertyKey[]): boolean => path.length === 4 && path[1] === 'limits' && QUANTITY_KEY.test(String(path[3]));

/**
 * A URL's `user:password@` with the password masked: a state.redis URL with a typo would put it in the start-up log. To
 * the last `@`: a generated password holds `/` (base64) or `@` as often as not, written unescaped, and a mask that
 * stopped at the first of them quoted it whole, or its end.
 */
const URL_PASSWORD = /^([a-z][a-z0-9+.-]*:\/\/[^/?#@:]*):[^]*@/i;
const withoutPassword = (value: string): string => value.replace(URL_PASSWORD, '$1:[redacted]@');

/** A number or boolean written in quotes (often "${VAR}") is a string in YAML: say how to write it. */
function quotedHint(expected: string, value: unknown): string {
  if (typeof value !== 'string') return '';
  const fits = expected === 'boolean' ? value === 'true' || value === 'false' : (expected === 'number' || expected === 'int') && value.trim() !== '' && Number.isFinite(Number(value));
  return fits ? ` (${JSON.stringify(value)}); write it without quotes (\${VAR} too, in block style: key: \${VAR}) so YAML reads it as a ${typeName(expected)}` : '';
}

/**
 * YAML reads an unquoted word by its looks: a key of digits (`apiKey: ${KEY}` with KEY=123456) is a number, `yes` is
 * text in YAML 1.2, not true. Say what to write instead.
 */
function typedHint(expected: string, value: unknown): string {
  if (expected === 'string' && (typeof value === 'number' || typeof value === 'boolean')) {
    return '; put it in quotes (also a "${VAR}") so YAML reads it as text';
  }
  if (expected === 'boolean' && typeof value === 'string' && /^(yes|no|on|off|y|n)$/i.test(value.trim())) {
    return ` (${JSON.stringify(value)}); write true or false`;
  }
  return '';
}

const UNIT_MS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };

/**
 * `timeoutMs: 10s`, `openS: 30s`: a duration written with a unit is a string in YAML, and "expected number" alone
 * does not say why. The unit is in the key's name (Ms, S): say so, and which number the user meant.
 */
function durationHint(expected: string, value: unknown, path: PropertyKey[]): string {
  if ((expected !== 'number' && expected !== 'int') || typeof value !== 'string') return '';
  const key = String(path.at(-1));
  const unit = key.endsWith('Ms') ? 'ms' : /[a-z]S$/.test(key) ? 's' : undefined;
  const written = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$/.exec(value);
  if (unit === undefined || written === null) return '';
  const ms = Number(written[1]) * UNIT_MS[written[2]!]!;
  const meant = unit === 'ms' ? ms : ms / 1000;
  // A fraction is no safe guess: some of these keys take whole numbers only (windowS).
  const write = Number.isInteger(meant) ? `: write ${key}: ${meant}` : '';
  return ` (${JSON.stringify(value)}); ${key} is a plain number of ${unit === 'ms' ? 'milliseconds' : 'seconds'}${write}`;
}

// The config reference's words (list, map), which are YAML's, rather than JavaScript's (array, record).
function typeName(expected: string, mapOf = 'object'): string {
  if (expected === 'int') return 'integer';
  if (expected === 'array') return 'list';
  if (expected === 'record') return `map of name to ${mapOf}`;
  return expected;
}

function kindOf(value: unknown): string {
  if (value === null) return 'null (empty value)';
  if (value === '') return 'an empty string';
  // YAML's .inf and .nan are numbers that no setting takes.
  if (typeof value === 'number' && !Number.isFinite(value)) return Number.isNaN(value) ? '.nan (not a number)' : `${value < 0 ? '-' : ''}.inf (infinity)`;
  if (Array.isArray(value)) return 'list';
  return typeof value;
}

function stripPrefix(message: string): string {
  return message.replace(/^(Invalid input|Invalid string|Too small|Too big): /, '');
}

function valueAt(data: unknown, path: readonly PropertyKey[]): unknown {
  let v = data;
  for (const seg of path) {
    if (v === null || typeof v !== 'object') return undefined;
    v = (v as Record<PropertyKey, unknown>)[seg];
  }
  return v;
}
