// Paths the config opens outside the managed routes, forwarded by @fastify/http-proxy with the provider's credentials
// in place of the client's. No retries: these are files, batches and the like, where a blind retry can duplicate work.
// Bounded by connectMs to connect, the passthrough's timeoutMs for the answer's headers, idleMs between its chunks.
import { randomUUID } from 'node:crypto';
import proxy from '@fastify/http-proxy';
import type { FastifyBaseLogger, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { Agent, Dispatcher } from 'undici';
import type { Config, ProviderConfig } from '../config/schema.ts';
import { GatewayError, isOpenAIErrorJson, normaliseUpstreamErrorBody } from '../errors.ts';
import { classify } from '../policy/outcome.ts';
import { computeDeadline } from '../policy/deadline.ts';
import { withoutBom } from '../http/byte-order-mark.ts';
import { errorCodeOf } from './error-outcome.ts';
import { headerWithoutKey, withoutKey, withoutKeyCut } from './key-echo.ts';
import { MAX_ERROR_BODY_BYTES, readCapped } from './read-capped.ts';
import { decodedPrefix, encodingOf } from './content-decoding.ts';
import { upstreamVia } from '../http/loop-guard.ts';
import { noteErrorCode, notePassthroughRequestId } from '../http/send-answer.ts';
import { notePassthroughBreak } from '../http/client-errors.ts';
import { viaProxy } from './egress-proxy.ts';
import { timedConnector } from './connect-timer.ts';
import { providerTls } from './provider-tls.ts';
import { clientStallMs } from '../pipeline/live-stream.ts';
import { checkTimeoutHeader } from '../http/timeout-header.ts';

type Passthrough = NonNullable<Config['passthrough']>;

/**
 * Client headers that must not reach the provider: its credentials (proxy ones too) and cookies, the organization or
 * project a client could pick to bill the company's key to, and the gateway's own x-stormgate-* headers. Also
 * `expect`: Node has already answered a client's `Expect: 100-continue`, and undici refuses to send the header at all
 * (UND_ERR_NOT_SUPPORTED), which turned every such upload (curl sends it for bodies over 1 KB) into a 502.
 */
const STRIP = new Set([
  'authorization', 'proxy-authorization', 'api-key', 'x-api-key', 'cookie', 'openai-organization', 'openai-project', 'expect',
  // Headers some servers and frameworks (and proxies in front of a provider) obey in place of the request line: another
  // method or path than the one the gateway checked against `methods` and `paths`. A GET-only passthrough must not
  // become a DELETE at the provider, with the company's key.
  'x-http-method-override', 'x-http-method', 'x-method-override', 'x-original-url', 'x-rewrite-url', 'x-original-method',
  // Who the client is, as a proxy would say it. The provider sees the gateway; a client must not pick the address or
  // host it is taken for (rate limits, allowlists, absolute URLs built from x-forwarded-host), as on the managed routes.
  'forwarded', 'x-real-ip', 'x-client-ip', 'true-client-ip',
  // What the gateway itself tells the provider on a managed retry: a passthrough request is sent once.
  'x-retry-attempt', 'x-retry-reason',
]);
const stripped = (name: string) => STRIP.has(name) || name.startsWith('x-stormgate-') || name.startsWith('x-forwarded-');

/**
 * Provider answer headers that describe the company's account, not the answer: as on the managed routes, not passed
 * back. Nor the gateway's own x-stormgate-* headers: a provider's would replace the request id the log line names.
 */
const ACCOUNT_HEADERS = new Set(['openai-organization', 'openai-project', 'set-cookie']);
const accountHeader = (name: string) =>
  ACCOUNT_HEADERS.has(name) || name.startsWith('x-ratelimit-') || name.startsWith('anthropic-ratelimit-') || name.startsWith('x-stormgate-');

/**
 * Headers about the provider's connection to the gateway, not the answer (RFC 9110 7.6.1), and those its `connection`
 * header names: the client's connection has its own (reply-from drops them from HTTP/2 answers only).
 */
function hopByHop(connection: unknown): Set<string> {
  const names = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade', 'te', 'trailer']);
  if (typeof connection === 'string') for (const n of connection.split(',')) names.add(n.trim().toLowerCase());
  return names;
}

/**
 * The provider refused the gateway's own key or billing: its body can echo part of the key, so it is never passed on.
 * Unless it refuses the request's content instead (isContentRefusal).
 */
const CREDENTIAL_STATUSES = new Set([401, 403]);

/**
 * Is a credential status's body the provider's verdict on the request's content (OpenRouter's moderation 403, xAI's
 * "Content violates usage guidelines"), as the managed routes' outcome table reads it (never a 401)? Answered
 * upstream_auth_error, the client was told the gateway's configuration was at fault for a refusal of what it sent.
 */
function isContentRefusal(status: number, body: Buffer): boolean {
  return classify({ kind: 'http', status, errorCode: errorCodeOf(status, withoutBom(body)), hint: undefined }).cls === 'content-policy';
}

/**
 * A passthrough error's body without the key. One in an encoding the gateway decodes is decoded (`decoded`: sent
 * without its content-encoding), cut at MAX_ERROR_BODY_BYTES decoded as an identity one is: one that decodes to more
 * (or was cut encoded) must not go on encoded, the key unsearched in it. One in an encoding the gateway cannot decode
 * (zstd, which the client may have asked the provider for; a stacked `gzip, gzip`) cannot be searched, and the
 * client's fetch decodes it: it is not passed on at all (no bytes, sent without its content-encoding). Any other
 * (identity, bytes that do not decode at all) is searched as it is.
 */
async function errorWithoutKey(bytes: Buffer, whole: boolean, contentEncoding: unknown, apiKey: string): Promise<{ bytes: Buffer; decoded: boolean; whole: boolean }> {
  const named = (Array.isArray(contentEncoding) ? contentEncoding.join(',') : typeof contentEncoding === 'string' ? contentEncoding : '').trim().toLowerCase();
  const encoding = encodingOf({ 'content-encoding': named || undefined });
  if (encoding === undefined && named !== '' && named !== 'identity') return { bytes: Buffer.alloc(0), decoded: true, whole: true };
  const decoded = encoding && (await decodedPrefix(bytes, encoding, MAX_ERROR_BODY_BYTES));
  // A decoded prefix may end at the cap or where the data broke off, as a body read up to the cap does: either cut
  // can fall inside a quoted key, whose start must not go on. `whole`: what is sent is all of the provider's error.
  if (decoded) return { bytes: withoutKeyCut(decoded, apiKey), decoded: true, whole: whole && decoded.length < MAX_ERROR_BODY_BYTES };
  return { bytes: whole ? withoutKey(bytes, apiKey) : withoutKeyCut(bytes, apiKey), decoded: false, whole };
}

/**
 * Whether an answer can carry a body to search. A 304 and any answer to a HEAD have none, and their headers describe
 * the resource: read and re-sent as a body, they would go out with `content-length: 0` (and a 304 with
 * `content-type: application/octet-stream`, which a cache then stores over the file's own type).
 */
const hasBody = (method: string, status: number): boolean => method !== 'HEAD' && status !== 304;

/**
 * The path a request names once spelled plainly: dot segments resolved, percent-escapes decoded, runs of slashes as
 * one, no trailing slash. Providers read `/v1/responses/` and `/v1//responses` as `/v1/responses` (or redirect there).
 * Dot segments are resolved before decoding and again after: reply-from builds the upstream URL with the WHATWG URL
 * parser, which sends `/v1/responses/.` and `/v1/responses/%2e` as `/v1/responses/` (a create, with the company's key
 * and none of the route's protection), and a provider that decodes first reads `%2F.` as a `/.` segment.
 */
function plainPath(path: string): string {
  let decoded = withoutDotSegments(path);
  try {
    decoded = withoutDotSegments(decodeURIComponent(decoded));
  } catch {
    // a malformed escape is left as it is: the provider cannot read it as a managed path either
  }
  return decoded.replace(/\/{2,}/g, '/').replace(/\/+$/, '') || '/';
}

/** The path as the WHATWG URL parser sends it: `.` and `..` segments (`%2e` spelled too) resolved. */
function withoutDotSegments(path: string): string {
  try {
    return new URL(`http://gateway${path.startsWith('/') ? '' : '/'}${path}`).pathname;
  } catch {
    return path;
  }
}

/**
 * A configured passthrough path without its trailing slash: what the requests under it are matched to (server.ts), and
 * the label they are counted under. `/v1/responses/` is configured with its slash so the proxy's prefix leaves the
 * route's own `/v1/responses` alone.
 */
export function passthroughBase(path: string): string {
  return path.replace(/\/+$/, '');
}

/** Each passthrough request's upstream call, while it may still be ended before its answer (endPassthroughCall). */
const CALLS = new WeakMap<object, AbortController>();

/**
 * Ends a passthrough request's upstream call with the gateway's own `reason`, which then becomes the request's answer
 * (through fastify's error handler: its own id, log line and count). For a body that stopped arriving
 * (server.requestTimeoutMs): answered on the bare socket instead, its 408 carried another id, and its line and count
 * said the client had left. False when the request has no call to end (not yet forwarded, or answered already).
 */
export function endPassthroughCall(request: object, reason: GatewayError): boolean {
  const call = CALLS.get(request);
  if (call === undefined || call.signal.aborted) return false;
  call.abort(reason);
  return true;
}

/** The gateway's own header naming a passthrough call to ClientBoundAgent; taken off before the request is sent. */
const CALL_HEADER = 'x-stormgate-passthrough-call';

/**
 * The passthrough's upstream connections, each request bound to its client. reply-from has no way to abort the
 * upstream request when the client leaves: one that had not got its answer's headers (a download the provider takes
 * its time to start, a hung provider) ran on to `passthrough.timeoutMs` (2 min by default) for nobody, holding one of
 * the passthrough's connections. `calls` holds each waiting client's signal under the id CALL_HEADER carries (not the
 * request id: a client may pick that, and two may pick the same).
 */
class ClientBoundAgent extends Dispatcher {
  readonly calls = new Map<string, AbortSignal>();

  /** `upstream`: an Agent, or the provider's egress proxy. */
  constructor(private readonly upstream: Dispatcher) {
    super();
  }

  override dispatch(options: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandler): boolean {
    return this.upstream.dispatch(options, handler);
  }

  override close(): Promise<void> {
    return this.upstream.close();
  }

  override destroy(): Promise<void> {
    return this.upstream.destroy();
  }

  override request<T = null>(options: Dispatcher.RequestOptions<T>): Promise<Dispatcher.ResponseData<T>>;
  override request<T = null>(options: Dispatcher.RequestOptions<T>, callback: (err: Error | null, data: Dispatcher.ResponseData<T>) => void): void;
  override request<T = null>(options: Dispatcher.RequestOptions<T>, callback?: (err: Error | null, data: Dispatcher.ResponseData<T>) => void): Promise<Dispatcher.ResponseData<T>> | void {
    const headers = { ...(options.headers as Record<string, string | string[] | undefined>) };
    const call = headers[CALL_HEADER];
    delete headers[CALL_HEADER];
    const signal = typeof call === 'string' ? this.calls.get(call) : undefined;
    const bound = { ...options, headers, ...(signal && { signal }) };
    return callback ? super.request(bound, callback) : super.request(bound);
  }
}

/**
 * A client whose own timeout (x-stainless-timeout, x-stormgate-timeout-ms) is shorter than passthrough.timeoutMs is
 * answered 504 deadline_exceeded before it, with x-should-retry: false, as on a managed route, and the upstream request
 * ended: left to time out on its own, the SDK sent the upload again, three uploads for one call at maxRetries 2.
 * Only until the answer's headers: the SDKs' timeout ends there too, and a download under way is the client's to read.
 */
function clientDeadline(request: FastifyRequest, reply: FastifyReply, passthroughMs: number, upstream: AbortController): NodeJS.Timeout | undefined {
  const { budgetMs, timeoutMs, source } = computeDeadline({ routeTimeoutMs: passthroughMs, marginMs: undefined, headers: request.headers });
  if (source === 'route') return undefined;
  return setTimeout(() => {
    if (reply.sent || reply.raw.headersSent) return;
    upstream.abort(new GatewayError('deadline_exceeded', `the provider did not answer the passthrough request within the client's timeout (${source}: ${timeoutMs} ms, answered ${timeoutMs - budgetMs} ms before it)`));
  }, Math.max(0, budgetMs - reply.elapsedTime));
}

/**
 * The request's logger without reply-from's own line for a provider that gave no answer ("response errored", at warn,
 * with a stack, for every such request): the request's one line says it, its errorCode and upstreamCode.
 */
function withoutProxyErrorLine(log: FastifyBaseLogger): FastifyBaseLogger {
  // As pino makes its children: the logger as prototype, one method in place.
  const quiet = Object.create(log) as FastifyBaseLogger;
  quiet.warn = ((obj: unknown, msg?: string, ...args: unknown[]) => {
    if (msg !== 'response errored') log.warn(obj as object, msg, ...args);
  }) as FastifyBaseLogger['warn'];
  return quiet;
}

/**
 * `managedPaths`: the routes' paths. A passthrough path under one of them (`/v1/responses/`, opened for retrieve,
 * cancel and delete) also matches `POST /v1/responses/`, which the provider runs as the managed call itself: with the
 * company's key and none of the retries, budget, breaker or deadline the route promises. Such a request gets the 404
 * the gateway gives that spelling without passthrough.
 */
export async function registerPassthrough(app: FastifyInstance, passthrough: Passthrough, provider: ProviderConfig, managedPaths: readonly string[], via: string): Promise<void> {
  const providerName = passthrough.provider;
  const managed = new Set(managedPaths.map((p) => p.replace(/\/+$/, '')));
  const base = new URL(provider.baseUrl);
  const basePath = base.pathname.replace(/\/+$/, '');
  /** Where the provider serves a passthrough path: `/v1/x` goes to `${basePath}/x`, as a path without `/v1` does. */
  const upstreamPath = (path: string) => `${basePath}${path.replace(/^\/v1(?=\/|$)/, '')}`;
  const served = passthrough.paths.map((p) => ({ path: passthroughBase(p), upstream: passthroughBase(upstreamPath(p)) }));
  /**
   * A redirect's location as the client should follow it: one to the provider's own address under a passthrough
   * path's upstream path is that path's at the gateway (nginx's proxy_redirect default); any other as it is.
   */
  const gatewayLocation = (location: string): string => {
    if (!location.startsWith(`${base.origin}/`)) return location;
    const rest = location.slice(base.origin.length);
    const under = served.find(({ upstream }) => rest === upstream || (rest.startsWith(upstream) && /^[/?#]/.test(rest.slice(upstream.length))));
    return under ? `${under.path}${rest.slice(under.upstream.length)}` : location;
  };
  for (const path of passthrough.paths) {
    // reply-from passes these on to every request. undici's defaults (300 s each) held a client on a hung provider
    // for five minutes. The headers timer starts once the request body is sent, so a long upload is not cut; idleMs
    // is a gap, not a length, so neither is a long download. A stored response's resumed stream (GET
    // /v1/responses/{id}?stream=true) may be in the model's thinking, where no event comes for as long as a first
    // token may take: cut at idleMs, a deep-research job resumed mid-thought ended in a bare `terminated`.
    const { idleMs, firstTokenMs } = provider.timeouts;
    const gapMs = path.startsWith('/v1/responses') ? Math.max(idleMs, firstTokenMs) : idleMs;
    const options = { connections: 16, headersTimeout: passthrough.timeoutMs, bodyTimeout: gapMs };
    const tls = providerTls(providerName, provider);
    const agent = new ClientBoundAgent(
      provider.proxy
        ? viaProxy(provider.proxy, provider.timeouts.connectMs, { ...options, requestTls: tls })
        : new Agent({ ...options, connect: timedConnector(provider.timeouts.connectMs, tls) }),
    );
    // reply-from leaves an agent it was given open: its kept connections (and a proxy's tunnels) end with the gateway.
    app.addHook('onClose', () => agent.close());
    await app.register(proxy, {
      upstream: base.origin,
      prefix: path,
      rewritePrefix: upstreamPath(path),
      httpMethods: passthrough.methods,
      preHandler: async (request, reply) => {
        const path = request.url.split('?')[0]!;
        if (managed.has(plainPath(path))) throw new GatewayError('unknown_url', `no route for ${request.method} ${path}`);
        // Its deadline is taken from it (clientDeadline), as on a managed route: written wrong, it is refused there too.
        checkTimeoutHeader(request.headers);
        // The client leaving before its answer is written ends the upstream request (ClientBoundAgent).
        const call = randomUUID();
        const gone = new AbortController();
        agent.calls.set(call, gone.signal);
        CALLS.set(request, gone);
        request.headers[CALL_HEADER] = call;
        const deadline = clientDeadline(request, reply, passthrough.timeoutMs, gone);
        request.log = withoutProxyErrorLine(request.log);
        reply.raw.once('close', () => {
          clearTimeout(deadline);
          agent.calls.delete(call);
          CALLS.delete(request);
          if (!reply.raw.writableFinished) gone.abort();
        });
      },
      undici: agent,
      // The gateway writes one log line per request itself; reply-from would add two more.
      disableRequestLogging: true,
      replyOptions: {
        // No retries at all. reply-from's default retries a GET or HEAD without a body on 503 up to 10 times (with
        // retriesCount 0 too: that is the very condition for it, and maxRetriesOn503: 0 reads as the default 10),
        // waiting the provider's retry-after taken as ms; and with retriesCount set, on UND_ERR_SOCKET. A delay
        // function that always answers null covers both.
        retryDelay: () => null,
        rewriteRequestHeaders: (req, headers) => {
          const out: Record<string, unknown> = {};
          // The client's hop-by-hop headers describe its connection to the gateway, not the request (RFC 9110 7.6.1);
          // undici also refuses to send keep-alive or upgrade at all, which turned such a request into a 502.
          const hop = hopByHop(headers.connection);
          for (const name in headers) if (!stripped(name) && !hop.has(name)) out[name] = headers[name];
          out[CALL_HEADER] = headers[CALL_HEADER];
          out.authorization = `Bearer ${provider.apiKey}`;
          // The gateway's request id, as on the managed routes: the provider's support can find the call by it.
          out['x-client-request-id'] = req.id;
          // This instance, so that a request that comes back to it is seen for the loop it is (http/loop-guard.ts).
          out.via = upstreamVia(via, headers.via as string | string[] | undefined);
          return out as typeof headers;
        },
        // The one rule for SDK retries: the gateway does not ask the client to repeat a passthrough call.
        rewriteHeaders: (headers) => {
          const out: Record<string, unknown> = {};
          const hop = hopByHop(headers.connection);
          // A provider that echoes the credentials it was sent (in a request id, a www-authenticate) must not hand
          // the key to the client: it is taken out of every header passed on, as out of error bodies.
          for (const name in headers) if (!accountHeader(name) && !hop.has(name)) out[name] = headerWithoutKey(headers[name], provider.apiKey);
          // A redirect to the provider's own address points back at the gateway: followed as given, the client called
          // the provider itself, without the key, past every policy. One elsewhere (a signed download URL) is the
          // provider's to give, and goes on as it is.
          if (typeof out.location === 'string') out.location = gatewayLocation(out.location);
          out['x-should-retry'] = 'false';
          return out as typeof headers;
        },
        onResponse: (request, reply, res) => {
          const credentials = CREDENTIAL_STATUSES.has(res.statusCode);
          // Its line names the provider's id of the answer, as a managed request's does (rewriteHeaders above took out
          // the key a provider may echo in it).
          const upstreamId = reply.getHeader('x-request-id') ?? reply.getHeader('request-id');
          if (typeof upstreamId === 'string') notePassthroughRequestId(request, upstreamId);
          // The gateway's own answer to a refused key or billing, in place of the provider's (headers and body). Not
          // through sendError: this answer's headers (x-should-retry: false, the provider's own with the key taken
          // out) are set already, by rewriteHeaders above, as for every answer passed through.
          const authError = () => {
            for (const name of ['content-length', 'content-encoding', 'content-type', 'transfer-encoding']) reply.removeHeader(name);
            const err = new GatewayError(
              'upstream_auth_error',
              `provider ${providerName} rejected the gateway's credentials or billing (status_${res.statusCode}); this is a gateway configuration problem, not the request's`,
            );
            const body = err.toBody();
            noteErrorCode(request, body);
            return reply.code(err.status).type('application/json').send(body);
          };
          // A 403 is read as well, as a managed route reads it: it may refuse the request's content, not the key. A 401
          // is the key whatever its body says.
          if (res.statusCode >= 300 && (!credentials || res.statusCode === 403) && hasBody(request.method, res.statusCode)) {
            // An error can quote the key the provider was sent: read (it is small), the key taken out, then sent.
            // A compressed one is decoded first and sent as it decodes: providers compress errors for every client
            // that accepts it (the SDKs all do), so the key would otherwise pass in gzip. A redirect's body too: a
            // server that quotes the request's credentials in its pages does not spare its 3xx ones (whose headers are
            // searched with every other answer's).
            return void readCapped(res.stream, MAX_ERROR_BODY_BYTES)
              .then(({ bytes, whole }) => errorWithoutKey(bytes, whole, reply.getHeader('content-encoding'), provider.apiKey))
              .then(
                ({ bytes, decoded, whole }) => {
                  if (credentials && !isContentRefusal(res.statusCode, bytes)) return authError();
                  // A content refusal goes on as on a managed route: the provider's reason, in the OpenAI shape. So does
                  // an error in another shape (a proxy's HTML page in front of the provider, a flat vLLM body): sent as
                  // read, the SDKs gave the client no code and an HTML page as the message. One cut at the cap goes on
                  // as read: its JSON cannot be read whole.
                  if (credentials || (res.statusCode >= 400 && whole && !isOpenAIErrorJson(bytes))) {
                    const body = normaliseUpstreamErrorBody(res.statusCode, bytes);
                    noteErrorCode(request, body);
                    return void reply.removeHeader('content-encoding').removeHeader('content-length').type('application/json').send(body);
                  }
                  // Its line names the error's code, as a managed path's does (a redirect's body has none to name).
                  if (res.statusCode >= 400) noteErrorCode(request, bytes);
                  if (decoded) reply.removeHeader('content-encoding');
                  reply.removeHeader('content-length').send(bytes);
                },
                // A 403 whose body broke off is still a refusal: read before, it was the gateway's answer at once.
                (err: Error) => (credentials ? authError() : reply.send(err)),
              );
          }
          if (!credentials) {
            // A client that takes nothing of the answer (a hung consumer keeping its connection open) would hold one of
            // the passthrough's few upstream connections for as long as it stays, and undici's body timer does not count
            // a body paused by backpressure: it is given up on as a stream's client is. The socket's own timer: a write
            // that makes progress, however slow, postpones it (see server.ts); the 'close' then ends the upstream body.
            reply.raw.setTimeout(clientStallMs(gapMs), () => reply.raw.destroy());
            // The provider breaking its answer off (a reset, a gap over idleMs) closes the client's connection: its line
            // says so, not that the client left. Heard before fastify's own listener, which closes the connection. One
            // whose client has gone already (its close ends the upstream body) is the client's leaving.
            res.stream.once('error', (err: unknown) => {
              if (!reply.raw.destroyed) notePassthroughBreak(request, err);
            });
            return reply.send(res.stream);
          }
          res.stream.resume();
          return authError();
        },
      },
    });
  }
}

