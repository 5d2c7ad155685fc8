// For the tests of the target keys a model name takes (fallback-keys, mutation-mut-today-23): one chat call's status
// as the SDK saw it, and the attempts /metrics counts for a target.
import OpenAI from 'openai';
import { metricSum, type Stack } from './stack.ts';

export async function status(client: OpenAI, model: string): Promise<number> {
  try {
    await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }] });
    return 200;
  } catch (err) {
    if (err instanceof OpenAI.APIError && err.status !== undefined) return err.status;
    throw err;
  }
}

export const attempts = (s: Stack, target: string, statusClass: string) => metricSum(s, `stormgate_upstream_attempts_total{target="${target}",status_class="${statusClass}"}`);
