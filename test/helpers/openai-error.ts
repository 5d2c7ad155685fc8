// The check every gateway error must pass: the OpenAI error shape, exactly its four fields.
import { expect } from 'vitest';
import OpenAI from 'openai';

export function expectOpenAIError(body: unknown, code: string, type = 'invalid_request_error'): Record<string, unknown> {
  const e = (body as { error: Record<string, unknown> }).error;
  expect(Object.keys(e).sort()).toEqual(['code', 'message', 'param', 'type']);
  expect(e.code).toBe(code);
  expect(e.type).toBe(type);
  expect(typeof e.message).toBe('string');
  return e;
}

export type APIError = InstanceType<typeof OpenAI.APIError>;

/** The SDK error a call rejects with (fails the test if it resolves, or rejects with anything else). */
export async function sdkError(p: Promise<unknown>): Promise<APIError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(OpenAI.APIError);
  return err as APIError;
}
