// The config schema is the single source of truth: types are inferred from it, defaults live here,
// and the README's config reference is generated from the `.describe()` texts (see test/config-docs.test.ts).
import { z } from 'zod';

const ms = (doc: string) => z.number().int().nonnegative().describe(doc);
const positiveMs = (doc: string) => z.number().int().positive().describe(doc);

export const BACKOFF_STRATEGIES = ['full-jitter', 'equal-jitter', 'decorrelated-jitter', 'exponential', 'fixed'] as const;

/** What an upstream outcome may be retried on: an HTTP status, or a transport failure class. */
export const RetryOnEntry = z.union([
  z.number().int().min(400).max(599),
  z.enum(['network', 'timeout']),
]);

export const BackoffSchema = z
  .strictObject({
    strategy: z
      .enum(BACKOFF_STRATEGIES)
      .default('full-jitter')
      .describe('How waits between attempts grow: full-jitter, equal-jitter, decorrelated-jitter; exponential and fixed (no jitter) exist for benchmarks only. Default: full-jitter.'),
    baseMs: positiveMs('Base wait in ms; the first retry waits up to this long. Default: 200.').default(200),
    capMs: positiveMs('Longest wait between attempts in ms. Default: 3000.').default(3000),
  })
  .describe('Backoff between attempts on one target when the upstream gave no wait hint.');

export const RetrySchema = z
  .strictObject({
    maxAttempts: z.number().int().min(1).max(20).default(3)
      .describe('Attempts on one target, the first included (1 disables retries). Default: 3.'),
    backoff: BackoffSchema.default({ strategy: 'full-jitter', baseMs: 200, capMs: 3000 }),
    retryOn: z.array(RetryOnEntry).default([429, 500, 502, 503, 504, 529, 'network', 'timeout'])
      .describe('Outcomes that are retried: HTTP statuses, `network` (refused, reset, DNS) and `timeout` (connect, first token, idle, response). 400, 404, 422 and credential errors are never retried whatever this says. Default: [429, 500, 502, 503, 504, 529, network, timeout].'),
    maxWaitHintMs: ms('Longest upstream wait hint (retry-after and friends) the gateway waits out; a longer hint ends retries on that target and reaches the client as retry-after. Default: 20000.').default(20000),
  })
  .describe('Retry policy of a route.');

export const TimeoutsSchema = z
  .strictObject({
    connectMs: positiveMs('Time to open a TCP/TLS connection to the provider, in ms. Default: 5000.').default(5000),
    firstTokenMs: positiveMs('For streams: time from sending the request to the first event that carries output (text, tool call or reasoning); role-only chunks and pings do not count. Default: 30000.').default(30000),
    idleMs: positiveMs('For streams: longest gap between two events (pings count), in ms. Default: 30000.').default(30000),
    responseMs: positiveMs('For non-streaming requests: per-attempt limit on the whole answer, in ms. Optional; unset, only the deadline bounds it, since long answers take minutes.').optional(),
  })
  .describe('Per-attempt timers of a provider.');

export const ProviderSchema = z
  .strictObject({
    family: z.enum(['openai']).describe('API family the provider speaks: openai (also any OpenAI-compatible server such as vLLM, Ollama or OpenRouter).'),
    baseUrl: z.url().describe('Base URL including the version prefix, e.g. https://api.openai.com/v1.'),
    apiKey: z.string().describe('API key, usually from the environment: "${OPENAI_API_KEY}". Sent upstream as the credential; never logged.'),
    timeouts: TimeoutsSchema.default({ connectMs: 5000, firstTokenMs: 30000, idleMs: 30000 }),
    maxConnections: z.number().int().positive().default(128)
      .describe('Size of the keep-alive connection pool to this provider. Default: 128.'),
  })
  .describe('An upstream provider.');

export const TargetSchema = z
  .strictObject({
    provider: z.string().min(1).describe('Name of a provider under `providers`.'),
    model: z.string().min(1).optional().describe('Upstream model to send instead of the client\'s. Optional; default: the client\'s model.'),
  })
  .describe('Where a route sends a request: a provider and, optionally, the upstream model.');

export const RouteSchema = z
  .strictObject({
    name: z.string().regex(/^[A-Za-z0-9_.-]+$/, 'letters, digits, "_", "." or "-"').describe('Route name, used in logs, headers and metric labels.'),
    match: z
      .strictObject({
        path: z.string().startsWith('/').describe('Request path, e.g. /v1/chat/completions.'),
        models: z.array(z.string().min(1)).min(1).optional()
          .describe('Model names the route serves; exact names or `*` globs. Optional; default: every model.'),
      })
      .describe('Which requests the route takes; routes are tried in file order and the first match wins.'),
    targets: z.array(TargetSchema).min(1).describe('Targets in order: the primary first.'),
    timeoutMs: positiveMs('Longest time the gateway spends on a request, all attempts and waits included. The client\'s own timeout headers can shorten it. Default: 120000.').default(120000),
    minAttemptMs: ms('A wait (backoff, wait hint) is only taken if at least this much time is left for the attempt after it, before the deadline; otherwise the gateway answers at once. Default: 1000.').default(1000),
    deadlineMarginMs: ms('Time kept back before the client\'s deadline so the gateway answers before the client gives up. Optional; default: the larger of 250 ms and 5% of the deadline.').optional(),
    retry: RetrySchema.default({
      maxAttempts: 3,
      backoff: { strategy: 'full-jitter', baseMs: 200, capMs: 3000 },
      retryOn: [429, 500, 502, 503, 504, 529, 'network', 'timeout'],
      maxWaitHintMs: 20000,
    }),
  })
  .describe('A route: which requests, which targets, which policies.');

export const PassthroughSchema = z
  .strictObject({
    provider: z.string().min(1).describe('Provider the paths are forwarded to, with its credentials.'),
    paths: z.array(z.string().startsWith('/')).min(1).describe('Exact paths forwarded as they are (no retries), e.g. /v1/files.'),
    methods: z.array(z.enum(['GET', 'POST', 'PUT', 'PATCH', 'DELETE'])).min(1).default(['GET'])
      .describe('HTTP methods forwarded on those paths. Default: [GET].'),
  })
  .describe('Paths outside the managed routes that are forwarded unchanged. Optional; off by default, so the gateway is no open relay for the provider key.');

export const ServerSchema = z
  .strictObject({
    host: z.string().default('127.0.0.1').describe('Address to listen on. Default: 127.0.0.1.'),
    port: z.number().int().min(0).max(65535).default(8080).describe('Port to listen on (0 picks a free one). Default: 8080.'),
    bodyLimitBytes: z.number().int().positive().default(10 * 1024 * 1024)
      .describe('Largest request body accepted; larger ones get 413. Default: 10485760.'),
    logLevel: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info')
      .describe('pino log level. Default: info.'),
  })
  .describe('The gateway\'s own HTTP listener.');

export const ConfigSchema = z
  .strictObject({
    server: ServerSchema.default({ host: '127.0.0.1', port: 8080, bodyLimitBytes: 10 * 1024 * 1024, logLevel: 'info' }),
    providers: z.record(z.string().regex(/^[A-Za-z0-9_.-]+$/), ProviderSchema).describe('Upstream providers by name.'),
    routes: z.array(RouteSchema).min(1).describe('Managed routes, tried in file order.'),
    passthrough: PassthroughSchema.optional(),
  })
  .superRefine((cfg, ctx) => {
    const names = new Set<string>();
    cfg.routes.forEach((route, i) => {
      if (names.has(route.name)) {
        ctx.addIssue({ code: 'custom', path: ['routes', i, 'name'], message: `route name "${route.name}" is used twice` });
      }
      names.add(route.name);
      route.targets.forEach((t, j) => {
        if (!(t.provider in cfg.providers)) {
          ctx.addIssue({
            code: 'custom',
            path: ['routes', i, 'targets', j, 'provider'],
            message: `unknown provider "${t.provider}"; expected one of: ${Object.keys(cfg.providers).join(', ')}`,
          });
        }
      });
    });
    if (cfg.passthrough && !(cfg.passthrough.provider in cfg.providers)) {
      ctx.addIssue({
        code: 'custom',
        path: ['passthrough', 'provider'],
        message: `unknown provider "${cfg.passthrough.provider}"; expected one of: ${Object.keys(cfg.providers).join(', ')}`,
      });
    }
    const managed = new Set(cfg.routes.map((r) => r.match.path));
    cfg.passthrough?.paths.forEach((p, i) => {
      if (managed.has(p)) {
        ctx.addIssue({ code: 'custom', path: ['passthrough', 'paths', i], message: `"${p}" is a managed route's path; passthrough is for paths no route serves` });
      }
    });
  });

export type Config = z.infer<typeof ConfigSchema>;
export type ConfigInput = z.input<typeof ConfigSchema>;
export type ProviderConfig = z.infer<typeof ProviderSchema>;
export type RouteConfig = z.infer<typeof RouteSchema>;
export type RetryConfig = z.infer<typeof RetrySchema>;
export type BackoffConfig = z.infer<typeof BackoffSchema>;
export type TargetConfig = z.infer<typeof TargetSchema>;
export type RetryOn = z.infer<typeof RetryOnEntry>;
