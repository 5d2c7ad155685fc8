// Where a streamed answer stands as its events pass: which choices have come and which have finished, whether a tool
// call's arguments are on their way (and whole so far), and whether an event ends the answer. Events in, state out,
// with no I/O and no timers: the rules for `n` choices, providers that ignore `n` and tool calls are tested here event
// by event, while the LiveStream that acts on them (timers, error events, the upstream's end) is tested through whole
// streams.
import type { ApiKind } from '../routing/router.ts';
import type { SseEvent } from './sse-parser.ts';
import { argumentPieces, choiceIndexes, choicesCalling, doneEvent, parsedData, type EventMeaning, type StreamShape } from './stream-events.ts';

/**
 * An event that carries a tool call: a non-empty `tool_calls` list (some servers send `"tool_calls":[]` with every
 * text delta), a legacy `function_call` object (the `functions` parameter; not the `"function_call": null` some
 * servers put in every delta), the Responses API's argument deltas, an Anthropic tool_use block or its input's deltas.
 */
const TOOL_CALL_DELTA = /"tool_calls"\s*:\s*\[\s*\{|"function_call"\s*:\s*\{|function_call_arguments\.delta|custom_tool_call_input\.delta|"type"\s*:\s*"(?:tool_use|input_json_delta)"/;
/** An Anthropic answer has one "choice": its finish (the message_delta with a stop_reason) finishes the answer. */
const ONE_FINISHED = { seen: [0], finished: [0] };

/** Tool call arguments longer than this, in all, are not kept to judge a [DONE] by (a cut of them goes unseen). */
const ARGUMENTS_KEPT_MAX = 1024 * 1024;

/** Arguments that are JSON, or none yet (a call whose arguments have not begun shows no cut). */
function isJson(text: string): boolean {
  if (text === '') return true;
  try {
    JSON.parse(text);
    return true;
  } catch {
    return false;
  }
}

/** How an event ended the answer: its end ([DONE], or a finish where the API has none after it), or an error event. */
type AnswerEnd = 'complete' | 'upstream-error';

export class AnswerProgress {
  readonly #api: ApiKind;
  readonly #shape: StreamShape;
  #finished = false;
  readonly #finishedIndexes = new Set<number>();
  /** With n > 1, the choices that have come at all: a provider that ignores `n` sends only one. */
  readonly #seenIndexes = new Set<number>();
  #toolCallOpen = false;
  /**
   * With n > 1, the choices whose tool call is on its way: each finishes on its own, so one choice's finish does not
   * close another's call (its arguments still streaming, a malformed event dropped then would have broken them).
   */
  readonly #callsOpen = new Set<number>();
  /** A chat stream's tool call arguments so far, by choice and call, until a finish: what a [DONE] before one cut. */
  #arguments: Map<string, string> | undefined = new Map();
  #argumentsLength = 0;

  constructor(api: ApiKind, shape: StreamShape) {
    this.#api = api;
    this.#shape = shape;
  }

  /** Every choice has had its finish_reason: only [DONE] (and the usage chunk, when asked for) is left. */
  get finished(): boolean {
    return this.#finished;
  }

  /** A tool call's arguments are on their way (until a finish): a malformed event now would corrupt them. */
  get toolCallOpen(): boolean {
    return this.#toolCallOpen || this.#callsOpen.size > 0;
  }

  /**
   * An event from before the first output (the head the client gets with it): with n > 1, the choices its role chunks
   * open have begun, as OpenAI opens every choice before any text, and must finish before the answer is whole, just
   * as a choice whose role chunk came after the first output must.
   */
  announced(ev: SseEvent): void {
    if (this.#shape.choices > 1 && this.#api !== 'messages') for (const i of choiceIndexes(parsedData(ev)).seen) this.#seenIndexes.add(i);
  }

  /**
   * An event passed on to the client (a malformed one is not): how it ends the answer, or undefined. `parsed`: its data
   * as readEvent parsed it, not parsed again.
   */
  passed(meaning: EventMeaning, ev: SseEvent, parsed = parsedData(ev)): AnswerEnd | undefined {
    const carriesCall = (meaning === 'output' || meaning === 'finish') && ev.data !== null && TOOL_CALL_DELTA.test(ev.data);
    if (this.#shape.choices > 1) {
      // Per choice (below): a choice's tool call is open from its first delta until that choice's own finish.
      if (carriesCall) for (const i of choicesCalling(parsed)) this.#callsOpen.add(i);
    } else if (meaning === 'finish') this.#toolCallOpen = false;
    else if (carriesCall) this.#toolCallOpen = true;
    if (carriesCall && this.#api === 'chat' && this.#finishedIndexes.size === 0) this.#keepArguments(parsed);
    if (meaning === 'done') return 'complete';
    if (meaning === 'error') return 'upstream-error';
    if (meaning === 'finish' && doneEvent(this.#api) === undefined) return 'complete';
    // With n > 1 each choice finishes on its own: the first finish_reason does not end the answer. Every event is
    // read for the choices it carries then (a provider that ignores `n` sends fewer); with one choice, finishes only.
    if (meaning === 'finish' || this.#shape.choices > 1) {
      const { seen, finished } = this.#api === 'messages' ? ONE_FINISHED : choiceIndexes(parsed);
      for (const i of seen) this.#seenIndexes.add(i);
      for (const i of finished) {
        this.#finishedIndexes.add(i);
        this.#callsOpen.delete(i);
      }
      this.#finished = this.#finishedIndexes.size >= this.#shape.choices;
    }
    return undefined;
  }

  /**
   * Why a [DONE] that comes now, before the answer is whole, ends an answer cut short rather than one whose server sends
   * no finish_reason (whose [DONE] is its end): another choice has had its finish_reason (this server sends them), or
   * a tool call's arguments so far are not yet JSON. Undefined when nothing shows it.
   */
  cutByDone(): string | undefined {
    if (this.whole()) return undefined;
    if (this.#finishedIndexes.size > 0) return 'a [DONE] before every choice\'s finish';
    for (const text of this.#arguments?.values() ?? []) if (!isJson(text)) return 'a [DONE] in the middle of a tool call\'s arguments';
    return undefined;
  }

  #keepArguments(parsed: object | undefined): void {
    if (this.#arguments === undefined) return;
    for (const { key, piece, opens } of argumentPieces(parsed)) {
      this.#argumentsLength += piece.length;
      if (this.#argumentsLength > ARGUMENTS_KEPT_MAX) {
        this.#arguments = undefined;
        return;
      }
      const before = this.#arguments.get(key) ?? '';
      // A new id where a call's arguments are already whole is a call of its own under the same index (Ollama, older
      // vLLM and SGLang number parallel calls so): judged alone, not as the first one's continuation. Not every new
      // id: a proxy that gives each chunk of one call an id of its own (LiteLLM's) has its pieces still joined.
      this.#arguments.set(key, opens && before !== '' && isJson(before) ? piece : before + piece);
    }
  }

  /**
   * Is the answer whole, [DONE] aside, once the upstream's response has ended? Every choice asked for has finished;
   * or, from a provider that ignores `n` and sends fewer, every choice that came has.
   */
  whole(): boolean {
    if (this.#finished) return true;
    if (this.#finishedIndexes.size === 0) return false;
    for (const i of this.#seenIndexes) if (!this.#finishedIndexes.has(i)) return false;
    return true;
  }
}
