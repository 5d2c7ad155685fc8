// Token usage from an answer (whole, or a stream's usage event), so cost dashboards bill the target that answered.

export interface Usage {
  prompt: number;
  completion: number;
}

/** Usage from a parsed answer or event: chat/completions/embeddings (`prompt_tokens`), Responses (`input_tokens`). */
export function usageOf(parsed: unknown): Usage | undefined {
  const p = parsed as { usage?: Record<string, unknown> | null; response?: { usage?: Record<string, unknown> | null } } | null;
  const u = p?.usage ?? p?.response?.usage;
  if (!u || typeof u !== 'object') return undefined;
  const prompt = Number(u.prompt_tokens ?? u.input_tokens ?? 0);
  const completion = Number(u.completion_tokens ?? u.output_tokens ?? 0);
  return Number.isFinite(prompt) && Number.isFinite(completion) ? { prompt, completion } : undefined;
}

/** Usage from a whole answer's body; undefined for bodies that are not JSON or carry none. */
export function usageOfBody(body: Buffer): Usage | undefined {
  // Cheap check first: most of the cost of parsing is wasted on bodies without usage.
  if (body.indexOf('"usage"') === -1) return undefined;
  try {
    return usageOf(JSON.parse(body.toString('utf8')));
  } catch {
    return undefined;
  }
}
