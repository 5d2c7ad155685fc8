// `${VAR}` and `${VAR:-default}` in config values. This runs on the parsed YAML tree, one string scalar at a
// time, so an environment value can never add keys or change the file's structure; keys are never interpolated.
import { isMap, isScalar, isSeq, type Document, type Node, type Scalar, type ScalarTag } from 'yaml';

/** A default may hold references itself (`${A:-${B}}`, as docker compose reads it). */
type Part = { literal: string } | { name: string; fallback?: Part[] };

/** A reference that could not be resolved, with the YAML path of the value that holds it. */
interface InterpolationIssue {
  path: Array<string | number>;
  node: Node;
  message: string;
  /** Set when the problem is an unset variable. */
  missingVar?: string;
}

const NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** Splits a value into literals and references; `$${` is a literal `${`. Throws on a malformed reference. */
function parseTemplate(value: string): Part[] {
  const parts: Part[] = [];
  let literal = '';
  let i = 0;
  while (i < value.length) {
    if (value.startsWith('$${', i)) {
      literal += '${';
      i += 3;
    } else if (value.startsWith('${', i)) {
      const end = closingBrace(value, i + 2);
      if (end === -1) throw new Error(`unterminated "\${" in "${value}"; write "$\${" for a literal "\${"`);
      const body = value.slice(i + 2, end);
      const sep = body.indexOf(':-');
      const name = sep === -1 ? body : body.slice(0, sep);
      if (!NAME.test(name)) {
        throw new Error(`invalid reference "\${${body}}"; expected \${NAME} or \${NAME:-default}`);
      }
      if (literal) parts.push({ literal });
      literal = '';
      parts.push(sep === -1 ? { name } : { name, fallback: parseTemplate(body.slice(sep + 2)) });
      i = end + 1;
    } else {
      literal += value[i];
      i += 1;
    }
  }
  if (literal) parts.push({ literal });
  return parts;
}

/** The `}` that closes the reference whose body starts at `from`, past any nested `${...}`; -1 if none. */
function closingBrace(value: string, from: number): number {
  let depth = 1;
  for (let j = from; j < value.length; j++) {
    if (value.startsWith('$${', j)) j += 2;
    else if (value.startsWith('${', j)) {
      depth++;
      j++;
    } else if (value[j] === '}' && --depth === 0) return j;
  }
  return -1;
}

/** The parts' text; a reference to an unset variable adds nothing and is reported to `missing`. */
function resolveParts(parts: Part[], env: NodeJS.ProcessEnv, missing: (name: string) => void): string {
  let out = '';
  for (const part of parts) {
    if ('literal' in part) out += part.literal;
    else if (part.fallback !== undefined) out += env[part.name] || resolveParts(part.fallback, env, missing);
    else if (env[part.name] !== undefined) out += env[part.name];
    else missing(part.name);
  }
  return out;
}

/** Every variable the parts name, defaults' included. */
function namesOf(parts: Part[]): string[] {
  return parts.flatMap((p) => ('name' in p ? [p.name, ...namesOf(p.fallback ?? [])] : []));
}

/**
 * Replaces references in every string value of `doc`, in place. `${VAR}` needs VAR set (an empty value is kept);
 * `${VAR:-default}` takes the default when VAR is unset or empty, as the shell does. An unset VAR becomes ""
 * so that validation can still report the file's other problems.
 */
export function interpolateDocument(
  doc: Document,
  env: NodeJS.ProcessEnv = process.env,
  /** Filled with the values that took something from the environment: their node, path and the variables' names. */
  fromEnv?: Array<{ path: Array<string | number>; node: Node; names: string[] }>,
): InterpolationIssue[] {
  const issues: InterpolationIssue[] = [];
  forEachStringScalar(doc.contents, [], (node, path) => {
    let parts: Part[];
    try {
      parts = parseTemplate(node.value as string);
    } catch (err) {
      issues.push({ path, node, message: (err as Error).message });
      return;
    }
    if (parts.every((p) => 'literal' in p) && !(node.value as string).includes('$${')) return;
    const out = resolveParts(parts, env, (name) => issues.push({ path, node, message: `environment variable ${name} is not set`, missingVar: name }));
    node.value = node.type === 'PLAIN' ? resolvePlain(doc, out) : out;
    fromEnv?.push({ path, node, names: namesOf(parts).filter((name) => env[name] !== undefined && env[name] !== '') });
  });
  return issues;
}

/** Names of the variables the document references, each once, in file order: what a test's environment must set. */
export function referencedEnvVars(doc: Document): string[] {
  const names = new Set<string>();
  forEachStringScalar(doc.contents, [], (node) => {
    try {
      for (const name of namesOf(parseTemplate(node.value as string))) names.add(name);
    } catch {
      // A malformed reference names no variable; interpolateDocument reports it.
    }
  });
  return [...names];
}

// An unquoted `port: ${PORT:-8080}` should read as if 8080 were written there, so a plain scalar's result gets
// YAML's own scalar typing (number, boolean, null); quoted scalars stay strings. Only scalar tags are tried,
// so the result is never a collection. An empty result stays an empty string, not YAML's null: `apiKey: ${KEY}` with
// KEY set but empty is an empty key (and said so), not a missing value of the wrong type. A plain scalar never holds
// surrounding whitespace, so a value with a line break at its end (a file written by `echo`, a mounted secret) is typed
// without it: `port: ${PORT}` with PORT="8080\n" is 8080; a value that stays text keeps it.
function resolvePlain(doc: Document, value: string): unknown {
  const written = value.trim();
  if (written === '') return value;
  for (const tag of doc.schema.tags) {
    const scalarTag = tag as ScalarTag;
    if (!scalarTag.collection && scalarTag.default && scalarTag.test?.test(written)) {
      // Some tags (floats) resolve to a Scalar node that keeps the written form: the value is what is wanted.
      const resolved = scalarTag.resolve(written, () => {}, {});
      return isScalar(resolved) ? resolved.value : resolved;
    }
  }
  return value;
}

function forEachStringScalar(
  node: unknown,
  path: Array<string | number>,
  visit: (node: Scalar, path: Array<string | number>) => void,
): void {
  if (isMap(node)) {
    for (const pair of node.items) {
      // A merge key's value is a symbol: its path reads `<<` as written.
      const key = isScalar(pair.key) ? (typeof pair.key.value === 'symbol' ? String(pair.key.value.description) : String(pair.key.value)) : String(pair.key);
      forEachStringScalar(pair.value, [...path, key], visit);
    }
  } else if (isSeq(node)) {
    node.items.forEach((item, i) => forEachStringScalar(item, [...path, i], visit));
  } else if (isScalar(node) && typeof node.value === 'string') {
    visit(node, path);
  }
}
