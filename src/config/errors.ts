// Config errors are values the CLI prints as they are: one line per problem, editor-style `file:line:`,
// so a user fixes every problem in one pass instead of one per restart.

/** One problem in a config file. `path` is dotted (`routes[0].retry.maxAttempts`), empty for the whole file. */
export interface ConfigIssue {
  path: string;
  line?: number;
  col?: number;
  message: string;
}

/** A config file that cannot be used; `code` is stable, the message is for humans. */
export class ConfigError extends Error {
  readonly code = 'STORMGATE_CONFIG_INVALID';
  override readonly name = 'ConfigError';

  /**
   * @param missingEnv environment variables the file needs but that are unset, so the CLI can point
   *   to the demo that needs no keys.
   * @param clientKeyEnv of them, those a client key of auth.keys reads: the operator's own secret, which no demo replaces.
   * @param providerKeyEnv of them, those a provider's apiKey reads: the only ones the demo does without.
   */
  constructor(
    readonly file: string,
    readonly issues: readonly ConfigIssue[],
    readonly missingEnv: readonly string[] = [],
    readonly clientKeyEnv: readonly string[] = [],
    readonly providerKeyEnv: readonly string[] = [],
  ) {
    super(issues.map((issue) => formatIssue(file, issue)).join('\n'));
  }
}

/** The file itself cannot be read (missing, a directory, no permission): nothing in it is invalid yet. */
export class UnreadableConfigError extends ConfigError {
  constructor(file: string, cause: Error) {
    super(file, [{ path: '', message: `cannot read the config file: ${cause.message}` }]);
  }
}

/** `<file>:<line>[:<col>]: <path>: <message>`; parts that are unknown are left out. */
function formatIssue(file: string, issue: ConfigIssue): string {
  const where = issue.line === undefined ? file : `${file}:${issue.line}${issue.col === undefined ? '' : `:${issue.col}`}`;
  return issue.path ? `${where}: ${issue.path}: ${issue.message}` : `${where}: ${issue.message}`;
}

/** `['routes', 0, 'retry']` -> `routes[0].retry`; keys that are not plain words are quoted. */
export function formatPath(path: readonly PropertyKey[]): string {
  let out = '';
  for (const seg of path) {
    if (typeof seg === 'number') out += `[${seg}]`;
    else if (/^[A-Za-z_][A-Za-z0-9_-]*$/.test(String(seg))) out += out ? `.${String(seg)}` : String(seg);
    else out += `[${JSON.stringify(String(seg))}]`;
  }
  return out;
}
