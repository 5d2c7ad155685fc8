// A passthrough client that leaves before its answer's headers: the upstream request ends with it, rather than running
// on to passthrough.timeoutMs (2 min by default) for nobody, holding one of the passthrough's connections.
import type { IncomingHttpHeaders } from 'node:http';
import { describe, expect, it } from 'vitest';
import { configServedBy, useStacks } from './helpers/stack.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';

const startStack = useStacks();
const startProvider = useFakeProviders();
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('a passthrough client that leaves before the answer starts', () => {
  it('ends the upstream request at once (a GET whose provider takes its time to answer)', async () => {
    const calls: { headers: IncomingHttpHeaders; endedAt?: number }[] = [];
    // Never answers: a download the provider is slow to start, or a hung provider.
    const provider = await startProvider((req, res) => {
      const call: (typeof calls)[number] = { headers: req.headers };
      calls.push(call);
      req.resume();
      res.on('close', () => (call.endedAt = Date.now()));
    });
    const stack = await startStack({
      config: (mockUrl) => ({ ...configServedBy(mockUrl, 'files', `${provider.origin}/v1`), passthrough: { provider: 'files', paths: ['/v1/files'], methods: ['GET'] } }),
    });
    const left = new AbortController();
    setTimeout(() => left.abort(), 300);
    await expect(fetch(`${stack.url}/v1/files/file-abc/content`, { signal: left.signal })).rejects.toThrow();
    const leftAt = Date.now();
    await sleep(700);
    expect(calls).toHaveLength(1);
    expect(calls[0]!.endedAt).toBeDefined();
    expect(calls[0]!.endedAt! - leftAt).toBeLessThan(500);
    // The gateway's own bookkeeping header does not reach the provider.
    expect(Object.keys(calls[0]!.headers).filter((h) => h.startsWith('x-stormgate-'))).toEqual([]);
  });

  it('still serves a client that stays: the answer reaches it whole', async () => {
    const provider = await startProvider((req, res) => {
      req.resume();
      setTimeout(() => res.writeHead(200, { 'content-type': 'application/json' }).end('{"object":"list","data":[]}'), 200);
    });
    const stack = await startStack({
      config: (mockUrl) => ({ ...configServedBy(mockUrl, 'files', `${provider.origin}/v1`), passthrough: { provider: 'files', paths: ['/v1/files'], methods: ['GET'] } }),
    });
    const res = await fetch(`${stack.url}/v1/files`);
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ object: 'list', data: [] });
  });
});
