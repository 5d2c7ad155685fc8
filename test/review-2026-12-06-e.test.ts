// Adversarial review of 2026-12-06's changes (wait hints read against the upstream's Date, the bare x-ratelimit-reset,
// OpenRouter's relayed hints, 404s that name no model counted upstream_error, finish_reason "error", the drain's wake).
// Found: a 404 on the client's own reference that carries no `param` (OpenAI's "File cfile_... not found on container
// cntr_...", "No file found with id 'file-...' in vector store 'vs_...'", Anthropic's `thread_not_found` for a
// message thread the account does not hold) named no model, so it was read as a wrong baseUrl (`unknownUrl`) and
// counted upstream_error: a client's stale ids paged the operator through the error-share SLO alert, and a thread
// continued at another account (which the SDK replays, README "message threads") counted as the provider failing;
// so did OpenRouter's 404 "No endpoints found that support tool use" (an agent's tools sent to a model without them).
// Fixed by turning the rule around (src/providers/error-outcome.ts isUnknownUrl): a 404 is a wrong URL only when it
// says so (OpenAI's "Invalid URL (...)", a bare "Not Found" / "Resource not found", "Cannot POST", or no error object
// at all, a web server's page); any other names something of the request, the client's.
import { describe, expect, it } from 'vitest';
import { httpOutcome } from '../src/providers/error-outcome.ts';
import { RETRY_LOOP_ONLY, scrapeMetrics, TEST_KEY, useStacks, type Stack } from './helpers/stack.ts';

const startStack = useStacks();
const openAi404 = (message: string, extra: Record<string, unknown> = {}) =>
  Buffer.from(JSON.stringify({ error: { message, type: 'invalid_request_error', param: null, code: null, ...extra } }));

describe('a 404 on the client\'s own request (an id it names, tools it asks for) is no wrong URL', () => {
  it.each([
    ['a container file', openAi404('File cfile_68628828cefc819186ceae6b71814a18 not found on container cntr_686287a8b3ac8198ac1c81a5a0484c70.')],
    ['a vector store file', openAi404("No file found with id 'file-1DpaZta9xg4paUYU73jXpN' in vector store 'vs_69010cc814b48191b467bc9a5a6776cc'.")],
    ['a conversation', openAi404("Conversation with id 'conv_689667905b048191b4740501625afd940c7533ace33a2dab' not found.")],
    ['OpenRouter: no endpoint for the request\'s tools', Buffer.from(JSON.stringify({ error: { message: 'No endpoints found that support tool use. To learn more about provider routing, visit: https://openrouter.ai/docs/provider-routing', code: 404 } }))],
    ['OpenRouter: no endpoint for its tool_choice', Buffer.from(JSON.stringify({ error: { message: "No endpoints found that support the provided 'tool_choice' value. To learn more about provider routing, visit: https://openrouter.ai/docs/provider-routing", code: 404 } }))],
    ['an Anthropic thread (thread_not_found)', Buffer.from(JSON.stringify({ type: 'error', error: { type: 'not_found_error', message: 'No thread state found for previous_message_id msg_01.', details: { error_code: 'thread_not_found' } } }))],
  ])('%s', (_what, body) => {
    const o = httpOutcome(404, {}, body, 0);
    expect(o.kind === 'http' && o.unknownUrl).toBeFalsy();
  });

  it('while a wrong URL still is one: OpenAI\'s Invalid URL, a web server\'s page, Azure\'s Resource not found', () => {
    for (const body of [
      openAi404('Invalid URL (POST /v1/responses)'),
      openAi404('Invalid URL (POST /v1/chat/completions)'),
      Buffer.from('<html><head><title>404 Not Found</title></head><body><center>nginx</center></body></html>'),
      Buffer.from(JSON.stringify({ error: { code: '404', message: 'Resource not found' } })),
      Buffer.from('404 page not found'),
    ]) {
      const o = httpOutcome(404, {}, body, 0);
      expect(o.kind === 'http' && o.unknownUrl, body.toString()).toBe(true);
    }
  });

  it('end to end: counted invalid_request, as the client\'s verdict it is, not upstream_error', async () => {
    const route = { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 2, backoff: { strategy: 'fixed' as const, baseMs: 5, capMs: 5 } } };
    const s: Stack = await startStack({
      route,
      provider: RETRY_LOOP_ONLY.provider,
      faults: { errors: [{ status: 404, message: "No file found with id 'file-1DpaZta9xg4paUYU73jXpN' in vector store 'vs_69010cc814b48191b467bc9a5a6776cc'." }] },
    });
    const res = await fetch(`${s.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${TEST_KEY}` },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(res.status).toBe(404);
    await res.arrayBuffer();
    const counts: Record<string, number> = {};
    for (const m of await scrapeMetrics(s.url)) {
      if (m.name !== 'stormgate_requests_total' || m.labels.route !== 'chat' || m.value === 0) continue;
      counts[m.labels.outcome!] = (counts[m.labels.outcome!] ?? 0) + m.value;
    }
    expect(counts).toEqual({ invalid_request: 1 });
  });
});
