// Review of the consecutive-failures rule's quiet period with other attempts out (breaker-burst-start): the attempts
// it counts as out must be those to the target the breaker judges, sent before the failure (src/pools/provider-pool.ts
// sending, keyed by the breaker's target). A route on a path the gateway has no API for
// (Anthropic's /v1/messages/count_tokens) has a pool entry of its own per target and route (`<key> <route>`,
// plan-targets.ts limitKey), but shares the target's breaker with /v1/messages: counted from its own entry alone, a
// count_tokens 503 saw none of the agent's /v1/messages requests out, the quiet period ran from the last success
// (none yet at start-up), and a provider failing a few requests at start-up had its breaker opened fleet-wide for openS.
import type { ServerResponse } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it } from 'vitest';
import { ConfigSchema } from '../src/config/schema.ts';
import { CONSECUTIVE_QUIET_MS } from '../src/policy/breaker.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { useGateways } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startGateway = useGateways();
// Before the gateways close (hooks run last registered first): a test that failed leaves none of its requests held,
// which the gateway's close would wait for.
const releases: Array<() => void> = [];
afterEach(() => {
  for (const release of releases.splice(0)) release();
});

const MODEL = 'claude-sonnet-4-6';

const message = (model: string) => ({
  id: 'msg_1',
  type: 'message',
  role: 'assistant',
  model,
  content: [{ type: 'text', text: 'hi' }],
  stop_reason: 'end_turn',
  stop_sequence: null,
  usage: { input_tokens: 3, output_tokens: 1 },
});

type Behaviour = 'hold' | 'fail';
const COUNT_PATH = '/v1/messages/count_tokens';

/**
 * An Anthropic provider and a gateway in front of it (breaker on, its defaults), with /v1/messages and count_tokens
 * routes to the same model: each path's requests are either held until `release` (on their way, as a completion is
 * for seconds) or answered 503 at once.
 */
async function agentStack(behaviour: Record<'messages' | 'count', Behaviour>) {
  const held: Array<{ res: ServerResponse; count: boolean }> = [];
  const provider = await startProvider((req, res) => {
    req.resume();
    req.on('end', () => {
      const count = req.url?.startsWith(COUNT_PATH) === true;
      if (behaviour[count ? 'count' : 'messages'] === 'hold') {
        held.push({ res, count });
        return;
      }
      res.writeHead(503, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ type: 'error', error: { type: 'api_error', message: 'unavailable' } }));
    });
  });
  const route = { targets: [{ provider: 'claude' }], retry: { maxAttempts: 1 }, park: false as const };
  const config = ConfigSchema.parse({
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    providers: { claude: { family: 'anthropic', baseUrl: provider.origin, apiKey: 'claude-key', maxConnections: 64 } },
    routes: [
      { name: 'messages', match: { path: '/v1/messages' }, ...route },
      { name: 'count', match: { path: COUNT_PATH }, ...route },
    ],
  });
  const url = await startGateway(config);
  const post = (path: string) =>
    fetch(`${url}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-api-key': 'client-key', 'anthropic-version': '2023-06-01' },
      body: JSON.stringify({ model: MODEL, max_tokens: 16, messages: [{ role: 'user', content: 'hi' }] }),
    }).then(async (r) => {
      await r.arrayBuffer();
      return r.status;
    });
  const opened = async () => {
    const text = await (await fetch(`${url}/metrics`)).text();
    const line = text.split('\n').find((l) => l.startsWith(`stormgate_breaker_transitions_total{target="claude/${MODEL}",to="open"}`));
    return line === undefined ? 0 : Number(line.split(' ').pop());
  };
  const release = () => {
    for (const { res, count } of held.splice(0)) {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(count ? { input_tokens: 3 } : message(MODEL)));
    }
  };
  releases.push(release);
  return { post, opened, held, release };
}

async function until(check: () => boolean): Promise<void> {
  for (let i = 0; i < 500 && !check(); i++) await sleep(10);
  expect(check()).toBe(true);
}

describe('the consecutive-failures rule counts every attempt out to the target, whatever route sent it', () => {
  it('does not open at start-up on count_tokens 503s while /v1/messages requests sent before them are out, and opens once none is', async () => {
    const s = await agentStack({ messages: 'hold', count: 'fail' });
    // An agent's first moments: its completions go out (and take seconds), its token counts come back 503 at once.
    const completions = Array.from({ length: 8 }, () => s.post('/v1/messages'));
    await until(() => s.held.length === 8);
    const counts = await Promise.all(Array.from({ length: 5 }, () => s.post(COUNT_PATH)));
    expect(counts).toEqual(Array(5).fill(503));
    expect(await s.opened()).toBe(0);
    // However long they take: any of them may yet be the success that ends the run.
    await sleep(CONSECUTIVE_QUIET_MS + 50);
    expect(await s.post(COUNT_PATH)).toBe(503);
    expect(await s.opened()).toBe(0);
    s.release();
    expect(await Promise.all(completions)).toEqual(Array(8).fill(200));
    expect(await s.opened()).toBe(0);
  });

  it('opens on a run of failures once no attempt sent before its latest is still out, whatever route sent them', async () => {
    const s = await agentStack({ messages: 'fail', count: 'fail' });
    for (let i = 0; i < 4; i++) expect(await s.post(i % 2 === 0 ? COUNT_PATH : '/v1/messages')).toBe(503);
    expect(await s.opened()).toBe(0);
    expect(await s.post('/v1/messages')).toBe(503);
    expect(await s.opened()).toBe(1);
  });

  it('does not open at start-up on /v1/messages 503s while count_tokens requests to the same model are out', async () => {
    const s = await agentStack({ messages: 'fail', count: 'hold' });
    const counts = Array.from({ length: 8 }, () => s.post(COUNT_PATH));
    await until(() => s.held.length === 8);
    const completions = await Promise.all(Array.from({ length: 5 }, () => s.post('/v1/messages')));
    expect(completions).toEqual(Array(5).fill(503));
    expect(await s.opened()).toBe(0);
    s.release();
    expect(await Promise.all(counts)).toEqual(Array(8).fill(200));
  });
});
