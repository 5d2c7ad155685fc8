// Adversarial review of the OpenAI -> Anthropic translation (2026-12-06, b): requests an openai SDK user sends that the
// Anthropic backup answered as something else, driven with the official SDK through the gateway over real HTTP.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';
import type { Script } from './helpers/scripted-provider.ts';

const start = useScriptedUpstreams();
const claude = [{ provider: 'a', model: 'claude-sonnet-4-5' }];
const answer: Script = {
  status: 200,
  headers: { 'content-type': 'application/json' },
  steps: [JSON.stringify({ id: 'msg_01', type: 'message', role: 'assistant', model: 'claude-sonnet-4-5', content: [{ type: 'text', text: ' and so on.' }], stop_reason: 'end_turn', stop_sequence: null, usage: { input_tokens: 9, output_tokens: 4 } })],
};

describe('a conversation whose last message is a system or developer instruction after the assistant', () => {
  // Anthropic has one system prompt, so the late instruction joins it and the conversation ends on the assistant's
  // turn: a prefill, which Anthropic continues (older models) or refuses (Claude 4.6 on), where OpenAI writes a new
  // reply that follows the instruction. Sent, the client got the tail of the earlier answer as its "summary".
  for (const role of ['system', 'developer'] as const) {
    it(`a last ${role} message is refused as inexpressible (400 naming it), not sent as a prefill`, async () => {
      const { client, seen } = await start({ a: { answer: () => answer, family: 'anthropic' } }, claude);
      const err = await client.chat.completions
        .create({
          model: 'gpt-4o',
          messages: [
            { role: 'user', content: 'Tell me about the Alps.' },
            { role: 'assistant', content: 'The Alps are a mountain range in Europe.' },
            { role, content: 'Now summarize the conversation in one word.' },
          ],
        })
        .then(() => undefined, (e: unknown) => e);
      expect(seen.a).toHaveLength(0); // never sent as a prefill
      expect(err).toBeInstanceOf(OpenAI.BadRequestError);
      expect((err as InstanceType<typeof OpenAI.BadRequestError>).message).toMatch(/messages\[2\]/);
    });
  }

  it('a system message after the user question, the assistant not last, still joins the system prompt and is sent', async () => {
    const { client, seen } = await start({ a: { answer: () => answer, family: 'anthropic' } }, claude);
    await client.chat.completions.create({
      model: 'gpt-4o',
      messages: [
        { role: 'user', content: 'Tell me about the Alps.' },
        { role: 'assistant', content: 'The Alps are a mountain range in Europe.' },
        { role: 'user', content: 'And their highest peak?' },
        { role: 'developer', content: 'Answer in one word.' },
      ],
    });
    const sent = JSON.parse(seen.a![0]!.raw!) as { system?: string; messages: Array<{ role: string }> };
    expect(sent.system).toBe('Answer in one word.');
    expect(sent.messages.at(-1)!.role).toBe('user');
  });
});

describe('a structured-output schema node with both anyOf and allOf (or oneOf beside anyOf)', () => {
  // The rule of json-schema.ts: keep what Anthropic takes, write every other constraint into the node's description.
  // A node may hold one combinator in the subset; the second was taken out of the node and written nowhere, so the
  // model was neither held to it nor told of it.
  it('keeps the one combinator the subset takes and writes the other into the description, never dropping it', async () => {
    const { client, seen } = await start({ a: { answer: () => answer, family: 'anthropic' } }, claude);
    const v = { anyOf: [{ type: 'integer' }, { type: 'string' }], allOf: [{ not: { const: 0 } }], oneOf: [{ type: 'integer' }, { type: 'string', minLength: 1 }] };
    await client.chat.completions.create({
      model: 'gpt-4o',
      messages: [{ role: 'user', content: 'give me a v' }],
      response_format: { type: 'json_schema', json_schema: { name: 'x', strict: true, schema: { type: 'object', properties: { v }, required: ['v'], additionalProperties: false } } },
    });
    const sent = JSON.parse(seen.a![0]!.raw!) as { output_config: { format: { schema: { properties: { v: Record<string, unknown> } } } } };
    const node = sent.output_config.format.schema.properties.v;
    expect(node['anyOf']).toEqual([{ type: 'integer' }, { type: 'string' }]);
    expect(node['description']).toContain('allOf');
    expect(node['description']).toContain('"not":{"const":0}');
    expect(node['description']).toContain('oneOf');
  });
});
