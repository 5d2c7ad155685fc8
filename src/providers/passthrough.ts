// Paths the config opens outside the managed routes, forwarded by @fastify/http-proxy with the provider's credentials
// in place of the client's. No retries: these are files, batches and the like, where a blind retry can duplicate work.
import proxy from '@fastify/http-proxy';
import type { FastifyInstance } from 'fastify';
import type { Config, ProviderConfig } from '../config/schema.ts';

type Passthrough = NonNullable<Config['passthrough']>;

/**
 * Client headers that must not reach the provider: its credentials (proxy ones too) and cookies, the organization or
 * project a client could pick to bill the company's key to, and the gateway's own x-stormgate-* headers.
 */
const STRIP = new Set(['authorization', 'proxy-authorization', 'api-key', 'x-api-key', 'cookie', 'openai-organization', 'openai-project']);
const stripped = (name: string) => STRIP.has(name) || name.startsWith('x-stormgate-');

export async function registerPassthrough(app: FastifyInstance, passthrough: Passthrough, provider: ProviderConfig): Promise<void> {
  const base = new URL(provider.baseUrl);
  const basePath = base.pathname.replace(/\/+$/, '');
  for (const path of passthrough.paths) {
    await app.register(proxy, {
      upstream: base.origin,
      prefix: path,
      rewritePrefix: `${basePath}${path.replace(/^\/v1(?=\/|$)/, '')}`,
      httpMethods: passthrough.methods,
      undici: { connections: 16, connect: { timeout: provider.timeouts.connectMs } },
      replyOptions: {
        rewriteRequestHeaders: (_req, headers) => {
          const out: Record<string, unknown> = {};
          for (const name in headers) if (!stripped(name)) out[name] = headers[name];
          out.authorization = `Bearer ${provider.apiKey}`;
          return out as typeof headers;
        },
        // The one rule for SDK retries: the gateway does not ask the client to repeat a passthrough call.
        rewriteHeaders: (headers) => ({ ...headers, 'x-should-retry': 'false' }),
      },
    });
  }
}
