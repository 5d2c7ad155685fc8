// The config schema is the single source of truth: types are inferred from it, defaults live here,
// and the README's config reference is generated from the `.describe()` texts (see test/config-docs.test.ts).
import { z } from 'zod';

/**
 * The longest a Node.js timer holds: past 2^31-1 ms (24.8 days) it fires after 1 ms instead (TimeoutOverflowWarning),
 * so a "huge" timeout would time every request out at once.
 */
export const MAX_TIMER_MS = 2 ** 31 - 1;
const ms = (doc: string) => z.number().int().nonnegative().max(MAX_TIMER_MS).describe(doc);
const positiveMs = (doc: string) => z.number().int().positive().max(MAX_TIMER_MS).describe(doc);
const MAX_TIMER_S = Math.floor(MAX_TIMER_MS / 1000);
/**
 * A key sent in a header: one written with `echo` ends in a line break, which no header may hold (trimmed, not sent).
 * Nor a character past ASCII (a zero-width space or a typographic quote pasted with the key): past U+00FF undici
 * refuses to send it, and every request to the provider was a 500; below, it goes as a byte no provider's key holds,
 * and the provider's refusal held the target off as a bad key. The message names the character, never the key.
 */
const headerSecret = () =>
  z
    .string()
    .trim()
    .refine((key) => !/[\x00-\x1f\x7f]/.test(key), { message: 'contains a line break or another control character inside it; a key is one line' })
    .superRefine((key, ctx) => {
      const beyond = /[^\x00-\x7f]/u.exec(key)?.[0];
      if (beyond === undefined) return;
      const code = `U+${beyond.codePointAt(0)!.toString(16).toUpperCase().padStart(4, '0')}`;
      ctx.addIssue({ code: 'custom', message: `holds a character beyond ASCII (${code}, pasted with the key?): a key is letters, digits and punctuation` });
    });

/**
 * `$OPENAI_API_KEY` (shell and docker compose style) is text here, not a reference: a provider got the variable's name
 * as its key, and a client key so written was the name, a key anyone who reads the config holds.
 */
const notShellReference = (key: string, ctx: z.RefinementCtx): void => {
  if (/^\$[A-Za-z_][A-Za-z0-9_]*$/.test(key)) ctx.addIssue({ code: 'custom', message: `is "${key}", which is text, not a reference to the variable: write \${${key.slice(1)}}` });
};

const BACKOFF_STRATEGIES = ['full-jitter', 'equal-jitter', 'decorrelated-jitter', 'exponential', 'fixed'] as const;

/** What an upstream outcome may be retried on: an HTTP status, or a transport failure class. */
const RetryOnEntry = z.union([
  z.number().int().min(400).max(599),
  z.enum(['network', 'timeout']),
  // Said whole (zod-issues.ts): `5xx` is text, and the word branch alone answered "expected one of: network, timeout".
], { error: 'expected an HTTP status as a whole number from 400 to 599 (503, not 5xx) or one of: network, timeout' });

const BackoffSchema = z
  .strictObject({
    strategy: z
      .enum(BACKOFF_STRATEGIES)
      .default('full-jitter')
      .describe('How waits between attempts grow: full-jitter, equal-jitter, decorrelated-jitter; exponential and fixed (no jitter) exist for benchmarks only. Default: full-jitter.'),
    baseMs: positiveMs('Base wait in ms; the first retry waits up to this long. Default: 200.').default(200),
    capMs: positiveMs('Longest wait between attempts in ms. Default: 3000.').default(3000),
  })
  // On the backoff itself, so a target's own retry and a contextWindowFallback's are checked as the route's is.
  .superRefine((b, ctx) => {
    if (b.baseMs > b.capMs) ctx.addIssue({ code: 'custom', path: ['baseMs'], message: `must not exceed capMs (${b.capMs})` });
  })
  .describe('Backoff between attempts on one target when the upstream gave no wait hint.');

export const RetrySchema = z
  .strictObject({
    maxAttempts: z.number().int().min(1).max(20).default(3)
      .describe('Attempts on one target, the first included (1 disables retries). Default: 3.'),
    backoff: BackoffSchema.prefault({}),
    retryOn: z.array(RetryOnEntry).default([429, 500, 502, 503, 504, 520, 524, 529, 'network', 'timeout'])
      .describe('Outcomes that are retried: HTTP statuses, `network` (refused, reset, DNS) and `timeout` (connect, first token, response; an idle stream\'s after its first output is never retried). 400, 404, 422, credential errors, redirects (3xx, a wrong baseUrl) and a request larger than the provider\'s whole token limit ("Request too large") are never retried whatever this says. An outcome left out here that the provider may have run (a timeout or lost connection after sending, a 500, 502, 504, or Cloudflare\'s 520 or 524) is not sent to the next target either. Default: [429, 500, 502, 503, 504, 520, 524, 529, network, timeout].'),
    maxWaitHintMs: ms('Longest upstream wait hint (retry-after and friends) the gateway waits out; a longer hint ends retries on that target and reaches the client as retry-after. Default: 20000.').default(20000),
  })
  .describe('Retry policy of a route.');

const TimeoutsSchema = z
  .strictObject({
    connectMs: positiveMs('Time to open a TCP/TLS connection to the provider, in ms. Default: 5000.').default(5000),
    firstTokenMs: positiveMs('For streams: time from sending the request to the first event that carries output (text, tool call, reasoning, refusal or audio; any Responses API delta or finished output item); role-only chunks and pings do not count. Longer than the longest silent thinking of a reasoning model. Default: 30000.').default(30000),
    idleMs: positiveMs('For streams: longest gap between two events (pings count), in ms. On passthrough paths: longest gap between two chunks of the answer\'s body (under /v1/responses, the longer of this and firstTokenMs: a resumed stream may be in the model\'s thinking), timed by undici, whose timer can fire up to about a second late. Also the longest gap inside an upstream error\'s body (status 300 and up), streamed or not: past it the error is judged by its status and headers with what came of its body. Default: 30000.').default(30000),
    responseMs: positiveMs('For non-streaming requests: per-attempt limit on the whole answer, in ms. Optional; unset, only the deadline bounds it, since long answers take minutes.').optional(),
    keepAliveMs: positiveMs('How long a connection to the provider is kept idle for the next request, in ms; below the provider\'s own idle timeout (many servers close at 5 s, without saying so), or a request sent as it closes the connection fails. A provider\'s Keep-Alive hint may shorten it, never lengthen it. Default: 4000.').default(4000),
  })
  .describe('Per-attempt timers of a provider.');

const breakerFields = {
  failureRate: z.number().gt(0).lte(1).describe('Share of failed requests in the window that opens the breaker (with at least minRequests). Default: 0.5.'),
  windowS: z.number().int().min(1).max(300).describe('Sliding window of the failure rate, in seconds. Default: 10.'),
  minRequests: z.number().int().min(1).describe('Requests the window needs before the failure rate can open the breaker. Default: 20.'),
  consecutiveFailures: z.number().int().min(1).describe('Failures in a row seen by one instance that open the breaker fleet-wide at once (as Envoy\'s consecutive_5xx), once that instance has had no success from the target for 250 ms (with none of its requests to the target sent before the latest failure still unanswered) or the run is four times as long. Default: 5.'),
  slowCallMs: positiveMs('An attempt cut short by the client\'s deadline or disconnect counts as a failure only if it had waited longer than this. Default: 5000.'),
  openS: z.number().positive().max(MAX_TIMER_S).describe('How long the breaker stays open before probing, in seconds (plus up to 10% random jitter). Default: 30.'),
  halfOpenProbes: z.number().int().min(1).describe('Probe requests allowed through at a time across the fleet while half-open. Default: 3.'),
  closeAfter: z.number().int().min(1).describe('Probe successes that close the breaker. While half-open, once closeAfter probes have answered, a failure share of failureRate or more reopens it (as do closeAfter failures); the first probe after an open spell reopens it on its own failure. Default: 3.'),
  probeWhileParkedMs: positiveMs('While requests are parked on an open target, the first probe goes this long after it opened, whatever openS says; each probe that fails doubles the wait, up to probeWhileParkedMaxMs. Default: 1000.'),
  probeWhileParkedMaxMs: positiveMs('Longest wait between probes while requests are parked (never past openS): how late parked requests may learn of a recovery, against how often a long outage is probed. Default: 5000.'),
};

/**
 * The same fields for one model, each described with its real default: a field a model leaves out is the provider's
 * (settingsForModel merges the two), not the value the provider's own field defaults to.
 */
const modelBreakerFields = Object.fromEntries(
  Object.entries(breakerFields).map(([key, field]) => {
    const doc = field.description ?? '';
    if (!/ Default: [^ ]+$/.test(doc)) throw new Error(`breaker field ${key}: its description must end in "Default: <value>."`);
    return [key, field.describe(doc.replace(/ Default: [^ ]+$/, ` Default: the provider's breaker.${key}.`))];
  }),
) as typeof breakerFields;

export const BreakerSchema = z
  .strictObject({
    failureRate: breakerFields.failureRate.default(0.5),
    windowS: breakerFields.windowS.default(10),
    minRequests: breakerFields.minRequests.default(20),
    consecutiveFailures: breakerFields.consecutiveFailures.default(5),
    slowCallMs: breakerFields.slowCallMs.default(5000),
    openS: breakerFields.openS.default(30),
    halfOpenProbes: breakerFields.halfOpenProbes.default(3),
    closeAfter: breakerFields.closeAfter.default(3),
    probeWhileParkedMs: breakerFields.probeWhileParkedMs.default(1000),
    probeWhileParkedMaxMs: breakerFields.probeWhileParkedMaxMs.default(5000),
    models: z
      .record(z.string().min(1), z.strictObject(modelBreakerFields).partial().describe('Fields that differ for this model; each one left out is the provider\'s.'))
      .default({})
      .describe('Per-model overrides of the fields above, by upstream model name. Default: none (every model has the provider\'s settings).'),
  })
  .describe('Circuit breaker per target (provider and model); `false` turns it off.');

const PoolClassSchema = z
  .strictObject({
    minShare: z.number().min(0).max(1).default(0).describe('Share of maxConcurrent this class keeps under contention; idle capacity is open to any class. The classes of a pool add up to 1 at most. Default: 0.'),
    maxShare: z.number().gt(0).max(1).default(1).describe('Share of maxConcurrent this class may hold at most, idle capacity or not (at least one slot); below 1, the rest is kept free for the other classes. For a class whose requests hold their slots long (a batch job\'s minutes-long streams): taking every idle slot, they left an online request arriving to wait for one of them to end. At least minShare. Default: 1.'),
    maxQueue: z.number().int().min(0).default(1000).describe('Requests of this class that may wait for a slot; more are shed. Default: 1000.'),
  })
  .describe('A priority class of the provider\'s pool.');

const DEFAULT_POOL_CLASSES = { online: { minShare: 0.5, maxShare: 1, maxQueue: 1000 }, batch: { minShare: 0.1, maxShare: 1, maxQueue: 10000 } };

const PoolsSchema = z
  .strictObject({
    maxConcurrent: z.number().int().positive().optional()
      .describe('Attempts in flight to this provider, all classes together; at most maxConnections. Optional; default: maxConnections.'),
    maxConcurrentRetries: z.number().int().positive().optional()
      .describe('Retries in flight to this provider; retries never bypass the pool, so one above maxConcurrent lets retries take the whole pool, as maxConcurrent itself does. Optional; default: a fifth of maxConcurrent (at least 1).'),
    classes: z.record(z.string().regex(/^[a-z][a-z0-9_-]*$/), PoolClassSchema).default(DEFAULT_POOL_CLASSES)
      .describe('Priority classes, highest first (e.g. critical, online, batch). Default: online (minShare 0.5, maxQueue 1000), batch (minShare 0.1, maxQueue 10000). Written, the map replaces these whole: a class left out is gone, and a class written takes the defaults below (minShare 0, maxQueue 1000), not the values above.'),
    decrease: z.number().gt(0).lt(1).default(0.9)
      .describe('Factor the adaptive limit of a target (provider and model) is multiplied by on a 429 or 529 (or an error coded capacity_exceeded, server_is_overloaded or slow_down, except Groq\'s 498: its flex tier at capacity, not the target), at most once per round trip; successes raise it by one per round trip. Default: 0.9.'),
    minLimit: z.number().int().positive().default(1).describe('Floor of the adaptive limit; one above maxConcurrent is maxConcurrent. Default: 1.'),
    // The same bounds as a client's rate (auth.limits): a due time a burst ahead stays within what a timer can hold.
    requestsPerMinute: z.number().min(0.0001).max(6_000_000).optional()
      .describe('Requests per minute each target (provider and model: OpenAI, Anthropic and Azure count their limits per model or deployment) is sent, the fleet\'s together: set it a little under the provider\'s limit and attempts beyond it wait in the pool, in class order, for their turn (under the one wait rule, so one that cannot expect its turn before its deadline is shed with the wait as its retry-after), instead of being sent to meet a 429. With a shared state store each instance paces at its share of the pool, by demand (not rounded to whole slots), the fleet\'s parts summing to the rate. Optional; default: no rate (the adaptive limit and hold-offs follow the provider\'s 429s).'),
    burst: z.number().int().min(1).max(1_000_000).optional()
      .describe('Requests a target may be sent at once after a quiet spell, under requestsPerMinute. Optional; default: one second\'s worth (requestsPerMinute / 60, at least 1), as providers enforce a minute\'s limit over shorter spans.'),
    tokensPerMinute: z.number().min(1).max(1_000_000_000).optional()
      .describe('Tokens per minute each target is sent, the fleet\'s together, up to a minute\'s worth at once, paced as requestsPerMinute is. A request counts as OpenAI counts it at arrival: its body\'s bytes / 4 plus the completion cap it sets (max_tokens, max_completion_tokens, max_output_tokens; times n, on /v1/completions for each prompt of a batch), each attempt again, and is never settled against the answer\'s usage (conservative against Anthropic, which counts output tokens as they are produced, not the cap at arrival); one larger than a minute\'s worth goes once the rate is full. Optional; default: no token rate.'),
    tokenBurst: z.number().int().min(1).max(1_000_000_000).optional()
      .describe('Tokens a target may be sent at once after a quiet spell, under tokensPerMinute; a request larger than it goes once the bucket is full. Set it to a few seconds\' worth when the provider enforces its token limit over shorter spans than a minute (a burst of requests sent at once is then refused with token 429s). Optional; default: a minute\'s worth (tokensPerMinute).'),
  })
  .refine((p) => p.burst === undefined || p.requestsPerMinute !== undefined, { message: 'burst is the request rate\'s: it needs requestsPerMinute', path: ['burst'] })
  .refine((p) => p.tokenBurst === undefined || p.tokensPerMinute !== undefined, { message: 'tokenBurst is the token rate\'s: it needs tokensPerMinute', path: ['tokenBurst'] })
  .describe('Concurrency of a provider, shared by priority classes, with an adaptive (AIMD) limit per target, and optionally request and token rates per target.');

const thinkingBudget = (effort: string, tokens: number) =>
  z.number().int().min(1024).max(128000).default(tokens)
    .describe(`budget_tokens for reasoning_effort "${effort}", at least 1024 (Anthropic's minimum). Default: ${tokens}.`);

const ThinkingSchema = z
  .strictObject({
    low: thinkingBudget('low', 1024),
    medium: thinkingBudget('medium', 4096),
    high: thinkingBudget('high', 16384),
    xhigh: thinkingBudget('xhigh', 24576),
  })
  .describe('Thinking budgets, in tokens, by reasoning_effort.');

/**
 * A URL's user and password, percent-decoded, as undici reads them for a proxy's Basic credentials. True for a text that
 * is no URL (`proxy: 10.0.0.1:3128`): the URL check says so, and a second line about a password would mislead.
 */
function userinfoDecodes(url: string): boolean {
  if (!URL.canParse(url)) return true;
  try {
    const { username, password } = new URL(url);
    decodeURIComponent(username);
    decodeURIComponent(password);
    return true;
  } catch {
    return false;
  }
}

const ProviderTlsSchema = z
  .strictObject({
    caFile: z.string().min(1).optional()
      .describe('PEM file of the CA certificates the provider\'s certificate is checked against, in place of Node\'s public roots: the private CA of an internal gateway or vLLM. Read at start-up (a relative path from the working directory); a file that cannot be read or holds no certificate fails start-up. Optional; default: Node\'s public roots, plus NODE_EXTRA_CA_CERTS.'),
    rejectUnauthorized: z.boolean().default(true)
      .describe('Refuse a certificate that does not verify (untrusted, expired, for another name). false accepts any certificate, so anyone on the way can read the requests and the provider\'s key: for a test server only, and the gateway warns at start-up. Default: true.'),
  })
  .describe('TLS to the provider (an https:// baseUrl). A certificate the gateway refuses fails the attempt with its TLS code (CERT_HAS_EXPIRED, ...): not retried on that target, nothing for its breaker, the next target is tried.');

const ProviderSchema = z
  .strictObject({
    family: z.enum(['openai', 'anthropic', 'azure-openai'])
      .describe('API family the provider speaks: openai (also any OpenAI-compatible server such as vLLM, Ollama or OpenRouter), anthropic (Messages API, chat completions translated both ways), azure-openai (deployments, api-key header).'),
    optional: z.boolean().default(false)
      .describe('With an empty apiKey, the provider is disabled (skipped as a target, said once at start-up) instead of failing start-up. Default: false.'),
    apiVersion: z.string().min(1).optional().describe('azure-openai only: the api-version query parameter, e.g. 2024-10-21. Required for azure-openai.'),
    anthropicVersion: z.string().min(1).default('2023-06-01').describe('anthropic only: the anthropic-version header of chat completions translated for it, and of /v1/messages requests that send none. Default: 2023-06-01.'),
    defaultMaxTokens: z.number().int().positive().default(4096)
      .describe('anthropic only: max_tokens sent when the client sets none (the Messages API requires it). Default: 4096.'),
    sampling: z.enum(['drop', 'forward', 'refuse']).default('drop')
      .describe('anthropic only: what happens to temperature and top_p, which newer Anthropic models reject: drop them, forward them (temperature clamped to 0..1; top_p only without a temperature, since newer models refuse the two together), or refuse the request for this target. Default: drop.'),
    thinking: z.union([z.literal(false), ThinkingSchema]).prefault({})
      .describe('anthropic only: a translated chat completion\'s reasoning_effort (low, medium, high, xhigh) asks for extended thinking, which comes back as reasoning_content: thinking.type enabled with the budget below on Claude 3.7 to 4.6, adaptive with output_config.effort on Claude 4.7 and later. Without a max_tokens from the client, max_tokens is defaultMaxTokens plus the budget (keep that under the model\'s output limit); with one, it is kept and the budget takes at most half of it. Left out (the request goes without thinking, never refused) where Anthropic would refuse it: a model older than 3.7 or an id not of the form claude-<family>-<version> or claude-<version>-<family>, half the client\'s max_tokens under 1024, a tool_choice that forces a call, temperature other than 1 or top_p under 0.95 (sampling: forward), a conversation ending in an assistant message (a prefill) or in tool results. none and minimal ask for no thinking. false ignores reasoning_effort. Default: on, with the budgets below.'),
    prefill: z.boolean().optional()
      .describe('The provider\'s models continue an assistant message placed last (a prefill), so stream recovery can send them the text already delivered. Default: false, except for anthropic, where it follows the model: Claude models before 4.6 take a prefill, Claude 4.6 and later refuse it.'),
    streamUsage: z.boolean().default(false)
      .describe('openai and azure-openai only: a streamed chat completion (or legacy completion, /v1/completions) whose client did not ask for its usage is sent with stream_options.include_usage: true (the client\'s other stream_options kept), so its tokens are billed in stormgate_tokens_total and the log line; the usage chunk, and the "usage": null on every other chunk, are taken out of that client\'s stream, which stays as it would be without the setting. A client that asks gets its usage chunk once, as before. Turn it on only where the provider accepts stream_options (OpenAI, vLLM and SGLang do): one that refuses unknown fields answers every such stream with a 400, as Azure does before api-version 2024-09-01-preview (2024-10-21 is the first GA one that takes it; 2024-06-01 refuses it). A stream the provider ends without the usage and without [DONE] waits idleMs after its finish, as one whose client asked for the usage. Anthropic streams and the Responses API report their usage always, so it does nothing there. Default: false.'),
    authHoldS: z.number().positive().max(MAX_TIMER_S).default(60)
      .describe('After the provider rejects the gateway\'s own credentials or billing (401, 402, 403, 429 insufficient_quota, billing_not_active or access_terminated), no request goes to it for this long, in seconds. Default: 60.'),
    baseUrl: z
      .url({ protocol: /^https?$/ })
      // undici sends no userinfo: a user:password written here would be dropped without a word.
      .refine((url) => !/^[a-z]+:\/\/[^/?#]*@/i.test(url), { message: 'holds a user or password (user:password@), which is never sent; the provider\'s key goes in apiKey' })
      // A zero-width space or a direction mark pasted with the URL: the URL parser percent-encodes it into the path,
      // and every request got the provider's 404.
      .superRefine((url, ctx) => {
        const ch = /\p{Cf}/u.exec(url)?.[0];
        if (ch) ctx.addIssue({ code: 'custom', message: `holds an invisible character (U+${ch.codePointAt(0)!.toString(16).toUpperCase().padStart(4, '0')}, pasted with the URL?), which would go into every request's path: remove it` });
      })
      .describe('Base URL the gateway adds each endpoint\'s path to: for openai with the version prefix (https://api.openai.com/v1), for anthropic the host (https://api.anthropic.com), for azure-openai the resource\'s endpoint (https://example.openai.azure.com). No endpoint path, query, fragment, user:password or invisible character (a zero-width space pasted with it).'),
    proxy: z
      .union([z.literal(''), z.url({ protocol: /^https?$/ })])
      // undici decodes the user and password once it starts: a bare % (a password such as "50%off") threw there.
      .refine((url) => url === '' || userinfoDecodes(url), { message: 'its user or password holds a % that starts no percent-encoded byte: write % as %25 (and @ : / as %40 %3A %2F)' })
      .optional()
      .describe('Egress proxy the provider is reached through, as an http:// or https:// URL, e.g. "${HTTPS_PROXY:-}" (empty: none). Connections are tunnelled with HTTP CONNECT; a user:password in the URL is sent as the proxy\'s Basic credentials and never logged. Default: none (the gateway does not read HTTPS_PROXY by itself: a provider on the company network usually must not go through it).'),
    tls: ProviderTlsSchema.optional(),
    apiKey: headerSecret()
      // The Authorization header's scheme written with the key: the provider got "Bearer Bearer sk-..." and a 401.
      .superRefine(notShellReference)
      .refine((key) => !/^bearer\s/i.test(key), { message: 'starts with "Bearer ", which the gateway writes itself (Authorization: Bearer <key>; x-api-key or api-key for anthropic and azure-openai): write the key alone, e.g. "${OPENAI_API_KEY}"' })
      .describe('API key, usually from the environment: "${OPENAI_API_KEY}" (surrounding whitespace and line breaks are trimmed). Sent upstream as the credential; never logged. Required unless the provider is optional; a server that needs none takes any placeholder, e.g. "none".'),
    timeouts: TimeoutsSchema.prefault({}),
    maxConnections: z.number().int().positive().default(128)
      .describe('Size of the keep-alive connection pool to this provider. Default: 128.'),
    pools: PoolsSchema.prefault({}),
    breaker: z.union([z.literal(false), BreakerSchema]).prefault({})
      .describe('Circuit breaker of each target of this provider, or false to turn it off. Default: on, with the defaults below.'),
  })
  .superRefine((p, ctx) => {
    const problem = URL.canParse(p.baseUrl) ? baseUrlProblem(p.family, new URL(p.baseUrl)) : undefined;
    if (problem) ctx.addIssue({ code: 'custom', path: ['baseUrl'], message: problem });
    // A plain http:// provider makes no TLS connection: the setting would be ignored without a word.
    if (p.tls && /^http:/i.test(p.baseUrl)) ctx.addIssue({ code: 'custom', path: ['tls'], message: 'applies to an https:// baseUrl only: this provider\'s is http://' });
  })
  .describe('An upstream provider.');

/** Endpoints the gateway adds to a base URL: one that already ends in one would be asked for /chat/completions twice. */
const ENDPOINT_SUFFIX = /\/(chat\/completions|completions|embeddings|responses|messages)\/*$/;

/**
 * A base URL that parses but that no request could use: only its origin and path are sent (the gateway appends the
 * endpoint's path and the client's query), so every request would get a 404, or lose what the URL added.
 */
function baseUrlProblem(family: string, url: URL): string | undefined {
  // Not quoted back: a query may hold a key.
  if (url.search !== '' || url.hash !== '') {
    return `holds a query (?...) or fragment (#...), which is never sent${family === 'azure-openai' ? '; the api-version goes in apiVersion' : ''}`;
  }
  if (url.port === '0') return 'has port 0, which no connection can reach: write the provider\'s port, or none for the scheme\'s own';
  const endpoint = ENDPOINT_SUFFIX.exec(url.pathname);
  if (endpoint) return `ends in the endpoint ${endpoint[0].replace(/\/+$/, '')}, which the gateway adds to it: write the API's base, e.g. ${EXAMPLE_BASE[family]}`;
  // Azure's paths (/openai/deployments/{name}/..., /openai/v1/...) are the gateway's to write.
  if (family === 'azure-openai' && /(^|\/)openai(\/|$)/.test(url.pathname)) {
    return `azure-openai takes the resource's endpoint alone, e.g. ${EXAMPLE_BASE[family]}: the gateway adds /openai/deployments/{model}/... to it`;
  }
  return undefined;
}

const EXAMPLE_BASE: Record<string, string> = {
  openai: 'https://api.openai.com/v1',
  anthropic: 'https://api.anthropic.com',
  'azure-openai': 'https://example.openai.azure.com',
};

const TargetSchema = z
  .strictObject({
    provider: z.string().min(1).describe('Name of a provider under `providers`.'),
    model: z.string().min(1).optional().describe('Upstream model to send instead of the client\'s. Optional; default: the client\'s model.'),
    weight: z.number().int().positive().default(1).describe('Share of requests with `strategy: weighted` (smooth weighted round-robin). Default: 1.'),
    retry: RetrySchema.optional().describe('Retry policy on this target in place of the route\'s `retry` as a whole, not merged with it: a field left out here takes its default below, not the route\'s value. Optional; default: the route\'s.'),
  })
  .describe('Where a route sends a request: a provider and, optionally, the upstream model.');

/** A route's context-window fallback: a target, tried alone, so its weight has nothing to weigh. */
const ContextWindowFallbackSchema = TargetSchema.extend({
  weight: z.number().int().positive().default(1)
    .describe('Has no effect here: the context-window fallback is one target, tried on its own whatever `strategy` says (accepted so a target can be copied here as it is). Default: 1.'),
});

const BudgetSchema = z
  .strictObject({
    ratio: z.number().min(0).max(10).default(0.1).describe('Retries allowed as a share of requests over the window. Default: 0.1.'),
    windowS: z.number().int().min(1).max(300).default(10).describe('Sliding window of the budget, in seconds. Default: 10.'),
    minRetriesPerSecond: z.number().min(0).default(10).describe('Fleet-wide floor, so a quiet route can still retry: minRetriesPerSecond × windowS whole retries per window (under 1 / windowS, none). Finagle\'s default: it decides only below ratio × requests, so at 100 requests a second and more the ratio alone bounds retries, while a small deployment\'s burst against a flaky provider is still retried. A retry after a rate limit (a 429, a 529) has a floor of at most 1 a second: retrying adds to the load the provider refuses. Default: 10.'),
    repeats: z
      .strictObject({
        windowS: z.number().int().min(0).max(600).default(60)
          .describe('A request whose body repeats, byte for byte (same client key, path, query and x-stormgate-priority), one this instance answered with an error (or whose client left) less than this many seconds ago is the client retrying without saying so (LangChain, the Vercel AI SDK, a fixed-interval loop): logged (clientRetry: repeat) and counted in stormgate_client_retries_total. 0 turns the watch off. Default: 60.'),
        countAsRetries: z.boolean().default(false)
          .describe('Take such a repeat from the retry budget as a retry, as one with x-stainless-retry-count is: the budget spent, it is served once and not retried by the gateway, and it does not enlarge the budget. Off by default: clients that send the same body on purpose (a load test, a health check) would be counted as retrying. Default: false.'),
      })
      .prefault({})
      .describe('Clients\' undeclared retries.'),
  })
  .describe('Retry budget, kept per route, target and priority class: retries stay a fixed share of traffic however bad the upstream gets.');

const ParkSchema = z
  .strictObject({
    maxQueue: z.number().int().min(1).default(10000).describe('Requests that may wait for an unavailable target at once, per route; more get 503. Default: 10000.'),
    maxWaitMs: positiveMs('Longest a request waits parked, all its waits together (released to a probe that failed, it parks again for what is left). Optional; default: no limit but its deadline (less minAttemptMs) and, for a hold-off, retry.maxWaitHintMs.').optional(),
  })
  .describe('Requests wait here while their target is unavailable (breaker open, hold-off) and no other target can take them. `false` turns it off.');

const RouteSchema = z
  .strictObject({
    name: z.string().regex(/^[A-Za-z0-9_.-]+$/, 'letters, digits, "_", "." or "-"').describe('Route name, used in logs, headers and metric labels.'),
    match: z
      .strictObject({
        path: z.string().startsWith('/').describe('Request path, e.g. /v1/chat/completions.'),
        models: z.array(z.string().min(1)).min(1).optional()
          .describe('Model names the route serves; exact names or `*` globs. Optional; default: every model.'),
      })
      .describe('Which requests the route takes; routes are tried in file order and the first match wins.'),
    targets: z.array(TargetSchema).min(1).describe('Targets in order: the primary first, then the fallbacks.'),
    strategy: z.enum(['fallback', 'weighted']).default('fallback')
      .describe('fallback: always the primary first; weighted: spread requests by `weight` (smooth weighted round-robin), skipping targets whose breaker is open or that are held off; the others remain fallbacks. Default: fallback.'),
    contextWindowFallback: ContextWindowFallbackSchema.optional()
      .describe('Target for requests the chosen target rejects with context_length_exceeded (e.g. a model with a larger window). Optional.'),
    streamRecovery: z.enum(['off', 'continue']).default('off')
      .describe('Experimental, chat only: on a stream cut, stalled or broken off by the provider\'s own error event (an overload, a server error) after its first byte, `continue` asks the next target for the rest of a text answer (never a half-sent tool call), or for the whole answer when only reasoning went out; otherwise the stream ends with an error event. Default: off.'),
    degraded: z.strictObject({ message: z.string().min(1).describe('Text of the degraded answer.') }).optional()
      .describe('When every target failed or is unavailable and nothing can be parked, answer a normal-looking completion with this text (x-stormgate-degraded: true) instead of an error. Optional; chat completions only.'),
    timeoutMs: positiveMs('Longest time the gateway spends on a request, all attempts and waits included. The client\'s own timeout headers can shorten it. Default: 120000.').default(120000),
    minAttemptMs: ms('A wait (backoff, wait hint) is only taken if at least this much time is left for the attempt after it, before the deadline; otherwise the gateway answers at once. Default: 1000.').default(1000),
    deadlineMarginMs: ms('Time kept back before the client\'s deadline so the gateway answers before the client gives up. Optional; default: the larger of 250 ms and 5% of the deadline. Set, it is kept back whole, but from a client\'s shorter timeout at most half of that timeout, and never more time given than the route\'s own timeout less the margin.').optional(),
    retry: RetrySchema.prefault({}),
    priority: z.string().default('online')
      .describe('Priority class of the route\'s requests in its providers\' pools; the x-stormgate-priority header can only lower it. Default: online.'),
    budget: BudgetSchema.prefault({}),
    park: z.union([z.literal(false), ParkSchema]).prefault({})
      .describe('Parking while the target is unavailable, or false to fail at once instead. Default: on, maxQueue 10000.'),
    idempotency: z
      .strictObject({
        bodyAsKeyMs: positiveMs('A request without an Idempotency-Key has its body as its key (scoped by client key and path, as a sent key is): one whose body repeats a request from the same client that is still running waits for it, and one that comes within this many ms of its answer gets that answer again. For a tool whose calls must not run twice, called by agents that send no key. Ignored when idempotency.enabled is false.'),
      })
      .optional()
      .describe('Idempotency for this route\'s requests that carry no Idempotency-Key (those that do are served as idempotency says). Optional; default: off, a request without a key runs as it comes.'),
  })
  .describe('A route: which requests, which targets, which policies.');

const PassthroughSchema = z
  .strictObject({
    provider: z.string().min(1).describe('Provider the paths are forwarded to, with its credentials.'),
    paths: z.array(z.string().startsWith('/')).min(1).describe('Paths forwarded as they are, with what is under them (no retries), e.g. /v1/files (also /v1/files/{id}/content).'),
    methods: z.array(z.enum(['GET', 'POST', 'PUT', 'PATCH', 'DELETE'])).min(1).default(['GET'])
      .describe('HTTP methods forwarded on those paths. Default: [GET].'),
    timeoutMs: positiveMs('Longest wait for the answer\'s headers once the request (its body included) is sent, in ms; then 504 upstream_timeout (timed by undici, whose timer can fire up to about a second late: 1000 fired after about 1.5 s). Longer than the slowest call these paths serve (an image generation answers only when it is done). A client whose own timeout (x-stainless-timeout, x-stormgate-timeout-ms) is shorter gets 504 deadline_exceeded just before it instead. Default: 120000.').default(120000),
  })
  .describe('Paths outside the managed routes that are forwarded unchanged. Optional; off by default, so the gateway is no open relay for the provider key.');

/** Is the database a Redis URL names (its path, else a `db` query parameter, as ioredis reads them) a number, or absent? */
function redisUrlDbIsNumber(url: string): boolean {
  const parsed = new URL(url);
  const path = parsed.pathname.replace(/^\//, '');
  return /^\d*$/.test(path !== '' ? path : (parsed.searchParams.get('db') ?? ''));
}

const HostPort = z.strictObject({ host: z.string().min(1).describe('Host name or address of the node.'), port: z.number().int().min(1).max(65535).describe('Port of the node.') });

const RedisSchema = z.union([
  z
    .string()
    .regex(/^$|^rediss?:\/\/\S+$/, 'a redis:// or rediss:// URL (or "" for in-process state)')
    // Not quoted back: the URL may hold the password. ioredis would throw on it at start-up, with a stack trace.
    .refine((url) => url === '' || URL.canParse(url), { message: 'is not a valid URL (check its host, port and the characters of the password: URL-encode @ : / [ ] in it)' })
    // ioredis sends SELECT with whatever the path parses to: `redis://redis:6379/stormgate` was SELECT NaN, whose
    // refusal it throws where nothing can catch it (exit 1 with a stack trace, at start-up or at a reconnect).
    .refine((url) => url === '' || !URL.canParse(url) || redisUrlDbIsNumber(url), {
      message: 'the path of a redis:// URL (and a `db` parameter) is the database number: write redis://host:6379/0, or no path for db 0 (the key prefix is state.keyPrefix)',
    })
    .describe('A redis:// or rediss:// URL; empty means no Redis (in-process state).'),
  z
    .strictObject({
      sentinels: z.array(HostPort).min(1).optional().describe('Redis Sentinel nodes; needs `name`.'),
      name: z.string().optional().describe('Sentinel master name.'),
      cluster: z.array(HostPort).min(1).optional().describe('Redis Cluster seed nodes.'),
      username: z.string().optional().describe('ACL user name (Redis 6+); unset: the default user.'),
      password: z.string().optional().describe('Usually "${REDIS_PASSWORD}"; never logged.'),
      db: z.number().int().min(0).optional().describe('Database index. Default: 0.'),
      tls: z.boolean().optional().describe('Connect with TLS.'),
    })
    .superRefine((r, ctx) => {
      if (r.sentinels === undefined && r.cluster === undefined) {
        ctx.addIssue({ code: 'custom', message: 'needs `sentinels` (with `name`) or `cluster`; for a single Redis write its URL as a string, e.g. "redis://:${REDIS_PASSWORD}@redis:6379"' });
      } else if (r.sentinels !== undefined && r.cluster !== undefined) {
        ctx.addIssue({ code: 'custom', message: 'set `sentinels` or `cluster`, not both' });
      } else if (r.sentinels !== undefined && !r.name) {
        ctx.addIssue({ code: 'custom', path: ['name'], message: 'Sentinel needs the master\'s `name`' });
      }
    })
    .describe('Sentinel or Cluster settings, as ioredis takes them.'),
]);

const StateSchema = z
  .strictObject({
    redis: RedisSchema.optional().describe('Shared state for a fleet of gateways. Optional; default: in-process state (one instance).'),
    commandTimeoutMs: positiveMs('Longest wait for Redis on the request path (a probe permit, a retry from the budget, a limited client\'s rates, an idempotency key\'s claim); past it the gateway decides on local state. Default: 50.').default(50),
    keyPrefix: z.string().regex(/^[A-Za-z0-9_:.-]*$/).default('stormgate').describe('Prefix of every Redis key and channel; one per fleet: keys name providers by their config name, so instances sharing a prefix must run the same providers. Default: stormgate.'),
  })
  .describe('Where the retry budget, breakers and hold-offs are kept.');

const ServerSchema = z
  .strictObject({
    // Empty (`host: ${HOST}` with HOST set to nothing), Node would listen on every interface: the opposite of the default.
    host: z.string().min(1).default('127.0.0.1').describe('Address to listen on. Default: 127.0.0.1.'),
    port: z.number().int().min(0).max(65535).default(8080).describe('Port to listen on (0 picks a free one). Default: 8080.'),
    // A name as the check compares it (the Host header without its port): one written with a port, a scheme or a `*.`
    // pattern never matched, and every request through the proxy got 403 with nothing said at start-up.
    allowedHosts: z.array(z.string().min(1).regex(/^(\*|[^\s:/*?#@[\]]+)$/, 'a host name alone ("gateway.example.com": no scheme, port, path or "*." pattern), or "*" for every name')).min(1).optional()
      .describe('Host names (the Host header without its port) a gateway on a loopback address answers besides the local ones (localhost, IP literals, names without a dot); others get 403 host_not_allowed, against DNS rebinding from a web page. `["*"]`: every name. Set, it applies on any address (0.0.0.0 too: a Kubernetes service name must then be listed). Optional; default: local names only on a loopback address, every name on any other.'),
    bodyLimitBytes: z.number().int().positive().default(10 * 1024 * 1024)
      .describe('Largest request body accepted; larger ones get 413. Default: 10485760.'),
    // The queues bound requests, not bytes: 10,000 batch requests of 500 KB waiting would hold 5 GB of raw bodies and
    // as much again parsed, past the heap's limit, and a process that dies drops every online request with the batch.
    maxWaitingBodyBytes: z.number().int().positive().optional()
      .describe('Most bytes of request bodies held by requests waiting for a pool slot, parked, or repeating an idempotency key whose run is still going (or waiting for Redis: idempotency.waitForRedisMs), across the instance (each also holds its parsed JSON, about as large, on the heap); a request that would pass it is shed (503 load_shed, 429 in a pool\'s lowest class; parked: 503 park_queue_full; a repeat: 409 idempotency_key_in_progress), with retry-after and x-should-retry: true. A pool\'s lowest class (batch) and repeats fill only half of it. Optional; default: a quarter of the V8 heap limit (--max-old-space-size), about 1 GB with Node\'s default on a machine of 16 GB or more.'),
    requestTimeoutMs: positiveMs('Longest a client may take to send its whole request, headers and body; past it the gateway answers 408 and closes the connection. Default: 60000.').default(60_000),
    keepAliveTimeoutMs: positiveMs('How long an idle client connection is kept open (answers say Keep-Alive: timeout=<seconds>). Keep it above the idle timeout of a load balancer in front (AWS ALB: 60 s), so the balancer closes an idle connection first and never sends a request into one the gateway is closing. Default: 72000.').default(72_000),
    logLevel: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info')
      .describe('pino log level. Default: info.'),
    logSuccessRate: z.number().min(0).max(1).default(1)
      .describe('Share of plain successes (answered by the first target on its first attempt, stream complete) whose request line is written; every other request is always logged. Metrics count them all. Default: 1.'),
  })
  .describe('The gateway\'s own HTTP listener.');

const ClientLimitSchema = z
  .strictObject({
    // The floor (one request in about 7 days, 6e8 ms apart) keeps a whole burst's due time, up to 6e14 ms ahead, within
    // what a Redis PX takes: a rate of 1e-12 failed the script, which degraded the whole state store on each of the
    // client's requests.
    requestsPerMinute: z.number().min(0.0001).max(6_000_000).optional().describe('Requests the client may send per minute, on average. Optional; default: no request rate.'),
    burst: z.number().int().min(1).max(1_000_000).optional().describe('Requests the client may send at once after a quiet spell. Optional; default: ten seconds\' worth (requestsPerMinute / 6), at least 1.'),
    tokensPerMinute: z.number().min(1).max(1_000_000_000).optional().describe('Tokens (prompt and completion, as the providers\' answers report them) the client\'s requests may use per minute, on average, up to a minute\'s worth at once. A request reserves an estimate once its body is read, its body\'s bytes / 4 plus the completion cap it sets (max_tokens, max_completion_tokens, max_output_tokens; times n, on /v1/completions for each prompt of a batch; a body over 64 KiB counts an inline base64 image as 1,600 tokens and an inline file as its decoded bytes / 4, not its base64 text), and is admitted only if that fits what is left (one larger than a minute\'s worth when the rate is full); when it ends, the reservation becomes the tokens its answer used (a stream that did not end whole, or was recovered: its completion at least the output it delivered), or, without usage, its prompt estimate plus the output its answer delivered, streamed or whole (its characters / 4, at most the completion cap when one was set), or nothing if no attempt of it was sent upstream. Optional; default: no token rate.'),
  })
  .refine((l) => l.requestsPerMinute !== undefined || l.tokensPerMinute !== undefined, { message: 'sets no rate: expected requestsPerMinute, tokensPerMinute or both' })
  .refine((l) => l.burst === undefined || l.requestsPerMinute !== undefined, { message: 'burst is the request rate\'s: it needs requestsPerMinute', path: ['burst'] })
  .describe('A client\'s rates, fleet-wide with a Redis state store (each instance on its own while Redis is away).');

const AuthSchema = z
  .strictObject({
    keys: z
      .record(
        z.string().regex(/^[A-Za-z0-9_.-]+$/, 'letters, digits, "_", "." or "-"'),
        // ASCII only (headerSecret): header bytes reach the gateway as Latin-1 while the config is UTF-8, so a key
        // beyond ASCII matched only for clients that send it as Latin-1 (fetch), never for those that send UTF-8 (curl).
        headerSecret()
          .superRefine(notShellReference)
          .describe('A client key, usually from the environment: "${STORMGATE_KEY_AGENTS}" (surrounding whitespace trimmed); never logged.'),
      )
      .describe('Client keys by client name. A request must carry one as its API key (Authorization: Bearer, x-api-key or api-key), or it gets 401 invalid_api_key; the name is logged with the request. /healthz, /readyz and /metrics stay open.'),
    priority: z
      .record(z.string(), z.string().describe('A priority class of the providers\' pools, e.g. batch.'))
      .optional()
      .describe('Priority class a client\'s requests take at most, by client name (e.g. batch-jobs: batch): like the x-stormgate-priority header, it can only lower the route\'s class. Every provider a route sends to must have the class. Optional; default: the route\'s class.'),
    limits: z
      .record(z.string(), ClientLimitSchema)
      .optional()
      .describe('Request and token rates per client, by client name; "*" sets them for every client not named (each its own). A request past one gets 429 client_rate_limited with retry-after-ms at once, before its body is read and before any provider is asked. Counts every request with the client\'s key, retries the client makes included. Optional; default: no limit.'),
  })
  .describe('Who may use the gateway. Optional; without it the gateway serves anyone who reaches its port with the providers\' keys: keep it on a loopback address, or behind a proxy that authenticates.');

const DrainSchema = z
  .strictObject({
    preStopMs: ms('After SIGTERM, /readyz fails at once while requests are still served this long, so a load balancer can take the instance out. Default: 5000.').default(5000),
    graceMs: ms('Then parked requests are answered at once, new ones get 503 (x-should-retry: true), and in-flight requests and streams get this long to finish before the process exits. Default: 30000.').default(30000),
  })
  .describe('Graceful shutdown on SIGTERM.');

const IdempotencySchema = z
  .strictObject({
    enabled: z.boolean().default(true).describe('A managed request with an `Idempotency-Key` header runs once: a repeat while it runs waits for its answer, a repeat after it gets the same answer again. Off: the header is only forwarded. Default: true.'),
    ttlMs: positiveMs('How long an answer is kept for repeats of its key, from when it was given. Default: 600000 (10 minutes).').default(600_000),
    maxAnswerBytes: z.number().int().positive().max(64 * 1024 * 1024).default(1024 * 1024).describe('Longest answer kept for repeats (a stream counts its events). A longer one is not kept: a repeat of its key gets 409 idempotency_answer_not_kept. Default: 1048576.'),
    memoryBytes: z.number().int().positive().max(2 ** 40).default(64 * 1024 * 1024).describe('Without Redis (or while it is away): the most answer bytes kept in the process; the oldest go first. An answer larger than this alone is not kept: a repeat of its key gets 409 idempotency_answer_not_kept. Default: 67108864.'),
    leaseMs: z.number().int().min(1000).max(MAX_TIMER_MS).default(10_000).describe('How long a run\'s claim on its key lasts in the state store unless its instance renews it (every third of it, while the run goes on): an instance that dies mid-run holds the key this long at most, then a repeat runs the request. Renewals that fail this long in a row (Redis unreachable from the instance alone) let the claim lapse too. Default: 10000.'),
    waitForRedisMs: z.number().int().min(0).max(MAX_TIMER_MS).default(0).describe('With a Redis state store: for this long after Redis goes away, a keyed request its instance knows nothing of (the key may be held in Redis by a run on another instance: an SDK\'s retry that reached another instance) waits for Redis to come back, as a repeat waits for a run, and gets 409 idempotency_key_in_progress at its deadline; after it, it runs on local state. For calls that must not run twice (a tool that sends money, a coupon), at the price of keyed requests waiting through a Redis blip. 0: runs on local state at once (availability before run-once). Default: 0.'),
  })
  .describe('Idempotency keys on the managed routes (the Idempotency-Key header), kept in the state store: shared by a fleet through Redis.');

export const ConfigSchema = z
  .strictObject({
    server: ServerSchema.prefault({}),
    providers: z.record(z.string().regex(/^[A-Za-z0-9_.-]+$/), ProviderSchema).describe('Upstream providers by name.'),
    routes: z.array(RouteSchema).min(1).describe('Managed routes, tried in file order.'),
    // `false` reads as left out, so the rest of the gateway sees one way of saying "off" (undefined), as before.
    passthrough: z.union([z.literal(false).transform(() => undefined), PassthroughSchema]).optional()
      .describe('Paths outside the managed routes that are forwarded unchanged, or false (the same as leaving it out). Optional; off by default, so the gateway is no open relay for the provider key.'),
    auth: AuthSchema.optional(),
    state: StateSchema.prefault({}),
    drain: DrainSchema.prefault({}),
    idempotency: IdempotencySchema.prefault({}),
  })
  .superRefine((cfg, ctx) => {
    const names = new Set<string>();
    cfg.routes.forEach((route, i) => {
      if (names.has(route.name)) {
        ctx.addIssue({ code: 'custom', path: ['routes', i, 'name'], message: `route name "${route.name}" is used twice` });
      }
      names.add(route.name);
      route.targets.forEach((t, j) => {
        if (!Object.hasOwn(cfg.providers, t.provider)) {
          ctx.addIssue({
            code: 'custom',
            path: ['routes', i, 'targets', j, 'provider'],
            message: unknownProvider(t.provider, cfg.providers),
          });
        }
      });
      // Planned for every request of the route: a name not under providers would fail each of them, not start-up.
      const wider = route.contextWindowFallback;
      if (wider && !Object.hasOwn(cfg.providers, wider.provider)) {
        ctx.addIssue({ code: 'custom', path: ['routes', i, 'contextWindowFallback', 'provider'], message: unknownProvider(wider.provider, cfg.providers) });
      }
    });
    if (cfg.passthrough && !Object.hasOwn(cfg.providers, cfg.passthrough.provider)) {
      ctx.addIssue({
        code: 'custom',
        path: ['passthrough', 'provider'],
        message: unknownProvider(cfg.passthrough.provider, cfg.providers),
      });
    }
    for (const [name, p] of Object.entries(cfg.providers)) {
      if (p.pools.maxConcurrent !== undefined && p.pools.maxConcurrent > p.maxConnections) {
        ctx.addIssue({
          code: 'custom',
          path: ['providers', name, 'pools', 'maxConcurrent'],
          message: `maxConcurrent (${p.pools.maxConcurrent}) must not exceed maxConnections (${p.maxConnections}), or undici would queue behind the gateway's back`,
        });
      }
      if (Object.keys(p.pools.classes).length === 0) ctx.addIssue({ code: 'custom', path: ['providers', name, 'pools', 'classes'], message: 'at least one class is needed' });
      // Shares that add up to more than the pool cannot all be kept: under contention the pool keeps the lower classes'
      // floors first, and a higher class gets less than its minShare promised. A hair over 1 is floating point (0.34 + 0.56 + 0.1).
      const shares = Object.entries(p.pools.classes);
      for (const [cls, c] of shares) {
        if (c.maxShare < c.minShare) {
          ctx.addIssue({ code: 'custom', path: ['providers', name, 'pools', 'classes', cls, 'maxShare'], message: `maxShare (${c.maxShare}) is below the class's minShare (${c.minShare}): expected at least minShare, as the class may never hold what it is promised under contention` });
        }
      }
      const total = shares.reduce((sum, [, c]) => sum + c.minShare, 0);
      if (total > 1 + 1e-9) {
        ctx.addIssue({
          code: 'custom',
          path: ['providers', name, 'pools', 'classes'],
          message: `the minShare values add up to ${Number(total.toFixed(6))} (${shares.map(([cls, c]) => `${cls} ${c.minShare}`).join(', ')}), more than the whole pool: expected at most 1 in all, as each is a share of maxConcurrent kept for its class under contention`,
        });
      }
    }
    // A class a pool does not have is no class there: the request would take the route's, the top one by default.
    // A contextWindowFallback goes out in the route's class too, and a client's auth.priority caps it at every
    // provider its routes send to (left out at one, the batch team's key took online capacity there).
    const routedProviders = new Map<string, string>();
    cfg.routes.forEach((route, i) => {
      [...route.targets, ...(route.contextWindowFallback ? [route.contextWindowFallback] : [])].forEach((t) => {
        if (!routedProviders.has(t.provider)) routedProviders.set(t.provider, route.name);
        const classes = own(cfg.providers, t.provider)?.pools.classes;
        if (classes && !Object.hasOwn(classes, route.priority)) {
          ctx.addIssue({
            code: 'custom',
            path: ['routes', i, 'priority'],
            message: `priority "${route.priority}" is not a class of provider "${t.provider}"; expected one of: ${Object.keys(classes).join(', ')}`,
          });
        }
      });
    });
    const clients = new Map<string, string>();
    for (const [name, key] of Object.entries(cfg.auth?.keys ?? {})) {
      if (key === '') {
        ctx.addIssue({ code: 'custom', path: ['auth', 'keys', name], message: 'is empty (its variable may be set but empty): a client key cannot be empty; remove the client to refuse it' });
      } else if (clients.has(key)) {
        ctx.addIssue({ code: 'custom', path: ['auth', 'keys', name], message: `is the same key as client "${clients.get(key)}": each client needs its own, or the log cannot tell them apart` });
      } else clients.set(key, name);
    }
    const classNames = [...new Set(Object.values(cfg.providers).flatMap((p) => Object.keys(p.pools.classes)))];
    for (const [name, cls] of Object.entries(cfg.auth?.priority ?? {})) {
      if (!Object.hasOwn(cfg.auth!.keys, name)) {
        ctx.addIssue({ code: 'custom', path: ['auth', 'priority', name], message: `no client "${name}" in auth.keys; expected one of: ${Object.keys(cfg.auth!.keys).join(', ')}` });
      } else if (!classNames.includes(cls)) {
        ctx.addIssue({ code: 'custom', path: ['auth', 'priority', name], message: `"${cls}" is not a priority class of any provider; expected one of: ${classNames.join(', ')}` });
      } else {
        for (const [provider, route] of routedProviders) {
          const classes = own(cfg.providers, provider)?.pools.classes;
          if (!classes || Object.hasOwn(classes, cls)) continue;
          ctx.addIssue({
            code: 'custom',
            path: ['auth', 'priority', name],
            message: `"${cls}" is not a priority class of provider "${provider}", which route "${route}" sends to (its classes: ${Object.keys(classes).join(', ')}): the client's requests would not be held to it there; give every provider the class`,
          });
          break;
        }
      }
    }
    for (const name of Object.keys(cfg.auth?.limits ?? {})) {
      if (name !== '*' && !Object.hasOwn(cfg.auth!.keys, name)) {
        ctx.addIssue({ code: 'custom', path: ['auth', 'limits', name], message: `no client "${name}" in auth.keys; expected one of: ${[...Object.keys(cfg.auth!.keys), '*'].join(', ')}` });
      }
    }
    if (cfg.auth && Object.keys(cfg.auth.keys).length === 0) {
      ctx.addIssue({ code: 'custom', path: ['auth', 'keys'], message: 'lists no client: with auth set, at least one key is needed (or leave auth out to serve anyone)' });
    }
    for (const [name, p] of Object.entries(cfg.providers)) {
      if (p.apiKey === '' && !p.optional) {
        ctx.addIssue({
          code: 'custom',
          path: ['providers', name, 'apiKey'],
          message: 'is empty (its variable may be set but empty): set it, write any placeholder such as "none" for a server that needs no key, or mark the provider optional: true to run without it',
        });
      }
      if (p.family === 'azure-openai' && !p.apiVersion) {
        ctx.addIssue({ code: 'custom', path: ['providers', name, 'apiVersion'], message: 'azure-openai needs apiVersion (e.g. "2024-10-21")' });
      }
    }
    cfg.routes.forEach((route, i) => {
      checkRouteFamilies(cfg, route, i, ctx);
      checkRouteTimes(route, i, ctx);
    });
    cfg.routes.forEach((route, i) => {
      const p = route.match.path;
      // fastify would read these as a parameter or wildcard, or the route would collide with the gateway's own:
      // start-up would fail on a FastifyError and its stack trace rather than on this line.
      if (!p.startsWith('/')) {
        // Its own line already, from the field's startsWith, with what to write: "not a plain path" said it again, wrongly.
      } else if (!LITERAL_PATH.test(p)) {
        ctx.addIssue({ code: 'custom', path: ['routes', i, 'match', 'path'], message: `"${p}" must be a plain path: no ":", "*", "?", "#" or spaces` });
      } else if (GATEWAY_PATHS.some((own) => p.replace(/\/+$/, '') === own || p.startsWith(`${own}/`))) {
        ctx.addIssue({ code: 'custom', path: ['routes', i, 'match', 'path'], message: `"${p}" is one of the gateway's own paths (${GATEWAY_PATHS.join(', ')})` });
      } else if (p.length > 1 && p.endsWith('/')) {
        // The route would listen on that path only: the SDKs' requests (no trailing slash) would all get 404.
        ctx.addIssue({ code: 'custom', path: ['routes', i, 'match', 'path'], message: `"${p}" ends in "/", which clients never send: write ${p.replace(/\/+$/, '') || '/'}` });
      }
      // The first match wins: behind a route of the same path that takes every model, this one never gets a request.
      const before = cfg.routes.findIndex((r, j) => j < i && r.match.path === p && takesEveryModel(r.match.models, route.match.models));
      if (before !== -1) {
        ctx.addIssue({
          code: 'custom',
          path: ['routes', i, 'match'],
          message: `route "${route.name}" is never used: route "${cfg.routes[before]!.name}" before it takes every model on ${p}; give that one match.models, or put this one first`,
        });
      }
    });
    const passed = new Map<string, number>();
    cfg.passthrough?.paths.forEach((p, i) => {
      const bare = p.replace(/\/+$/, '') || '/';
      if (!p.startsWith('/')) return; // the field's startsWith says so, as for a route's path
      if (!LITERAL_PATH.test(p)) ctx.addIssue({ code: 'custom', path: ['passthrough', 'paths', i], message: `"${p}" must be a plain path: no ":", "*", "?", "#" or spaces` });
      else if (passed.has(bare)) ctx.addIssue({ code: 'custom', path: ['passthrough', 'paths', i], message: `"${p}" is listed already (passthrough.paths[${passed.get(bare)}])` });
      else passed.set(bare, i);
    });
    // fastify refuses a method declared twice on a path: start-up would end on its error and a stack trace.
    cfg.passthrough?.methods.forEach((m, i, all) => {
      if (all.indexOf(m) < i) ctx.addIssue({ code: 'custom', path: ['passthrough', 'methods', i], message: `"${m}" is listed already (passthrough.methods[${all.indexOf(m)}])` });
    });
    const managed = cfg.routes.map((r) => r.match.path);
    cfg.passthrough?.paths.forEach((p, i) => {
      // A prefix forwards what is under it: `/v1` would pass /v1/chat/completions/ and /v1//chat/completions on
      // unmanaged, with the company's key, past retries, budgets and breakers.
      const covered = managed.find((m) => m === p || m.startsWith(`${p.replace(/\/+$/, '')}/`));
      if (covered !== undefined) {
        ctx.addIssue({ code: 'custom', path: ['passthrough', 'paths', i], message: `"${p}" covers the managed route path ${covered}; passthrough is for paths no route serves` });
      } else if (GATEWAY_PATHS.some((own) => p === own || p.startsWith(`${own}/`))) {
        ctx.addIssue({ code: 'custom', path: ['passthrough', 'paths', i], message: `"${p}" is one of the gateway's own paths (${GATEWAY_PATHS.join(', ')})` });
      }
    });
    // Passthrough swaps in an OpenAI-style bearer key and keeps OpenAI's /v1 paths: Anthropic (x-api-key, no /v1)
    // and Azure (api-key, deployments, api-version) would get requests they cannot read.
    const passProvider = cfg.passthrough && own(cfg.providers, cfg.passthrough.provider);
    if (passProvider && passProvider.family !== 'openai') {
      ctx.addIssue({ code: 'custom', path: ['passthrough', 'provider'], message: `passthrough forwards to openai-family providers only; "${cfg.passthrough!.provider}" is ${passProvider.family}` });
    }
    cfg.routes.forEach((route, i) => {
      if (route.degraded && route.match.path !== '/v1/chat/completions') {
        ctx.addIssue({ code: 'custom', path: ['routes', i, 'degraded'], message: `degraded answers are chat completions; route "${route.name}" serves ${route.match.path}` });
      }
    });
  });

/**
 * Times of a route that only make sense together: a margin as long as the deadline leaves nothing to work with. (A
 * minAttemptMs at or above timeoutMs is allowed: it only means that no retry wait is ever taken.)
 */
function checkRouteTimes(route: { timeoutMs: number; deadlineMarginMs?: number | undefined }, i: number, ctx: z.RefinementCtx): void {
  if (route.deadlineMarginMs !== undefined && route.deadlineMarginMs >= route.timeoutMs) {
    ctx.addIssue({ code: 'custom', path: ['routes', i, 'deadlineMarginMs'], message: `must be less than timeoutMs (${route.timeoutMs}): it is kept back from the deadline` });
  }
}

/**
 * The entry of a map by a name from the file: a name such as `toString` or `constructor` is found on every object's
 * prototype, and read with `in` or `[]` it passed for a provider or class that the file never defined.
 */
function own<T>(map: Record<string, T>, name: string): T | undefined {
  return Object.hasOwn(map, name) ? map[name] : undefined;
}

function unknownProvider(name: string, providers: Record<string, unknown>): string {
  const names = Object.keys(providers);
  return names.length === 0 ? `unknown provider "${name}": \`providers\` defines none` : `unknown provider "${name}"; expected one of: ${names.join(', ')}`;
}

/**
 * Does a route's model filter let through every request a later route's would take? None takes all; a pattern of `*`
 * alone takes every model, but not a request that names none (the moderations and images APIs default it), which a
 * later route without `models` still serves.
 */
function takesEveryModel(models: readonly string[] | undefined, later: readonly string[] | undefined): boolean {
  return models === undefined || (later !== undefined && models.some((m) => /^\*+$/.test(m)));
}

/** A path as fastify takes it literally: its `:` starts a parameter, `*` a wildcard. */
const LITERAL_PATH = /^\/[^\s:*?#]*$/;

/** Paths the gateway serves itself, which passthrough may not take over. */
const GATEWAY_PATHS = ['/healthz', '/readyz', '/metrics', '/v1/models'];

/** OpenAI's APIs besides chat completions, which no Anthropic target can serve. */
const OPENAI_ONLY_PATHS: ReadonlySet<string> = new Set(['/v1/embeddings', '/v1/completions', '/v1/responses']);

type ProvidersOf = Record<string, { family: 'openai' | 'anthropic' | 'azure-openai' }>;
type RouteOf = { match: { path: string }; strategy?: string | undefined; targets: Array<{ provider: string; model?: string | undefined }>; contextWindowFallback?: { provider: string; model?: string | undefined } | undefined };

/**
 * Which fallbacks make sense for a path: an embedding from another model lives in another space (it would corrupt an
 * index), and a Responses API conversation lives at one family's servers.
 */
function checkRouteFamilies(cfg: { providers: ProvidersOf }, route: RouteOf, i: number, ctx: z.RefinementCtx): void {
  const targets = [...route.targets, ...(route.contextWindowFallback ? [route.contextWindowFallback] : [])];
  const family = (t: { provider: string }) => own(cfg.providers, t.provider)?.family;
  const at = (j: number) => (j < route.targets.length ? ['routes', i, 'targets', j] : ['routes', i, 'contextWindowFallback']);
  // Anthropic is translated from chat completions, or serves its own API as it is; on OpenAI's other APIs every
  // request would be refused as the client's fault.
  if (OPENAI_ONLY_PATHS.has(route.match.path)) {
    targets.forEach((t, j) => {
      if (family(t) !== 'anthropic') return;
      const message =
        route.match.path === '/v1/embeddings'
          ? 'anthropic has no embeddings API; embeddings fall back only to the same model at another OpenAI-compatible provider'
          : `anthropic targets serve /v1/chat/completions and Anthropic's own API (/v1/messages), not ${route.match.path}`;
      ctx.addIssue({ code: 'custom', path: at(j), message });
    });
  }
  // A first target that takes the client's model names them in its family: a backup of the other family (an
  // Anthropic fallback behind an OpenAI primary, or the reverse) that sends the client's name on (gpt-4o to
  // Anthropic) fails with a 404 on every request, and only in the outage it is there for. A weighted route sends
  // first attempts to every target: each one without a model takes the client's names, so all of those must be
  // of one family (a share of all traffic would otherwise fail, not only in an outage).
  const weighted = route.strategy === 'weighted';
  const reference = weighted ? targets.find((t) => t.model === undefined) : targets[0]!;
  if (route.match.path === '/v1/chat/completions' && reference !== undefined && reference.model === undefined) {
    const crosses = (t: { provider: string }) => (family(t) === 'anthropic') !== (family(reference) === 'anthropic');
    targets.forEach((t, j) => {
      if (t === reference || t.model !== undefined || family(t) === undefined || !crosses(t)) return;
      const other = weighted ? `a weighted target ("${reference.provider}") that is also sent the` : `the first target ("${reference.provider}"), whose`;
      ctx.addIssue({
        code: 'custom',
        path: [...at(j), 'model'],
        message: `"${t.provider}" is of another API family than ${other} model names clients send: name the model it serves (e.g. model: ${family(t) === 'anthropic' ? 'claude-sonnet-4-6' : 'gpt-4o'})`,
      });
    });
  }
  // The Messages API is passed on as the client wrote it: only Anthropic reads it.
  if (route.match.path === '/v1/messages') {
    targets.forEach((t, j) => {
      const f = family(t);
      if (f !== undefined && f !== 'anthropic') ctx.addIssue({ code: 'custom', path: at(j), message: `/v1/messages is Anthropic's Messages API, served by anthropic targets only; "${t.provider}" is ${f}` });
    });
  }
  if (route.match.path === '/v1/embeddings') {
    targets.forEach((t, j) => {
      if (j > 0 && t.model !== targets[0]!.model) {
        ctx.addIssue({ code: 'custom', path: [...at(j), 'model'], message: 'embeddings fall back only to the same model (a vector from another model lives in another space): every target needs the same `model`' });
      }
    });
  }
  if (route.match.path === '/v1/responses') {
    // A follow-up (previous_response_id) goes to the first target, where the conversation must be: spreading first
    // turns over several would send follow-ups to a provider that never stored them.
    if (route.strategy === 'weighted' && route.targets.length > 1) {
      ctx.addIssue({ code: 'custom', path: ['routes', i, 'strategy'], message: '/v1/responses cannot spread requests (weighted): a conversation lives at the provider that stored it, so use fallback' });
    }
    // Azure's v1 surface serves OpenAI's Responses API as it is: the two are one API here.
    const api = (t: { provider: string }) => (family(t) === 'azure-openai' ? 'openai' : family(t));
    targets.forEach((t, j) => {
      if (j > 0 && family(t) !== 'anthropic' && api(t) !== api(targets[0]!)) {
        ctx.addIssue({ code: 'custom', path: at(j), message: '/v1/responses falls back only within the same API family' });
      }
    });
  }
}

export type Config = z.infer<typeof ConfigSchema>;
export type ConfigInput = z.input<typeof ConfigSchema>;
export type ProviderConfig = z.infer<typeof ProviderSchema>;
export type RouteConfig = z.infer<typeof RouteSchema>;
export type RetryConfig = z.infer<typeof RetrySchema>;
export type BackoffConfig = z.infer<typeof BackoffSchema>;
export type TargetConfig = z.infer<typeof TargetSchema>;
export type RetryOn = z.infer<typeof RetryOnEntry>;
export type BreakerConfig = z.infer<typeof BreakerSchema>;
/** What the budget's arithmetic reads (repeats is the request side's: state/client-repeats.ts). */
export type BudgetSettings = Omit<z.infer<typeof BudgetSchema>, 'repeats'>;
export type ParkConfig = z.infer<typeof ParkSchema>;
export type StateConfig = z.infer<typeof StateSchema>;
export type IdempotencyConfig = z.infer<typeof IdempotencySchema>;
/** One client's entry in auth.limits. */
export type ClientLimitConfig = z.infer<typeof ClientLimitSchema>;
