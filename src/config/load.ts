// Reads the gateway's YAML config: parse, interpolate ${ENV}, validate, and report every problem at once
// with the file and line, so a bad config fails at startup with a message that says what to fix.
import { readFileSync } from 'node:fs';
import { isScalar, LineCounter, parseDocument, type Document, type Node } from 'yaml';
import { aliasBombIssue, anchorIssues } from './anchors.ts';
import { caFileIssues } from './ca-file.ts';
import { ConfigError, UnreadableConfigError, formatPath, type ConfigIssue } from './errors.ts';
import { interpolateDocument } from './interpolate.ts';
import { keyAtOffset, lineOf, nodeAt } from './locate.ts';
import { ConfigSchema, type Config } from './schema.ts';
import { describeZodIssues } from './zod-issues.ts';

export { ConfigError, UnreadableConfigError } from './errors.ts';

/** Loads and validates a config file; throws ConfigError listing every problem. */
export function loadConfigFile(file: string, env: NodeJS.ProcessEnv = process.env): Config {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw new UnreadableConfigError(file, err as Error);
  }
  const config = parseConfig(text, file, env);
  // The files the config names, once it is valid: a CA file that cannot be used fails start-up as a config problem,
  // at the line that names it. The text as written, not yet interpolated: a path a variable gave is named as the file
  // writes it (`the file ${VLLM_CA} names`), since the variable may hold a secret instead (a key swapped with it, the
  // PEM itself from a Kubernetes secret), which "cannot read <value>" printed to the start-up log.
  // Read again only for a CA file, which few configs name.
  const lineCounter = new LineCounter();
  let doc: Document | undefined;
  const written = () => (doc ??= parseDocument(text, { lineCounter, merge: true }));
  const issues = caFileIssues(config, (at, path) => {
    const node = nodeAt(written(), at);
    const raw = isScalar(node) && typeof node.value === 'string' ? node.value : undefined;
    return raw !== undefined && raw.includes('${') ? `the file ${raw} names` : path;
  });
  if (issues.length > 0) throw new ConfigError(file, issues.map(({ at, ...issue }) => ({ ...issue, line: lineOf(written(), lineCounter, at) })));
  return config;
}

/** Validates config text; `file` is only used in messages. Throws ConfigError listing every problem. */
export function parseConfig(text: string, file: string, env: NodeJS.ProcessEnv = process.env): Config {
  const lineCounter = new LineCounter();
  const doc = parseYaml(text, file, lineCounter);
  const locate = (path: readonly PropertyKey[]) => lineOf(doc, lineCounter, path);

  const fromEnv: Array<{ path: Array<string | number>; node: Node; names: string[] }> = [];
  const envIssues = interpolateDocument(doc, env, fromEnv);
  const missingEnv = [...new Set(envIssues.flatMap((i) => (i.missingVar ? [i.missingVar] : [])))];
  // Client keys (auth.keys) are the operator's own secrets: the CLI says so, and offers no demo in their place.
  const isClientKey = (path: ReadonlyArray<string | number>) => path[0] === 'auth' && path[1] === 'keys';
  const elsewhere = new Set(envIssues.flatMap((i) => (i.missingVar && !isClientKey(i.path) ? [i.missingVar] : [])));
  const clientKeyEnv = missingEnv.filter((name) => !elsewhere.has(name));
  // Only a provider's key is what the demo (the bundled mock) does without: a URL or a port it does not replace. Any
  // `apiKey`, so that one in an anchor's block (`x-provider: &defaults { apiKey: ... }`) counts too.
  const isProviderKey = (path: ReadonlyArray<string | number>) => path[path.length - 1] === 'apiKey';
  const providerKeyEnv = [...new Set(envIssues.flatMap((i) => (i.missingVar && isProviderKey(i.path) ? [i.missingVar] : [])))];
  const issues: Array<ConfigIssue & { at: readonly PropertyKey[] }> = envIssues.map((i) => ({
    at: i.path,
    path: formatPath(i.path),
    line: locate(i.path),
    message: i.message,
  }));

  let data: unknown;
  try {
    data = doc.toJS({ maxAliasCount: 100 });
  } catch (err) {
    // Unknown aliases, merges of a non-mapping and alias bombs only surface when the tree is built: the first two are
    // found again with their line and path, the library's words having neither.
    const anchors = anchorIssues(doc, lineCounter);
    const bomb = anchors.length > 0 ? undefined : aliasBombIssue(doc, lineCounter);
    throw new ConfigError(file, anchors.length > 0 ? anchors : [bomb ?? { path: '', message: (err as Error).message }]);
  }
  if (data === null || data === undefined) {
    throw new ConfigError(file, [{ path: '', line: 1, message: 'the file is empty; expected a mapping with `providers` and `routes`' }]);
  }
  // Top-level `x-` keys are the file's own (as in docker compose): a place for anchors that merge keys bring in.
  if (typeof data === 'object' && !Array.isArray(data)) {
    for (const key of Object.keys(data)) if (key.startsWith('x-')) delete (data as Record<string, unknown>)[key];
  }

  // An optional provider runs without its key, but only an empty one: an unset ${VAR} is still an error, which says how.
  for (const [n, i] of envIssues.entries()) {
    if (i.missingVar !== undefined && isProviderKey(i.path) && i.path.length === 3 && i.path[0] === 'providers' && optionalAt(data, i.path[1]!)) {
      issues[n]!.message += `; the provider is optional: write "\${${i.missingVar}:-}" to start without it when the variable is unset`;
    }
  }

  for (const at of reservedKeys(data, [])) {
    issues.push({ at, path: formatPath(at), line: locate(at), message: 'cannot be a name here: JavaScript objects reserve "__proto__", and the entry would be dropped without a word; choose another' });
  }

  const result = ConfigSchema.safeParse(data);
  if (result.success && issues.length === 0) return result.data;
  const failedRefs = issues.map((i) => i.at);
  const failedNodes = new Set(envIssues.map((i) => i.node));
  for (const issue of result.success ? [] : describeZodIssues(ConfigSchema, result.error.issues, data)) {
    // A value whose reference failed already has its issue; what zod says about the "" left behind is noise. The
    // value may be one an alias or a merge key (`<<: *defaults`) copied elsewhere.
    const at = issue.at ?? issue.path;
    const node = nodeAt(doc, at);
    if (failedRefs.some((ref) => startsWith(at, ref)) || failedNodes.has(node as Node)) continue;
    issues.push({ at, path: formatPath(issue.path), line: locate(at), message: withoutEnvValues(issue.message, node, fromEnv, data, at) });
  }
  throw new ConfigError(file, sortByLine(issues.map(({ at: _at, ...issue }) => issue)), missingEnv, clientKeyEnv, providerKeyEnv);
}

/** An unquoted ${...} after a flow mapping or list opened on the same line: `{ port: ${PORT} }`. */
const UNQUOTED_REF_IN_FLOW = /[{[][^"'\n]*?[\s,:[]\$\{/;
/** An unquoted `*` as a key (`*: { requestsPerMinute: 600 }`): YAML reads it as an alias, auth.limits means every client. */
const UNQUOTED_STAR_KEY = /(?:^|[\s{,])\*\s*:/;

/** A line with its quoted text and comment each replaced by x: what is left is what YAML reads as syntax. */
function stripQuoted(line: string): string {
  return line.replace(/"(?:[^"\\]|\\.)*"|'[^']*'|\s#.*$/g, 'x');
}

function parseYaml(text: string, file: string, lineCounter: LineCounter): Document {
  // Merge keys (`<<: *defaults`) are YAML 1.1's, which the 1.2 parser leaves off unless asked; configs use them.
  const doc = parseDocument(text, { lineCounter, uniqueKeys: true, prettyErrors: true, merge: true });
  const all = [...doc.errors, ...doc.warnings];
  if (all.length === 0) return doc;
  // A tab in the indentation makes the parser misread the lines after it too ("All mapping items must start at the
  // same column" on lines that are fine): the tabs are the problems to fix.
  const tabs = all.filter((e) => e.code === 'TAB_AS_INDENT');
  const problems = tabs.length > 0 ? tabs : all;
  // The parser's own words for this one ("Unexpected flow-map-start at node end", and more on every later line)
  // do not say what to change.
  const first = problems[0]!;
  const firstLine = first.linePos?.[0]?.line;
  // Quoted text and comments may hold braces and ${...} legitimately: only what is left is looked at.
  const source = firstLine === undefined ? undefined : stripQuoted(text.split(/\r?\n/)[firstLine - 1]!);
  if (first.code === 'UNEXPECTED_TOKEN' && source !== undefined && UNQUOTED_REF_IN_FLOW.test(source)) {
    throw new ConfigError(file, [
      {
        path: '',
        line: firstLine,
        message:
          'an unquoted ${VAR} inside a flow mapping or list ({ } or [ ]) is not valid YAML: quote it ("${VAR}") where the value is text, or write that mapping in block style (one key per line) where it is a number or true/false',
      },
    ]);
  }
  // The parser's words for an unquoted `*` key ("Alias ending in : is ambiguous", after tokens it calls unexpected)
  // do not say to quote it, as the README writes auth.limits' "*".
  const star = problems.map((e) => e.linePos?.[0]?.line).find((line) => line !== undefined && UNQUOTED_STAR_KEY.test(stripQuoted(text.split(/\r?\n/)[line - 1]!)));
  if (star !== undefined) {
    throw new ConfigError(file, [{ path: '', line: star, message: 'an unquoted * is a YAML alias, not a name: quote it ("*": ...), as auth.limits writes the limit of every client not named' }]);
  }
  throw new ConfigError(
    file,
    problems.map((e) => {
      const pos = e.linePos?.[0];
      // prettyErrors appends "at line L, column C:" and a source excerpt; the location goes in front instead.
      let message = e.message.split('\n')[0]!.replace(/ at line \d+, column \d+:?$/, '');
      let path = '';
      // Brackets (or indentation) thousands of levels deep overflow the parser's stack; its words are the engine's.
      if (e.code === 'RESOURCE_EXHAUSTION' && /call stack/i.test(message)) message = 'nests too deeply for the parser (thousands of levels of [ { or indentation): a config nests a few levels; look for brackets that repeat or never close';
      // The library's words name the call to make instead ("please use YAML.parseAllDocuments()").
      if (e.code === 'MULTIPLE_DOCS') message = 'the file holds more than one YAML document (this --- line starts another): the gateway reads one; remove the line and what follows it, or merge them into one mapping';
      if (e.code === 'DUPLICATE_KEY') {
        const dup = keyAtOffset(doc, e.pos[0]);
        if (dup) {
          message = `duplicate key "${dup.key}"`;
          path = formatPath(dup.path);
        }
      }
      return { path, line: pos?.line, col: pos?.col, message };
    }),
  );
}

/**
 * A value that came from the environment may be a secret put in the wrong place (`baseUrl: "${OPENAI_API_KEY}"`):
 * the message names the variable instead of echoing what it holds, since start-up errors end up in logs. The value is
 * found by its node, so one an alias or a merge key copied to another place is found there too.
 */
function withoutEnvValues(message: string, node: unknown, fromEnv: ReadonlyArray<{ node: Node; names: string[] }>, data: unknown, at: readonly PropertyKey[]): string {
  const source = node === undefined ? undefined : fromEnv.find((f) => f.node === node);
  if (!source || source.names.length === 0) return message;
  const value = valueAt(data, at);
  const named = `the value of ${source.names.map((n) => `$${n}`).join(', ')}`;
  // A number or true/false, as YAML typed an unquoted ${VAR}, is shown where a message shows one (` (N)`, `received N`,
  // `got N`): only there, a bare number being any message's.
  if (typeof value === 'number' || typeof value === 'boolean') {
    const shown = String(value);
    return message.replaceAll(` (${shown})`, ` (${named})`).replaceAll(`received ${shown}`, `received ${named}`).replaceAll(`got ${shown}`, `got ${named}`);
  }
  // Messages quote what they received ("..."): that quoted form is replaced, never bare text that could be any word.
  if (typeof value !== 'string' || value === '') return message;
  // A hint that rewrites the value (`write "/<value>"` for a path without its "/") would print it whole: a variable's
  // value is fixed where it is set, not here, so the hint goes.
  return message.replaceAll(`; write ${JSON.stringify(`/${value}`)}`, '').replaceAll(JSON.stringify(value), named);
}

/** Paths of `__proto__` keys, which the YAML parser keeps as keys but zod's maps leave out. */
function reservedKeys(value: unknown, path: Array<string | number>): Array<Array<string | number>> {
  if (value === null || typeof value !== 'object') return [];
  const own = Object.hasOwn(value, '__proto__') ? [[...path, '__proto__']] : [];
  return [...own, ...Object.entries(value).flatMap(([key, v]) => reservedKeys(v, [...path, Array.isArray(value) ? Number(key) : key]))];
}

/** Whether `providers.<name>.optional` is true in the data. */
function optionalAt(data: unknown, name: string | number): boolean {
  return valueAt(data, ['providers', name, 'optional']) === true;
}

function valueAt(data: unknown, path: readonly PropertyKey[]): unknown {
  let v = data;
  for (const seg of path) v = v !== null && typeof v === 'object' ? (v as Record<PropertyKey, unknown>)[seg] : undefined;
  return v;
}

function startsWith(path: readonly PropertyKey[], prefix: readonly PropertyKey[]): boolean {
  return prefix.length <= path.length && prefix.every((seg, i) => String(seg) === String(path[i]));
}

function sortByLine(issues: ConfigIssue[]): ConfigIssue[] {
  return [...issues].sort((a, b) => (a.line ?? Number.MAX_SAFE_INTEGER) - (b.line ?? Number.MAX_SAFE_INTEGER));
}
