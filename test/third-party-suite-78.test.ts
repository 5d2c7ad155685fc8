// Third-party failure-scenario suite 78: the REQUEST side of a failover to another API family. A chat completion
// written for OpenAI by the official `openai` 6.x SDK (as agents write them) reaches an Anthropic target after the
// OpenAI primary fails (503s, its breaker open, held off by a retry-after). What reaches Claude must be a valid
// Messages request that means the same; where none can, the client gets the error the README promises (the primary's
// failure, ending `not tried: <target> (<reason>)`), Claude is sent nothing, and never a 400 from Claude is blamed on
// a request that was valid as sent.
// Written from the README ("Failover and API families": what is translated, ignored, refused), OpenAI's chat
// completions reference (temperature 0..2, `stop` a string or up to 4 strings, `max_completion_tokens` replacing
// `max_tokens`, `developer` messages, image parts as URLs or base64 data: URLs, `input_audio` and `file` parts, `n`,
// `logit_bias`, `logprobs`, `seed`, `response_format`, `user`/`safety_identifier`, `reasoning_effort`) and Anthropic's
// Messages reference (max_tokens required; temperature 0..1; Sonnet 4.5 on refuse temperature and top_p together;
// `system` a string or text blocks; text blocks must hold non-whitespace text, in `messages` and in `system` alike;
// stop_sequences with non-whitespace; image sources base64 with media_type, or url; documents; tool_result content a
// string or blocks; metadata.user_id no email or phone; thinking budget_tokens >= 1024 and < max_tokens, and not with
// a temperature other than 1; fields it does not know answered "Extra inputs are not permitted").
// The Anthropic upstream here (node:http, test/helpers/scripted-upstreams.ts) enforces those rules as Anthropic does, with
// a 400 invalid_request_error, and records what it got; each test asserts the exact translated body.
// What the earlier suites (anthropic-translate, anthropic-fidelity, failover-fidelity, translation-fuzz, 17, 19, 51)
// leave out, covered here end to end through a real primary outage: every sampling mode with Claude's own range rule
// enforced, stop as a string / 5 strings / whitespace-only, the max-tokens precedence and the provider default, system
// and developer messages mid-conversation, an image whose data: URL names the wrong type, inexpressible parts,
// one agent history with every awkward shape at once, the OpenAI-only knobs (refused or ignored, each), user ids, the
// thinking budget against max_tokens, the same translation behind an open breaker and a hold-off, and Claude's own 400
// for a request the gateway could not know it would refuse.
// Found here: a whitespace-only `system` or `developer` message (valid at OpenAI: a template with an empty
// instruction, or a blank line) went to Claude as `system: "   "` (or joined in as "  \n\nreal"), and Anthropic
// answers 400 "system: text content blocks must contain non-whitespace text": the failover failed with Claude's
// rejection appended to the primary's 503, for a request that says nothing more than the same without it. Fixed in
// src/providers/anthropic/messages.ts toAnthropicConversation: a system or developer message with no non-whitespace text
// is left out, as whitespace-only text parts already were (README: "whitespace-only text parts ... are left out").
// Bounds are generous: a loaded 2-core machine.
import { createHash } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { sdkError } from './helpers/openai-error.ts';
import { json, type Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams, type UpstreamsGateway, type UpstreamsOptions } from './helpers/scripted-upstreams.ts';

const gw = useScriptedUpstreams();
const CLAUDE = 'claude-sonnet-4-5';
const TARGET = `claude/${CLAUDE}`;
const TARGETS = [{ provider: 'primary' }, { provider: 'claude', model: CLAUDE }];

// ---- The primary's outage -------------------------------------------------------------------------------------------
const OVERLOADED = { error: { message: 'The server is overloaded. Please try again later.', type: 'server_error', param: null, code: null } };
const outage = (): Script => json(503, OVERLOADED);

// ---- Claude: Anthropic's documented request rules, each a 400 invalid_request_error as Anthropic words it ----------
const ANTHROPIC_FIELDS = new Set(['model', 'max_tokens', 'messages', 'system', 'stop_sequences', 'stream', 'temperature', 'top_p', 'top_k', 'tools', 'tool_choice', 'metadata', 'thinking', 'output_config', 'service_tier']);
const IMAGE_TYPES = new Set(['image/jpeg', 'image/png', 'image/gif', 'image/webp']);
type Block = Record<string, unknown> & { type: string };
const blank = (t: unknown) => typeof t !== 'string' || t.trim() === '';

/** Why Anthropic would answer 400 to this body, or undefined when it takes it. */
function claudeRefuses(body: Record<string, unknown>): string | undefined {
  for (const key of Object.keys(body)) if (!ANTHROPIC_FIELDS.has(key)) return `${key}: Extra inputs are not permitted`;
  if (!Number.isInteger(body['max_tokens']) || (body['max_tokens'] as number) < 1) return 'max_tokens: Field required';
  const t = body['temperature'];
  if (t !== undefined && (typeof t !== 'number' || t < 0 || t > 1)) return 'temperature: Input should be less than or equal to 1';
  if (t !== undefined && body['top_p'] !== undefined) return '`temperature` and `top_p` cannot both be specified for this model. Please use only one.';
  const system = body['system'];
  if (typeof system === 'string' && blank(system)) return 'system: text content blocks must contain non-whitespace text';
  if (Array.isArray(system) && system.some((b: Block) => blank(b.text))) return 'system: text content blocks must contain non-whitespace text';
  const stops = body['stop_sequences'];
  if (Array.isArray(stops) && stops.some(blank)) return 'stop_sequences: each stop sequence must contain non-whitespace characters';
  const userId = (body['metadata'] as { user_id?: string } | undefined)?.user_id;
  if (userId !== undefined && (userId.includes('@') || userId.length > 256)) return 'metadata.user_id: appears to contain personally identifiable information';
  const thinking = body['thinking'] as { type: string; budget_tokens?: number } | undefined;
  if (thinking?.type === 'enabled') {
    const budget = thinking.budget_tokens ?? 0;
    if (budget < 1024) return 'thinking.enabled.budget_tokens: Input should be greater than or equal to 1024';
    if (budget >= (body['max_tokens'] as number)) return '`max_tokens` must be greater than `thinking.budget_tokens`';
    if (t !== undefined && t !== 1) return '`temperature` may only be set to 1 when thinking is enabled';
  }
  const messages = body['messages'] as Array<{ role: string; content: string | Block[] }>;
  if (!Array.isArray(messages) || messages.length === 0) return 'messages: at least one message is required';
  const toolUses = new Set<string>();
  let toolsUsed = false;
  for (const [i, m] of messages.entries()) {
    if (m.role !== (i % 2 === 0 ? 'user' : 'assistant')) return `messages.${i}.role: roles must alternate between "user" and "assistant", starting with "user"`;
    const blocks: Block[] = typeof m.content === 'string' ? [{ type: 'text', text: m.content }] : m.content;
    if (blocks.length === 0) return `messages.${i}: all messages must have non-empty content`;
    const previous = messages[i - 1];
    const called = new Set(Array.isArray(previous?.content) ? previous.content.filter((b) => b.type === 'tool_use').map((b) => b.id as string) : []);
    for (const b of blocks) {
      if (b.type === 'text' && blank(b.text)) return `messages.${i}: text content blocks must contain non-whitespace text`;
      if (b.type === 'image') {
        const source = b['source'] as { type: string; media_type?: string; data?: string; url?: string };
        if (source.type === 'base64' && !IMAGE_TYPES.has(source.media_type ?? '')) return `messages.${i}: image media type not supported`;
        if (source.type === 'base64' && source.media_type === 'image/jpeg' && Buffer.from(source.data ?? '', 'base64')[0] !== 0xff) return `messages.${i}: Image does not match the provided media type image/jpeg`;
      }
      if (b.type === 'tool_use') {
        toolsUsed = true;
        if (toolUses.has(b.id as string)) return '`tool_use` ids must be unique';
        toolUses.add(b.id as string);
      }
      if (b.type === 'tool_result') {
        toolsUsed = true;
        if (!called.has(b['tool_use_id'] as string)) return `messages.${i}: unexpected \`tool_use_id\` found in \`tool_result\` blocks`;
      }
    }
  }
  if (toolsUsed && !Array.isArray(body['tools'])) return 'Requests which include `tool_use` or `tool_result` blocks must define tools.';
  return undefined;
}

const claudeMessage = (text: string) => ({
  id: 'msg_01XFDUDYJgAACzvnptvVoYEL',
  type: 'message',
  role: 'assistant',
  model: CLAUDE,
  content: [{ type: 'text', text }],
  stop_reason: 'end_turn',
  stop_sequence: null,
  usage: { input_tokens: 25, output_tokens: 4 },
});

/** Claude as Anthropic's API answers: a 400 invalid_request_error for what it refuses, else a whole message. */
const claude = (body: Record<string, unknown>): Script => {
  const refusal = claudeRefuses(body);
  if (refusal !== undefined) return json(400, { type: 'error', error: { type: 'invalid_request_error', message: refusal }, request_id: 'req_011CSHoEeqs5C35K2UUqR7Fy' }, { 'request-id': 'req_011CSHoEeqs5C35K2UUqR7Fy' });
  return json(200, claudeMessage('Answered by Claude.'), { 'request-id': 'req_011CSHoEeqs5C35K2UUqR7Fz' });
};

/** A gateway whose OpenAI primary answers every request with `primary` (503 by default) and whose backup is Claude. */
const failingOver = (opts: UpstreamsOptions & { primary?: (n: number) => Script } = {}): Promise<UpstreamsGateway> =>
  gw({ primary: (_b, n) => (opts.primary ?? outage)(n), claude: { answer: (b) => claude(b), family: 'anthropic' } }, TARGETS, opts);

const user = (content: string) => ({ role: 'user' as const, content });
const ASK = [user('Summarise the release notes.')];
const TEXT = (t: string) => ({ type: 'text', text: t });

/** What Claude is sent for `ASK` with nothing else asked: the body every single-field test extends. */
const base = (extra: Record<string, unknown> = {}) => ({ model: CLAUDE, max_tokens: 4096, messages: [{ role: 'user', content: [TEXT('Summarise the release notes.')] }], ...extra });

/** Sends one chat completion through the outage; asserts Claude answered it, after the primary's 503s. */
async function answered(g: UpstreamsGateway, params: Record<string, unknown>) {
  const { data, response } = await g.client.chat.completions.create({ model: 'gpt-4o', messages: ASK, ...params } as never).withResponse();
  expect(response.status).toBe(200);
  expect(response.headers.get('x-stormgate-target')).toBe(TARGET);
  expect((data as { choices: Array<{ message: { content: string } }> }).choices[0]!.message.content).toBe('Answered by Claude.');
  return { sent: g.seen['claude']!.at(-1)!.body, headers: response.headers };
}

/** Sends one chat completion through the outage that Claude cannot be sent: the primary's 503, naming why not. */
async function notTried(g: UpstreamsGateway, params: Record<string, unknown>, why: string) {
  const before = g.seen['claude']!.length;
  const err = await sdkError(g.client.chat.completions.create({ model: 'gpt-4o', messages: ASK, ...params } as never));
  expect(err.status).toBe(503);
  expect(err.message).toContain(`not tried: ${TARGET} (anthropic cannot express this request: ${why}`);
  expect(g.seen['claude']!.length).toBe(before); // Claude was sent nothing
  return err;
}

describe('temperature and top_p, which Claude takes only in 0..1 and (Sonnet 4.5 on) not together', () => {
  it('drops them by default: temperature 1.5 and top_p 0.9, valid at OpenAI, never reach Claude as a 400', async () => {
    const g = await failingOver();
    const { sent, headers } = await answered(g, { temperature: 1.5, top_p: 0.9 });
    expect(sent).toEqual(base());
    expect(headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(g.seen['primary']!.map((s) => s.body['temperature'])).toEqual([1.5, 1.5]); // the primary had them as sent
  });

  it('with sampling: forward, clamps 1.5 to Claude\'s 1, and keeps only temperature when both are set', async () => {
    const g = await failingOver({ providers: { claude: { sampling: 'forward' } } });
    expect((await answered(g, { temperature: 1.5 })).sent).toEqual(base({ temperature: 1 }));
    expect((await answered(g, { temperature: 0.2, top_p: 0.9 })).sent).toEqual(base({ temperature: 0.2 }));
    expect((await answered(g, { top_p: 0.9 })).sent).toEqual(base({ top_p: 0.9 }));
    expect((await answered(g, { temperature: 0 })).sent).toEqual(base({ temperature: 0 }));
  });

  it('with sampling: refuse, a request with a temperature is not sent to Claude: the primary\'s 503 says why', async () => {
    const g = await failingOver({ providers: { claude: { sampling: 'refuse' } } });
    await notTried(g, { temperature: 0.7 }, 'temperature / top_p is not supported by an Anthropic target');
    await notTried(g, { top_p: 0.5 }, 'temperature / top_p is not supported by an Anthropic target');
    // Without either, the same request goes.
    expect((await answered(g, {})).sent).toEqual(base());
  });
});

describe('stop: a string, more strings than OpenAI takes, a whitespace-only one', () => {
  it('sends a string as one stop sequence and five strings as five, and drops the empty one', async () => {
    const g = await failingOver();
    expect((await answered(g, { stop: 'END' })).sent).toEqual(base({ stop_sequences: ['END'] }));
    expect((await answered(g, { stop: ['\nObservation:', 'A', 'B', 'C', 'D'] })).sent).toEqual(base({ stop_sequences: ['\nObservation:', 'A', 'B', 'C', 'D'] }));
    expect((await answered(g, { stop: ['', 'END'] })).sent).toEqual(base({ stop_sequences: ['END'] }));
    expect((await answered(g, { stop: [] })).sent).toEqual(base());
  });

  it('never sends a whitespace-only stop sequence Claude refuses, nor drops it: the request is not sent there', async () => {
    const g = await failingOver();
    const err = await notTried(g, { stop: ['\n', 'END'] }, 'an Anthropic target cannot stop at a whitespace-only stop sequence');
    expect(err.code).toBe(null); // the primary's own 503, not a 400 telling the client to change its request
  });
});

describe('max_completion_tokens, max_tokens, or neither (Claude requires max_tokens)', () => {
  it('sends max_completion_tokens over the deprecated max_tokens, either alone, and the provider default without', async () => {
    const g = await failingOver({ providers: { claude: { defaultMaxTokens: 2000 } } });
    expect((await answered(g, { max_completion_tokens: 300 })).sent).toEqual(base({ max_tokens: 300 }));
    expect((await answered(g, { max_tokens: 200 })).sent).toEqual(base({ max_tokens: 200 }));
    expect((await answered(g, { max_completion_tokens: 300, max_tokens: 200 })).sent).toEqual(base({ max_tokens: 300 }));
    expect((await answered(g, {})).sent).toEqual(base({ max_tokens: 2000 }));
  });
});

describe('system and developer messages: Anthropic has one system prompt, of non-whitespace text', () => {
  it('joins system and developer messages from anywhere into the system prompt, and the user turns around them into one', async () => {
    const g = await failingOver();
    const messages = [
      { role: 'system', content: 'You are terse.' },
      user('First question.'),
      { role: 'developer', content: [{ type: 'text', text: 'Answer in French.' }, { type: 'text', text: 'No lists.' }] },
      user('Second question.'),
    ];
    const { sent } = await answered(g, { messages });
    expect(sent).toEqual({
      model: CLAUDE,
      max_tokens: 4096,
      system: 'You are terse.\n\nAnswer in French.\nNo lists.',
      messages: [{ role: 'user', content: [TEXT('First question.'), TEXT('Second question.')] }],
    });
  });

  it('leaves out a whitespace-only system or developer message, which OpenAI takes and Claude answers 400', async () => {
    const g = await failingOver();
    // A prompt template with an empty instruction slot, a blank developer line: valid as sent to OpenAI.
    const blankOnly = await answered(g, { messages: [{ role: 'system', content: '   ' }, ...ASK] });
    expect(blankOnly.sent).toEqual(base());
    const withReal = await answered(g, { messages: [{ role: 'developer', content: '\n' }, { role: 'system', content: [{ type: 'text', text: ' ' }] }, { role: 'system', content: 'Be brief.' }, ...ASK] });
    expect(withReal.sent).toEqual(base({ system: 'Be brief.' }));
  });

  it('refuses a developer message after the assistant\'s last turn (Claude would continue that turn), sending Claude nothing', async () => {
    const g = await failingOver();
    const messages = [...ASK, { role: 'assistant', content: 'Here is the summary.' }, { role: 'developer', content: 'Now shorten it.' }];
    await notTried(g, { messages }, "messages[2]: an Anthropic target cannot answer a developer message that follows the assistant's last turn");
  });
});

describe('content parts: images, audio, files', () => {
  // The first bytes of a PNG and of a JPEG, base64.
  const PNG = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==';
  const JPEG = '/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAgGBgcGBQgHBwcJCQgKDBQNDAsLDBkSEw8UHRofHh0aHBwgJC4nICIsIxwcKDcpLDAxNDQ0Hyc5PTgyPC4zNDL/';

  it('sends a data: URL as base64 of the type its bytes are (not the type it names), and an https URL as a url source', async () => {
    const g = await failingOver();
    const content = [
      { type: 'text', text: 'Compare these.' },
      // A PNG under a hard-coded image/jpeg: OpenAI reads the bytes; Claude would refuse the named type.
      { type: 'image_url', image_url: { url: `data:image/jpeg;base64,${PNG}`, detail: 'low' } },
      { type: 'image_url', image_url: { url: `data:image/jpg;base64,${JPEG}` } },
      { type: 'image_url', image_url: { url: 'https://upload.wikimedia.org/wikipedia/commons/a/a7/Camponotus_flavomarginatus_ant.jpg', detail: 'high' } },
    ];
    const { sent } = await answered(g, { messages: [{ role: 'user', content }] });
    expect(sent).toEqual(
      base({
        messages: [
          {
            role: 'user',
            content: [
              TEXT('Compare these.'),
              { type: 'image', source: { type: 'base64', media_type: 'image/png', data: PNG } },
              { type: 'image', source: { type: 'base64', media_type: 'image/jpeg', data: JPEG } },
              { type: 'image', source: { type: 'url', url: 'https://upload.wikimedia.org/wikipedia/commons/a/a7/Camponotus_flavomarginatus_ant.jpg' } },
            ],
          },
        ],
      }),
    );
  });

  it('sends an inline PDF as a document, and refuses audio input and an OpenAI file id (nothing to send) for Claude', async () => {
    const g = await failingOver();
    const pdf = { type: 'file', file: { filename: 'notes.pdf', file_data: 'data:application/pdf;base64,JVBERi0xLjQK' } };
    const { sent } = await answered(g, { messages: [{ role: 'user', content: [pdf, { type: 'text', text: 'Summarise.' }] }] });
    expect(sent).toEqual(base({ messages: [{ role: 'user', content: [{ type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: 'JVBERi0xLjQK' }, title: 'notes.pdf' }, TEXT('Summarise.')] }] }));
    const audio = { type: 'input_audio', input_audio: { data: 'UklGRiQAAABXQVZF', format: 'wav' } };
    await notTried(g, { messages: [{ role: 'user', content: [TEXT('Transcribe.'), audio] }] }, 'messages[0].content[1]: audio input is not supported by an Anthropic target');
    await notTried(g, { messages: [{ role: 'user', content: [{ type: 'file', file: { file_id: 'file-6F2ksmvXxt4VdoqmHRw6kL' } }] }] }, 'messages[0].content[0]: only inline PDF files');
  });
});

describe("an agent's history, every awkward shape at once", () => {
  it('sends text and tool calls as one assistant turn, tool results (array content) as one user turn, merges consecutive user messages and drops an empty assistant reply', async () => {
    const g = await failingOver();
    const tools = [{ type: 'function', function: { name: 'read_file', description: 'Read a file', parameters: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] } } }];
    const messages = [
      { role: 'system', content: 'You are a coding agent.' },
      user('Look at the config.'),
      user('Both files, please.'),
      {
        role: 'assistant',
        content: 'Reading both.',
        tool_calls: [
          { id: 'call_a1', type: 'function', function: { name: 'read_file', arguments: '{"path":"a.yaml"}' } },
          { id: 'call_b2', type: 'function', function: { name: 'read_file', arguments: '{"path":"b.yaml"}' } },
        ],
      },
      { role: 'tool', tool_call_id: 'call_b2', content: [{ type: 'text', text: 'b: 2' }] },
      { role: 'tool', tool_call_id: 'call_a1', content: [{ type: 'text', text: 'a: 1' }, { type: 'text', text: '   ' }] },
      { role: 'assistant', content: '' },
      user('Which is larger?'),
    ];
    const { sent } = await answered(g, { messages, tools, tool_choice: 'auto' });
    expect(sent).toEqual({
      model: CLAUDE,
      max_tokens: 4096,
      system: 'You are a coding agent.',
      messages: [
        { role: 'user', content: [TEXT('Look at the config.'), TEXT('Both files, please.')] },
        {
          role: 'assistant',
          content: [
            TEXT('Reading both.'),
            { type: 'tool_use', id: 'call_a1', name: 'read_file', input: { path: 'a.yaml' } },
            { type: 'tool_use', id: 'call_b2', name: 'read_file', input: { path: 'b.yaml' } },
          ],
        },
        {
          role: 'user',
          content: [
            { type: 'tool_result', tool_use_id: 'call_b2', content: [TEXT('b: 2')] },
            { type: 'tool_result', tool_use_id: 'call_a1', content: [TEXT('a: 1')] },
            TEXT('Which is larger?'),
          ],
        },
      ],
      tools: [{ name: 'read_file', description: 'Read a file', input_schema: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] } }],
      tool_choice: { type: 'auto' },
    });
  });
});

describe("OpenAI-only knobs: refused where the answer's shape or content would change, ignored where not", () => {
  it.each([
    ['n: 2', { n: 2 }, 'n > 1 is not supported by an Anthropic target'],
    ['logprobs', { logprobs: true, top_logprobs: 3 }, 'logprobs is not supported by an Anthropic target'],
    ['logit_bias', { logit_bias: { '50256': -100 } }, 'logit_bias is not supported by an Anthropic target'],
    ['response_format json_object', { response_format: { type: 'json_object' } }, 'response_format json_object (use json_schema) is not supported'],
    ['presence_penalty', { presence_penalty: 0.5 }, 'presence_penalty is not supported by an Anthropic target'],
  ])('refuses %s for Claude: the primary\'s 503 names it, Claude is sent nothing', async (_name, params, why) => {
    const g = await failingOver();
    await notTried(g, params, why);
  });

  it('ignores seed, n: 1, an empty logit_bias, logprobs: false, store, metadata and a text response_format: none reaches Claude', async () => {
    const g = await failingOver();
    const params = { seed: 42, n: 1, logit_bias: {}, logprobs: false, store: true, metadata: { run: 'nightly' }, response_format: { type: 'text' }, prompt_cache_key: 'k1', service_tier: 'auto' };
    expect((await answered(g, params)).sent).toEqual(base());
  });

  it('sends a json_schema response format as output_config.format, the constraints Claude refuses moved into descriptions', async () => {
    const g = await failingOver();
    const schema = { type: 'object', properties: { title: { type: 'string', maxLength: 80 }, pages: { type: 'integer', minimum: 1 } }, required: ['title', 'pages'], additionalProperties: false };
    const { sent } = await answered(g, { response_format: { type: 'json_schema', json_schema: { name: 'book', strict: true, schema } } });
    expect(sent).toEqual(
      base({
        output_config: {
          format: {
            type: 'json_schema',
            schema: { type: 'object', properties: { title: { type: 'string', description: '{maxLength: 80}' }, pages: { type: 'integer', description: '{minimum: 1}' } }, required: ['title', 'pages'], additionalProperties: false },
          },
        },
      }),
    );
  });

  it('sends user (or safety_identifier, first) as metadata.user_id: an email as its SHA-256, a uuid as it is', async () => {
    const g = await failingOver();
    const sha = createHash('sha256').update('ada@example.com').digest('hex');
    expect((await answered(g, { user: 'ada@example.com' })).sent).toEqual(base({ metadata: { user_id: sha } }));
    const uuid = '0b6c3d0e-8f6a-4b8e-9d1c-2f3a4b5c6d7e';
    expect((await answered(g, { user: 'ada@example.com', safety_identifier: uuid })).sent).toEqual(base({ metadata: { user_id: uuid } }));
    // An empty safety_identifier names no one: the user it stands beside does.
    expect((await answered(g, { user: 'ada@example.com', safety_identifier: '' })).sent).toEqual(base({ metadata: { user_id: sha } }));
  });
});

describe('reasoning_effort -> thinking, its budget below max_tokens as Claude requires', () => {
  it('adds the budget to the default max_tokens without a client limit, takes at most half of one, and none under 1024', async () => {
    const g = await failingOver({ providers: { claude: { defaultMaxTokens: 2000 } } });
    expect((await answered(g, { reasoning_effort: 'high' })).sent).toEqual(base({ max_tokens: 2000 + 16384, thinking: { type: 'enabled', budget_tokens: 16384 } }));
    expect((await answered(g, { reasoning_effort: 'high', max_completion_tokens: 3000 })).sent).toEqual(base({ max_tokens: 3000, thinking: { type: 'enabled', budget_tokens: 1500 } }));
    expect((await answered(g, { reasoning_effort: 'low', max_completion_tokens: 2048 })).sent).toEqual(base({ max_tokens: 2048, thinking: { type: 'enabled', budget_tokens: 1024 } }));
    // Half of 1500 is under Anthropic's minimum: the request goes without thinking rather than as a 400.
    expect((await answered(g, { reasoning_effort: 'medium', max_tokens: 1500 })).sent).toEqual(base({ max_tokens: 1500 }));
    expect((await answered(g, { reasoning_effort: 'minimal' })).sent).toEqual(base({ max_tokens: 2000 }));
  });

  it('with sampling: forward, sends no thinking next to a temperature other than 1 (Claude refuses the two)', async () => {
    const g = await failingOver({ providers: { claude: { sampling: 'forward' } } });
    expect((await answered(g, { reasoning_effort: 'low', temperature: 0.3 })).sent).toEqual(base({ temperature: 0.3 }));
    // 1.5 clamps to 1, which thinking takes.
    expect((await answered(g, { reasoning_effort: 'low', temperature: 1.5 })).sent).toEqual(base({ max_tokens: 4096 + 1024, temperature: 1, thinking: { type: 'enabled', budget_tokens: 1024 } }));
  });
});

describe('the same translation whatever made the primary unavailable', () => {
  const rich = {
    messages: [{ role: 'developer', content: 'Reply in one line.' }, user('Status?')],
    stop: 'STOP',
    max_completion_tokens: 64,
    user: 'ada@example.com',
    temperature: 1.5,
    seed: 7,
  };
  const expected = {
    model: CLAUDE,
    max_tokens: 64,
    system: 'Reply in one line.',
    messages: [{ role: 'user', content: [TEXT('Status?')] }],
    stop_sequences: ['STOP'],
    metadata: { user_id: createHash('sha256').update('ada@example.com').digest('hex') },
  };
  const send = (g: UpstreamsGateway) => g.client.chat.completions.create({ model: 'gpt-4o', ...rich } as never).withResponse();

  it('behind an open breaker: the primary is sent nothing, Claude the same body', async () => {
    const g = await failingOver({ providers: { primary: { breaker: { consecutiveFailures: 2, openS: 60 } } } });
    let fallback: string | null = null;
    for (let i = 0; i < 6 && fallback !== 'breaker_open'; i++) {
      const { response } = await send(g);
      expect(response.headers.get('x-stormgate-target')).toBe(TARGET);
      fallback = response.headers.get('x-stormgate-fallback');
      if (fallback !== 'breaker_open') await sleep(300); // the trip rule waits out 250 ms without a success
    }
    expect(fallback).toBe('breaker_open');
    const primarySent = g.seen['primary']!.length;
    const { response } = await send(g);
    expect(response.headers.get('x-stormgate-fallback')).toBe('breaker_open');
    expect(g.seen['primary']!.length).toBe(primarySent);
    for (const s of g.seen['claude']!) expect(s.body).toEqual(expected);
  });

  it('held off by a retry-after: Claude the same body, and a request Claude cannot take gets the hold-off, naming why', async () => {
    const held = () => json(429, { error: { message: 'Rate limit reached for gpt-4o', type: 'requests', param: null, code: 'rate_limit_exceeded' } }, { 'retry-after': '30' });
    const g = await failingOver({ primary: held });
    const first = await send(g);
    // The request that got the hint leaves for it (longer than maxWaitHintMs); the next finds the primary held off.
    expect(first.response.headers.get('x-stormgate-fallback')).toBe('wait_hint');
    const second = await send(g);
    expect(second.response.headers.get('x-stormgate-fallback')).toBe('held_off');
    expect(g.seen['primary']!.length).toBe(1);
    expect(g.seen['claude']!.map((s) => s.body)).toEqual([expected, expected]);
    const err = await sdkError(g.client.chat.completions.create({ model: 'gpt-4o', ...rich, n: 3 } as never));
    expect(err.status).toBe(429);
    expect(err.message).toContain(`not tried: ${TARGET} (anthropic cannot express this request: n > 1`);
    expect(g.seen['claude']!.length).toBe(2);
  });
});

describe("Claude's own 400 for a request valid as sent", () => {
  it('reaches the client as the primary\'s 503 with Claude\'s reason appended, never as a 400 to fix the request', async () => {
    // Claude cannot fetch the image URL (Anthropic's 400), where OpenAI could: the gateway could not know beforehand.
    const unreachable = (): Script => json(400, { type: 'error', error: { type: 'invalid_request_error', message: 'Unable to download the file. Please verify the URL and try again.' }, request_id: 'req_011CSHoEeqs5C35K2UUqR7G0' });
    const g = await gw({ primary: () => outage(), claude: { answer: unreachable, family: 'anthropic' } }, TARGETS);
    const content = [TEXT('What is this?'), { type: 'image_url', image_url: { url: 'https://intranet.example/diagram.png' } }];
    const err = await sdkError(g.client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content }] } as never));
    expect(err.status).toBe(503);
    expect(err.message).toContain(`the fallback ${TARGET} rejected the request (400: Unable to download the file. Please verify the URL and try again.)`);
    expect(g.seen['claude']!.map((s) => (s.body['messages'] as Array<{ content: Block[] }>)[0]!.content[1])).toEqual([{ type: 'image', source: { type: 'url', url: 'https://intranet.example/diagram.png' } }]);
  });
});
