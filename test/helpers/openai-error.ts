// The check every gateway error must pass: the OpenAI error shape, exactly its four fields.
import { expect } from 'vitest';

export function expectOpenAIError(body: unknown, code: string, type = 'invalid_request_error'): Record<string, unknown> {
  const e = (body as { error: Record<string, unknown> }).error;
  expect(Object.keys(e).sort()).toEqual(['code', 'message', 'param', 'type']);
  expect(e.code).toBe(code);
  expect(e.type).toBe(type);
  expect(typeof e.message).toBe('string');
  return e;
}
