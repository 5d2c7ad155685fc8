// Review of what the gateway emits (answers, headers, logs, metrics, start-up errors) for the credentials it holds:
// the provider key a compatible server quotes in the `code` of an error it reports inside a 2xx, and a secret that a
// swapped variable put in tls.caFile, quoted by the start-up error as the file it could not read.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { useGatewayProcesses } from './helpers/gateway-process.ts';
import { useGateways } from './helpers/stack.ts';

// As long as a real project key (sk-proj-..., about 160 characters): longer than the 64 the gateway keeps of a code.
const LONG_KEY = `sk-proj-review07-${'0123456789abcdef'.repeat(9)}`;
const SHORT_KEY = 'sk-review07-short-key-5c1e9a';

const startProvider = useFakeProviders();
const startGateway = useGateways();
const startProcess = useGatewayProcesses();

/** Any 10 characters of `key` in a row past its public prefix, found in `text`. */
function leaks(text: string, key: string): string | undefined {
  for (let i = 8; i + 10 <= key.length; i++) if (text.includes(key.slice(i, i + 10))) return key.slice(i, i + 10);
  return undefined;
}

const failedResponse = (code: string) => ({ id: 'resp_1', object: 'response', created_at: 1, status: 'failed', model: 'gpt-4o', output: [], error: { code, message: 'boom' } });
const sse = (res: ServerResponse, text: string) => {
  res.writeHead(200, { 'content-type': 'text/event-stream' });
  res.end(text);
};

/** An OpenAI-compatible server that puts the key it was sent in the `code` of an error inside a 200, picked by model. */
function echoInCode(req: IncomingMessage, res: ServerResponse): void {
  const chunks: Buffer[] = [];
  req.on('data', (d: Buffer) => chunks.push(d));
  req.on('end', () => {
    const key = String(req.headers.authorization ?? '').replace(/^Bearer /, '');
    const model = (JSON.parse(Buffer.concat(chunks).toString()) as { model: string }).model;
    if (model === 'failed-whole') {
      res.writeHead(200, { 'content-type': 'application/json' });
      return void res.end(JSON.stringify(failedResponse(key)));
    }
    if (model === 'failed-stream') {
      const created = { ...failedResponse(key), status: 'in_progress', error: null };
      return sse(res, `event: response.created\ndata: ${JSON.stringify({ type: 'response.created', sequence_number: 0, response: created })}\n\nevent: response.failed\ndata: ${JSON.stringify({ type: 'response.failed', sequence_number: 1, response: failedResponse(key) })}\n\n`);
    }
    if (model === 'error-first') return sse(res, `data: ${JSON.stringify({ error: { message: 'failed', type: 'server_error', code: key } })}\n\n`);
    // After output: the stream is the client's, its error event is scrubbed there; the breaker's line names the code.
    const chunk = { id: 'c', object: 'chat.completion.chunk', created: 1, model, choices: [{ index: 0, delta: { role: 'assistant', content: 'Hi' }, finish_reason: null }] };
    sse(res, `data: ${JSON.stringify(chunk)}\n\ndata: ${JSON.stringify({ error: { message: 'failed', type: 'server_error', code: key } })}\n\n`);
  });
}

async function gatewayWith(key: string, logs: string[]): Promise<string> {
  const provider = await startProvider(echoInCode);
  const config = parseConfig(
    `server: { host: 127.0.0.1, port: 0, logLevel: debug }
providers:
  openai: { family: openai, baseUrl: "${provider.origin}/v1", apiKey: "\${REVIEW_KEY}", breaker: { consecutiveFailures: 1, minRequests: 1, openS: 1 } }
routes:
  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: openai } ], retry: { maxAttempts: 1 }, park: false }
  - { name: responses, match: { path: /v1/responses }, targets: [ { provider: openai } ], retry: { maxAttempts: 1 }, park: false }
`,
    'review.yaml',
    { REVIEW_KEY: key },
  );
  return startGateway(config, { logs });
}

describe("a provider's key quoted as the code of an error inside a 2xx", () => {
  for (const [name, key] of [['a long key (cut at 64 characters)', LONG_KEY], ['a short key', SHORT_KEY]] as const) {
    it(`is not in the 502 the client gets for a failed Response or an error event before any output: ${name}`, async () => {
      const logs: string[] = [];
      const url = await gatewayWith(key, logs);
      const asks: Array<[string, object]> = [
        ['/v1/responses', { model: 'failed-whole', input: 'hi' }],
        ['/v1/responses', { model: 'failed-stream', input: 'hi', stream: true }],
        ['/v1/chat/completions', { model: 'error-first', messages: [{ role: 'user', content: 'hi' }], stream: true }],
      ];
      for (const [path, body] of asks) {
        const res = await fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
        const text = `${[...res.headers].join('\n')}\n${await res.text()}`;
        expect(res.status, text).toBe(502);
        // The failure is still told: the code's place says it was taken out.
        expect(text).toContain('[redacted]');
        expect(leaks(text, key), `${JSON.stringify(body)}: ${text}`).toBeUndefined();
      }
      for (const line of logs) expect(leaks(line, key), line).toBeUndefined();
    });
  }

  it("is not in the breaker's log line when an error event ends a stream after its output", async () => {
    const logs: string[] = [];
    const url = await gatewayWith(SHORT_KEY, logs);
    const res = await fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'error-after', messages: [{ role: 'user', content: 'hi' }], stream: true }) });
    const text = await res.text();
    expect(text).toContain('Hi');
    expect(leaks(text, SHORT_KEY), text).toBeUndefined();
    let opened: string | undefined;
    for (let i = 0; i < 50 && opened === undefined; i++) {
      await sleep(20);
      opened = logs.find((l) => l.includes('"breaker open"'));
    }
    expect(opened, logs.join('')).toBeDefined();
    expect(opened).toContain('"reason":"stream_error"');
    for (const line of logs) expect(leaks(line, SHORT_KEY), line).toBeUndefined();
  });
});

describe('tls.caFile from the environment', () => {
  // A key swapped into caFile (the variables mixed up), or the PEM itself put in the variable (a Kubernetes secret
  // mounted as an environment variable, where the gateway wants a path): the error said "cannot read <the value>".
  const PRIVATE_PEM = '-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC-review07\n-----END PRIVATE KEY-----';
  it('is named by its variable, never by its value, when the file cannot be used; file, line and path are said', async () => {
    const config = `server: { host: 127.0.0.1, port: 0 }
providers:
  openai:
    family: openai
    baseUrl: https://api.openai.com/v1
    apiKey: "\${OPENAI_API_KEY}"
    tls: { caFile: "\${OPENAI_API_KEY}" }
  vllm:
    family: openai
    baseUrl: https://vllm.internal.example/v1
    apiKey: none
    tls: { caFile: "\${VLLM_CA}" }
routes:
  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: openai }, { provider: vllm } ] }
`;
    const g = startProcess('ca-file-from-env', config, { OPENAI_API_KEY: SHORT_KEY, VLLM_CA: PRIVATE_PEM });
    expect(await g.exited).toBe(2);
    const out = g.output();
    expect(out).toMatch(/ca-file-from-env\.yaml:7: providers\.openai\.tls\.caFile: cannot read .*\$\{?OPENAI_API_KEY.*\(ENOENT\)/);
    expect(out).toMatch(/ca-file-from-env\.yaml:12: providers\.vllm\.tls\.caFile: cannot read .*\$\{?VLLM_CA.*\(ENOENT\)/);
    expect(leaks(out, SHORT_KEY), out).toBeUndefined();
    expect(out).not.toContain('PRIVATE KEY');
    expect(out).not.toContain('MIIE');
  });

  it('is still quoted as written when the file names it (a path is no secret)', async () => {
    const g = startProcess('ca-file-written', `providers:
  vllm: { family: openai, baseUrl: "https://vllm.internal.example/v1", apiKey: none, tls: { caFile: /nonexistent/review07-ca.pem } }
routes:
  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: vllm } ] }
`);
    expect(await g.exited).toBe(2);
    expect(g.output()).toContain('ca-file-written.yaml:2: providers.vllm.tls.caFile: cannot read /nonexistent/review07-ca.pem (ENOENT)');
  });
});
