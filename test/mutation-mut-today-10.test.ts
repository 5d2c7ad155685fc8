// Mutation tests for the day's changes (QA rev10): what an instance kept while Redis was away reaching Redis through a
// second outage (src/state/redis-kept-keys.ts sendLocalKeys), and an early answer's mark per request on a kept-alive
// connection (src/http/client-errors.ts).
import { connect } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { answer, cutAndFleet, eventually, running } from './helpers/redis-stores.ts';
import { defaultConfig, useStacks } from './helpers/stack.ts';


describe('a run claimed in the process while Redis was away, through a second outage', () => {
  it('claimed in Redis at the return (for what is left of its lease), its end reaches Redis after the next one; one whose key the fleet answered leaves that answer there', async () => {
    const { cut, fleet, admin, keyPrefix, away, back, close } = await cutAndFleet({ prefix: 'mut10' });
    try {
      await away();
      const now = Date.now();
      expect(await cut.claimKey('mine', running('run', now), 30_000)).toBeUndefined();
      expect(await cut.claimKey('both', running('run-2', now), 30_000)).toBeUndefined();
      expect(await fleet.claimKey('both', running('theirs', now), 30_000)).toBeUndefined();
      await fleet.settleKey('both', answer('theirs'), 60_000, now, 'theirs');
      await back();
      await eventually(async () => (await fleet.readKey('mine', Date.now()))?.state === 'running', 2_000);
      const pttl = await admin.pttl(`${keyPrefix}:idempotency:{mine}`);
      expect(pttl).toBeGreaterThan(20_000);
      expect(pttl).toBeLessThanOrEqual(30_000);
      await sleep(200);
      await away();
      await cut.settleKey('mine', answer('mine'), 60_000, Date.now(), 'run');
      await cut.settleKey('both', answer('mine too'), 60_000, Date.now(), 'run-2');
      await back();
      // Not the claim of a run that is over, held until it lapses: a repeat on the fleet gets the answer.
      await eventually(async () => (await fleet.readKey('mine', Date.now()))?.state === 'done', 2_000);
      expect(await fleet.readKey('mine', Date.now())).toEqual(answer('mine'));
      await sleep(200);
      expect(await fleet.readKey('both', Date.now())).toEqual(answer('theirs'));
    } finally {
      await close();
    }
  });
});

describe('early answers on one kept-alive connection', () => {
  const startStack = useStacks();

  it('a second request answered early (413) that then times out sending its body gets no second answer, after a first one whose body came in whole', async () => {
    const stack = await startStack({ config: (url) => ({ ...defaultConfig(url), server: { host: '127.0.0.1', port: 0, requestTimeoutMs: 800, bodyLimitBytes: 1000 } }) });
    const socket = connect(Number(new URL(stack.url).port), '127.0.0.1');
    let answers = '';
    socket.on('data', (d) => (answers += d.toString()));
    const closed = new Promise<void>((r) => socket.once('close', () => r()));
    const head = (length: number) => `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: ${length}\r\n\r\n`;
    socket.write(head(2000));
    await eventually(() => answers.includes('HTTP/1.1 413 '), 3_000);
    socket.write('x'.repeat(2000));
    socket.write(head(100_000) + '{"model":');
    await closed;
    expect(answers.match(/HTTP\/1\.1 \d{3} /g)).toEqual(['HTTP/1.1 413 ', 'HTTP/1.1 413 ']);
  });
});
