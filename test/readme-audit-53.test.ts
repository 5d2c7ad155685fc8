// README claims checked as a new user meets them (audit 53): "Logs and metrics", "Health, readiness, shutdown",
// "Deployment", the grafana/ files and config/examples, by running them. What earlier audits and tests hold (the metric
// table's names and labels, the dashboard's and rules' queries, the compose and image files, the drain) is not repeated.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { requestLine, useStacks } from './helpers/stack.ts';

const README = readFileSync(join(import.meta.dirname, '..', 'README.md'), 'utf8');

describe('README "Logs and metrics": the size of a request line', () => {
  const stack = useStacks();

  it('states about the bytes a plain success line takes, and the day\'s volume at 1,000 requests/s from it', async () => {
    const s = await stack();
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 });
    await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    const line = await requestLine(s);
    expect(line.attempts).toHaveLength(1);
    const raw = s.logs.find((l) => l.includes(`"reqId":"${line.reqId}"`))!;
    const bytes = Buffer.byteLength(raw); // as pino wrote it, the newline included

    const claim = /At about ([\d,]+) bytes a line.*?, 1,000 requests\/s\s+write about (\d+) GB a day/s.exec(README);
    expect(claim, 'the README states a line\'s size and a day\'s volume').not.toBeNull();
    const stated = Number(claim![1]!.replace(/,/g, ''));
    // The mock's request ids are 10 characters shorter than OpenAI's (req_ and 32 hex digits), its provider name 2
    // shorter than "openai": a real line is a little longer than this one.
    expect(Math.abs(stated - bytes) / bytes, `a plain success line is ${bytes} bytes here, the README says about ${stated}`).toBeLessThan(0.1);
    const gbPerDay = (stated * 1000 * 86_400) / 1e9;
    expect(Math.abs(Number(claim![2]) - gbPerDay) / gbPerDay).toBeLessThan(0.1);
  });
});
