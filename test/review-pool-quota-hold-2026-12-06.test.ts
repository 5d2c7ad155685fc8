// A quota-low answer whose reset is further off than a Node timer can wait (2^31-1 ms, about 24.8 days: an Anthropic
// reset date skewed far ahead, an OpenAI-compatible provider's `x-ratelimit-reset-requests: 1000h`): the pool's timer
// for the end of its lower-class hold overflowed to 1 ms, fired, re-armed itself for the same overflowing delay, and
// spun a timer a millisecond (with a TimeoutOverflowWarning each) for as long as the hold lasted.
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { setTimeout as sleep } from 'node:timers/promises';
import { completion, useScriptedGateway } from './helpers/scripted-provider.ts';

const gateway = useScriptedGateway();

let overflows = 0;
const onWarning = (w: Error) => {
  if (w.name === 'TimeoutOverflowWarning') overflows++;
};
beforeEach(() => {
  overflows = 0;
  process.on('warning', onWarning);
});
afterEach(() => {
  process.off('warning', onWarning);
});

describe('a quota hold whose reset is weeks away', () => {
  it('arms no timer past what Node can wait: no 1 ms spin while the hold lasts', async () => {
    const { client } = await gateway((body) => ({
      ...completion('ok', String(body.model)),
      headers: { 'content-type': 'application/json', 'x-ratelimit-limit-requests': '1000', 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '1000h' },
    }));
    const answer = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    expect(answer.choices[0]!.message.content).toBe('ok');
    // An overflowed timer fires every millisecond: over half a second, hundreds of warnings.
    await sleep(500);
    expect(overflows).toBe(0);
  });
});

describe('a quota hold the provider\'s later answers end', () => {
  it('lets batch go once an answer says the quota is no longer low, not only at the reset first announced', async () => {
    const quota = (remaining: string) => ({ 'content-type': 'application/json', 'x-ratelimit-limit-requests': '1000', 'x-ratelimit-remaining-requests': remaining, 'x-ratelimit-reset-requests': '1h' });
    // The first answer: quota spent, reset in an hour (as announced); the next ones: the window rolled over, 990 left.
    const { client } = await gateway((body, n) => ({ ...completion('ok', String(body.model)), headers: quota(n === 1 ? '0' : '990') }));
    const ask = (priority?: string) =>
      client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }, priority ? { headers: { 'x-stormgate-priority': priority } } : {});
    await ask();
    await ask();
    const answer = await ask('batch');
    expect(answer.choices[0]!.message.content).toBe('ok');
  });
});
