// Azure OpenAI as an enterprise runs it, through the openai SDK: as the primary with api.openai.com behind it, against a
// hand-written Azure server (helpers/azure-provider.ts) that answers as Azure does: its deployments paths and api-key,
// its error bodies, content filter verdicts, annotation chunks with empty choices, retry-after-ms.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import type { FaultSpec } from '../src/mock/faults.ts';
import { defaultConfig, requestLine, useStacks, type Stack } from './helpers/stack.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { afterFinishWaitMs } from '../src/pipeline/live-stream.ts';
import { azureHandler, type AzureFault, type AzureSeen } from './helpers/azure-provider.ts';

const startStack = useStacks();
const startProvider = useFakeProviders();
// In TEST_SECRETS too, so the run's log check looks for it.
const AZURE_KEY = 'azure-key-0123456789abcdef0123456789';

type RouteOf = ConfigInput['routes'][number];

/**
 * An Azure server and the stack's mock (an OpenAI-compatible provider) on the routes `routes` names, in the order
 * `targets` gives; by default Azure first, the mock behind it, on chat and embeddings.
 */
async function azureStack(
  opts: { faults?: AzureFault[]; verdictDelayMs?: number; deployments?: string[]; mockFaults?: FaultSpec; routes?: string[]; targets?: RouteOf['targets']; retry?: RouteOf['retry'] } = {},
): Promise<{ s: Stack; seen: AzureSeen[] }> {
  const seen: AzureSeen[] = [];
  const deployments = opts.deployments ?? ['gpt-4o', 'text-embedding-3-small'];
  const azure = await startProvider(azureHandler({ apiKey: AZURE_KEY, deployments, faults: opts.faults, verdictDelayMs: opts.verdictDelayMs, seen }));
  const routes = opts.routes ?? ['chat', 'embeddings'];
  const s = await startStack({
    faults: opts.mockFaults,
    config: (url) => {
      const base = defaultConfig(url);
      return {
        ...base,
        providers: {
          mock: { ...base.providers.mock!, breaker: false },
          azure: { family: 'azure-openai', baseUrl: azure.origin, apiKey: AZURE_KEY, apiVersion: '2024-10-21', breaker: false },
        },
        routes: base.routes
          .filter((r) => routes.includes(r.name))
          .map((r) => ({
            ...r,
            targets: opts.targets ?? [{ provider: 'azure' }, { provider: 'mock' }],
            park: false,
            retry: opts.retry ?? { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 10, capMs: 10 } },
          })),
      } satisfies ConfigInput;
    },
  });
  return { s, seen };
}


const sdk = (s: Stack) => new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
const messages = [{ role: 'user' as const, content: 'hi' }];

describe('Azure OpenAI behind the gateway', () => {
  it("streams Azure's answer whole: its empty-choices annotation chunks pass on without counting as output, and its usage is counted", async () => {
    const { s, seen } = await azureStack();
    const { data: stream, response } = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true, stream_options: { include_usage: true } }).withResponse();
    // The id Azure's support asks for comes back; its region does not.
    expect(response.headers.get('apim-request-id')).toBe('a0b1c2d3-0000-4000-8000-000000000001');
    expect(response.headers.get('x-ms-region')).toBeNull();
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    expect(seen[0]!.url).toBe('/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21');
    expect(seen[0]!.headers['api-key']).toBe(AZURE_KEY);
    expect(chunks[0]!.choices).toEqual([]);
    expect((chunks[0] as unknown as { prompt_filter_results: unknown[] }).prompt_filter_results).toHaveLength(1);
    expect(chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('')).toBe('Hello from Azure.');
    expect(chunks.at(-1)!.usage).toMatchObject({ prompt_tokens: 11, completion_tokens: 3 });
    expect(s.mock.stats().total).toBe(0);
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toContain('stormgate_tokens_total{route="chat",target="azure/gpt-4o",kind="prompt"} 11');
    expect(metrics).toContain('stormgate_tokens_total{route="chat",target="azure/gpt-4o",kind="completion"} 3');
    expect((await requestLine(s)).streamEnd).toBe('complete');
  });

  it("passes on Azure's verdict on a prompt (400 content_filter with its innererror): not retried, not failed over to OpenAI", async () => {
    const { s, seen } = await azureStack({ faults: ['prompt-filtered'] });
    const err = (await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.BadRequestError>;
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect(err.code).toBe('content_filter');
    expect((err.error as { innererror?: { code?: string } }).innererror?.code).toBe('ResponsibleAIPolicyViolation');
    expect(err.headers.get('x-should-retry')).toBe('false');
    expect(seen).toHaveLength(1);
    expect(s.mock.stats().total).toBe(0);
  });

  it("passes on the verdict of Azure's asynchronous content filter on an answer's last part, sent after the model's finish", async () => {
    // Asynchronous Filter mode checks what the model wrote while it streams; the last part's verdict comes after the
    // model's own finish_reason, when the filter is done with it, then [DONE]. Cut a second after the finish, the
    // client was told the answer had ended well and never saw the content_filter it ended with.
    const { s } = await azureStack({ faults: ['late-verdict'], verdictDelayMs: 2_000 });
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    const finishes: string[] = [];
    for await (const c of stream) for (const choice of c.choices) if (choice.finish_reason) finishes.push(choice.finish_reason);
    expect(finishes).toEqual(['stop', 'content_filter']);
    expect((await requestLine(s)).streamEnd).toBe('complete');
  });

  it("holds Azure for its credentials (401 invalid subscription key, 403 firewall) and answers from OpenAI, the api-key in no log line nor answer", async () => {
    for (const fault of ['bad-key', 'firewall'] as const) {
      const { s, seen } = await azureStack({ faults: [fault] });
      const first = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
      expect(first.response.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
      expect(first.response.headers.get('x-stormgate-fallback')).toBe('credentials');
      // Held: the next request goes to OpenAI at once.
      await sdk(s).chat.completions.create({ model: 'gpt-4o', messages });
      expect(seen).toHaveLength(1);
      expect(s.mock.stats().total).toBe(2);
      expect(JSON.stringify([...first.response.headers]) + JSON.stringify(first.data)).not.toContain(AZURE_KEY);
      expect(s.logs.join('')).not.toContain(AZURE_KEY);
      // The last one is closed after the test, as every stack is.
      if (fault === 'bad-key') await s.close();
    }
  });

  it("retries Azure's 429 after its retry-after-ms and its 503 'engine is currently overloaded' on Azure, then answers from it", async () => {
    const { s, seen } = await azureStack({ faults: ['rate-limited', 'overloaded'] });
    const { data, response } = await sdk(s).embeddings.create({ model: 'text-embedding-3-small', input: 'x' }).withResponse();
    expect(response.headers.get('x-stormgate-target')).toBe('azure/text-embedding-3-small');
    expect(data.data[0]!.embedding).toHaveLength(3);
    expect(seen.map((r) => r.headers['x-retry-reason'])).toEqual([undefined, 'status_429', 'status_503']);
    expect(s.mock.stats().total).toBe(0);
  });
});

describe('Azure OpenAI as the backup of api.openai.com on the Responses API', () => {
  it('takes a Responses request the OpenAI primary failed, on its v1 surface with the deployment as the model', async () => {
    const { s, seen } = await azureStack({
      deployments: ['resp-deploy'],
      mockFaults: { errors: [{ status: 503, rate: 1 }] },
      routes: ['responses'],
      targets: [{ provider: 'mock' }, { provider: 'azure', model: 'resp-deploy' }],
      retry: { maxAttempts: 1 },
    });
    const { data, response } = await sdk(s).responses.create({ model: 'gpt-4o', input: 'hi' }).withResponse();
    expect(data.output_text).toBe('Hello from Azure.');
    expect(response.headers.get('x-stormgate-target')).toBe('azure/resp-deploy');
    expect(seen[0]!.url).toBe('/openai/v1/responses');
  });
});

describe('afterFinishWaitMs', () => {
  it("waits a second for a finished answer's [DONE], idleMs from Azure, whose asynchronous filter speaks after the finish", () => {
    expect(afterFinishWaitMs('openai', 30_000)).toBe(1_000);
    expect(afterFinishWaitMs('anthropic', 30_000)).toBe(1_000);
    expect(afterFinishWaitMs('openai', 400)).toBe(400);
    expect(afterFinishWaitMs('azure-openai', 30_000)).toBe(30_000);
  });
});
