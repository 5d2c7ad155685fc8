// API families: how to address, authenticate and (for Anthropic) translate a request for one target, and how to read
// its answers back in the OpenAI shape the client speaks. The pipeline sees only OpenAI-shaped answers.
import type { ProviderConfig } from '../config/schema.ts';
import type { ApiKind } from '../routing/router.ts';
import { SseParser, type SseEvent } from '../streaming/sse-parser.ts';
import { laterUsage, usageOf, type Usage } from '../streaming/usage.ts';
import { takeUsageOut } from '../streaming/hidden-usage.ts';
import { asksUsage } from '../streaming/stream-events.ts';
import { AnthropicStreamTranslator, isAnthropicErrorType, toAnthropicRequest, toOpenAIError, toOpenAIResponse, type AnthropicMessage, type OpenAIChatRequest } from './anthropic/index.ts';
import { parseExact, stringifyExact } from './exact-json.ts';

/** Turns a family's answers into the OpenAI shape. Absent for OpenAI-compatible families. */
export interface ResponseTranslator {
  error(status: number, body: Buffer): { status: number; body: Buffer };
  body(body: Buffer): Buffer;
  stream(): StreamTranslator;
}

export interface StreamTranslator {
  push(ev: SseEvent): SseEvent[];
  end(): SseEvent[];
  /**
   * The usage the upstream's own events reported so far, whether or not the client asked for it: an Anthropic stream
   * always carries it (message_start, message_delta), and the translated one only when include_usage was set.
   */
  usage(): Usage | undefined;
  /**
   * The usage the gateway asked for (streamUsage) has not come yet: a finished answer waits for it, as for a usage
   * chunk the client asked for, before the second after its finish counts.
   */
  usageDue?(): boolean;
}

export interface UpstreamRequest {
  path: string;
  /** The family's own headers: credentials and version headers. */
  headers: Record<string, string>;
  body: Buffer | string;
  translator: ResponseTranslator | undefined;
  /**
   * For a family's own API passed on as it is (Anthropic's Messages API): its error answers read in OpenAI terms, to
   * be classified (the status and code they stand for), while the client gets them as the family sent them.
   */
  errorMeaning?: (status: number, body: Buffer) => { status: number; body: Buffer };
  /**
   * For the same, and for a request translated to the family: the error answer an error event before a stream's first
   * output stands for (its data as the upstream sent it, the family's own error object), read in OpenAI terms as
   * errorMeaning reads one; undefined when the event names no status.
   */
  errorEventMeaning?: (data: Buffer) => { status: number; body: Buffer } | undefined;
  /**
   * An OpenAI-family chat stream whose usage the gateway asked for (the provider's streamUsage) and the client did
   * not: its events with that usage taken out, for the client, and the usage kept for the bill.
   */
  hideUsage?: () => StreamTranslator;
}

interface FamilyInput {
  api: ApiKind;
  /** The client's path (e.g. /v1/chat/completions) and query string. */
  clientPath: string;
  query: string;
  json: Record<string, unknown>;
  rawBody: Buffer;
  /** The upstream model: the target's override, else the client's. */
  model: string | undefined;
  /** The client's `anthropic-version`: its body is written for that version of the Messages API. */
  anthropicVersion?: string | undefined;
}

export type Prepared = { ok: true; request: UpstreamRequest } | { ok: false; reason: string; param?: string };

/** The request for one target, in its family's terms; or why the target cannot serve it. */
export function prepareUpstream(provider: ProviderConfig, input: FamilyInput): Prepared {
  try {
    return prepareFor(provider, input);
  } catch (err) {
    // JSON.parse takes a body nested tens of thousands deep (10 MB of `[`), but the recursion that translates it for
    // Anthropic, or JSON.stringify that swaps its model, overflows the stack: the client's request, not the gateway's
    // failure (it was a 500 internal_error, which clients retry).
    // Only the stack's overflow: another RangeError is the gateway's own bug, not the client's request.
    if (err instanceof RangeError && /call stack/i.test(err.message)) return { ok: false, reason: 'the request is nested too deeply to be prepared for this target' };
    throw err;
  }
}

function prepareFor(provider: ProviderConfig, input: FamilyInput): Prepared {
  const basePath = basePathOf(provider);
  const usageAsked = provider.family !== 'anthropic' && provider.streamUsage && usageToAsk(input);
  const asSent = !usageAsked && (input.model === undefined || input.model === input.json.model);
  const client = asSent ? input.json : exactJson(input);
  const json = usageAsked ? { ...client, stream_options: { ...(client.stream_options as object | null | undefined), include_usage: true } } : client;
  const body = asSent ? input.rawBody : stringifyExact({ ...json, ...(input.model !== undefined && { model: input.model }) });
  const hidden = usageAsked ? { hideUsage: usageHidingStream } : undefined;
  if (input.api === 'messages' && provider.family !== 'anthropic') return { ok: false, reason: `${provider.family} targets do not serve the Anthropic Messages API` };
  switch (provider.family) {
    case 'openai':
      return {
        ok: true,
        request: { path: `${basePath}${input.clientPath.replace(/^\/v1(?=\/|$)/, '')}${input.query}`, headers: { authorization: `Bearer ${provider.apiKey}` }, body, translator: undefined, ...hidden },
      };
    case 'azure-openai': {
      if (!input.model) return { ok: false, reason: 'azure-openai needs a model (its deployment name) and the request has none', param: 'model' };
      // Azure serves the Responses API only on its v1 surface, OpenAI's path with the deployment as the body's model
      // (no deployment in the path, no api-version): /openai/deployments/{model}/responses is a 404 there.
      if (input.api === 'responses') {
        return { ok: true, request: { path: `${basePath}/openai/v1/responses${input.query}`, headers: { 'api-key': provider.apiKey }, body, translator: undefined } };
      }
      // The deployment is a path segment: encodeURIComponent leaves dots alone, and `.` or `..` there would be read as
      // a dot segment (by Azure, by a proxy in front of it), the request sent with the key to a path above the deployments.
      if (input.model === '.' || input.model === '..') return { ok: false, reason: `azure-openai cannot name a deployment \`${input.model}\``, param: 'model' };
      const query = new URLSearchParams(input.query.slice(1));
      query.set('api-version', provider.apiVersion!);
      const path = `${basePath}/openai/deployments/${encodeURIComponent(input.model)}${input.clientPath.replace(/^\/v1(?=\/|$)/, '')}?${query}`;
      return { ok: true, request: { path, headers: { 'api-key': provider.apiKey }, body, translator: undefined, ...hidden } };
    }
    case 'anthropic':
      return prepareAnthropic(provider, basePath, input, body);
  }
}

/**
 * The client's body to write again (its model swapped, its usage asked for): read from its bytes when it may hold a
 * number a double rounds, as a 64-bit id in a tool_use input on /v1/messages (exact-json.ts), else as parsed.
 */
function exactJson(input: FamilyInput): Record<string, unknown> {
  return parseExact(input.rawBody.toString('utf8'), input.json) as Record<string, unknown>;
}

/**
 * streamUsage: a streamed chat completion or completion (/v1/completions) whose client did not ask for its usage
 * (stream_options.include_usage) is asked for it here. Only where stream_options is an object or absent: anything else
 * is the client's request, to be refused as it wrote it. The Responses API reports its usage always, as Anthropic does.
 */
function usageToAsk(input: FamilyInput): boolean {
  if ((input.api !== 'chat' && input.api !== 'completions') || input.json.stream !== true || asksUsage(input.json)) return false;
  const options = input.json.stream_options;
  return options === undefined || options === null || (typeof options === 'object' && !Array.isArray(options));
}

/** The client's events of a stream whose usage the gateway asked for: that usage out of them, kept for the bill. */
function usageHidingStream(): StreamTranslator {
  let usage: Usage | undefined;
  return {
    push(ev) {
      const taken = takeUsageOut(ev);
      usage = laterUsage(usage, taken.usage);
      return taken.left ? [taken.left] : [];
    },
    end: () => [],
    usage: () => usage,
    usageDue: () => usage === undefined,
  };
}

const basePaths = new WeakMap<ProviderConfig, string>();

/** The base URL's path without its trailing slash, parsed once per provider (URL parsing is not free per request). */
function basePathOf(provider: ProviderConfig): string {
  let p = basePaths.get(provider);
  if (p === undefined) basePaths.set(provider, (p = new URL(provider.baseUrl).pathname.replace(/\/+$/, '')));
  return p;
}

function prepareAnthropic(provider: ProviderConfig, basePath: string, input: FamilyInput, body: Buffer | string): Prepared {
  // Anthropic's own API (/v1/messages, and its other paths a route names): the request goes on as the client wrote it.
  if (input.api === 'messages' || input.api === 'other') return nativeAnthropic(provider, basePath, input, body);
  if (input.api !== 'chat') return { ok: false, reason: `anthropic targets serve chat completions and Anthropic's own API only, not ${input.clientPath}` };
  if (!input.model) return { ok: false, reason: 'anthropic needs a model and the request has none', param: 'model' };
  const translated = toAnthropicRequest(input.json as unknown as OpenAIChatRequest, { model: input.model, defaultMaxTokens: provider.defaultMaxTokens, sampling: provider.sampling, thinking: provider.thinking });
  if (!translated.ok) {
    return { ok: false, reason: `anthropic cannot express this request: ${translated.reason}`, ...(translated.param !== undefined && { param: translated.param }) };
  }
  const path = `${basePath.replace(/\/v1$/, '')}/v1/messages`;
  const headers = { 'x-api-key': provider.apiKey, 'anthropic-version': provider.anthropicVersion };
  // An error event before the first output stands for the status its type names, as on Anthropic's own API: an
  // overload read as a broken stream reached chat clients as a 502, and did not lower the target's concurrency as the
  // same overload answered with a 529 does.
  const translator = anthropicTranslator(input.model, translated.includeUsage, translated.toolNames);
  return { ok: true, request: { path, headers, body: stringifyExact(translated.body), translator, errorEventMeaning: anthropicErrorEventMeaning } };
}

/**
 * A request in Anthropic's own terms: the client's body (its model swapped for the target's), its anthropic-version
 * (else the provider's), the provider's key. Errors reach the client as Anthropic sent them; they are read in OpenAI
 * terms only to be classified (a billing refusal, a prompt too long), as a translated chat request's are.
 */
function nativeAnthropic(provider: ProviderConfig, basePath: string, input: FamilyInput, body: Buffer | string): Prepared {
  const path = `${basePath.replace(/\/v1$/, '')}${input.clientPath}${input.query}`;
  const headers = { 'x-api-key': provider.apiKey, 'anthropic-version': input.anthropicVersion ?? provider.anthropicVersion };
  return { ok: true, request: { path, headers, body, translator: undefined, errorMeaning: anthropicErrorMeaning, errorEventMeaning: anthropicErrorEventMeaning } };
}

function anthropicErrorMeaning(status: number, body: Buffer): { status: number; body: Buffer } {
  return openAIErrorOf(status, parsedOrText(body));
}

function parsedOrText(body: Buffer): unknown {
  try {
    return JSON.parse(body.toString('utf8'));
  } catch {
    return body.toString('utf8');
  }
}

function openAIErrorOf(status: number, parsed: unknown): { status: number; body: Buffer } {
  const t = toOpenAIError(status, parsed);
  return { status: t.status, body: Buffer.from(JSON.stringify(t.body)) };
}

/**
 * Anthropic reports an error that comes once its stream has begun (an overload, most often) as an `error` event in the
 * 200 stream, carrying the error object, and type, of the answer it gives with a status before a stream begins. Before
 * any output it is that answer (overloaded_error a 529, api_error a 500, rate_limit_error a 429, ...): retried, failed
 * over and passed on as the status would be, and the client gets it as Anthropic sent it. Read as a broken stream, an
 * overload reached the Anthropic SDKs as a 502 that did not name it. A type Anthropic does not document names no status.
 */
function anthropicErrorEventMeaning(data: Buffer): { status: number; body: Buffer } | undefined {
  const parsed = parsedOrText(data) as { error?: { type?: unknown } } | string | null;
  return typeof parsed === 'object' && isAnthropicErrorType(parsed?.error?.type) ? openAIErrorOf(0, parsed) : undefined;
}

function anthropicTranslator(model: string, includeUsage: boolean, toolNames: ReadonlyMap<string, string> | undefined): ResponseTranslator {
  return {
    error: anthropicErrorMeaning,
    body(body) {
      // Exact: a tool input's 64-bit id keeps its digits (exact-json.ts).
      const msg = parseExact(body.toString('utf8')) as AnthropicMessage | null;
      // Anything but a message (`{}`, an error with a 200) would become an empty "successful" completion.
      if (msg?.type !== 'message' || !Array.isArray(msg.content)) throw new Error('the answer is not an Anthropic message');
      return Buffer.from(stringifyExact(toOpenAIResponse(msg, { model, toolNames })));
    },
    stream() {
      const translator = new AnthropicStreamTranslator({ model, includeUsage, toolNames });
      const reframe = (texts: string[]) => (texts.length === 0 ? [] : new SseParser().push(Buffer.from(texts.join(''))));
      return {
        push: (ev) => reframe(translator.push({ event: ev.event, data: ev.data })),
        end: () => reframe(translator.end()),
        // None before message_start, nor from a proxy that leaves usage out: nothing reported, not zero tokens.
        usage: () => {
          const usage = translator.usage;
          return usage === undefined ? undefined : usageOf({ usage });
        },
      };
    },
  };
}
