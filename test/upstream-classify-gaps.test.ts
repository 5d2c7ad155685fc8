// Three upstream answers the outcome table used to read wrong, each driven with the official `openai` SDK through a
// real gateway against scripted providers (node:http servers on 127.0.0.1): Groq's 498 `capacity_exceeded` with a
// `retry-after` (Groq's flex tier at capacity: its hint now holds that tier of the target off, and only it), Gemini's 400
// FAILED_PRECONDITION "User location is not supported for the API use." (the gateway's deployment, not the client's
// request: the 403 it stands for), and a content-policy 403 on a passthrough path (a content refusal, not the gateway's
// credentials), each as the provider sends it on the wire.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { expectOpenAIError, sdkError } from './helpers/openai-error.ts';
import { completion, healthy, json, scripted, type Answer, type Seen } from './helpers/scripted-provider.ts';
import { countingClient, metricSum, useStacks } from './helpers/stack.ts';
import { FAST, useScriptedUpstreams, type UpstreamsGateway } from './helpers/scripted-upstreams.ts';

const startStack = useStacks();
const startProvider = useFakeProviders();

const messages = [{ role: 'user' as const, content: 'Summarise the incident report.' }];

const gw = useScriptedUpstreams();
type Gw = UpstreamsGateway;

const chat = (g: Gw, model: string) => g.client.chat.completions.create({ model, messages }).withResponse();
/** The same request on a service tier (`flex`: Groq's batch tier; `on_demand`, Groq's default, is not in the SDK's types). */
const onTier = (g: Gw, model: string, tier: string) =>
  g.client.chat.completions.create({ model, messages, service_tier: tier as 'flex' }).withResponse();

// ---------------------------------------------------------------------------------------------------------------
/** Groq's 498 on the flex service tier: the tier is at capacity and the request was not processed. */
const GROQ_498 = {
  error: { message: 'Flex tier capacity exceeded. This is a known issue and we are working on it. Please try again later.', type: 'invalid_request_error', code: 'capacity_exceeded' },
};

describe("Groq's 498 capacity_exceeded with retry-after", () => {
  it('holds Groq off for the hint, as a 503 would: the next flex request goes straight to the backup (held_off)', async () => {
    const g = await gw({ groq: () => json(498, GROQ_498, { 'retry-after': '5' }), together: healthy('from together') }, [
      { provider: 'groq', model: 'llama-3.3-70b-versatile' },
      { provider: 'together', model: 'meta-llama/Llama-3.3-70B-Instruct-Turbo' },
    ]);
    const first = await onTier(g, 'llama-70b', 'flex');
    expect(first.data.choices[0]!.message.content).toBe('from together');
    const second = await onTier(g, 'llama-70b', 'flex');
    expect(second.data.choices[0]!.message.content).toBe('from together');
    expect(second.response.headers.get('x-stormgate-fallback')).toBe('held_off');
    // The overloaded target was asked once, not once per request during the window it named.
    expect(g.seen.groq).toHaveLength(1);
    expect(g.seen.together).toHaveLength(2);
  });

  it('answers a lone Groq held off by its 498 with 429 provider_held_off and the remaining retry-after, without asking it again', async () => {
    const g = await gw({ groq: () => json(498, GROQ_498, { 'retry-after': '5' }) }, [{ provider: 'groq', model: 'llama-3.3-70b-versatile' }]);
    const { client, counter } = countingClient(g.s, { maxRetries: 0 });
    const first = await sdkError(client.chat.completions.create({ model: 'llama-70b', messages, service_tier: 'flex' }));
    expect(first.status).toBe(498);
    expect((first.error as { code?: string }).code).toBe('capacity_exceeded');
    // Told the wait to the hold-off's end, and not invited back by the SDK: the gateway answers that wait itself.
    expect(Number(first.headers?.get('retry-after'))).toBeGreaterThanOrEqual(5);
    expect(first.headers?.get('x-should-retry')).toBe('false');
    const second = await sdkError(client.chat.completions.create({ model: 'llama-70b', messages, service_tier: 'flex' }));
    expect(second.status).toBe(429);
    expect((second.error as { code?: string }).code).toBe('provider_held_off');
    const retryAfter = Number(second.headers?.get('retry-after'));
    expect(retryAfter).toBeGreaterThanOrEqual(1);
    // The hold-off's spread (a tenth) and the request's own (up to a second).
    expect(retryAfter).toBeLessThanOrEqual(7);
    expect(counter.requests).toBe(2);
    expect(g.seen.groq).toHaveLength(1);
  });

  it('starts no hold-off on a 498 that is not capacity_exceeded (another meaning of the status): the next request asks Groq again', async () => {
    const other = { error: { message: 'Invalid token.', type: 'invalid_request_error', code: 'invalid_token' } };
    const g = await gw({ groq: () => json(498, other, { 'retry-after': '5' }), together: healthy('should not be asked') }, [
      { provider: 'groq', model: 'llama-3.3-70b-versatile' },
      { provider: 'together', model: 'meta-llama/Llama-3.3-70B-Instruct-Turbo' },
    ]);
    expect((await sdkError(onTier(g, 'llama-70b', 'flex'))).status).toBe(498);
    expect((await sdkError(onTier(g, 'llama-70b', 'flex'))).status).toBe(498);
    expect(g.seen.groq).toHaveLength(2);
    expect(g.seen.together).toHaveLength(0);
  });
});


/** Groq as it serves two tiers: its flex tier full (498 with retry-after), its on-demand tier answering. */
const groqFlexFull =
  (retryAfter = '5'): Answer =>
  (body) =>
    body.service_tier === 'flex' ? json(498, GROQ_498, { 'retry-after': retryAfter }) : completion('from groq', 'llama-3.3-70b-versatile');

describe("Groq's 498 holds off its flex tier only", () => {
  const targets = [
    { provider: 'groq', model: 'llama-3.3-70b-versatile' },
    { provider: 'together', model: 'meta-llama/Llama-3.3-70B-Instruct-Turbo' },
  ];

  it('sends default-tier requests (no service_tier, auto, on_demand) to Groq while its flex tier is held off; a second flex request goes to the backup', async () => {
    const g = await gw({ groq: groqFlexFull(), together: healthy('from together') }, targets);
    const batch = await onTier(g, 'llama-70b', 'flex');
    expect(batch.data.choices[0]!.message.content).toBe('from together');
    // Online traffic on the same target: Groq's on-demand tier has room, and nothing the flex tier said holds it.
    const online = await chat(g, 'llama-70b');
    expect(online.data.choices[0]!.message.content).toBe('from groq');
    expect(online.response.headers.get('x-stormgate-fallback')).toBeNull();
    for (const tier of ['auto', 'on_demand']) {
      const res = await onTier(g, 'llama-70b', tier);
      expect(res.data.choices[0]!.message.content, tier).toBe('from groq');
    }
    const batch2 = await onTier(g, 'llama-70b', 'flex');
    expect(batch2.data.choices[0]!.message.content).toBe('from together');
    expect(batch2.response.headers.get('x-stormgate-fallback')).toBe('held_off');
    // Groq: the first flex request, then the three default-tier ones; the second flex request never went.
    expect(g.seen.groq!.map((s) => s.body.service_tier ?? 'none')).toEqual(['flex', 'none', 'auto', 'on_demand']);
  });

  it('answers a flex request 429 provider_held_off when Groq is the only target, and a default-tier request from Groq', async () => {
    const g = await gw({ groq: groqFlexFull() }, [targets[0]!]);
    expect((await sdkError(onTier(g, 'llama-70b', 'flex'))).status).toBe(498);
    const online = await chat(g, 'llama-70b');
    expect(online.data.choices[0]!.message.content).toBe('from groq');
    const held = await sdkError(onTier(g, 'llama-70b', 'flex'));
    expect(held.status).toBe(429);
    expect((held.error as { code?: string }).code).toBe('provider_held_off');
    expect(held.message).toContain('flex');
    expect(g.seen.groq).toHaveLength(2);
  });

  it('opens no breaker for the default tier however often the flex tier is full, and cuts none of its limit', async () => {
    // Without retry-after (no hold-off): every flex request asks Groq and is refused.
    const g = await gw({ groq: (body) => (body.service_tier === 'flex' ? json(498, GROQ_498) : completion('from groq', 'llama-3.3-70b-versatile')), together: healthy('from together') }, targets, {
      provider: { breaker: { consecutiveFailures: 2, minRequests: 2, failureRate: 0.5, openS: 30 } },
    });
    for (let i = 0; i < 4; i++) expect((await onTier(g, 'llama-70b', 'flex')).data.choices[0]!.message.content).toBe('from together');
    const online = await chat(g, 'llama-70b');
    expect(online.data.choices[0]!.message.content).toBe('from groq');
    expect(online.response.headers.get('x-stormgate-fallback')).toBeNull();
    expect(g.seen.groq).toHaveLength(5);
  });

  it('parks a flex request for the flex tier without holding up default-tier requests, and releases it when the hold-off ends', async () => {
    let flexAsked = 0;
    const g = await gw(
      { groq: (body) => (body.service_tier === 'flex' && ++flexAsked === 1 ? json(498, GROQ_498, { 'retry-after': '1' }) : completion(`from groq ${String(body.service_tier ?? 'default')}`, 'llama-3.3-70b-versatile')) },
      [targets[0]!],
      { route: { park: { maxQueue: 10 } } },
    );
    expect((await sdkError(onTier(g, 'llama-70b', 'flex'))).status).toBe(498);
    const startedAt = Date.now();
    const parked = onTier(g, 'llama-70b', 'flex');
    // While the flex request waits in the lot, online requests do not queue behind it.
    const online = await chat(g, 'llama-70b');
    expect(online.data.choices[0]!.message.content).toBe('from groq default');
    expect(Date.now() - startedAt).toBeLessThan(900);
    const released = await parked;
    expect(released.data.choices[0]!.message.content).toBe('from groq flex');
    expect(Date.now() - startedAt).toBeGreaterThanOrEqual(500);
    expect(g.seen.groq!.map((s) => s.body.service_tier ?? 'none')).toEqual(['flex', 'none', 'flex']);
    // Only the flex request went through the lot: the online one never queued behind it (in one queue, it parked
    // behind the flex request and was let go past it).
    expect(await metricSum(g.s, 'stormgate_park_outcomes_total{route="chat",outcome="released"}')).toBe(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
const LOCATION = 'User location is not supported for the API use.';
/** As Gemini's OpenAI-compatible endpoint answers it: a one-element list of Google API errors. */
const GEMINI_LOCATION_LIST = [{ error: { code: 400, message: LOCATION, status: 'FAILED_PRECONDITION' } }];
/** As Google's native API (and a proxy that unwraps the list) answers it. */
const GEMINI_LOCATION_OBJECT = { error: { code: 400, message: LOCATION, status: 'FAILED_PRECONDITION' } };
const gemini = (answer: Answer) => ({ answer, path: '/v1beta/openai' });

describe("Gemini's 400 FAILED_PRECONDITION 'User location is not supported'", () => {
  it('fails over to the backup without retrying Gemini, and holds Gemini like refused credentials: the next request skips it', async () => {
    const g = await gw({ gemini: gemini(() => json(400, GEMINI_LOCATION_LIST)), openai: healthy('from openai') }, [
      { provider: 'gemini', model: 'gemini-2.5-flash' },
      { provider: 'openai', model: 'gpt-4o-mini' },
    ]);
    const first = await chat(g, 'flash');
    expect(first.data.choices[0]!.message.content).toBe('from openai');
    expect(first.response.headers.get('x-stormgate-fallback')).toBe('credentials');
    const second = await chat(g, 'flash');
    expect(second.data.choices[0]!.message.content).toBe('from openai');
    expect(second.response.headers.get('x-stormgate-fallback')).toBe('credentials');
    expect(g.seen.gemini).toHaveLength(1);
    expect(g.seen.openai).toHaveLength(2);
  });

  it('reads the object form of the same error the same way', async () => {
    const g = await gw({ gemini: gemini(() => json(400, GEMINI_LOCATION_OBJECT)), openai: healthy('from openai') }, [
      { provider: 'gemini', model: 'gemini-2.5-flash' },
      { provider: 'openai', model: 'gpt-4o-mini' },
    ]);
    const res = await chat(g, 'flash');
    expect(res.data.choices[0]!.message.content).toBe('from openai');
    expect(g.seen.gemini).toHaveLength(1);
  });

  it("never tells the client to fix its request: a lone Gemini's refusal is 502 upstream_auth_error, not Google's 400", async () => {
    const g = await gw({ gemini: gemini(() => json(400, GEMINI_LOCATION_LIST)) }, [{ provider: 'gemini', model: 'gemini-2.5-flash' }]);
    const err = await sdkError(chat(g, 'flash'));
    expect(err.status).toBe(502);
    expect((err.error as { code?: string }).code).toBe('upstream_auth_error');
    expect(err.message).not.toContain('User location');
    // The operator is sent to the deployment's location, not to the key.
    expect(err.message).toContain('unsupported_country_region_territory');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.headers?.get('retry-after')).toBeNull();
    expect(g.seen.gemini).toHaveLength(1);
  });

  it('names the location, not the key or the billing, to the requests that find Gemini under the hold it started', async () => {
    const g = await gw({ gemini: gemini(() => json(400, GEMINI_LOCATION_LIST)) }, [{ provider: 'gemini', model: 'gemini-2.5-flash' }]);
    expect((await sdkError(chat(g, 'flash'))).status).toBe(502);
    const held = await sdkError(chat(g, 'flash'));
    expect(held.status).toBe(502);
    expect((held.error as { code?: string }).code).toBe('upstream_auth_error');
    expect(held.message).toMatch(/is not used for another \d+ s/);
    expect(held.message).toContain('unsupported_country_region_territory');
    expect(held.message).toContain('location');
    expect(held.message).not.toContain('credentials or billing');
    expect(held.message).not.toContain('User location');
    expect(g.seen.gemini).toHaveLength(1);
  });

  it("names the location in the note on a held Gemini that a failed backup's answer carries", async () => {
    const g = await gw({ gemini: gemini(() => json(400, GEMINI_LOCATION_LIST)), openai: () => json(500, { error: { message: 'boom', type: 'server_error', code: null } }) }, [
      { provider: 'gemini', model: 'gemini-2.5-flash' },
      { provider: 'openai', model: 'gpt-4o-mini' },
    ]);
    expect((await sdkError(chat(g, 'flash'))).status).toBe(500);
    const held = await sdkError(chat(g, 'flash'));
    expect(held.message).toContain('gemini/gemini-2.5-flash (held for');
    expect(held.message).toContain('the provider refused the location the gateway calls from');
    expect(g.seen.gemini).toHaveLength(1);
  });

  it('still says credentials or billing to the requests held after a refused key', async () => {
    const g = await gw({ gemini: gemini(() => json(401, { error: { message: 'Incorrect API key provided.', type: 'invalid_request_error', code: 'invalid_api_key' } })) }, [
      { provider: 'gemini', model: 'gemini-2.5-flash' },
    ]);
    expect((await sdkError(chat(g, 'flash'))).status).toBe(502);
    const held = await sdkError(chat(g, 'flash'));
    expect(held.message).toContain("rejected the gateway's credentials or billing");
    expect(held.message).not.toContain('location');
  });

  it('still passes on a FAILED_PRECONDITION about the request itself (a file not yet ACTIVE) as the 400 it is', async () => {
    const notActive = [{ error: { code: 400, message: 'The File abc123 is not in an ACTIVE state and usage is not allowed.', status: 'FAILED_PRECONDITION' } }];
    const g = await gw({ gemini: gemini(() => json(400, notActive)), openai: healthy('should not be asked') }, [
      { provider: 'gemini', model: 'gemini-2.5-flash' },
      { provider: 'openai', model: 'gpt-4o-mini' },
    ]);
    const err = await sdkError(chat(g, 'flash'));
    expect(err.status).toBe(400);
    expect(err.message).toContain('not in an ACTIVE state');
    expect(g.seen.openai).toHaveLength(0);
  });
});

// ---------------------------------------------------------------------------------------------------------------
const OPENROUTER_MODERATION = {
  error: {
    code: 403,
    message: 'openai/gpt-4o requires moderation on OpenAI. Your input was flagged for "violence/graphic". No credits were charged.',
    metadata: { reasons: ['violence/graphic'], flagged_input: 'describe the crash scene in...', provider_name: 'OpenAI', model_slug: 'openai/gpt-4o' },
  },
  user_id: 'user_2x9',
};
const XAI_CONTENT_403 = { code: 'permission-denied', error: 'Content violates usage guidelines. Failed check: SAFETY_CHECK_TYPE_CSAM' };
/** A credentials 403 that quotes the key it was sent, as some providers' do. */
const KEY_403 = { error: { message: 'Project does not have access to this model with key images-key-0123456789.', type: 'invalid_request_error', param: null, code: 'model_not_found' } };

/** A gateway whose passthrough forwards POST /v1/images/generations to a provider that answers `status` with `body`. */
async function imagesPassthrough(status: number, body: unknown): Promise<{ client: OpenAI; seen: Seen[] }> {
  const seen: Seen[] = [];
  const p = await startProvider(scripted(() => json(status, body), seen));
  const s = await startStack({
    config: () => ({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: { images: { family: 'openai', baseUrl: `${p.origin}/v1`, apiKey: 'images-key-0123456789', breaker: false } },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'images' }], ...FAST }],
      passthrough: { provider: 'images', paths: ['/v1/images/generations'], methods: ['POST'] },
    }),
  });
  return { seen, client: new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0 }) };
}

describe('a passthrough 403', () => {
  it("passes OpenRouter's moderation 403 to the client as the content refusal it is, in the OpenAI shape", async () => {
    const { client, seen } = await imagesPassthrough(403, OPENROUTER_MODERATION);
    const err = await sdkError(client.images.generate({ model: 'openai/gpt-image-1', prompt: 'a crash scene' }));
    expect(err.status).toBe(403);
    expect(err.message).toContain('Your input was flagged');
    expect((err.error as { metadata?: { reasons?: string[] } }).metadata?.reasons).toEqual(['violence/graphic']);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(seen).toHaveLength(1);
  });

  it("passes xAI's 'Content violates usage guidelines' 403 on as an OpenAI-shaped content refusal", async () => {
    const { client } = await imagesPassthrough(403, XAI_CONTENT_403);
    const err = await sdkError(client.images.generate({ model: 'grok-2-image', prompt: 'something refused' }));
    expect(err.status).toBe(403);
    expect(err.message).toContain('Content violates usage guidelines');
    expect(typeof (err.error as { type?: unknown }).type).toBe('string');
  });

  it("keeps a credentials 403 the gateway's upstream_auth_error, with its own message: never the provider's body", async () => {
    const { client } = await imagesPassthrough(403, KEY_403);
    const err = await sdkError(client.images.generate({ model: 'gpt-image-1', prompt: 'a lighthouse' }));
    expect(err.status).toBe(502);
    expectOpenAIError(err.error === undefined ? {} : { error: err.error }, 'upstream_auth_error', 'server_error');
    expect(err.message).not.toContain('Project does not have access');
    expect(err.message).not.toContain('images-key-0123456789');
    expect(err.headers?.get('x-should-retry')).toBe('false');
  });
});
