// A credential hold that starts while requests wait in the provider's pool for a slot: they must not go out with the
// refused key when a slot frees up (each would be one more 401 and a round trip lost), but move on to the next target
// at once, as a newcomer does.
import { describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';

const start = useScriptedUpstreams();
const json = (body: unknown, status = 200) => ({ status, headers: { 'content-type': 'application/json' }, steps: [JSON.stringify(body)] });
const completion = { id: 'chatcmpl-1', object: 'chat.completion', created: 1, model: 'gpt-4o', choices: [{ index: 0, message: { role: 'assistant', content: 'from backup' }, finish_reason: 'stop' }], usage: { prompt_tokens: 1, completion_tokens: 2, total_tokens: 3 } };

describe('a credential hold begun while requests wait for a slot', () => {
  it('sends none of the waiting requests with the refused key: they go to the backup', async () => {
    const refused = { error: { message: 'Incorrect API key provided.', type: 'invalid_request_error', param: null, code: 'invalid_api_key' } };
    const { client, seen } = await start(
      {
        primary: () => ({ ...json(refused, 401), steps: [300, JSON.stringify(refused)] }),
        backup: () => json(completion),
      },
      [{ provider: 'primary' }, { provider: 'backup' }],
      { providers: { primary: { maxConnections: 1 } } },
    );
    const answers = await Promise.all(Array.from({ length: 4 }, () => client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }).withResponse()));
    for (const { data, response } of answers) {
      expect(data.choices[0]!.message.content).toBe('from backup');
      expect(response.headers.get('x-stormgate-target')).toMatch(/^backup/);
    }
    // Only the request that held the slot went to the primary; the ones queued behind it learnt of the hold.
    expect(seen.primary!.length).toBe(1);
    expect(seen.backup!.length).toBe(4);
  });

  it('with no other target, the waiting requests get the 502 upstream_auth_error without going upstream', async () => {
    const refused = { error: { message: 'Incorrect API key provided: sk-abc***xyz.', type: 'invalid_request_error', param: null, code: 'invalid_api_key' } };
    const { client, seen } = await start({ primary: () => ({ ...json(refused, 401), steps: [300, JSON.stringify(refused)] }) }, [{ provider: 'primary' }], { providers: { primary: { maxConnections: 1 } } });
    const outcomes = await Promise.all(
      Array.from({ length: 3 }, () =>
        client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }).then(
          () => undefined,
          (err: unknown) => err,
        ),
      ),
    );
    for (const err of outcomes) {
      expect(err).toBeInstanceOf(OpenAI.APIError);
      const e = err as InstanceType<typeof OpenAI.APIError>;
      expect(e.status).toBe(502);
      expect(e.code).toBe('upstream_auth_error');
      expect(e.message).not.toContain('sk-abc');
    }
    expect(seen.primary!.length).toBe(1);
  });
});
