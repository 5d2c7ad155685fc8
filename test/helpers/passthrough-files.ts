// A gateway whose passthrough forwards GET /v1/files to a provider of the test's own, and a GET that sends every
// header as written (fetch refuses `connection` and adds and drops some of its own).
import { request as httpRequest, type IncomingHttpHeaders } from 'node:http';
import { configServedBy, type Stack, type StackOptions } from './stack.ts';

/** configServedBy gives the provider `<name>-key` (in TEST_SECRETS: the run's logs are checked for it too). */
export const FILES_PROVIDER = 'files';

export function filesPassthrough(startStack: (opts: StackOptions) => Promise<Stack>, origin: string): Promise<Stack> {
  return startStack({
    config: (mockUrl) => ({ ...configServedBy(mockUrl, FILES_PROVIDER, `${origin}/v1`), passthrough: { provider: FILES_PROVIDER, paths: ['/v1/files'], methods: ['GET'] } }),
  });
}

/** A GET through node:http on a connection of its own. */
export function rawGet(url: string, headers: Record<string, string> = {}): Promise<{ status: number; headers: IncomingHttpHeaders; body: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(url, { headers, agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
    });
    req.on('error', reject);
    req.end();
  });
}
