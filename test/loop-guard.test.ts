// A gateway whose provider baseUrl points at itself (OPENAI_BASE_URL exported for the agents in the shell that starts
// it) must not send each request to itself again and again: the request that comes back is answered 508 at once, and
// the client learns why. Two gateways in a row (one in front of the other) are no loop.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { freePort } from './helpers/free-port.ts';
import { defaultConfig, RETRY_LOOP_ONLY, useGateways, useStacks } from './helpers/stack.ts';

const startStack = useStacks();
const startGateway = useGateways();

/** A gateway on `port` whose only provider is at `baseUrl`. */
async function gatewayOn(port: number, baseUrl: string, logs: string[] = []): Promise<string> {
  const input: ConfigInput = {
    ...defaultConfig('http://127.0.0.1:9', RETRY_LOOP_ONLY),
    server: { host: '127.0.0.1', port, logLevel: 'info' },
    providers: { upstream: { family: 'openai', baseUrl, apiKey: 'k', breaker: false } },
    routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'upstream' }], retry: { maxAttempts: 3 } }],
    passthrough: { provider: 'upstream', paths: ['/v1/files'], methods: ['GET'] },
  };
  return startGateway(ConfigSchema.parse(input), { logs, port });
}

describe('a provider baseUrl that points at the gateway itself', () => {
  it('answers the request that comes back 508 loop_detected at once: one extra request, not a storm', async () => {
    const port = await freePort();
    const logs: string[] = [];
    const url = await gatewayOn(port, `http://127.0.0.1:${port}/v1`, logs);
    const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'client', maxRetries: 2 });
    const err = (await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.status).toBe(508);
    expect(err.code).toBe('loop_detected');
    expect(err.message).toMatch(/baseUrl points at the gateway itself/);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    // The client's request and the one copy that came back: two log lines, no more.
    const lines = logs.map((l) => JSON.parse(l) as { status?: number; msg?: string }).filter((l) => l.status !== undefined);
    expect(lines.map((l) => l.status).sort()).toEqual([508, 508]);
    expect(logs.some((l) => l.includes('came back to it'))).toBe(true);
    // Passthrough paths too.
    const files = await fetch(`${url}/v1/files`);
    expect(files.status).toBe(508);
    expect(((await files.json()) as { error: { code: string } }).error.code).toBe('loop_detected');
  });

  it('lets one gateway stand in front of another', async () => {
    const s = await startStack(RETRY_LOOP_ONLY);
    const url = await gatewayOn(await freePort(), `${s.url}/v1`);
    const answer = await new OpenAI({ baseURL: `${url}/v1`, apiKey: 'client', maxRetries: 0 }).chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    expect(answer.choices[0]!.message.content).toBeTruthy();
    // The front gateway's entry, then the one in front of the mock's.
    expect(s.mock.requests()[0]!.headers.via).toMatch(/^1\.1 stormgate-[0-9a-f]{8}, 1\.1 stormgate-[0-9a-f]{8}$/);
  });
});

describe('a fleet whose provider baseUrl points at the fleet (its load balancer)', () => {
  it('answers a request that went from one instance to another and back 508, not hop after hop until the deadline', async () => {
    const [pa, pb] = [await freePort(), await freePort()];
    const logsA: string[] = [];
    const logsB: string[] = [];
    // Two instances, each one's provider the other: a balancer that sends every request to the other instance.
    const a = await gatewayOn(pa, `http://127.0.0.1:${pb}/v1`, logsA);
    await gatewayOn(pb, `http://127.0.0.1:${pa}/v1`, logsB);
    const client = new OpenAI({ baseURL: `${a}/v1`, apiKey: 'client', maxRetries: 0, timeout: 5_000 });
    const err = (await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.status).toBe(508);
    // A, B, and A again, which sees its own name: three requests in all.
    const statuses = (logs: string[]) => logs.map((l) => JSON.parse(l) as { status?: number }).filter((l) => l.status !== undefined).length;
    expect(statuses(logsA) + statuses(logsB)).toBe(3);
    // Passthrough paths too.
    const files = await fetch(`${a}/v1/files`);
    expect(files.status).toBe(508);
  });

  it('passes on only the gateways\' own via entries, each once, and its own last', async () => {
    const { upstreamVia } = await import('../src/http/loop-guard.ts');
    expect(upstreamVia('1.1 stormgate-0000000a', undefined)).toBe('1.1 stormgate-0000000a');
    expect(upstreamVia('1.1 stormgate-0000000a', '1.0 corp-proxy, 1.1 stormgate-0000000b,1.1 stormgate-0000000b\r, evil')).toBe('1.1 stormgate-0000000b, 1.1 stormgate-0000000a');
    const many = Array.from({ length: 100 }, (_, i) => `1.1 stormgate-${i.toString(16).padStart(8, '0')}`).join(', ');
    expect(upstreamVia('1.1 stormgate-ffffffff', many).split(', ')).toHaveLength(17);
  });
});

describe("the instance's name in its log lines", () => {
  it('is on every line, and is the name its via entry upstream carries', async () => {
    const s = await startStack({ faults: { errors: [{ status: 503, rate: 1, times: 1 }] } });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 });
    await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    const via = s.mock.requests()[0]!.headers.via;
    expect(via).toMatch(/^1\.1 stormgate-[0-9a-f]{8}$/);
    const lines = s.logs.map((l) => JSON.parse(l) as { instance?: string; msg?: string });
    expect(lines.some((l) => l.msg === 'request')).toBe(true);
    for (const line of lines) expect(line.instance).toBe(via!.slice('1.1 '.length));
  });
});

describe("the client's trace in the request's log line", () => {
  it("logs traceparent's trace id, and none for a malformed or all-zero one", async () => {
    const s = await startStack();
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 });
    const ask = (traceparent: string, id: string) => client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }, { headers: { traceparent, 'x-request-id': id } });
    await ask('00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', 'good');
    await ask('not-a-trace', 'bad');
    await ask('00-00000000000000000000000000000000-00f067aa0ba902b7-01', 'zero');
    const byId = new Map(s.logs.map((l) => JSON.parse(l) as { reqId?: string; traceId?: string }).filter((l) => l.reqId).map((l) => [l.reqId, l]));
    expect(byId.get('good')?.traceId).toBe('4bf92f3577b34da6a3ce929d0e0e4736');
    expect(byId.get('bad')).toBeDefined();
    expect(byId.get('bad')?.traceId).toBeUndefined();
    expect(byId.get('zero')?.traceId).toBeUndefined();
    // Forwarded upstream as it came.
    expect(s.mock.requests()[0]!.headers.traceparent).toBe('00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01');
  });
});
