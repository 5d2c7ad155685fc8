// Whether a target continues an assistant message placed last (a prefill), which stream recovery relies on to have
// the next target finish a cut answer. A model's property, not a provider's: Anthropic's Claude models before 4.6
// take one, and Claude 4.6 and later refuse it ("Prefilling assistant messages is not supported for this model", 400).

import type { ProviderConfig } from '../config/schema.ts';

/**
 * Major and minor version in Claude model ids: claude-sonnet-4-6, claude-opus-4-7-20260101, us.anthropic.claude-opus-4-6-v1,
 * and dotted as OpenRouter and LiteLLM spell them (anthropic/claude-sonnet-4.6: read as 4.0, it was sent a prefill it refuses).
 */
const CLAUDE_VERSION = /claude-(?:opus|sonnet|haiku)-(\d+)(?:[-.](\d{1,2}))?(?!\d)/;

/**
 * The provider's `prefill` when set; otherwise none, except for an Anthropic model older than Claude 4.6 (the older
 * ids, claude-3-5-sonnet-20241022 and the like, name the version first). An unknown Anthropic id (a future naming)
 * is taken as a newer model's: a recovery not tried costs the client what it would have had anyway; one refused
 * costs a retry from the budget. Pure.
 */
export function takesPrefill(provider: Pick<ProviderConfig, 'family' | 'prefill'>, model: string | undefined): boolean {
  if (provider.prefill !== undefined) return provider.prefill;
  if (provider.family !== 'anthropic' || model === undefined) return false;
  if (/claude-[1-3](?:[-.]\d)?(?:-|$)/.test(model)) return true;
  const m = CLAUDE_VERSION.exec(model);
  if (!m) return false;
  const major = Number(m[1]);
  const minor = Number(m[2] ?? 0);
  return major < 4 || (major === 4 && minor < 6);
}
