// The request rules of Anthropic's Messages API that a translated OpenAI conversation can break, checked as the real
// API checks them and refused with its 400 and message. A mock that took what the real API refuses would let a
// translation bug through every test and show it only in production, when the Anthropic backup is needed. Only rules
// that are documented (the API reference, as written in @anthropic-ai/sdk's types) or that the API's own 400s show in
// public reports are here; the messages are the API's, so a test can match them. Kept to the conversation's shape,
// tools and a few scalar fields: what a translator produces, not every field the API has.
import { MockRequestError } from './errors.ts';
import type { Body } from './openai-responses.ts';

type Block = Record<string, unknown>;
interface Turn {
  role: 'user' | 'assistant';
  blocks: Block[];
  /** Index of the request message the merged turn starts at, for the error's path. */
  at: number;
}

const refuse = (message: string): never => {
  throw new MockRequestError(400, message);
};

// `tools.N.custom.name: String should match pattern '^[a-zA-Z0-9_-]{1,128}$'` (the bound was 64 until 2025).
const TOOL_NAME = /^[a-zA-Z0-9_-]{1,128}$/;
// `messages.N.content.M.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'`
const TOOL_ID = /^[a-zA-Z0-9_-]+$/;
const IMAGE_TYPES: ReadonlySet<string> = new Set(['image/jpeg', 'image/png', 'image/gif', 'image/webp']);

/** Throws the API's 400 (a MockRequestError) for the first rule `body` breaks. */
export function checkMessagesRequest(body: Body): void {
  checkScalars(body);
  const tools = checkTools(body['tools']);
  checkToolChoice(body['tool_choice'], body['tools']);
  checkSystem(body['system']);
  const turns = mergedTurns(body['messages']);
  checkToolPairs(turns, tools);
  checkThinking(body, turns);
}

function checkScalars(body: Body): void {
  const max = body['max_tokens'];
  if (max !== undefined && !(typeof max === 'number' && Number.isInteger(max) && max >= 0)) refuse('max_tokens: Input should be a valid integer');
  const temperature = body['temperature'];
  if (typeof temperature === 'number' && temperature > 1) refuse('temperature: Input should be less than or equal to 1');
  if (typeof temperature === 'number' && temperature < 0) refuse('temperature: Input should be greater than or equal to 0');
  const stops = body['stop_sequences'];
  if (Array.isArray(stops) && stops.some((s) => typeof s !== 'string' || s.trim() === '')) refuse('stop_sequences: each stop sequence must contain non-whitespace');
}

/** The request's tool names (client tools: server tools are not checked here). */
function checkTools(tools: unknown): Set<string> {
  const names = new Set<string>();
  if (tools === undefined) return names;
  if (!Array.isArray(tools)) return refuse('tools: Input should be a valid list');
  for (const [i, tool] of (tools as Block[]).entries()) {
    const type = tool?.['type'];
    if (type !== undefined && type !== null && type !== 'custom') continue; // a server tool (web_search_20250305, ...)
    const name = tool?.['name'];
    // A name of the right characters that is too long gets the length's own message (as Claude Code's MCP users saw it).
    if (typeof name === 'string' && name.length > 128 && TOOL_NAME.test(name.slice(0, 128))) refuse(`tools.${i}.custom.name: String should have at most 128 characters`);
    if (typeof name !== 'string' || !TOOL_NAME.test(name)) refuse(`tools.${i}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{1,128}$'`);
    const schema = tool['input_schema'] as Block | undefined;
    if (typeof schema !== 'object' || schema === null || schema['type'] !== 'object') refuse(`tools.${i}.custom.input_schema.type: Input should be 'object'`);
    if (names.has(name as string)) refuse('tools: Tool names must be unique.');
    names.add(name as string);
  }
  return names;
}

const TOOL_CHOICE_TYPES = ['auto', 'any', 'tool', 'none'];

/**
 * tool_choice: one of its four types, and a forced `tool` names one the request defines (a client tool or a server
 * tool's name). The API refuses a name it has no tool for (the wording of that 400 is not in public reports: this
 * one is ours). Without this check, a translation that forced a tool the request does not send passed every test.
 */
function checkToolChoice(choice: unknown, tools: unknown): void {
  if (choice === undefined || choice === null) return;
  const type = (choice as Block)['type'];
  if (!TOOL_CHOICE_TYPES.includes(String(type))) refuse(`tool_choice: Input tag '${String(type)}' found using 'type' does not match any of the expected tags: 'auto', 'any', 'tool', 'none'`);
  if (type !== 'tool') return;
  const name = (choice as Block)['name'];
  if (typeof name !== 'string') refuse('tool_choice.tool.name: Field required');
  const defined = Array.isArray(tools) && (tools as Block[]).some((t) => t?.['name'] === name);
  if (!defined) refuse(`tool_choice.name: Tool '${String(name)}' not found in tools`);
}

function checkSystem(system: unknown): void {
  if (system === undefined || typeof system === 'string') return;
  if (!Array.isArray(system)) return refuse('system: Input should be a valid string');
  for (const block of system as Block[]) {
    if (block?.['type'] !== 'text' || typeof block['text'] !== 'string') refuse('system: Input should be a valid list of text blocks');
    if (block['text'] === '') refuse('system: text content blocks must be non-empty');
  }
}

/** The messages as the API reads them: consecutive turns of one role combined into one (as documented). */
function mergedTurns(messages: unknown): Turn[] {
  if (!Array.isArray(messages) || messages.length === 0) return refuse('messages: Field required');
  const turns: Turn[] = [];
  for (const [i, raw] of (messages as Block[]).entries()) {
    const role = raw?.['role'];
    if (role !== 'user' && role !== 'assistant') refuse(`messages.${i}.role: Input should be 'user' or 'assistant'`);
    const content = raw['content'];
    const blocks: Block[] = typeof content === 'string' ? [{ type: 'text', text: content }] : Array.isArray(content) ? (content as Block[]) : refuse(`messages.${i}.content: Field required`);
    const last = i === messages.length - 1;
    if (blocks.length === 0 && !(last && role === 'assistant')) refuse(`messages.${i}: all messages must have non-empty content except for the optional final assistant message`);
    for (const [j, block] of blocks.entries()) checkBlock(block, `messages.${i}.content.${j}`, role as Turn['role'], last, blocks);
    const prev = turns.at(-1);
    if (prev !== undefined && prev.role === role) prev.blocks.push(...blocks);
    else turns.push({ role: role as Turn['role'], blocks: [...blocks], at: i });
  }
  return turns;
}

function checkBlock(block: Block, at: string, role: Turn['role'], last: boolean, siblings: Block[]): void {
  switch (block?.['type']) {
    case 'text': {
      const text = block['text'];
      if (typeof text !== 'string') return refuse(`${at}.text.text: Input should be a valid string`);
      // A final assistant message is a prefill: its whitespace rule is the prefill's own (anthropic-responses.ts).
      if (last && role === 'assistant') return;
      if (text === '') refuse('messages: text content blocks must be non-empty');
      // Whitespace-only text passes beside other text with something in it, and is refused alone.
      const said = siblings.some((b) => b?.['type'] === 'text' && typeof b['text'] === 'string' && b['text'].trim() !== '');
      if (text.trim() === '' && !said) refuse('messages: text content blocks must contain non-whitespace text');
      return;
    }
    case 'tool_use': {
      if (typeof block['id'] !== 'string' || !TOOL_ID.test(block['id'])) refuse(`${at}.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'`);
      const name = block['name'];
      if (typeof name !== 'string' || !TOOL_NAME.test(name)) refuse(`${at}.tool_use.name: String should match pattern '^[a-zA-Z0-9_-]{1,128}$'`);
      const input = block['input'];
      if (typeof input !== 'object' || input === null || Array.isArray(input)) refuse(`${at}.tool_use.input: Input should be a valid dictionary`);
      return;
    }
    case 'tool_result': {
      const id = block['tool_use_id'];
      if (typeof id !== 'string' || !TOOL_ID.test(id)) refuse(`${at}.tool_result.tool_use_id: String should match pattern '^[a-zA-Z0-9_-]+$'`);
      const content = block['content'];
      if (Array.isArray(content)) {
        for (const [k, inner] of (content as Block[]).entries()) checkBlock(inner, `${at}.tool_result.content.${k}`, 'user', false, content as Block[]);
      }
      return;
    }
    case 'image': {
      const source = block['source'] as Block | undefined;
      if (source?.['type'] === 'base64' && !IMAGE_TYPES.has(String(source['media_type']))) {
        refuse(`${at}.image.source.base64.media_type: Input should be 'image/jpeg', 'image/png', 'image/gif' or 'image/webp'`);
      }
      return;
    }
    default:
      return; // documents, thinking and the rest: not produced by a chat.completions translation (thinking: checkThinking)
  }
}

/**
 * Every tool_use is answered by a tool_result in the very next turn, those tool_results open that turn, and no
 * tool_result answers a call the previous turn did not make; tool_use ids are unique; a conversation with either
 * block defines tools. Messages as the API writes them in its 400s.
 */
function checkToolPairs(turns: Turn[], tools: Set<string>): void {
  const seen = new Set<string>();
  let toolBlocks = false;
  for (const [t, turn] of turns.entries()) {
    const results = turn.blocks.filter((b) => b['type'] === 'tool_result');
    const prev = turns[t - 1];
    const called = prev?.role === 'assistant' ? prev.blocks.filter((b) => b['type'] === 'tool_use').map((b) => b['id'] as string) : [];
    if (results.length > 0) toolBlocks = true;
    for (const result of results) {
      const id = result['tool_use_id'] as string;
      if (!called.includes(id)) {
        const j = turn.blocks.indexOf(result);
        refuse(`messages.${turn.at}.content.${j}: unexpected \`tool_use_id\` found in \`tool_result\` blocks: ${id}. Each \`tool_result\` block must have a corresponding \`tool_use\` block in the previous message.`);
      }
    }
    if (turn.role === 'user' && called.length > 0) {
      const leading = turn.blocks.findIndex((b) => b['type'] !== 'tool_result');
      const opening = leading === -1 ? turn.blocks.length : leading;
      if (opening < results.length) {
        refuse(`messages.${turn.at}: Did not find ${results.length} \`tool_result\` block(s) at the beginning of this message. Messages following \`tool_use\` blocks must begin with a matching number of \`tool_result\` blocks.`);
      }
    }
    if (turn.role !== 'assistant') continue;
    const uses = turn.blocks.filter((b) => b['type'] === 'tool_use');
    if (uses.length > 0) toolBlocks = true;
    for (const use of uses) {
      const id = use['id'] as string;
      if (seen.has(id)) refuse('messages: `tool_use` ids must be unique');
      seen.add(id);
    }
    const next = turns[t + 1];
    if (next === undefined) continue; // a final assistant turn: its calls are the prefill's own business
    const answered = new Set(next.role === 'user' ? next.blocks.filter((b) => b['type'] === 'tool_result').map((b) => b['tool_use_id']) : []);
    const missing = uses.map((u) => u['id'] as string).filter((id) => !answered.has(id));
    if (missing.length > 0) {
      refuse(`messages.${next.at}: \`tool_use\` ids were found without \`tool_result\` blocks immediately after: ${missing.join(', ')}. Each \`tool_use\` block must have a corresponding \`tool_result\` block in the next message.`);
    }
  }
  if (toolBlocks && tools.size === 0) refuse('Requests which include `tool_use` or `tool_result` blocks must define tools.');
}

const FEATURES = 'Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking#feature-compatibility';

/**
 * Extended thinking's own rules (the extended-thinking and adaptive-thinking guides, and the API's 400s): a budget of
 * at least 1024 and under max_tokens, no sampling changes, no forced tool use, and a last assistant turn (a prefill,
 * or the one whose tool calls the conversation ends answering) that opens with a thinking block. And which models
 * take which form: none before Claude 3.7, `enabled` up to 4.6, `adaptive` from 4.6. The model messages are ours
 * (the API's wording for them is not in public reports); the others are the API's.
 */
function checkThinking(body: Body, turns: Turn[]): void {
  const thinking = body['thinking'] as Block | undefined;
  if (thinking === undefined || thinking === null) return;
  const type = thinking['type'];
  if (type === 'disabled') return;
  if (type !== 'enabled' && type !== 'adaptive') refuse("thinking: Input tag does not match any of the expected tags: 'enabled', 'disabled', 'adaptive'");
  const display = thinking['display'];
  if (display !== undefined && display !== 'summarized' && display !== 'omitted') refuse(`thinking.${type}.display: Input should be 'summarized' or 'omitted'`);
  const version = claudeVersion(String(body['model']));
  if (version !== undefined && version < 3.7) refuse(`${String(body['model'])} does not support thinking.`);
  if (type === 'enabled') {
    if (version !== undefined && version >= 4.7) refuse('thinking.type.enabled is not supported for this model. Use thinking.type.adaptive and output_config.effort instead.');
    const budget = thinking['budget_tokens'];
    if (typeof budget !== 'number' || !Number.isInteger(budget)) refuse('thinking.enabled.budget_tokens: Field required');
    if ((budget as number) < 1024) refuse('thinking.enabled.budget_tokens: Input should be greater than or equal to 1024');
    const max = body['max_tokens'];
    if (typeof max === 'number' && max <= (budget as number)) {
      refuse('`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking#max-tokens-and-context-window-size');
    }
  } else if (version !== undefined && version < 4.6) refuse('adaptive thinking is not supported on this model. Use thinking.type.enabled with budget_tokens.');
  const effort = (body['output_config'] as Block | undefined)?.['effort'];
  if (effort !== undefined && !['low', 'medium', 'high', 'max'].includes(String(effort))) refuse("output_config.effort: Input should be 'low', 'medium', 'high' or 'max'");
  if (body['temperature'] !== undefined && body['temperature'] !== 1) refuse(`\`temperature\` may only be set to 1 when thinking is enabled or in interleaved thinking mode. ${FEATURES}`);
  if (typeof body['top_p'] === 'number' && body['top_p'] < 0.95) refuse(`\`top_p\` must be greater than or equal to 0.95 or unset when thinking is enabled. ${FEATURES}`);
  if (body['top_k'] !== undefined) refuse(`\`top_k\` must be unset when thinking is enabled. ${FEATURES}`);
  const choice = (body['tool_choice'] as Block | undefined)?.['type'];
  if (choice === 'any' || choice === 'tool') refuse('Thinking may not be enabled when tool_choice forces tool use.');
  const last = turns.at(-1);
  const endsInResults = last?.role === 'user' && last.blocks.some((b) => b['type'] === 'tool_result');
  const final = last?.role === 'assistant' ? last : endsInResults ? turns.at(-2) : undefined;
  const first = final?.blocks[0]?.['type'];
  if (final !== undefined && first !== 'thinking' && first !== 'redacted_thinking') {
    refuse(
      `messages.${final.at}.content.0.type: Expected \`thinking\` or \`redacted_thinking\`, but found \`${String(first)}\`. When \`thinking\` is enabled, a final \`assistant\` message must start with a thinking block (preceeding the lastmost set of \`tool_use\` and \`tool_result\` blocks). We recommend you include thinking blocks from previous turns. To avoid this requirement, disable \`thinking\`. Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking`,
    );
  }
}

/** A Claude model's version as a number (3.7, 4.6, 4) when its id reads as one, else undefined (any model goes). */
function claudeVersion(model: string): number | undefined {
  const m = /claude-([1-3])(?:[-.](\d))?(?=-|$)/.exec(model) ?? /claude-(?:opus|sonnet|haiku)-(\d+)(?:[-.](\d{1,2}))?(?!\d)/.exec(model);
  return m ? Number(m[1]) + Number(m[2] ?? 0) / 10 : undefined;
}
