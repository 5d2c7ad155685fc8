// Adversarial multi-tenant review (2026-12-07, b): what one client's requests can make the gateway do to everyone
// else's. Found: OpenAI's 403 `model_not_found` ("Project `proj_...` does not have access to model `...`": a model the
// gateway's key may not use) is read as the gateway's credentials refused and holds the target for authHoldS,
// fleet-wide. For a learned model that holds that model alone; but for a name under `<provider>/other` (past the 32
// learned names, or a name unfit for a label) it held the key every such model shares: one client's request for a
// model its provider key cannot use turned every other tenant's unlisted models away with 502 upstream_auth_error for
// 60 s. Fixed in src/pipeline/record-outcome.ts: a refusal of the model alone does not hold the shared key.
// Also pinned: a client's context_length_exceeded never opens the shared breaker, and a credential hold is per target
// (provider and model), never the whole provider.
import { describe, expect, it } from 'vitest';
import { MAX_LEARNED_MODELS } from '../src/routing/target-keys.ts';
import { useScriptedUpstreams, type UpstreamsGateway } from './helpers/scripted-upstreams.ts';
import type { Script } from './helpers/scripted-provider.ts';

const start = useScriptedUpstreams();
const json = (status: number, body: unknown): Script => ({ status, headers: { 'content-type': 'application/json' }, steps: [JSON.stringify(body)] });
/** A model the gateway's project may not use gets OpenAI's 403; WAF words get the 403 a firewall in front sends. */
const NO_ACCESS = new Set(['o1-pro', 'gpt-4o-realtime preview']);
function provider(body: Record<string, unknown>): Script {
  const model = String(body.model);
  const text = JSON.stringify(body.messages);
  if (NO_ACCESS.has(model)) return json(403, { error: { message: `Project \`proj_abc\` does not have access to model \`${model}\``, type: 'invalid_request_error', param: null, code: 'model_not_found' } });
  if (text.includes('WAF')) return json(403, { message: 'Forbidden' });
  if (text.includes('LONG')) return json(400, { error: { message: "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.", type: 'invalid_request_error', param: 'messages', code: 'context_length_exceeded' } });
  return json(200, { id: 'c1', object: 'chat.completion', created: 1, model, choices: [{ index: 0, message: { role: 'assistant', content: 'fine' }, finish_reason: 'stop' }], usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } });
}

async function call(g: UpstreamsGateway, model: string, content = 'hello'): Promise<{ status: number; code: string | undefined }> {
  const res = await fetch(`${g.s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: 'Bearer sk-client' },
    body: JSON.stringify({ model, messages: [{ role: 'user', content }] }),
  });
  const body = (await res.json()) as { error?: { code?: string } };
  return { status: res.status, code: body.error?.code };
}

describe('one client\'s request for a model the gateway\'s key cannot use', () => {
  it('does not hold the key unlisted models share: past the learned names, the others are still answered', async () => {
    const g = await start({ openai: provider }, [{ provider: 'openai' }], { provider: { breaker: {} } });
    // Other tenants' models take every learned place (a gateway serving many models does this by itself).
    for (let i = 0; i < MAX_LEARNED_MODELS; i++) expect((await call(g, `ft:gpt-4o-mini:org-${i}`)).status).toBe(200);
    expect((await call(g, 'gpt-4.1-nano')).status).toBe(200); // under openai/other
    // One client asks for a model the project may not use: it is refused, as before, with the gateway's own error.
    expect(await call(g, 'o1-pro')).toEqual({ status: 502, code: 'upstream_auth_error' });
    // Every other tenant's model under openai/other is still served (it was 502 upstream_auth_error for authHoldS).
    expect(await call(g, 'gpt-4.1-nano')).toEqual({ status: 200, code: undefined });
    expect(await call(g, 'gpt-4o-mini-2024-07-18')).toEqual({ status: 200, code: undefined });
  });

  it('nor with a name unfit for a label, which is under the shared key at once', async () => {
    const g = await start({ openai: provider }, [{ provider: 'openai' }], { provider: { breaker: {} } });
    expect(await call(g, 'gpt-4o-realtime preview')).toEqual({ status: 502, code: 'upstream_auth_error' });
    expect(await call(g, 'another model name')).toEqual({ status: 200, code: undefined });
  });

  it('while a learned model the key cannot use is held alone, and asked no more for authHoldS', async () => {
    const g = await start({ openai: provider }, [{ provider: 'openai' }], { provider: { breaker: {} } });
    expect((await call(g, 'o1-pro')).status).toBe(502);
    expect((await call(g, 'o1-pro')).status).toBe(502);
    expect(g.seen.openai!.filter((s) => s.body.model === 'o1-pro')).toHaveLength(1);
    expect((await call(g, 'gpt-4o')).status).toBe(200);
  });
});

describe('what a client\'s own faults do to the shared guards', () => {
  it('a content-triggered 403 holds the target of its model only, never the provider\'s other models', async () => {
    const g = await start({ openai: provider }, [{ provider: 'openai' }], { provider: { breaker: {} } });
    expect((await call(g, 'gpt-4o', 'WAF trips on this')).status).toBe(502);
    expect((await call(g, 'gpt-4o-mini')).status).toBe(200);
  });

  it('forty context_length_exceeded at once never open the breaker the other clients share', async () => {
    const g = await start({ openai: provider }, [{ provider: 'openai' }], { provider: { breaker: {} } });
    const statuses = await Promise.all(Array.from({ length: 40 }, async () => (await call(g, 'gpt-4o', 'LONG')).status));
    expect(statuses.every((s) => s === 400)).toBe(true);
    expect(await call(g, 'gpt-4o')).toEqual({ status: 200, code: undefined });
    expect(g.seen.openai!).toHaveLength(41);
  });
});
