// server.keepAliveTimeoutMs: how long an idle client connection is kept, told to clients in Keep-Alive, so it can be
// set above a load balancer's own idle timeout.
import { request } from 'node:http';
import { describe, expect, it } from 'vitest';
import { ConfigSchema } from '../src/config/schema.ts';
import { defaultConfig, useExtraMocks, useGateways } from './helpers/stack.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();

function keepAliveHeader(url: string): Promise<string | undefined> {
  return new Promise((resolve, reject) => {
    const req = request(`${url}/healthz`, { agent: false, headers: { connection: 'keep-alive' } }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.headers['keep-alive']?.toString()));
    });
    req.on('error', reject);
    req.end();
  });
}

describe('server.keepAliveTimeoutMs', () => {
  it('is 72 s by default, above AWS ALB\'s 60 s, and follows the config when set', async () => {
    const mock = await startMock();
    const base = defaultConfig(mock.url);
    expect(await keepAliveHeader(await startGateway(ConfigSchema.parse(base)))).toBe('timeout=72');
    const longer = ConfigSchema.parse({ ...base, server: { ...base.server, keepAliveTimeoutMs: 620_000 } });
    expect(await keepAliveHeader(await startGateway(longer))).toBe('timeout=620');
  });
});
