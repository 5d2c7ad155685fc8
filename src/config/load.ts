// Reads the gateway's YAML config: parse, interpolate ${ENV}, validate, and report every problem at once
// with the file and line, so a bad config fails at startup with a message that says what to fix.
import { readFileSync } from 'node:fs';
import { LineCounter, parseDocument, type Document } from 'yaml';
import { ConfigError, formatPath, type ConfigIssue } from './errors.ts';
import { interpolateDocument, referencedEnvVars } from './interpolate.ts';
import { keyAtOffset, lineOf } from './locate.ts';
import { ConfigSchema, type Config } from './schema.ts';
import { describeZodIssues } from './zod-issues.ts';

export { ConfigError, type ConfigIssue } from './errors.ts';

/** Loads and validates a config file; throws ConfigError listing every problem. */
export function loadConfigFile(file: string, env: NodeJS.ProcessEnv = process.env): Config {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw new ConfigError(file, [{ path: '', message: `cannot read the config file: ${(err as Error).message}` }]);
  }
  return parseConfig(text, file, env);
}

/** Validates config text; `file` is only used in messages. Throws ConfigError listing every problem. */
export function parseConfig(text: string, file: string, env: NodeJS.ProcessEnv = process.env): Config {
  const lineCounter = new LineCounter();
  const doc = parseYaml(text, file, lineCounter);
  const locate = (path: readonly PropertyKey[]) => lineOf(doc, lineCounter, path);

  const fromEnv: Array<{ path: Array<string | number>; names: string[] }> = [];
  const envIssues = interpolateDocument(doc, env, fromEnv);
  const missingEnv = [...new Set(envIssues.flatMap((i) => (i.missingVar ? [i.missingVar] : [])))];
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
    // Unknown aliases and alias bombs only surface when the tree is built.
    throw new ConfigError(file, [{ path: '', message: (err as Error).message }]);
  }
  if (data === null || data === undefined) {
    throw new ConfigError(file, [{ path: '', line: 1, message: 'the file is empty; expected a mapping with `providers` and `routes`' }]);
  }

  const result = ConfigSchema.safeParse(data);
  if (result.success && issues.length === 0) return result.data;
  const failedRefs = issues.map((i) => i.at);
  for (const issue of result.success ? [] : describeZodIssues(ConfigSchema, result.error.issues, data)) {
    // A value whose reference failed already has its issue; what zod says about the "" left behind is noise.
    const at = issue.at ?? issue.path;
    if (failedRefs.some((ref) => startsWith(at, ref))) continue;
    issues.push({ at, path: formatPath(issue.path), line: locate(at), message: withoutEnvValues(issue.message, at, fromEnv, data) });
  }
  throw new ConfigError(file, sortByLine(issues.map(({ at: _at, ...issue }) => issue)), missingEnv);
}

/** Names of the environment variables a config text references, for `--check`-style reporting. */
export function configEnvVars(text: string): string[] {
  return referencedEnvVars(parseDocument(text));
}

/** An unquoted ${...} after a flow mapping or list opened on the same line: `{ port: ${PORT} }`. */
const UNQUOTED_REF_IN_FLOW = /[{[][^"'\n]*?[\s,:[]\$\{/;

function parseYaml(text: string, file: string, lineCounter: LineCounter): Document {
  const doc = parseDocument(text, { lineCounter, uniqueKeys: true, prettyErrors: true });
  const problems = [...doc.errors, ...doc.warnings];
  if (problems.length === 0) return doc;
  // The parser's own words for this one ("Unexpected flow-map-start at node end", and more on every later line)
  // do not say what to change.
  const first = problems[0]!;
  const firstLine = first.linePos?.[0]?.line;
  // Quoted text and comments may hold braces and ${...} legitimately: only what is left is looked at.
  const source = firstLine === undefined ? undefined : text.split(/\r?\n/)[firstLine - 1]!.replace(/"(?:[^"\\]|\\.)*"|'[^']*'|\s#.*$/g, 'x');
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
  throw new ConfigError(
    file,
    problems.map((e) => {
      const pos = e.linePos?.[0];
      // prettyErrors appends "at line L, column C:" and a source excerpt; the location goes in front instead.
      let message = e.message.split('\n')[0]!.replace(/ at line \d+, column \d+:?$/, '');
      let path = '';
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
 * the message names the variable instead of echoing what it holds, since start-up errors end up in logs.
 */
function withoutEnvValues(message: string, at: readonly PropertyKey[], fromEnv: ReadonlyArray<{ path: Array<string | number>; names: string[] }>, data: unknown): string {
  const source = fromEnv.find((f) => f.path.length === at.length && startsWith(at, f.path));
  if (!source || source.names.length === 0) return message;
  const value = valueAt(data, at);
  // Messages quote what they received ("..."): that quoted form is replaced, never bare text that could be any word.
  if (typeof value !== 'string' || value === '') return message;
  return message.replaceAll(JSON.stringify(value), `the value of ${source.names.map((n) => `$${n}`).join(', ')}`);
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
