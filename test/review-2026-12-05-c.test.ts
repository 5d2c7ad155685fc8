// Adversarial review of today's changes (2026-12-05, c): the after-finish wait that pings put off for idleMs at most,
// and the 405s on the ops paths. Real HTTP, a fake provider playing the bytes and timing.
import { request as httpRequest, type IncomingMessage } from 'node:http';
import { describe, expect, it } from 'vitest';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { cc, delta } from './helpers/scripted-provider.ts';
import { configServedBy, requestLine, useStacks } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();
const msgs = [{ role: 'user' as const, content: 'hi' }];

function openStream(url: string, body: Record<string, unknown>): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' } }, resolve);
    req.on('error', reject);
    req.end(JSON.stringify({ model: 'gpt-4o', messages: msgs, stream: true, ...body }));
  });
}

/** An upstream that finishes its one chunk, then pings every 200 ms for ever: no usage chunk, no [DONE]. */
async function pingingForEver(up: { closed: boolean }) {
  return startProvider((req, res) => {
    req.resume();
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.on('close', () => (up.closed = true));
    res.write(cc([delta({ role: 'assistant', content: 'done' }, 'stop')]));
    const timer = setInterval(() => res.write(': ping\n\n'), 200);
    res.on('close', () => clearInterval(timer));
  });
}

describe('after the finish, pings for ever', () => {
  const cases: Array<[string, Record<string, unknown>, Record<string, unknown>]> = [
    ['no usage asked: [DONE] waited for', {}, {}],
    ['the client asked for include_usage', { stream_options: { include_usage: true } }, {}],
    ['the gateway asked for it (streamUsage)', {}, { streamUsage: true }],
  ];
  for (const [who, body, provider] of cases) {
    it(`an upstream that pings on after its finish and never sends the usage or [DONE] is finalised (${who})`, async () => {
      // Self-hosted servers often ignore include_usage: the usage never comes, and pings must not keep the client for ever.
      const up = { closed: false };
      const p = await pingingForEver(up);
      const s = await startStack({
        config: (mockUrl) => {
          const c = configServedBy(mockUrl, 'p', `${p.origin}/v1`);
          return { ...c, providers: { ...c.providers, p: { ...c.providers['p']!, ...provider, timeouts: { idleMs: 2_000 } } } };
        },
      });
      const started = Date.now();
      const res = await openStream(s.url, body);
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (text += d));
      const ended = await Promise.race([new Promise((r) => res.on('end', () => r(true))), new Promise((r) => setTimeout(() => r(false), 15_000))]);
      if (!ended) res.destroy();
      expect(ended).toBe(true);
      // idleMs (2 s) from the finish, then the wait for [DONE]; before, every ping restarted the wait.
      const tookMs = Date.now() - started;
      expect(tookMs).toBeGreaterThanOrEqual(1_900);
      expect(tookMs).toBeLessThan(12_000);
      expect(text).toContain('data: [DONE]');
      expect(text).not.toContain('stream_interrupted');
      expect((await requestLine(s)).streamEnd).toBe('done-added');
    }, 25_000);
  }
});

/** Method, status and allow header of a request to the gateway, over real HTTP, with `headers`. */
function ask(url: string, method: string, path: string, headers: Record<string, string> = {}): Promise<{ status: number; allow: string | undefined; body: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(`${url}${path}`, { method, headers }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode!, allow: res.headers.allow, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

describe('the ops paths\' 405s', () => {
  it('with client keys, a wrong method on an ops path is 405 (no key needed, as for GET), and HEAD /metrics is 200', async () => {
    const s = await startStack({
      config: (mockUrl) => {
        const c = configServedBy(mockUrl, 'p', 'http://127.0.0.1:9/v1');
        return { ...c, auth: { keys: { team: 'sk-client-0123456789abcdef' } }, passthrough: { provider: 'p', paths: ['/v1/files'], methods: ['GET', 'POST', 'DELETE'] } };
      },
    });
    for (const path of ['/healthz', '/readyz', '/metrics']) {
      const post = await ask(s.url, 'POST', path);
      expect(post.status, path).toBe(405);
      expect(post.allow, path).toBe('GET, HEAD');
      expect(post.body, path).not.toContain('sk-client');
      expect((await ask(s.url, 'HEAD', path)).status, path).toBe(200);
      expect((await ask(s.url, 'OPTIONS', path)).status, path).toBe(405);
    }
    // A managed path still wants a key.
    expect((await ask(s.url, 'GET', '/v1/chat/completions')).status).toBe(401);
  });

  it('a Host the gateway does not answer to is refused before the 405', async () => {
    const s = await startStack({
      config: (mockUrl) => {
        const c = configServedBy(mockUrl, 'p', 'http://127.0.0.1:9/v1');
        return { ...c, server: { ...c.server, allowedHosts: ['gw.example.com'] } };
      },
    });
    const res = await ask(s.url, 'POST', '/metrics', { host: 'evil.example.net' });
    expect(res.status).not.toBe(405);
    expect(res.body).toContain('host_not_allowed');
    expect((await ask(s.url, 'POST', '/metrics', { host: 'gw.example.com' })).status).toBe(405);
  });
});
