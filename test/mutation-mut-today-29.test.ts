// Mutants of the OpenAI <-> Anthropic translation (src/providers/anthropic/) that the other tests let live, killed end
// to end: the openai SDK against the gateway, an Anthropic-family target played by a scripted upstream that answers as
// the Messages API does (its refusals included), and what the SDK user reads checked.
import type Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { json, type Answer } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';
import { message, toolUse } from './fixtures/anthropic/wire.ts';

const start = useScriptedUpstreams();
/** A gateway whose chat route goes to one Anthropic target, `answer` playing it. */
const claude = (answer: Answer, model = 'claude-sonnet-4-5') => start({ claude: { answer, family: 'anthropic' } }, [{ provider: 'claude', model }]);

/** Anthropic's own 400, in its error shape. */
const invalid = (msg: string) => json(400, { type: 'error', error: { type: 'invalid_request_error', message: msg } });
const whole = (content: Anthropic.ContentBlock[], over: Partial<Anthropic.Message> = {}) => json(200, message(content, over));

describe('a tool_choice naming a tool whose name Anthropic respells', () => {
  it('forces that tool under the name it was sent with, and the SDK reads the call under its own name', async () => {
    // As the Messages API does: a tool_choice must name one of the request's tools.
    const { client, seen } = await claude((body) => {
      const names = (body['tools'] as Array<{ name: string }>).map((t) => t.name);
      const choice = body['tool_choice'] as { type: string; name: string };
      if (!names.includes(choice.name)) return invalid(`tool_choice.name: Tool '${choice.name}' not found in tools`);
      return whole([toolUse('toolu_01', choice.name, { path: 'README.md' })], { stop_reason: 'tool_use' });
    });
    const tool = (name: string) => ({ type: 'function' as const, function: { name, parameters: { type: 'object', properties: { path: { type: 'string' } } } } });
    const done = await client.chat.completions.create({
      model: 'gpt-4o',
      messages: [{ role: 'user', content: 'Read the readme.' }],
      tools: [tool('fs.list_dir'), tool('fs.read_file')],
      tool_choice: { type: 'function', function: { name: 'fs.read_file' } },
    });
    expect(seen.claude![0]!.body['tool_choice']).toEqual({ type: 'tool', name: 'fs_read_file' });
    const choice = done.choices[0]!;
    expect(choice.finish_reason).toBe('tool_calls');
    expect(choice.message.tool_calls).toEqual([{ id: 'toolu_01', type: 'function', function: { name: 'fs.read_file', arguments: '{"path":"README.md"}' } }]);
  });
});

/** The text of the last tool_result the request sent, whatever form its content took. */
function lastToolResult(body: Record<string, unknown>): string {
  const blocks = (body['messages'] as Array<{ content: Array<{ type: string; content?: unknown }> }>).flatMap((m) => m.content);
  const result = blocks.filter((b) => b.type === 'tool_result').at(-1)?.content;
  return typeof result === 'string' ? result : (result as Array<{ text: string }>).map((b) => b.text).join('\n');
}

describe('a tool result of several text parts', () => {
  it('reaches the model whole: every part, in order', async () => {
    // The model reads the tool's output back to the user.
    const { client } = await claude((body) => whole([{ type: 'text', text: `The tool said: ${lastToolResult(body)}`, citations: null }]));
    const done = await client.chat.completions.create({
      model: 'gpt-4o',
      messages: [
        { role: 'user', content: 'List the files.' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'ls', arguments: '{}' } }] },
        { role: 'tool', tool_call_id: 'call_1', content: [{ type: 'text', text: 'README.md' }, { type: 'text', text: 'package.json' }] },
      ],
      tools: [{ type: 'function', function: { name: 'ls', parameters: { type: 'object', properties: {} } } }],
    });
    expect(done.choices[0]!.message.content).toBe('The tool said: README.md\npackage.json');
  });
});

describe('an Anthropic 400 for a prompt over the context window', () => {
  it('reaches the SDK as context_length_exceeded in each wording Anthropic uses', async () => {
    const wordings = [
      'prompt is too long: 215000 tokens > 200000 maximum',
      'input length and `max_tokens` exceed context limit: 197000 + 8192 > 200000, decrease input length or `max_tokens` and try again',
    ];
    const { client } = await claude((_body, n) => invalid(wordings[n - 1]!));
    for (const wording of wordings) {
      const err = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'A long story.' }] }).then(() => undefined, (e: unknown) => e);
      expect(err).toBeInstanceOf(OpenAI.BadRequestError);
      expect({ code: (err as InstanceType<typeof OpenAI.APIError>).code, message: (err as Error).message }).toEqual({ code: 'context_length_exceeded', message: `400 ${wording}` });
    }
  });
});

/**
 * What Anthropic's structured outputs refuse of a schema, in the two ways these tests need: minItems other than 0 or
 * 1, and a $ref to a definition the schema does not hold. Undefined when it takes the schema.
 */
function schemaRefusal(root: Record<string, unknown>): string | undefined {
  let why: string | undefined;
  const walk = (node: unknown): void => {
    if (typeof node !== 'object' || node === null) return;
    const n = node as Record<string, unknown>;
    if (typeof n['minItems'] === 'number' && n['minItems'] > 1) why ??= `For 'array' type, 'minItems' values other than 0 or 1 are not supported`;
    if (typeof n['$ref'] === 'string') {
      const [, key, name] = /^#\/(\$defs|definitions)\/(.+)$/.exec(n['$ref']) ?? [];
      if (!(key && name && (root[key] as Record<string, unknown> | undefined)?.[name])) why ??= `Reference '${n['$ref']}' could not be resolved`;
    }
    for (const v of Object.values(n)) walk(v);
  };
  walk(root);
  return why;
}

/** A target that answers `answer` as JSON text, or refuses the request's output schema as Anthropic would. */
const structured = (answer: unknown): Answer => (body) => {
  const schema = (body['output_config'] as { format: { schema: Record<string, unknown> } }).format.schema;
  const why = schemaRefusal(schema);
  return why ? invalid(`output_config.format.schema: ${why}`) : whole([{ type: 'text', text: JSON.stringify(answer), citations: null }]);
};

describe('a response_format schema with constraints Anthropic does not take', () => {
  it('minItems over 1 is written into the description, and the SDK gets its JSON answer', async () => {
    const { client, seen } = await claude(structured({ tags: ['a', 'b'] }));
    const schema = { type: 'object', properties: { tags: { type: 'array', items: { type: 'string' }, minItems: 2 } }, required: ['tags'], additionalProperties: false };
    const done = await client.chat.completions.create({
      model: 'gpt-4o',
      messages: [{ role: 'user', content: 'Two tags.' }],
      response_format: { type: 'json_schema', json_schema: { name: 'tags', schema, strict: true } },
    });
    expect(JSON.parse(done.choices[0]!.message.content!)).toEqual({ tags: ['a', 'b'] });
    const sent = (seen.claude![0]!.body['output_config'] as { format: { schema: { properties: { tags: Record<string, unknown> } } } }).format.schema.properties.tags;
    expect(sent).toEqual({ type: 'array', items: { type: 'string' }, description: '{minItems: 2}' });
  });

  it('a root $ref beside its definitions (zod-to-json-schema\'s named form) keeps the definitions it points into', async () => {
    const { client } = await claude(structured({ city: 'Paris' }));
    const schema = {
      $ref: '#/definitions/Place',
      definitions: { Place: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'], additionalProperties: false } },
      $schema: 'http://json-schema.org/draft-07/schema#',
    };
    const done = await client.chat.completions.create({
      model: 'gpt-4o',
      messages: [{ role: 'user', content: 'Where?' }],
      response_format: { type: 'json_schema', json_schema: { name: 'place', schema } },
    });
    expect(JSON.parse(done.choices[0]!.message.content!)).toEqual({ city: 'Paris' });
  });
});
