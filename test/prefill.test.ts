import { describe, expect, it } from 'vitest';
import { takesPrefill } from '../src/providers/prefill.ts';

const anthropic = { family: 'anthropic' as const, prefill: undefined };
const openai = { family: 'openai' as const, prefill: undefined };

describe('takesPrefill', () => {
  it('reads an Anthropic model\'s id: Claude before 4.6 continues a prefill, 4.6 and later refuse one (400)', () => {
    for (const model of ['claude-3-5-sonnet-20241022', 'claude-3-opus-20240229', 'claude-2.1', 'claude-sonnet-4-20250514', 'claude-opus-4-1-20250805', 'claude-sonnet-4-5', 'claude-haiku-4-5-20251001']) {
      expect(takesPrefill(anthropic, model), model).toBe(true);
    }
    for (const model of ['claude-sonnet-4-6', 'claude-opus-4-6', 'us.anthropic.claude-opus-4-6-v1', 'claude-opus-4-7-20260401', 'claude-opus-5', 'claude-next', undefined]) {
      expect(takesPrefill(anthropic, model), String(model)).toBe(false);
    }
  });

  it('takes the provider\'s own prefill when set, and is false for other families without it', () => {
    expect(takesPrefill({ family: 'anthropic', prefill: true }, 'claude-sonnet-4-6')).toBe(true);
    expect(takesPrefill({ family: 'anthropic', prefill: false }, 'claude-sonnet-4-5')).toBe(false);
    expect(takesPrefill(openai, 'claude-sonnet-4-5')).toBe(false);
    expect(takesPrefill({ family: 'openai', prefill: true }, 'gpt-4o')).toBe(true);
  });
});
