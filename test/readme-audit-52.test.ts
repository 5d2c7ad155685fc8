// README claims checked as a new user meets them (audit 52): the "Headers" section's list of what goes upstream,
// against the headers a retried request really carries at the provider. What earlier audits and tests hold (the error
// table against ERROR_CODES, the metric table, the config reference, the quick start) is not repeated.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { RETRY_LOOP_ONLY, useStacks } from './helpers/stack.ts';

const README = readFileSync(join(import.meta.dirname, '..', 'README.md'), 'utf8');
/** The "Headers" section's first bullet: what the gateway sends upstream. */
const SENT_UPSTREAM = (() => {
  const section = README.slice(README.indexOf('### Headers'), README.indexOf('### Paths'));
  return section.slice(section.indexOf('- Sent upstream'), section.indexOf('- Passed back from upstream'));
})();

describe('README "Headers": what is sent upstream', () => {
  const stack = useStacks(RETRY_LOOP_ONLY);

  it('names every header the gateway itself adds to a retried request, and the via entry as it is written', async () => {
    const s = await stack({ faults: { errors: [{ status: 503, times: 1 }] } });
    const client = { 'content-type': 'application/json', 'user-agent': 'audit/52', accept: 'application/json' };
    const res = await fetch(`${s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: client,
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(res.status).toBe(200);
    const [first, retry] = s.mock.requests();
    expect(retry).toBeDefined();
    // What the provider got beyond the client's own headers and the transport's (host, connection, content-length).
    const transport = new Set(['host', 'connection', 'content-length']);
    const added = Object.keys(retry!.headers).filter((h) => !transport.has(h) && !(h in client));
    expect(added.sort()).toEqual(['authorization', 'via', 'x-client-request-id', 'x-retry-attempt', 'x-retry-reason']);
    for (const name of added) expect(SENT_UPSTREAM, `the Headers section does not name ${name}`).toContain(`\`${name}`);
    expect(first!.headers['x-retry-attempt']).toBeUndefined();
    expect([retry!.headers['x-retry-attempt'], retry!.headers['x-retry-reason']]).toEqual(['1', 'status_503']);

    // The via entry is `1.1 ` and the instance's name, which is `stormgate-` and 8 hex digits (the log line's instance):
    // not `stormgate-` put before that name a second time.
    const line = JSON.parse(s.logs.find((l) => l.includes('"reqId"'))!) as { instance: string };
    expect(line.instance).toMatch(/^stormgate-[0-9a-f]{8}$/);
    expect(retry!.headers.via).toBe(`1.1 ${line.instance}`);
    const written = /`via: ([^`]+)`/.exec(SENT_UPSTREAM)?.[1];
    expect(written).toBe('1.1 <instance>');
  });
});
