// One provider `p` behind a chat route, for tests that talk to a fake provider (helpers/fake-provider.ts) through a
// stack (helpers/stack.ts), and the chat call they send.
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { ConfigInput } from '../../src/config/schema.ts';
import { chatCompletion } from './fake-provider.ts';

/** One provider p at `origin` behind a chat route (no breaker, no parking), with `extra` merged into the config. */
export function configFor(origin: string, route: Partial<ConfigInput['routes'][number]>, extra: Partial<ConfigInput> = {}): () => ConfigInput {
  return () => ({
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    providers: { p: { family: 'openai', baseUrl: `${origin}/v1`, apiKey: 'p-key-0123456789', breaker: false } },
    routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'p' }], park: false, ...route }],
    ...extra,
  });
}

/** A gpt-4o chat completion; its status, retry-after-ms and error code. */
export const ask = (url: string, headers: Record<string, string> = {}) =>
  fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
  }).then(async (r) => ({ status: r.status, retryAfterMs: Number(r.headers.get('retry-after-ms')), code: ((await r.json()) as { error?: { code?: string } }).error?.code }));

/** A provider handler that answers its first request 503 (busy) and every later one a chat completion, `answerMs` on. */
export function busyOnceThen(answerMs = 0): (req: IncomingMessage, res: ServerResponse) => void {
  let n = 0;
  return (req, res) => {
    req.resume();
    if (n++ === 0) return void res.writeHead(503, { 'content-type': 'application/json' }).end('{"error":{"message":"busy","type":"server_error","code":null}}');
    const answer = () => res.writeHead(200, { 'content-type': 'application/json' }).end(chatCompletion(answerMs > 0 ? 'late' : 'ok'));
    if (answerMs > 0) setTimeout(answer, answerMs).unref();
    else answer();
  };
}
