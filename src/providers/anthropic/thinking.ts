// OpenAI's reasoning_effort -> Anthropic's thinking, for a chat completion translated for an Anthropic target. The
// rule: a failover must never turn a request the target would have answered into a 400, so thinking is asked for
// only where Anthropic takes it, and left out (the request goes as before, without thinking) wherever it would be
// refused. Anthropic refuses thinking (documented, and seen in its 400s):
//   - on models without it: Claude 3.5 and older (and names this code cannot place: an alias, a future family);
//   - in the budget form (`enabled` + budget_tokens) on Claude 4.7 and later, which take only `adaptive` + effort;
//   - with a budget under 1024 or not under max_tokens;
//   - with a tool_choice that forces a call (any, tool): only auto and none;
//   - with temperature other than 1 or top_p under 0.95 (sent only with `sampling: forward`);
//   - when the last assistant turn does not open with a thinking block, which it must when it is a prefill (the
//     conversation ends on it) or when the conversation ends in its tool results (an agent loop's next step): an
//     OpenAI client sends back no thinking blocks, and none could be made up, as each carries Anthropic's signature.
import type { AnthropicMessagesRequest } from './types.ts';

/** Thinking budgets, in tokens, per reasoning_effort (the provider's `thinking` setting). */
export interface ThinkingBudgets {
  low: number;
  medium: number;
  high: number;
  xhigh: number;
}

/** Anthropic's smallest budget_tokens. */
const MIN_BUDGET_TOKENS = 1024;

type Effort = keyof ThinkingBudgets;
const EFFORTS: ReadonlySet<string> = new Set<Effort>(['low', 'medium', 'high', 'xhigh']);

/** The fields a request with thinking gets in place of its own. */
type ThinkingFields = Pick<AnthropicMessagesRequest, 'thinking' | 'max_tokens' | 'output_config'>;

interface ThinkingInput {
  /** The client's reasoning_effort, as sent. */
  effort: unknown;
  /** The translated request, tools, sampling and conversation included. */
  request: AnthropicMessagesRequest;
  /** The client set max_tokens / max_completion_tokens (else request.max_tokens is the provider's default). */
  clientMaxTokens: boolean;
  budgets: ThinkingBudgets;
}

/**
 * The thinking fields for a request, or undefined to send it without thinking: no effort asked for (none, minimal,
 * a value OpenAI does not have), or one of the refusals above. Pure.
 *
 * max_tokens covers thinking and answer together at Anthropic, as max_completion_tokens covers reasoning and answer
 * at OpenAI. A client's own limit is kept, and the budget takes at most half of it (the answer keeps the other half);
 * under 1024 tokens, no thinking. Without one, the budget is added to the provider's defaultMaxTokens, so the answer
 * keeps the room it has without thinking.
 */
export function thinkingFields(input: ThinkingInput): ThinkingFields | undefined {
  const { effort, request, clientMaxTokens, budgets } = input;
  if (typeof effort !== 'string' || !EFFORTS.has(effort)) return undefined;
  const form = thinkingForm(request.model);
  if (form === undefined || refused(request)) return undefined;
  const configured = budgets[effort as Effort];
  if (form === 'adaptive') {
    // Claude decides how much to think, at the effort asked; 4.7 and later leave the thinking text out unless
    // asked for it (display), and a client that asked for reasoning reads it as reasoning_content.
    const output_config = { ...request.output_config, effort: effort === 'xhigh' ? 'high' : effort } as NonNullable<AnthropicMessagesRequest['output_config']>;
    return { thinking: { type: 'adaptive', display: 'summarized' }, max_tokens: clientMaxTokens ? request.max_tokens : request.max_tokens + configured, output_config };
  }
  const budget = clientMaxTokens ? Math.min(configured, Math.floor(request.max_tokens / 2)) : configured;
  if (budget < MIN_BUDGET_TOKENS) return undefined;
  return { thinking: { type: 'enabled', budget_tokens: budget }, max_tokens: clientMaxTokens ? request.max_tokens : request.max_tokens + budget };
}

/**
 * How a model takes thinking: `budget` (Claude 3.7, Claude 4 to 4.6: `enabled` with budget_tokens, deprecated on 4.6
 * but taken), `adaptive` (Claude 4.7 and later Opus, Sonnet and Haiku: the only form they take), or undefined (older
 * models, and ids this cannot read: sending thinking to them could be refused).
 */
export function thinkingForm(model: string): 'budget' | 'adaptive' | undefined {
  const version = claudeVersion(model);
  if (version === undefined) return undefined;
  const [major, minor] = version;
  if (major < 3 || (major === 3 && minor < 7)) return undefined;
  if (major === 3 || (major === 4 && minor <= 6)) return 'budget';
  return 'adaptive';
}

// Ids that name the version first: claude-3-7-sonnet-20250219, claude-3-5-haiku-latest, claude-3-opus-20240229, claude-2.1.
const VERSION_FIRST = /claude-([1-3])(?:[-.](\d))?(?=-|$)/;
// Ids that name the family first: claude-sonnet-4-5, claude-opus-4-1-20250805, us.anthropic.claude-opus-4-6-v1, claude-sonnet-4-20250514,
// and dotted as OpenRouter and LiteLLM spell them (anthropic/claude-opus-4.7): read as 4.0, that got the budget form 4.7 refuses.
const FAMILY_FIRST = /claude-(?:opus|sonnet|haiku)-(\d+)(?:[-.](\d{1,2}))?(?!\d)/;

function claudeVersion(model: string): [major: number, minor: number] | undefined {
  const m = VERSION_FIRST.exec(model) ?? FAMILY_FIRST.exec(model);
  return m ? [Number(m[1]), Number(m[2] ?? 0)] : undefined;
}

function refused(request: AnthropicMessagesRequest): boolean {
  const choice = request.tool_choice?.type;
  if (choice === 'any' || choice === 'tool') return true;
  if (request.temperature !== undefined && request.temperature !== 1) return true;
  if (request.top_p !== undefined && request.top_p < 0.95) return true;
  const last = request.messages.at(-1);
  if (last?.role === 'assistant') return true; // a prefill
  return last?.role === 'user' && last.content.some((b) => b.type === 'tool_result');
}
