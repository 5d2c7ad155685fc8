// The gateway's own account refused inside a 2xx: OpenAI's Responses API starts a stream (`response.created`) and only
// then sends `insufficient_quota` as an `event: error`, Anthropic sends `billing_error` as a stream `error` event, and
// some routers answer a whole error object with a 200. Read as a broken answer, each was retried on the same target and
// counted as a breaker failure (the breaker opened after five). It is the 429, 401 or 403 it stands for: the credentials path,
// one attempt, the next target at once, and the target held for authHoldS.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import type { RequestListener } from 'node:http';
import { accountStatusOfError, classify } from '../src/policy/outcome.ts';
import { eventStream, useFakeProviders, type FakeProvider } from './helpers/fake-provider.ts';
import { defaultConfig, useStacks, type Stack } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();

const QUOTA = { message: 'You exceeded your current quota, please check your plan and billing details.', type: 'insufficient_quota', param: null, code: 'insufficient_quota' };

/**
 * A provider `broke` with `handler` as the first target of every route, then the healthy mock unless `alone`. The
 * breaker and the budget stay at their defaults: a breaker that opens on these answers is part of what is checked.
 */
async function stack(handler: RequestListener, family: 'openai' | 'anthropic' = 'openai', alone = false): Promise<{ s: Stack; broke: FakeProvider }> {
  const broke = await startProvider(handler);
  const s = await startStack({
    config: (mockUrl) => {
      const base = defaultConfig(mockUrl, { route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } } });
      const baseUrl = family === 'openai' ? `${broke.origin}/v1` : broke.origin;
      return {
        ...base,
        providers: { ...base.providers, broke: { family, baseUrl, apiKey: 'broke-key' } },
        routes: base.routes
          .filter((r) => family === 'openai' || r.match.path === '/v1/chat/completions')
          // Behind an Anthropic first target the OpenAI-family mock names its model (the config asks for it).
          .map((r) => ({ ...r, targets: alone ? [{ provider: 'broke' }] : [{ provider: 'broke' }, { provider: 'mock', ...(family === 'anthropic' && { model: 'gpt-4o' }) }] })),
      };
    },
  });
  return { s, broke };
}

const sdk = (s: Stack) => new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
const messages = [{ role: 'user' as const, content: 'hi' }];

async function metricsText(s: Stack): Promise<string> {
  return (await fetch(`${s.url}/metrics`)).text();
}

describe('an error that names the gateway\'s own account, inside a 2xx', () => {
  it('is the 429, 401 or 403 it stands for, by code or by type; any other error is not', () => {
    expect(accountStatusOfError('insufficient_quota', undefined)).toBe(429);
    expect(accountStatusOfError(undefined, 'billing_not_active')).toBe(429);
    expect(accountStatusOfError('invalid_api_key', undefined)).toBe(401);
    expect(accountStatusOfError(undefined, 'authentication_error')).toBe(401);
    expect(accountStatusOfError(undefined, 'permission_error')).toBe(403);
    // Anthropic's own, as a /v1/messages route passes it on untranslated.
    expect(accountStatusOfError(undefined, 'billing_error')).toBe(402);
    expect(classify({ kind: 'http', status: 402, errorCode: 'billing_error', hint: undefined }).cls).toBe('credentials');
    expect(accountStatusOfError('rate_limit_exceeded', 'requests')).toBeUndefined();
    expect(accountStatusOfError('server_error', undefined)).toBeUndefined();
    expect(classify({ kind: 'http', status: 429, errorCode: 'insufficient_quota', hint: undefined }).cls).toBe('credentials');
  });

  it('a Responses API stream that sends insufficient_quota after response.created fails over at once and holds the target', async () => {
    const { s, broke } = await stack(
      eventStream((res) => {
        res.write(`event: response.created\ndata: ${JSON.stringify({ type: 'response.created', sequence_number: 0, response: { id: 'resp_1', object: 'response', status: 'in_progress', output: [] } })}\n\n`);
        res.end(`event: error\ndata: ${JSON.stringify({ type: 'error', sequence_number: 1, code: QUOTA.code, message: QUOTA.message, param: null })}\n\n`);
      }),
    );
    for (let i = 0; i < 2; i++) {
      const { data: stream, response } = await sdk(s).responses.create({ model: 'gpt-4o', input: 'hi', stream: true }).withResponse();
      let text = '';
      for await (const ev of stream) if (ev.type === 'response.output_text.delta') text += ev.delta;
      expect(text).not.toBe('');
      expect(response.headers.get('x-stormgate-fallback')).toBe('credentials');
      expect(response.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
    }
    // One attempt, not maxAttempts; the second request skipped the held target.
    expect(broke.hits()).toBe(1);
    expect(await metricsText(s)).toMatch(/^stormgate_credentials_held\{target="broke\/gpt-4o"\} 1$/m);
  });

  it('a chat stream whose first event is an insufficient_quota error never opens the breaker, however many requests meet it', async () => {
    const { s, broke } = await stack(
      eventStream((res) => {
        res.write(`data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }] })}\n\n`);
        res.end(`data: ${JSON.stringify({ error: QUOTA })}\n\n`);
      }),
    );
    for (let i = 0; i < 6; i++) {
      const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true });
      let text = '';
      for await (const c of stream) text += c.choices[0]?.delta?.content ?? '';
      expect(text).toMatch(/Mock answer/);
    }
    expect(broke.hits()).toBe(1);
    const text = await metricsText(s);
    expect(text).toMatch(/^stormgate_breaker_state\{target="broke\/gpt-4o"\} 0$/m);
    expect(text).toMatch(/^stormgate_credentials_held\{target="broke\/gpt-4o"\} 1$/m);
  });

  it('an Anthropic billing_error event before the first output is answered 502 upstream_auth_error after one attempt', async () => {
    const ev = (type: string, data: object) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
    const { s, broke } = await stack(
      eventStream((res) => {
        res.write(ev('message_start', { message: { id: 'msg_1', type: 'message', role: 'assistant', model: 'claude-x', content: [], stop_reason: null, usage: { input_tokens: 3, output_tokens: 1 } } }));
        res.end(ev('error', { error: { type: 'billing_error', message: 'Your credit balance is too low to access the Anthropic API.' } }));
      }),
      'anthropic',
      true,
    );
    for (let i = 0; i < 2; i++) {
      const err = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(OpenAI.APIError);
      const e = err as InstanceType<typeof OpenAI.APIError>;
      expect(e.status).toBe(502);
      expect(e.code).toBe('upstream_auth_error');
      expect(e.headers?.get('x-should-retry')).toBe('false');
      // The provider's own words stay out of it, as for the same answer given as a status.
      expect(e.message).not.toMatch(/credit balance/);
    }
    expect(broke.hits()).toBe(1);
  });

  it.each([
    { name: 'an insufficient_quota error object', family: 'openai' as const, body: { error: QUOTA } },
    { name: "Anthropic's billing_error", family: 'anthropic' as const, body: { type: 'error', error: { type: 'billing_error', message: 'Your credit balance is too low to access the Anthropic API.' } } },
  ])('$name answered whole with a 200 fails over at once and holds the target', async ({ family, body }) => {
    const { s, broke } = await stack((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify(body));
      });
    }, family);
    for (let i = 0; i < 2; i++) {
      const { data, response } = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
      expect(data.choices[0]!.message.content).toMatch(/Mock answer/);
      expect(response.headers.get('x-stormgate-fallback')).toBe('credentials');
    }
    expect(broke.hits()).toBe(1);
  });

  it('a quota refused after the first output ends that stream with the error, and holds the target for the next requests', async () => {
    const chunk = (delta: Record<string, unknown>) => `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta, finish_reason: null }] })}\n\n`;
    const { s, broke } = await stack(
      eventStream((res) => {
        res.write(chunk({ role: 'assistant', content: '' }) + chunk({ content: 'Half an ans' }));
        res.end(`data: ${JSON.stringify({ error: QUOTA })}\n\n`);
      }),
    );
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    let text = '';
    const err = await (async () => {
      for await (const c of stream) text += c.choices[0]?.delta?.content ?? '';
    })().catch((e: unknown) => e);
    expect(text).toBe('Half an ans');
    expect(err).toBeInstanceOf(OpenAI.APIError);
    // The next request does not meet the refusal again: the held target is skipped.
    const { response } = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(response.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
    expect(broke.hits()).toBe(1);
    expect(await metricsText(s)).toMatch(/^stormgate_credentials_held\{target="broke\/gpt-4o"\} 1$/m);
  });
});
