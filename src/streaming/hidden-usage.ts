// The usage the gateway asked an OpenAI-family provider for (streamUsage) and the client did not: taken out of the
// client's chat (and legacy completions) chunks, kept for the bill. The client's stream is then the one it would have had without the setting.
import type { SseEvent } from './sse-parser.ts';
import { usageOf, type Usage } from './usage.ts';

/** A top-level key of a chunk, not in a string (a quote in one is escaped): found in the text, at any depth. */
const USAGE_KEY = /"usage"\s*:/g;
/** `"usage": null` and the comma on one side of it, as OpenAI puts it on every chunk when include_usage is on. */
const NULL_USAGE = /\s*,\s*"usage"\s*:\s*null|"usage"\s*:\s*null\s*,?\s*/;
/**
 * What OpenAI's usage chunk holds besides `choices: []` and its usage: nothing for the client. So is a vendor's
 * extension (`x_groq`, ...): the chunk exists only because the gateway asked, and an empty `choices` a client did not
 * expect breaks code that reads `chunk.choices[0]`.
 */
const ENVELOPE = new Set(['id', 'object', 'created', 'model', 'system_fingerprint', 'service_tier', 'choices', 'usage', 'obfuscation']);
const isEnvelope = (key: string) => ENVELOPE.has(key) || key.startsWith('x_');

/**
 * One chat chunk without its top-level `usage`, and the usage it held. `left` is undefined for the usage chunk itself
 * (`choices: []` with a usage and nothing else), which is dropped; any other event comes back as it was when it has no
 * usage (the same object). `"usage": null` is cut out of the text, so the rest of the chunk reaches the client byte for
 * byte (a re-serialised chunk would have its numbers and escapes rewritten); a chunk that carries choices and a usage
 * both (a compatible server's finish) is re-serialised without it.
 */
export function takeUsageOut(ev: SseEvent): { left: SseEvent | undefined; usage: Usage | undefined } {
  if (ev.data === null || !ev.data.includes('"usage"')) return { left: ev, usage: undefined };
  let chunk: Record<string, unknown>;
  try {
    chunk = JSON.parse(ev.data) as Record<string, unknown>;
  } catch {
    // Malformed: judged by the LiveStream as any malformed event is.
    return { left: ev, usage: undefined };
  }
  if (typeof chunk !== 'object' || chunk === null || Array.isArray(chunk) || !Object.hasOwn(chunk, 'usage')) return { left: ev, usage: undefined };
  const { usage: held, ...rest } = chunk;
  const usage = usageOf(chunk);
  if (held !== null && typeof held === 'object' && noChoices(rest) && Object.keys(rest).every(isEnvelope)) return { left: undefined, usage };
  if (held === null && !ev.data.includes('\n') && (ev.data.match(USAGE_KEY)?.length ?? 0) === 1) {
    const data = ev.data.replace(NULL_USAGE, '');
    if (data !== ev.data) return { left: withData(ev, data), usage };
  }
  return { left: withData(ev, JSON.stringify(rest)), usage };
}

const noChoices = (chunk: Record<string, unknown>) => chunk.choices === undefined || (Array.isArray(chunk.choices) && chunk.choices.length === 0);

/** The event with `data` in place of its data lines, its other lines (event:, id:) kept. */
function withData(ev: SseEvent, data: string): SseEvent {
  const lines: string[] = [];
  let put = false;
  for (const line of ev.raw.split(/\r\n|\n|\r/)) {
    if (!/^data(:|$)/.test(line)) lines.push(line);
    else if (!put) {
      lines.push(`data: ${data}`);
      put = true;
    }
  }
  return { raw: lines.join('\n'), data, event: ev.event };
}
