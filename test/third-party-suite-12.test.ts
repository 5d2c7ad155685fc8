// A twelfth third-party failure-scenario suite, written from the README ("Retries", "Failover and API families",
// "Retry budget, circuit breaker, hold-offs", "Streaming", "What the client sees", "Errors") as a team whose gateway
// fronts the BIG CLOUDS' endpoints would test it: Google Gemini's OpenAI-compatible endpoint
// (generativelanguage.googleapis.com/v1beta/openai), Azure OpenAI, OpenAI's own rarer answers, and Claude (Anthropic's
// own API, the one Anthropic-family backup the README supports) behind them. Each upstream fails the way it does on the
// wire, shapes taken from GitHub issues where users posted them: Gemini's errors as a one-element list
// `[{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "details": [RetryInfo]}}]`, its 503 "The model is
// overloaded", its 500 INTERNAL, its 400 INVALID_ARGUMENT for a bad key, its safety blocks as finish_reason
// "content_filter" with nothing said; Azure's content-filter 400 with `innererror`, its 429 with `retry-after-ms`, its
// `DeploymentNotFound` 404 and its 408 "The operation was timeout."; OpenAI's 500 "The server had an error while
// processing your request", 503 "The engine is currently overloaded", a Responses stream's `insufficient_quota` after
// `response.created` and its `invalid_prompt`. Every scenario drives a real gateway over HTTP with the official `openai`
// SDK and counts what each scripted upstream (a node:http server on 127.0.0.1) received.
//
// Not here, because the README does not support it: Claude on Vertex AI (`:rawPredict` paths, OAuth tokens,
// `anthropic_version` in the body) and on Bedrock (SigV4, `/model/{id}/invoke`). The `anthropic` family speaks
// Anthropic's own API only (`x-api-key`, `/v1/messages`).
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { sdkError } from './helpers/openai-error.ts';
import { baseResponse, completion, DONE, failsThen, healthy, json, msgItem, responsesHead, responsesTail, rev, streamed, textDelta, type Answer } from './helpers/scripted-provider.ts';
import { countingClient, requestLine } from './helpers/stack.ts';
import { useScriptedUpstreams, type UpstreamsGateway } from './helpers/scripted-upstreams.ts';



const messages = [{ role: 'user' as const, content: 'Summarise the incident report.' }];

/** Claude's Messages API answer, as Anthropic's own endpoint sends it. */
const claude =
  (text: string): Answer =>
  () =>
    json(200, {
      id: 'msg_01XFDUDYJgAACzvnptvVoYEL',
      type: 'message',
      role: 'assistant',
      model: 'claude-sonnet-4-6',
      content: [{ type: 'text', text }],
      stop_reason: 'end_turn',
      stop_sequence: null,
      usage: { input_tokens: 12, output_tokens: 4 },
    });

/** A whole Responses API answer. */
const responseAnswer = (text: string): Answer => (body) => {
  const usage = { input_tokens: 12, input_tokens_details: { cached_tokens: 0 }, output_tokens: 2, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 14 };
  if (body.stream !== true) return json(200, baseResponse('completed', [msgItem(text)], usage));
  return { steps: [...responsesHead(), textDelta(text, 4), ...responsesTail(text, 5)] };
};

const gw = useScriptedUpstreams();
type Gw = UpstreamsGateway;

const chat = (g: Gw, model = 'gemini-2.5-flash') => g.client.chat.completions.create({ model, messages }).withResponse();

// ---------------------------------------------------------------------------------------------------------------
// Wire shapes.

const gemini = (up: Answer) => ({ family: 'openai' as const, answer: up, path: '/v1beta/openai' });
/** Gemini's OpenAI-compatible endpoint answers errors as a one-element list of Google API errors. */
const googleError = (code: number, status: string, message: string, details?: unknown[]) => [{ error: { code, message, status, ...(details ? { details } : {}) } }];
const GEMINI_429 = (retryDelay: string) =>
  googleError(429, 'RESOURCE_EXHAUSTED', 'You exceeded your current quota, please check your plan and billing details. For more information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.', [
    {
      '@type': 'type.googleapis.com/google.rpc.QuotaFailure',
      violations: [{ quotaMetric: 'generativelanguage.googleapis.com/generate_content_free_tier_requests', quotaId: 'GenerateRequestsPerMinutePerProjectPerModel-FreeTier', quotaDimensions: { location: 'global', model: 'gemini-2.5-flash' }, quotaValue: '10' }],
    },
    { '@type': 'type.googleapis.com/google.rpc.Help', links: [{ description: 'Learn more about Gemini API quotas', url: 'https://ai.google.dev/gemini-api/docs/rate-limits' }] },
    { '@type': 'type.googleapis.com/google.rpc.RetryInfo', retryDelay },
  ]);
const GEMINI_503 = googleError(503, 'UNAVAILABLE', 'The model is overloaded. Please try again later.');
const GEMINI_500 = googleError(500, 'INTERNAL', 'An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting');
const GEMINI_BAD_KEY = googleError(400, 'INVALID_ARGUMENT', 'API key not valid. Please pass a valid API key.', [
  { '@type': 'type.googleapis.com/google.rpc.ErrorInfo', reason: 'API_KEY_INVALID', domain: 'googleapis.com', metadata: { service: 'generativelanguage.googleapis.com' } },
  { '@type': 'type.googleapis.com/google.rpc.LocalizedMessage', locale: 'en-US', message: 'API key not valid. Please pass a valid API key.' },
]);
const GEMINI_BAD_ARG = googleError(400, 'INVALID_ARGUMENT', 'Invalid JSON payload received. Unknown name "foo": Cannot find field.');
/** A Gemini chunk, as its OpenAI-compatible stream sends them (no system_fingerprint, a model name without version). */
const gchunk = (d: Record<string, unknown>, finish: string | null = null) =>
  `data: ${JSON.stringify({ choices: [{ delta: d, finish_reason: finish, index: 0 }], created: 1741290958, id: 'Hq2zZ9-hA5', model: 'gemini-2.5-flash', object: 'chat.completion.chunk' })}\n\n`;

const azure = (up: Answer) => ({ family: 'azure-openai' as const, answer: up });
const FILTER_HIT = {
  hate: { filtered: false, severity: 'safe' },
  jailbreak: { filtered: true, detected: true },
  self_harm: { filtered: false, severity: 'safe' },
  sexual: { filtered: false, severity: 'safe' },
  violence: { filtered: false, severity: 'safe' },
};
const AZURE_FILTER_400 = {
  error: {
    message:
      "The response was filtered due to the prompt triggering Azure OpenAI's content management policy. Please modify your prompt and retry. To learn more about our content filtering policies please read our documentation: https://go.microsoft.com/fwlink/?linkid=2198766",
    type: null,
    param: 'prompt',
    code: 'content_filter',
    status: 400,
    innererror: { code: 'ResponsibleAIPolicyViolation', content_filter_result: FILTER_HIT },
  },
};
const AZURE_429 = {
  error: {
    code: '429',
    message:
      'Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 10 seconds. Please go here: https://aka.ms/oai/quotaincrease if you would like to further increase the default rate limit.',
  },
};
const azure429Headers = (ms: number) => ({
  'retry-after': String(Math.ceil(ms / 1000)),
  'retry-after-ms': String(ms),
  'x-ratelimit-remaining-requests': '0',
  'x-ratelimit-remaining-tokens': '0',
  'x-ms-region': 'Sweden Central',
  'apim-request-id': 'a0b1c2d3-0000-4000-8000-000000000001',
});
const AZURE_404 = { error: { code: 'DeploymentNotFound', message: 'The API deployment for this resource does not exist. If you created the deployment within the last 5 minutes, please wait a moment and try again.' } };
const AZURE_408 = { error: { code: 'Timeout', message: 'The operation was timeout.' } };
const AZURE_503 = { error: { code: '503', message: 'The engine is currently overloaded, please try again later' } };

const OPENAI_500 = {
  error: {
    message: 'The server had an error while processing your request. Sorry about that!',
    type: 'server_error',
    param: null,
    code: null,
  },
};
const OPENAI_503 = { error: { message: 'The engine is currently overloaded, please try again later.', type: 'server_error', param: null, code: null } };
const INVALID_PROMPT = {
  message:
    'Invalid prompt: your prompt was flagged as potentially violating our usage policy. Please try again with a different prompt: https://platform.openai.com/docs/guides/reasoning#advice-on-prompting',
  type: 'invalid_request_error',
  param: null,
  code: 'invalid_prompt',
};
const QUOTA_MESSAGE = 'You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.';

// ---------------------------------------------------------------------------------------------------------------
describe('Gemini (OpenAI-compatible endpoint)', () => {
  it("waits out a 429 RESOURCE_EXHAUSTED whose only hint is the list body's RetryInfo (1s), and is answered on the retry", async () => {
    const g = await gw({ gemini: gemini(failsThen(1, () => json(429, GEMINI_429('1s')), 'after the quota window')) }, [{ provider: 'gemini' }]);
    const t0 = Date.now();
    const res = await chat(g);
    const took = Date.now() - t0;
    expect(res.data.choices[0]!.message.content).toBe('after the quota window');
    expect(took).toBeGreaterThanOrEqual(950);
    expect(took).toBeLessThan(8_000);
    expect(g.seen.gemini).toHaveLength(2);
    expect(g.seen.gemini![0]!.url).toBe('/v1beta/openai/chat/completions');
    expect(g.seen.gemini![1]!.headers['x-retry-reason']).toBe('status_429');
  });

  it('gives a lone 429 with RetryInfo 29s (over maxWaitHintMs) to the SDK as an OpenAI-shaped 429 with retry-after, after one upstream request', async () => {
    const g = await gw({ gemini: gemini(() => json(429, GEMINI_429('29s'))) }, [{ provider: 'gemini' }]);
    const err = await sdkError(chat(g));
    expect(err.status).toBe(429);
    expect(err.message).toContain('You exceeded your current quota');
    expect(typeof (err.error as { message?: unknown }).message).toBe('string');
    const retryAfter = Number(err.headers?.get('retry-after'));
    expect(retryAfter).toBeGreaterThanOrEqual(29);
    expect(retryAfter).toBeLessThanOrEqual(36);
    // A wait the gateway would not take, after one upstream request: the SDK is invited back then.
    expect(err.headers?.get('x-should-retry')).toBe('true');
    expect(Number(err.headers?.get('retry-after-ms'))).toBeGreaterThanOrEqual(29_000);
    expect(g.seen.gemini).toHaveLength(1);
  });

  it("starts no hold-off on a RetryInfo hint (that request's own): the next request goes to Gemini again", async () => {
    const g = await gw({ gemini: gemini((_b, n) => (n === 1 ? json(429, GEMINI_429('29s')) : completion('second call', 'gemini-2.5-flash'))) }, [{ provider: 'gemini' }], {
      route: { park: { maxQueue: 100 } },
    });
    await sdkError(chat(g));
    const res = await chat(g);
    expect(res.data.choices[0]!.message.content).toBe('second call');
    expect(g.seen.gemini).toHaveLength(2);
  });

  it('fails a 429 whose RetryInfo is over maxWaitHintMs over to the Claude backup at once (wait_hint), translated', async () => {
    const g = await gw(
      { gemini: gemini(() => json(429, GEMINI_429('29s'))), anthropic: { family: 'anthropic', answer: claude('from claude') } },
      [{ provider: 'gemini' }, { provider: 'anthropic', model: 'claude-sonnet-4-6' }],
    );
    const t0 = Date.now();
    const res = await chat(g);
    expect(Date.now() - t0).toBeLessThan(2_000);
    expect(res.data.choices[0]!.message.content).toBe('from claude');
    expect(res.data.model).toBe('claude-sonnet-4-6');
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('wait_hint');
    expect(g.seen.gemini).toHaveLength(1);
    expect(g.seen.anthropic).toHaveLength(1);
    expect(g.seen.anthropic![0]!.url).toBe('/v1/messages');
    expect(g.seen.anthropic![0]!.headers['x-api-key']).toBe('anthropic-key-0123456789');
  });

  it("retries a 503 'The model is overloaded' and, still overloaded, fails over to Claude (retries_exhausted)", async () => {
    const g = await gw(
      { gemini: gemini(() => json(503, GEMINI_503)), anthropic: { family: 'anthropic', answer: claude('claude took it') } },
      [{ provider: 'gemini' }, { provider: 'anthropic', model: 'claude-sonnet-4-6' }],
    );
    const res = await chat(g);
    expect(res.data.choices[0]!.message.content).toBe('claude took it');
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(g.seen.gemini).toHaveLength(2);
    expect(g.seen.anthropic).toHaveLength(1);
  });

  it("gives the SDK a lone 503 'The model is overloaded' in the OpenAI shape after the gateway's retries, x-should-retry false: 2 upstream, 1 SDK request", async () => {
    const g = await gw({ gemini: gemini(() => json(503, GEMINI_503)) }, [{ provider: 'gemini' }]);
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const err = await sdkError(client.chat.completions.create({ model: 'gemini-2.5-flash', messages }));
    expect(err.status).toBe(503);
    expect(err.message).toContain('The model is overloaded');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    // Google's numeric code goes on as a string, as the shape types it.
    expect((err.error as { code?: unknown }).code).toBe('503');
    expect(counter.requests).toBe(1);
    expect(g.seen.gemini).toHaveLength(2);
  });

  it('retries a 500 INTERNAL and is answered by the second attempt', async () => {
    const g = await gw({ gemini: gemini(failsThen(1, () => json(500, GEMINI_500), 'second time lucky')) }, [{ provider: 'gemini' }]);
    const res = await chat(g);
    expect(res.data.choices[0]!.message.content).toBe('second time lucky');
    expect(res.response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(g.seen.gemini).toHaveLength(2);
  });

  it('does not send a 500 INTERNAL to the backup when retryOn leaves 500 out (Gemini may have run it)', async () => {
    const g = await gw(
      { gemini: gemini(() => json(500, GEMINI_500)), openai: healthy('should not be asked') },
      [{ provider: 'gemini' }, { provider: 'openai', model: 'gpt-4o-mini' }],
      { route: { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5 }, retryOn: [429, 503, 'network'] } } },
    );
    const err = await sdkError(chat(g));
    expect(err.status).toBe(500);
    expect(err.message).toContain('An internal error has occurred');
    expect(g.seen.gemini).toHaveLength(1);
    expect(g.seen.openai).toHaveLength(0);
  });

  it("takes a 400 INVALID_ARGUMENT 'API key not valid' (reason API_KEY_INVALID) as the gateway's credentials: fails over, the client never blamed", async () => {
    const g = await gw({ gemini: gemini(() => json(400, GEMINI_BAD_KEY)), openai: healthy('from openai') }, [{ provider: 'gemini' }, { provider: 'openai', model: 'gpt-4o-mini' }]);
    const res = await chat(g);
    expect(res.data.choices[0]!.message.content).toBe('from openai');
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('credentials');
    // Held for its credentials: the next request skips Gemini.
    const again = await chat(g);
    expect(again.response.headers.get('x-stormgate-fallback')).toBe('credentials');
    expect(g.seen.gemini).toHaveLength(1);
    expect(g.seen.openai).toHaveLength(2);
  });

  it("answers a lone Gemini's API_KEY_INVALID with 502 upstream_auth_error, x-should-retry false, not Google's 400", async () => {
    const g = await gw({ gemini: gemini(() => json(400, GEMINI_BAD_KEY)) }, [{ provider: 'gemini' }]);
    const err = await sdkError(chat(g));
    expect(err.status).toBe(502);
    expect((err.error as { code?: string }).code).toBe('upstream_auth_error');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.headers?.get('retry-after')).toBeNull();
    expect(g.seen.gemini).toHaveLength(1);
  });

  it('passes an ordinary 400 INVALID_ARGUMENT (a bad field) to the client as its own error: not failed over, not retried', async () => {
    const g = await gw({ gemini: gemini(() => json(400, GEMINI_BAD_ARG)), openai: healthy('should not be asked') }, [{ provider: 'gemini' }, { provider: 'openai', model: 'gpt-4o-mini' }]);
    const err = await sdkError(chat(g));
    expect(err.status).toBe(400);
    expect(err.message).toContain('Invalid JSON payload received');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(g.seen.gemini).toHaveLength(1);
    expect(g.seen.openai).toHaveLength(0);
  });

  it("passes a safety block (finish_reason content_filter, empty content) through as Gemini's answer: not retried, not routed around", async () => {
    const g = await gw({ gemini: gemini(() => completion('', 'gemini-2.5-flash', 'content_filter')), openai: healthy('should not be asked') }, [{ provider: 'gemini' }, { provider: 'openai', model: 'gpt-4o-mini' }]);
    const res = await chat(g);
    expect(res.data.choices[0]!.finish_reason).toBe('content_filter');
    expect(res.data.choices[0]!.message.content).toBe('');
    expect(g.seen.gemini).toHaveLength(1);
    expect(g.seen.openai).toHaveLength(0);
  });

  it('streams a safety block that carries no output at all (role chunk, content_filter finish, [DONE]) to the SDK as it is, from Gemini alone', async () => {
    const g = await gw(
      { gemini: gemini(() => ({ steps: [gchunk({ role: 'assistant' }, 'content_filter'), DONE] })), openai: healthy('should not be asked') },
      [{ provider: 'gemini' }, { provider: 'openai', model: 'gpt-4o-mini' }],
    );
    const stream = await g.client.chat.completions.create({ model: 'gemini-2.5-flash', messages, stream: true });
    const finishes: Array<string | null> = [];
    let text = '';
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        text += c.delta.content ?? '';
        if (c.finish_reason) finishes.push(c.finish_reason);
      }
    }
    expect(text).toBe('');
    expect(finishes).toEqual(['content_filter']);
    expect(g.seen.gemini).toHaveLength(1);
    expect(g.seen.openai).toHaveLength(0);
  });

  it('streams text then a content_filter finish (the rest of the answer blocked) through whole', async () => {
    const g = await gw(
      { gemini: gemini(() => ({ steps: [gchunk({ role: 'assistant', content: 'The first part' }), gchunk({ content: '' }, 'content_filter'), DONE] })) },
      [{ provider: 'gemini' }],
    );
    const stream = await g.client.chat.completions.create({ model: 'gemini-2.5-flash', messages, stream: true });
    let text = '';
    let finish: string | null = null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    expect(text).toBe('The first part');
    expect(finish).toBe('content_filter');
  });

  it('retries a stream whose only event is an in-band error (Gemini overloaded after the 200) and streams the second attempt', async () => {
    const g = await gw(
      {
        gemini: gemini((_b, n) =>
          n === 1 ? { steps: [`data: ${JSON.stringify({ error: { code: 503, message: 'The model is overloaded. Please try again later.', status: 'UNAVAILABLE' } })}\n\n`] } : streamed('second stream'),
        ),
      },
      [{ provider: 'gemini' }],
    );
    const stream = await g.client.chat.completions.create({ model: 'gemini-2.5-flash', messages, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
    expect(text).toBe('second stream');
    expect(g.seen.gemini).toHaveLength(2);
  });

  it('retries a stream request answered with the list-shaped 503 (not SSE) and streams the second attempt', async () => {
    const g = await gw({ gemini: gemini(failsThen(1, () => json(503, GEMINI_503), 'streamed at last')) }, [{ provider: 'gemini' }]);
    const stream = await g.client.chat.completions.create({ model: 'gemini-2.5-flash', messages, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
    expect(text).toBe('streamed at last');
    expect(g.seen.gemini).toHaveLength(2);
  });

  it('ends a stream whose in-band error comes after the first text with an error the SDK raises, the text so far delivered', async () => {
    const err500 = `data: ${JSON.stringify({ error: { code: 500, message: 'An internal error has occurred.', status: 'INTERNAL' } })}\n\n`;
    const g = await gw({ gemini: gemini(() => ({ steps: [gchunk({ role: 'assistant', content: 'Half an ans' }), err500] })) }, [{ provider: 'gemini' }]);
    const stream = await g.client.chat.completions.create({ model: 'gemini-2.5-flash', messages, stream: true });
    let text = '';
    const failure = await (async () => {
      try {
        for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
      } catch (e) {
        return e;
      }
      return undefined;
    })();
    expect(text).toBe('Half an ans');
    expect(failure).toBeInstanceOf(OpenAI.APIError);
    expect(g.seen.gemini).toHaveLength(1);
  });

  it("opens Gemini's breaker after a run of 503s, so later requests go to Claude without touching Gemini", async () => {
    const g = await gw(
      { gemini: gemini(() => json(503, GEMINI_503)), anthropic: { family: 'anthropic', answer: claude('claude while gemini is down') } },
      [{ provider: 'gemini' }, { provider: 'anthropic', model: 'claude-sonnet-4-6' }],
      { providers: { gemini: { breaker: { consecutiveFailures: 4, openS: 30 } } } },
    );
    for (let i = 0; i < 3; i++) {
      await chat(g);
      await sleep(150);
    }
    const before = g.seen.gemini!.length;
    expect(before).toBeGreaterThanOrEqual(4);
    const res = await chat(g);
    expect(res.data.choices[0]!.message.content).toBe('claude while gemini is down');
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('breaker_open');
    expect(g.seen.gemini).toHaveLength(before);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('Azure OpenAI', () => {
  it('passes a content-filter 400 (innererror ResponsibleAIPolicyViolation) to the client as it came: no retry, no failover to OpenAI', async () => {
    const g = await gw({ azure: azure(() => json(400, AZURE_FILTER_400)), openai: healthy('should not be asked') }, [{ provider: 'azure', model: 'gpt-4o' }, { provider: 'openai', model: 'gpt-4o' }]);
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const err = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages }));
    expect(err.status).toBe(400);
    expect((err.error as { code?: string }).code).toBe('content_filter');
    expect(err.message).toContain("Azure OpenAI's content management policy");
    // Which category tripped is Azure's detail the client needs to tell the user.
    expect((err.error as { innererror?: { code?: string } }).innererror?.code).toBe('ResponsibleAIPolicyViolation');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(counter.requests).toBe(1);
    expect(g.seen.azure).toHaveLength(1);
    expect(g.seen.azure![0]!.url).toBe('/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21');
    expect(g.seen.openai).toHaveLength(0);
  });

  it('waits a 429 out by its retry-after-ms (250 ms), not its retry-after (1 s), and is answered on the retry', async () => {
    const g = await gw({ azure: azure(failsThen(1, () => json(429, AZURE_429, azure429Headers(250)), 'after 250 ms')) }, [{ provider: 'azure', model: 'gpt-4o' }]);
    const t0 = Date.now();
    const res = await chat(g, 'gpt-4o');
    const took = Date.now() - t0;
    expect(res.data.choices[0]!.message.content).toBe('after 250 ms');
    expect(took).toBeGreaterThanOrEqual(240);
    expect(took).toBeLessThan(950);
    expect(g.seen.azure).toHaveLength(2);
  });

  it('moves to OpenAI at once on a 429 with retry-after-ms 10000, and sends the next request straight there while Azure is held off', async () => {
    const g = await gw({ azure: azure(() => json(429, AZURE_429, azure429Headers(10_000))), openai: healthy('from openai') }, [{ provider: 'azure', model: 'gpt-4o' }, { provider: 'openai', model: 'gpt-4o' }], {
      route: { park: { maxQueue: 100 } },
    });
    const t0 = Date.now();
    const first = await chat(g, 'gpt-4o');
    expect(Date.now() - t0).toBeLessThan(1_500);
    expect(first.data.choices[0]!.message.content).toBe('from openai');
    const second = await chat(g, 'gpt-4o');
    expect(second.response.headers.get('x-stormgate-fallback')).toBe('held_off');
    expect(g.seen.azure).toHaveLength(1);
    expect(g.seen.openai).toHaveLength(2);
  });

  it('answers while Azure is held off with 429 provider_held_off, x-should-retry true and the remaining retry-after, when no other target can', async () => {
    const g = await gw({ azure: azure(() => json(429, AZURE_429, azure429Headers(10_000))) }, [{ provider: 'azure', model: 'gpt-4o' }], {
      route: { park: false, retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5 }, maxWaitHintMs: 2_000 } },
    });
    const first = await sdkError(chat(g, 'gpt-4o'));
    expect(first.status).toBe(429);
    const second = await sdkError(chat(g, 'gpt-4o'));
    expect(second.status).toBe(429);
    expect((second.error as { code?: string }).code).toBe('provider_held_off');
    expect(second.headers?.get('x-should-retry')).toBe('true');
    const retryAfter = Number(second.headers?.get('retry-after'));
    expect(retryAfter).toBeGreaterThanOrEqual(5);
    expect(retryAfter).toBeLessThanOrEqual(13);
    expect(g.seen.azure).toHaveLength(1);
  });

  it('tries the next target on DeploymentNotFound (a deployment the config named), never retried', async () => {
    const g = await gw({ azure: azure(() => json(404, AZURE_404)), openai: healthy('from openai') }, [{ provider: 'azure', model: 'gpt-4o-prod' }, { provider: 'openai', model: 'gpt-4o' }]);
    const res = await chat(g, 'gpt-4o');
    expect(res.data.choices[0]!.message.content).toBe('from openai');
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('error');
    expect(g.seen.azure).toHaveLength(1);
  });

  it('gives the client DeploymentNotFound for a deployment the client named itself: 404, not retried', async () => {
    const g = await gw({ azure: azure(() => json(404, AZURE_404)) }, [{ provider: 'azure' }]);
    const err = await sdkError(chat(g, 'my-typo-deployment'));
    expect(err.status).toBe(404);
    expect(err.message).toContain('The API deployment for this resource does not exist');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(g.seen.azure).toHaveLength(1);
    expect(g.seen.azure![0]!.url).toContain('/openai/deployments/my-typo-deployment/');
  });

  it("fails a 408 'The operation was timeout.' over to OpenAI (the provider's failure), not retried on Azure (408 is in no default retryOn)", async () => {
    const g = await gw({ azure: azure(() => json(408, AZURE_408)), openai: healthy('from openai') }, [{ provider: 'azure', model: 'gpt-4o' }, { provider: 'openai', model: 'gpt-4o' }]);
    const res = await chat(g, 'gpt-4o');
    expect(res.data.choices[0]!.message.content).toBe('from openai');
    expect(g.seen.azure).toHaveLength(1);
    expect(g.seen.openai).toHaveLength(1);
  });

  it("answers a lone Azure 408 with x-should-retry false, so the SDK (which retries 408s) sends it once", async () => {
    const g = await gw({ azure: azure(() => json(408, AZURE_408)) }, [{ provider: 'azure', model: 'gpt-4o' }]);
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const err = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages }));
    expect(err.status).toBe(408);
    expect(err.message).toContain('The operation was timeout.');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(counter.requests).toBe(1);
    expect(g.seen.azure).toHaveLength(1);
  });

  it('retries a 408 when the route lists it in retryOn, and is answered on the retry', async () => {
    const g = await gw({ azure: azure(failsThen(1, () => json(408, AZURE_408), 'took its time')) }, [{ provider: 'azure', model: 'gpt-4o' }], {
      route: { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5 }, retryOn: [408, 429, 503] } },
    });
    const res = await chat(g, 'gpt-4o');
    expect(res.data.choices[0]!.message.content).toBe('took its time');
    expect(g.seen.azure).toHaveLength(2);
    expect(g.seen.azure![1]!.headers['x-retry-reason']).toBe('status_408');
  });

  it("retries a 503 'The engine is currently overloaded' and is answered by the second attempt", async () => {
    const g = await gw({ azure: azure(failsThen(1, () => json(503, AZURE_503), 'engine back')) }, [{ provider: 'azure', model: 'gpt-4o' }]);
    const res = await chat(g, 'gpt-4o');
    expect(res.data.choices[0]!.message.content).toBe('engine back');
    expect(g.seen.azure).toHaveLength(2);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe("OpenAI's rarer answers", () => {
  it("retries a 500 'The server had an error while processing your request' and is answered on the retry (x-retry-reason status_500)", async () => {
    const g = await gw({ openai: failsThen(1, () => json(500, OPENAI_500), 'fine now') }, [{ provider: 'openai' }]);
    const res = await chat(g, 'gpt-4o');
    expect(res.data.choices[0]!.message.content).toBe('fine now');
    expect(g.seen.openai).toHaveLength(2);
    expect(g.seen.openai![1]!.headers['x-retry-reason']).toBe('status_500');
    expect(g.seen.openai![1]!.headers['x-retry-attempt']).toBe('1');
  });

  it('gives the SDK a lasting 500 with its message and x-should-retry false: 2 upstream requests, 1 SDK request', async () => {
    const g = await gw({ openai: () => json(500, OPENAI_500) }, [{ provider: 'openai' }]);
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const err = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages }));
    expect(err.status).toBe(500);
    expect(err.message).toContain('The server had an error while processing your request');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(counter.requests).toBe(1);
    expect(g.seen.openai).toHaveLength(2);
  });

  it("retries a 503 'The engine is currently overloaded' and, still overloaded, fails over to Azure (retries_exhausted)", async () => {
    const g = await gw({ openai: () => json(503, OPENAI_503), azure: azure(healthy('from azure')) }, [{ provider: 'openai' }, { provider: 'azure', model: 'gpt-4o' }]);
    const res = await chat(g, 'gpt-4o');
    expect(res.data.choices[0]!.message.content).toBe('from azure');
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(g.seen.openai).toHaveLength(2);
    expect(g.seen.azure).toHaveLength(1);
  });

  const quotaEvent = (seq: number) =>
    `event: error\ndata: ${JSON.stringify({ type: 'error', sequence_number: seq, error: { type: 'insufficient_quota', code: 'insufficient_quota', message: QUOTA_MESSAGE, param: null } })}\n\n`;
  const quotaStream: Answer = () => ({ steps: [rev('response.created', { response: baseResponse('in_progress') }, 0), rev('response.in_progress', { response: baseResponse('in_progress') }, 1), quotaEvent(2)] });

  it('takes a Responses stream\'s insufficient_quota after response.created as the gateway\'s billing: 502 upstream_auth_error, x-should-retry false, never retried', async () => {
    const g = await gw({ openai: quotaStream }, [{ provider: 'openai' }], { path: '/v1/responses' });
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const err = await sdkError(
      (async () => {
        const stream = await client.responses.create({ model: 'gpt-4.1', input: 'hi', stream: true });
        for await (const _ of stream);
      })(),
    );
    expect(err.status).toBe(502);
    expect((err.error as { code?: string }).code).toBe('upstream_auth_error');
    expect(err.message).not.toContain('You exceeded your current quota');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.headers?.get('retry-after')).toBeNull();
    expect(counter.requests).toBe(1);
    expect(g.seen.openai).toHaveLength(1);
  });

  it("fails a Responses stream's insufficient_quota over to Azure's v1 surface (credentials), and the next request skips OpenAI", async () => {
    const g = await gw({ openai: quotaStream, azure: azure(responseAnswer('from azure')) }, [{ provider: 'openai' }, { provider: 'azure', model: 'gpt-4.1' }], { path: '/v1/responses' });
    const first = await g.client.responses.create({ model: 'gpt-4.1', input: 'hi', stream: true }).withResponse();
    let text = '';
    for await (const ev of first.data) if (ev.type === 'response.output_text.delta') text += ev.delta;
    expect(text).toBe('from azure');
    expect(first.response.headers.get('x-stormgate-fallback')).toBe('credentials');
    expect(g.seen.azure![0]!.url).toBe('/openai/v1/responses');
    const second = await g.client.responses.create({ model: 'gpt-4.1', input: 'again' }).withResponse();
    expect(second.data.output_text).toBe('from azure');
    expect(second.response.headers.get('x-stormgate-fallback')).toBe('credentials');
    expect(g.seen.openai).toHaveLength(1);
    expect(g.seen.azure).toHaveLength(2);
  });

  it('passes a Responses 400 invalid_prompt to the client as it came: not retried, not failed over to Azure', async () => {
    const g = await gw({ openai: () => json(400, { error: INVALID_PROMPT }), azure: azure(responseAnswer('should not be asked')) }, [{ provider: 'openai' }, { provider: 'azure', model: 'o3' }], {
      path: '/v1/responses',
    });
    const err = await sdkError(g.client.responses.create({ model: 'o3', input: 'how do I...' }));
    expect(err.status).toBe(400);
    expect((err.error as { code?: string }).code).toBe('invalid_prompt');
    expect(err.message).toContain('flagged as potentially violating our usage policy');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(g.seen.openai).toHaveLength(1);
    expect(g.seen.azure).toHaveLength(0);
  });

  it("answers a Responses stream's response.failed with invalid_prompt after response.created as the 400 it stands for: not retried, not failed over", async () => {
    const failed = { ...baseResponse('failed'), error: { code: 'invalid_prompt', message: INVALID_PROMPT.message } };
    const g = await gw(
      {
        openai: () => ({ steps: [rev('response.created', { response: baseResponse('in_progress') }, 0), rev('response.in_progress', { response: baseResponse('in_progress') }, 1), rev('response.failed', { response: failed }, 2)] }),
        azure: azure(responseAnswer('should not be asked')),
      },
      [{ provider: 'openai' }, { provider: 'azure', model: 'o3' }],
      { path: '/v1/responses' },
    );
    const err = await sdkError(
      (async () => {
        const stream = await g.client.responses.create({ model: 'o3', input: 'how do I...', stream: true });
        for await (const _ of stream);
      })(),
    );
    expect(err.status).toBe(400);
    expect((err.error as { code?: string }).code).toBe('invalid_prompt');
    expect(g.seen.openai).toHaveLength(1);
    expect(g.seen.azure).toHaveLength(0);
  });

  it("logs the failed attempts' reasons for a 503 that moved to Azure (the operator's view of the incident)", async () => {
    const g = await gw({ openai: () => json(503, OPENAI_503), azure: azure(healthy('from azure')) }, [{ provider: 'openai' }, { provider: 'azure', model: 'gpt-4o' }]);
    await chat(g, 'gpt-4o');
    const line = await requestLine(g.s);
    expect(JSON.stringify(line)).toContain('503');
    expect(line.attempts).toHaveLength(3);
  });
});
