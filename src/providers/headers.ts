// Which headers cross the gateway, in each direction. Allowlists, not denylists: the client's credentials,
// cookies and hop-by-hop headers must never reach a provider, and the provider's account details never reach clients.
import { firstHeader, type HeaderBag } from '../header-bag.ts';
import { withoutKey } from './key-echo.ts';

/** Client headers a provider may need (README: "Headers"). `x-stainless-*` describe the SDK and help provider support. */
export const FORWARD_REQUEST: ReadonlySet<string> = new Set([
  'accept',
  'user-agent',
  'openai-beta',
  'anthropic-beta',
  'traceparent',
  'tracestate',
  'baggage',
  'idempotency-key',
]);
/** The SDK's timeout headers describe the client's deadline, which the gateway enforces itself. */
const STAINLESS_SKIP = new Set(['x-stainless-timeout', 'x-stainless-read-timeout']);

/**
 * Upstream response headers the client sees; the SDKs expose x-request-id and provider support asks for it (Azure's
 * for its apim-request-id).
 */
export const FORWARD_RESPONSE: ReadonlySet<string> = new Set([
  'content-type',
  'x-request-id',
  'request-id',
  'apim-request-id',
  'openai-processing-ms',
  'openai-version',
  'openai-model',
]);

export function forwardedRequestHeaders(client: HeaderBag): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name in client) {
    const value = client[name];
    if (value === undefined) continue;
    if (FORWARD_REQUEST.has(name) || (name.startsWith('x-stainless-') && !STAINLESS_SKIP.has(name))) {
      out[name] = Array.isArray(value) ? value.join(', ') : value;
    }
  }
  return out;
}

/**
 * The upstream headers the client sees. `apiKey` is the key the provider was sent: a server that echoes it (in its
 * request id, say) must not hand it to the client, so it is taken out of every value passed on.
 */
export function forwardedResponseHeaders(upstream: HeaderBag, apiKey = ''): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name of FORWARD_RESPONSE) {
    const value = firstHeader(upstream, name);
    if (value !== undefined) out[name] = withoutKey(value, apiKey);
  }
  // Anthropic names its id `request-id`; the OpenAI SDKs read `x-request-id` (their `request_id`) only.
  if (out['x-request-id'] === undefined && out['request-id'] !== undefined) out['x-request-id'] = out['request-id'];
  return out;
}
