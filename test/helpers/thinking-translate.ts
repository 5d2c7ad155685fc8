// reasoning_effort -> thinking as toAnthropicRequest translates it, for the tests of the mapping: the default budgets,
// a question to think about, and a check that the strict mock (and so Anthropic) takes what was sent.
import { expect } from 'vitest';
import { checkMessagesRequest } from '../../src/mock/anthropic-strict.ts';
import { toAnthropicRequest, type OpenAIChatRequest, type ThinkingBudgets } from '../../src/providers/anthropic/index.ts';

export const budgets: ThinkingBudgets = { low: 1024, medium: 4096, high: 16384, xhigh: 24576 };
export const ask = [{ role: 'user' as const, content: 'Prove that there are infinitely many primes.' }];

/** A chat completion (`o3`, asking `ask`, plus `extra`) as translated for an Anthropic target; throws when refused. */
export function translate(extra: Partial<OpenAIChatRequest>, opts: { model?: string; sampling?: 'drop' | 'forward'; thinking?: ThinkingBudgets | false } = {}) {
  const body = { model: 'o3', messages: ask, ...extra } as OpenAIChatRequest;
  const r = toAnthropicRequest(body, { model: opts.model ?? 'claude-sonnet-4-5', defaultMaxTokens: 4096, sampling: opts.sampling, thinking: opts.thinking ?? budgets });
  if (!r.ok) throw new Error(r.reason);
  return r.body;
}

/** The translated request is one the (strict) mock, and so Anthropic, takes. */
export const accepted = (body: object) => expect(() => checkMessagesRequest(body as Record<string, unknown>)).not.toThrow();
