// An eighty-first third-party failure-scenario suite: an enterprise team whose primary is AZURE OPENAI (`family:
// azure-openai`: /openai/deployments/{deployment}/..., the `api-version` query, the `api-key` header) with OpenAI and
// Claude behind it, driven with the official `openai` 6.x SDK pointed at the gateway (the client does not know Azure is
// there). Each upstream is a scripted node:http server on 127.0.0.1 that records the exact path, query, headers and body
// of every request. Azure's answers are written as Azure sends them (its REST reference, and captures users posted in
// GitHub issues): a 503 with `retry-after` in a regional outage, a 429 whose `code` is the string "429" with
// `retry-after-ms`, the content filter's 400 with `innererror.content_filter_result`, `DeploymentNotFound`,
// `OperationNotSupported` ("The chatCompletion operation does not work with the specified model" when a deployment's
// model serves another API), and its stream's annotation chunks. What test/azure-openai.test.ts,
// test/third-party-suite-12.test.ts and test/review-families-2026-12-06.test.ts already cover (a 429 waited by its
// retry-after-ms, a content-filter 400 not failed over to OpenAI, DeploymentNotFound, 408) is not repeated: this file
// takes the failovers across families, the exact bytes and headers each provider gets, and the client-named deployment.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { azureFilter400, FILTER_SAFE } from './helpers/azure-provider.ts';
import { sdkError } from './helpers/openai-error.ts';
import { completion, DONE, json, type Answer, type Script } from './helpers/scripted-provider.ts';
import { countingClient } from './helpers/stack.ts';
import { useScriptedUpstreams, type UpstreamsGateway } from './helpers/scripted-upstreams.ts';

const start = useScriptedUpstreams();
type Gw = UpstreamsGateway;

const AZ_KEY = 'az-key-0123456789';
const OPENAI_KEY = 'openai-key-0123456789';
const CLAUDE_KEY = 'claude-key-0123456789';
/** What an AzureOpenAI-minded client puts beside its bearer token: it must reach no provider. */
const CLIENT_API_KEY = 'client-azure-key';

const APIM_ID = 'b7e1c0de-5a5a-4f00-9d1c-000000000081';
/** The headers Azure sends with every answer (the region and quota ones are its own, for no client). */
const azureHeaders = (extra: Record<string, string> = {}) => ({
  'content-type': 'application/json',
  'apim-request-id': APIM_ID,
  'x-ms-region': 'East US 2',
  'x-ms-rai-invoked': 'true',
  'x-ratelimit-remaining-requests': '0',
  'x-ratelimit-remaining-tokens': '0',
  ...extra,
});
const azureJson = (status: number, body: unknown, headers: Record<string, string> = {}): Script => ({ status, headers: azureHeaders(headers), steps: [JSON.stringify(body)] });

/** The prompt filter's 400, as Azure answered it for a jailbreak attempt (Prompt Shields). */
const AZURE_FILTER_400 = azureFilter400({ ...FILTER_SAFE, jailbreak: { filtered: true, detected: true } });
const AZURE_429 = {
  error: {
    code: '429',
    message: 'Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 25 seconds. Please go here: https://aka.ms/oai/quotaincrease if you would like to further increase the default rate limit.',
  },
};
const AZURE_503 = { error: { code: 'ServiceUnavailable', message: 'The service is temporarily unable to process your request. Please try again later.' } };
const AZURE_404 = { error: { code: 'DeploymentNotFound', message: 'The API deployment for this resource does not exist. If you created the deployment within the last 5 minutes, please wait a moment and try again.' } };
const operationNotSupported = (deployment: string) => ({
  error: { code: 'OperationNotSupported', message: `The chatCompletion operation does not work with the specified model, ${deployment}. Please choose different model and try again. You can learn more about which models can be used with each operation here: https://go.microsoft.com/fwlink/?linkid=2197993.` },
});

/** Azure's whole chat completion, with its filter annotations. */
const azureCompletion = (text: string): Script =>
  azureJson(200, {
    choices: [{ content_filter_results: FILTER_SAFE, finish_reason: 'stop', index: 0, logprobs: null, message: { role: 'assistant', content: text, refusal: null } }],
    created: 1735000000,
    id: 'chatcmpl-AZ81',
    model: 'gpt-4o-2024-11-20',
    object: 'chat.completion',
    prompt_filter_results: [{ prompt_index: 0, content_filter_results: FILTER_SAFE }],
    system_fingerprint: 'fp_az81',
    usage: { completion_tokens: 3, prompt_tokens: 9, total_tokens: 12 },
  });

const sse = (o: unknown) => `data: ${JSON.stringify(o)}\n\n`;
const anthropicEv = (type: string, fields: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...fields })}\n\n`;
/** Claude's streamed answer of one text block, as the Messages API sends it. */
const claudeStream = (text: string): Script => ({
  status: 200,
  headers: { 'content-type': 'text/event-stream', 'request-id': 'req_011CClaude81' },
  steps: [
    anthropicEv('message_start', { message: { id: 'msg_81', type: 'message', role: 'assistant', model: 'claude-sonnet-4-6', content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 14, output_tokens: 1 } } }),
    anthropicEv('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
    anthropicEv('content_block_delta', { index: 0, delta: { type: 'text_delta', text } }),
    anthropicEv('content_block_stop', { index: 0 }),
    anthropicEv('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 5 } }),
    anthropicEv('message_stop', {}),
  ],
});

const az = (answer: Answer) => ({ answer, family: 'azure-openai' as const });
const claude = (answer: Answer) => ({ answer, family: 'anthropic' as const });
const openaiOk = (text: string): Answer => () => ({ ...completion(text, 'gpt-4o-2024-08-06'), headers: { 'content-type': 'application/json', 'x-request-id': 'req_openai_81' } });

/** The SDK as the team configured it: plain OpenAI, plus the api-key header an Azure-minded library adds. */
const teamClient = (g: Gw, maxRetries = 0) => new OpenAI({ baseURL: g.s.baseURL, apiKey: 'sk-client-not-a-provider-key', maxRetries, defaultHeaders: { 'api-key': CLIENT_API_KEY } });
const messages = [{ role: 'user' as const, content: 'Summarise the quarterly incident report.' }];

/** Every header value a provider received, joined: for "no credential of anyone else's" checks. */
const headerText = (h: Record<string, unknown>) => JSON.stringify(h);

describe('Azure OpenAI primary, failover across families', () => {
  it("a regional outage (503 with retry-after: 30) fails over to OpenAI at once: the same body but the model, each provider only its own credential, and the next request skips Azure", async () => {
    const g = await start({ az: az(() => azureJson(503, AZURE_503, { 'retry-after': '30' })), openai: openaiOk('from openai') }, [
      { provider: 'az', model: 'gpt4o-prod-eastus2' },
      { provider: 'openai', model: 'gpt-4o' },
    ]);
    const request = { model: 'gpt-4o', messages, temperature: 0.2, max_tokens: 300, user: 'emp-4411', seed: 7 };
    const t0 = Date.now();
    const first = await teamClient(g).chat.completions.create(request).withResponse();
    expect(Date.now() - t0).toBeLessThan(5_000);
    expect(first.data.choices[0]!.message.content).toBe('from openai');
    expect(first.response.headers.get('x-stormgate-target')).toBe('openai/gpt-4o');
    expect(first.response.headers.get('x-stormgate-fallback')).toBe('wait_hint');
    // Azure's id belongs to the failed attempt; the answer carries the one of the provider that answered.
    expect(first.response.headers.get('x-request-id')).toBe('req_openai_81');
    expect(first.response.headers.get('apim-request-id')).toBeNull();
    expect(first.response.headers.get('x-ms-region')).toBeNull();

    expect(g.seen.az).toHaveLength(1);
    const toAzure = g.seen.az![0]!;
    expect(toAzure.url).toBe('/openai/deployments/gpt4o-prod-eastus2/chat/completions?api-version=2024-10-21');
    expect(toAzure.headers['api-key']).toBe(AZ_KEY);
    expect(toAzure.headers.authorization).toBeUndefined();
    expect(toAzure.body).toEqual({ ...request, model: 'gpt4o-prod-eastus2' });

    expect(g.seen.openai).toHaveLength(1);
    const toOpenAI = g.seen.openai![0]!;
    expect(toOpenAI.url).toBe('/v1/chat/completions');
    expect(toOpenAI.headers.authorization).toBe(`Bearer ${OPENAI_KEY}`);
    // Neither Azure's key nor the client's api-key header reaches OpenAI; the client's key reaches nobody.
    expect(toOpenAI.headers['api-key']).toBeUndefined();
    expect(toOpenAI.body).toEqual({ ...request, model: 'gpt-4o' });
    for (const seen of [toAzure, toOpenAI]) {
      expect(headerText(seen.headers)).not.toContain(CLIENT_API_KEY);
      expect(headerText(seen.headers)).not.toContain('sk-client-not-a-provider-key');
    }
    expect(headerText(toOpenAI.headers)).not.toContain(AZ_KEY);

    // Held off for the 30 s Azure asked for: the next request goes straight to OpenAI.
    const second = await teamClient(g).chat.completions.create(request).withResponse();
    expect(second.response.headers.get('x-stormgate-fallback')).toBe('held_off');
    expect(g.seen.az).toHaveLength(1);
    expect(g.seen.openai).toHaveLength(2);
  });

  it("a streamed request meets Azure's 429 (code \"429\", retry-after-ms 25000): handed to Claude at once, translated, and the SDK's stream is Claude's text", async () => {
    const g = await start(
      {
        az: az(() => azureJson(429, AZURE_429, { 'retry-after': '25', 'retry-after-ms': '25000' })),
        claude: claude(() => claudeStream('Claude took over.')),
      },
      [{ provider: 'az', model: 'gpt4o-prod' }, { provider: 'claude', model: 'claude-sonnet-4-6' }],
    );
    const t0 = Date.now();
    const { data: stream, response } = await teamClient(g).chat.completions.create({ model: 'gpt-4o', messages, stream: true, stream_options: { include_usage: true } }).withResponse();
    let text = '';
    let usage: unknown;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? '';
      if (chunk.usage) usage = chunk.usage;
    }
    expect(Date.now() - t0).toBeLessThan(5_000);
    expect(text).toBe('Claude took over.');
    expect(usage).toMatchObject({ prompt_tokens: 14, completion_tokens: 5 });
    expect(response.headers.get('x-stormgate-target')).toBe('claude/claude-sonnet-4-6');
    expect(response.headers.get('x-stormgate-fallback')).toBe('wait_hint');
    // Azure's quota headers are not the client's; its apim-request-id was the failed attempt's.
    expect(response.headers.get('x-ratelimit-remaining-requests')).toBeNull();
    expect(response.headers.get('apim-request-id')).toBeNull();

    expect(g.seen.az).toHaveLength(1);
    expect(g.seen.az![0]!.body).toMatchObject({ model: 'gpt4o-prod', stream: true });
    const toClaude = g.seen.claude![0]!;
    expect(toClaude.url).toBe('/v1/messages');
    expect(toClaude.headers['x-api-key']).toBe(CLAUDE_KEY);
    expect(toClaude.headers['api-key']).toBeUndefined();
    expect(toClaude.headers.authorization).toBeUndefined();
    expect(headerText(toClaude.headers)).not.toContain(AZ_KEY);
    expect(headerText(toClaude.headers)).not.toContain(CLIENT_API_KEY);
    expect(toClaude.body).toMatchObject({ model: 'claude-sonnet-4-6', stream: true, messages: [{ role: 'user', content: [{ type: 'text', text: messages[0]!.content }] }] });
  });
});

describe("Azure's content filter is a verdict on the request", () => {
  it('a streamed prompt the filter refuses (400 content_filter, jailbreak detected) reaches the SDK as it came, with apim-request-id: sent once, Claude never asked', async () => {
    const g = await start({ az: az(() => azureJson(400, AZURE_FILTER_400)), claude: claude(() => claudeStream('should not be asked')) }, [
      { provider: 'az', model: 'gpt4o-prod' },
      { provider: 'claude', model: 'claude-sonnet-4-6' },
    ]);
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const err = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }));
    expect(err.status).toBe(400);
    expect(err.code).toBe('content_filter');
    expect(err.param).toBe('prompt');
    const inner = (err.error as { innererror?: { code?: string; content_filter_result?: { jailbreak?: unknown } } }).innererror;
    expect(inner?.code).toBe('ResponsibleAIPolicyViolation');
    expect(inner?.content_filter_result?.jailbreak).toEqual({ filtered: true, detected: true });
    // The id Azure's support asks for when a team disputes a filter decision.
    expect(err.headers?.get('apim-request-id')).toBe(APIM_ID);
    expect(err.headers?.get('x-ms-region')).toBeNull();
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(counter.requests).toBe(1);
    expect(g.seen.az).toHaveLength(1);
    expect(g.seen.claude).toHaveLength(0);
  });

  it("Azure's filter as the fallback of a down OpenAI primary still ends the request: the client gets content_filter, not OpenAI's 503, and Claude behind is never asked", async () => {
    const g = await start(
      {
        openai: () => json(503, { error: { message: 'The server is overloaded or not ready yet.', type: 'server_error', param: null, code: null } }),
        az: az(() => azureJson(400, AZURE_FILTER_400)),
        claude: claude(() => claudeStream('should not be asked')),
      },
      [{ provider: 'openai', model: 'gpt-4o' }, { provider: 'az', model: 'gpt4o-prod' }, { provider: 'claude', model: 'claude-sonnet-4-6' }],
      { route: { retry: { maxAttempts: 1 } } },
    );
    const err = await sdkError(teamClient(g).chat.completions.create({ model: 'gpt-4o', messages }));
    expect(err.status).toBe(400);
    expect(err.code).toBe('content_filter');
    expect(err.headers?.get('x-stormgate-target')).toBe('az/gpt4o-prod');
    expect(g.seen.openai).toHaveLength(1);
    expect(g.seen.az).toHaveLength(1);
    expect(g.seen.claude).toHaveLength(0);
  });

  it("a content_filter error event as a 200 stream's first event (a proxy in front of Azure writes the filter's 400 so) is the same verdict: 400 content_filter, OpenAI never asked", async () => {
    const event = sse({ error: { ...AZURE_FILTER_400.error } });
    const g = await start({ az: az(() => ({ status: 200, headers: { ...azureHeaders(), 'content-type': 'text/event-stream' }, steps: [event] })), openai: openaiOk('should not be asked') }, [
      { provider: 'az', model: 'gpt4o-prod' },
      { provider: 'openai', model: 'gpt-4o' },
    ]);
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const err = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }));
    expect(err.status).toBe(400);
    expect(err.code).toBe('content_filter');
    expect(err.param).toBe('prompt');
    expect(err.message).toContain("Azure OpenAI's content management policy");
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(counter.requests).toBe(1);
    expect(g.seen.az).toHaveLength(1);
    expect(g.seen.openai).toHaveLength(0);
  });

  it("a stream's annotation chunks (empty choices with prompt_filter_results, a choice's content_filter_result error \"The contents are not filtered\") pass through byte for byte: output, not an error", async () => {
    const base = { created: 1735000000, id: 'chatcmpl-AZ81s', model: 'gpt-4o-2024-11-20', object: 'chat.completion.chunk', system_fingerprint: 'fp_az81' };
    const events = [
      sse({ choices: [], created: 0, id: '', model: '', object: '', prompt_filter_results: [{ prompt_index: 0, content_filter_results: FILTER_SAFE }] }),
      // Azure's filter service failing open on a chunk (a GitHub capture of 2023-12): an `error` inside the choice.
      sse({ ...base, choices: [{ index: 0, finish_reason: null, delta: { role: 'assistant', content: '' }, content_filter_result: { error: { code: 'content_filter_error', message: 'The contents are not filtered' } } }] }),
      sse({ ...base, choices: [{ index: 0, finish_reason: null, delta: { content: 'Quarter ' }, content_filter_results: FILTER_SAFE }] }),
      sse({ ...base, choices: [{ index: 0, finish_reason: null, delta: { content: 'was calm.' }, content_filter_results: FILTER_SAFE }] }),
      sse({ ...base, choices: [{ index: 0, finish_reason: 'stop', delta: {}, content_filter_results: {} }] }),
      DONE,
    ];
    const g = await start({ az: az(() => ({ status: 200, headers: { ...azureHeaders(), 'content-type': 'text/event-stream; charset=utf-8' }, steps: events })), openai: openaiOk('should not be asked') }, [
      { provider: 'az', model: 'gpt4o-prod' },
      { provider: 'openai', model: 'gpt-4o' },
    ]);
    const res = await fetch(`${g.s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: 'Bearer sk-client-not-a-provider-key' },
      body: JSON.stringify({ model: 'gpt-4o', messages, stream: true }),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get('apim-request-id')).toBe(APIM_ID);
    expect(await res.text()).toBe(events.join(''));
    expect(g.seen.az).toHaveLength(1);
    expect(g.seen.openai).toHaveLength(0);
  });
});

describe('the deployment: named by the config or by the client', () => {
  it("OperationNotSupported for a deployment the config named (its model now serves the Responses API only) is the configuration's, so OpenAI answers", async () => {
    const g = await start({ az: az(() => azureJson(400, operationNotSupported('gpt-5.1-codex'))), openai: openaiOk('from openai') }, [
      { provider: 'az', model: 'codex-prod' },
      { provider: 'openai', model: 'gpt-4o' },
    ]);
    const { data, response } = await teamClient(g).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(data.choices[0]!.message.content).toBe('from openai');
    expect(response.headers.get('x-stormgate-fallback')).toBe('error');
    expect(g.seen.az).toHaveLength(1);
    expect(g.seen.az![0]!.url).toBe('/openai/deployments/codex-prod/chat/completions?api-version=2024-10-21');
  });

  it('OperationNotSupported for a deployment the client named is its own 400, as it came: not retried, not failed over', async () => {
    const g = await start({ az: az(() => azureJson(400, operationNotSupported('text-embedding-3-large'))), openai: openaiOk('should not be asked') }, [{ provider: 'az' }, { provider: 'openai' }]);
    const err = await sdkError(teamClient(g).chat.completions.create({ model: 'embeddings-large', messages }));
    expect(err.status).toBe(400);
    expect(err.code).toBe('OperationNotSupported');
    expect(err.message).toContain('does not work with the specified model');
    expect(g.seen.az).toHaveLength(1);
    expect(g.seen.openai).toHaveLength(0);
  });

  it("a client's typo deployment (DeploymentNotFound) is the client's 404: OpenAI not asked, and Azure neither held nor broken for the teams using real deployments", async () => {
    const g = await start(
      { az: az((body) => (body.model === 'gpt-4o' ? azureCompletion('from azure') : azureJson(404, AZURE_404))), openai: openaiOk('should not be asked') },
      [{ provider: 'az' }, { provider: 'openai' }],
      { providers: { az: { breaker: { minRequests: 3, consecutiveFailures: 2, failureRate: 0.5, windowS: 10 } } } },
    );
    for (let i = 0; i < 6; i++) {
      const err = await sdkError(teamClient(g).chat.completions.create({ model: `gpt-4o-typo-${i}`, messages }));
      expect(err.status).toBe(404);
      expect(err.message).toContain('The API deployment for this resource does not exist');
    }
    const ok = await teamClient(g).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(ok.data.choices[0]!.message.content).toBe('from azure');
    expect(ok.response.headers.get('x-stormgate-target')).toBe('az/gpt-4o');
    expect(ok.response.headers.get('apim-request-id')).toBe(APIM_ID);
    expect(g.seen.az).toHaveLength(7);
    expect(g.seen.openai).toHaveLength(0);
  });

  it('a client model that would climb out of the deployments in any spelling stays one encoded path segment (or is refused), and the key goes nowhere else', async () => {
    const g = await start({ az: az(() => azureJson(404, AZURE_404)) }, [{ provider: 'az' }]);
    const models = ['%2e%2e', '.%2E', '%2e', 'a/../b', '../../openai/v1/files', '..\\..\\admin', '..;', ' ..', '..%2f', '\u2024\u2024', 'x?api-version=2020-01-01#', '...'];
    for (const model of models) {
      const res = await fetch(`${g.s.baseURL}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model, messages }),
      });
      expect(res.status, model).toBe(404);
      await res.arrayBuffer();
    }
    const paths = g.seen.az!.map((s) => s.url);
    expect(paths).toEqual([
      '/openai/deployments/%252e%252e/chat/completions?api-version=2024-10-21',
      '/openai/deployments/.%252E/chat/completions?api-version=2024-10-21',
      '/openai/deployments/%252e/chat/completions?api-version=2024-10-21',
      '/openai/deployments/a%2F..%2Fb/chat/completions?api-version=2024-10-21',
      '/openai/deployments/..%2F..%2Fopenai%2Fv1%2Ffiles/chat/completions?api-version=2024-10-21',
      '/openai/deployments/..%5C..%5Cadmin/chat/completions?api-version=2024-10-21',
      '/openai/deployments/..%3B/chat/completions?api-version=2024-10-21',
      '/openai/deployments/%20../chat/completions?api-version=2024-10-21',
      '/openai/deployments/..%252f/chat/completions?api-version=2024-10-21',
      '/openai/deployments/%E2%80%A4%E2%80%A4/chat/completions?api-version=2024-10-21',
      '/openai/deployments/x%3Fapi-version%3D2020-01-01%23/chat/completions?api-version=2024-10-21',
      '/openai/deployments/.../chat/completions?api-version=2024-10-21',
    ]);
    // Whatever the name, every request stayed under /openai/deployments/<one segment>/chat/completions.
    for (const p of paths) expect(new URL(p, 'http://azure').pathname.split('/')).toHaveLength(6);
    for (const s of g.seen.az!) expect(s.headers['api-key']).toBe(AZ_KEY);
  });
});

describe("the client's query string", () => {
  it("an Azure-minded client's ?api-version= is replaced by the provider's on Azure, and the provider's never reaches OpenAI after a failover", async () => {
    const g = await start({ az: az(() => azureJson(503, AZURE_503, { 'retry-after': '30' })), openai: openaiOk('from openai') }, [
      { provider: 'az', model: 'gpt4o-prod' },
      { provider: 'openai', model: 'gpt-4o' },
    ]);
    const client = new OpenAI({ baseURL: g.s.baseURL, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0, defaultQuery: { 'api-version': '2024-06-01' } });
    const r = await client.chat.completions.create({ model: 'gpt-4o', messages });
    expect(r.choices[0]!.message.content).toBe('from openai');
    const azureUrl = new URL(g.seen.az![0]!.url, 'http://azure');
    expect(azureUrl.pathname).toBe('/openai/deployments/gpt4o-prod/chat/completions');
    expect(azureUrl.searchParams.getAll('api-version')).toEqual(['2024-10-21']);
    const openaiUrl = new URL(g.seen.openai![0]!.url, 'http://openai');
    expect(openaiUrl.pathname).toBe('/v1/chat/completions');
    expect(openaiUrl.searchParams.getAll('api-version')).not.toContain('2024-10-21');
  });
});
