// Tool names as Anthropic takes them, and back. Anthropic answers 400 to a tool (or a tool_use in the history) whose
// name is not of letters, digits, `_` and `-`, 1 to 128 of them ("tools.0.custom.name: String should match pattern
// '^[a-zA-Z0-9_-]{1,128}$'"); OpenAI-compatible servers take more (an MCP client's `fs.read_file` or
// `github/create_issue`, a long namespaced name). Such a name goes to Anthropic in another spelling, and the answer's
// tool calls come back under the client's own, so the agent never sees the difference. Pure; one instance per request.

/** The names Anthropic takes. */
const TOOL_NAME = /^[a-zA-Z0-9_-]{1,128}$/;
// A respelled name is cut here, leaving room for a `_N` suffix that keeps it apart from the others.
const RESPELLED_MAX = 120;

export class ToolNames {
  /** The client's name -> the one Anthropic is given. */
  readonly #given = new Map<string, string>();
  readonly #taken = new Set<string>();
  /** Anthropic's name -> the client's, for the names that were respelled only. */
  readonly #original = new Map<string, string>();

  /** `names`: every tool name the request holds (tools, calls in the history, tool_choice); valid ones keep their spelling. */
  constructor(names: Iterable<string>) {
    const all = [...new Set(names)];
    // Names Anthropic takes first, so that a respelled one never takes a name the client uses as it is.
    for (const name of all) if (TOOL_NAME.test(name)) this.#keep(name, name);
    for (const name of all) this.of(name);
  }

  /** The name Anthropic is given for the client's `name`. */
  of(name: string): string {
    const given = this.#given.get(name);
    if (given !== undefined) return given;
    const base = name.replace(/[^a-zA-Z0-9_-]/g, '_').slice(0, RESPELLED_MAX) || 'tool';
    let respelled = base;
    for (let n = 2; this.#taken.has(respelled); n++) respelled = `${base}_${n}`;
    this.#keep(name, respelled);
    this.#original.set(respelled, name);
    return respelled;
  }

  /** Anthropic's name -> the client's, for respelled names; undefined when none was (the common case). */
  get respelled(): ReadonlyMap<string, string> | undefined {
    return this.#original.size > 0 ? this.#original : undefined;
  }

  #keep(name: string, given: string): void {
    this.#given.set(name, given);
    this.#taken.add(given);
  }
}

/** Every tool name a chat.completions request holds, wherever it is; malformed entries are the translator's to refuse. */
export function requestToolNames(body: { tools?: unknown; messages?: unknown; tool_choice?: unknown }): string[] {
  const names: string[] = [];
  const add = (fn: unknown) => {
    const name = (fn as { name?: unknown } | null | undefined)?.name;
    if (typeof name === 'string') names.push(name);
  };
  if (Array.isArray(body.tools)) for (const t of body.tools) add((t as { function?: unknown } | null)?.function);
  if (Array.isArray(body.messages)) {
    for (const m of body.messages) {
      const calls = (m as { tool_calls?: unknown } | null)?.tool_calls;
      if (Array.isArray(calls)) for (const c of calls) add((c as { function?: unknown } | null)?.function);
    }
  }
  const choice = body.tool_choice as { function?: unknown } | null | undefined;
  if (typeof choice === 'object') add(choice?.function);
  return names;
}
