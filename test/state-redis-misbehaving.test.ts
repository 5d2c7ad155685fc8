// A Redis that is up but misbehaves while the gateway uses it: it answers reads but refuses writes (OOM under
// noeviction), its ACL loses the events channel at run time. The store must stay degraded while Redis cannot take
// its writes (one warning, not a degraded/recovered pair every second), and come back to the fleet once Redis is fixed,
// subscription included, without a restart.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { afterEach, describe, expect, it } from 'vitest';
import { fleetShare } from '../src/pools/fleet-share.ts';
import { configProblem } from '../src/state/redis-errors.ts';
import type { BreakerRecord } from '../src/state/store.ts';
import { startRedis, useRedisServerWithAdmin } from './helpers/redis-server.ts';
import { eventually, loggedStores, README_ACL, type LogLine } from './helpers/redis-stores.ts';
import { TEST_SECRETS } from './helpers/test-secrets.ts';

const PASSWORD = TEST_SECRETS[2]!;

const server = useRedisServerWithAdmin();
const store = loggedStores('m');

afterEach(async () => {
  await server.admin().config('SET', 'maxmemory', '0');
});




const count = (lines: LogLine[], prefix: string) => lines.filter((l) => l.msg.startsWith(prefix)).length;

describe('a Redis that answers reads but refuses writes (OOM with maxmemory-policy noeviction)', () => {
  it('stays degraded while writes fail: one degraded line, no recovered/degraded pair every second; back once writes pass', async () => {
    const { store: s, lines } = store(server.redis().url);
    expect(await s.ready()).toBe(true);
    await server.admin().config('SET', 'maxmemory-policy', 'noeviction');
    await server.admin().config('SET', 'maxmemory', '1'); // below what any redis-server uses: every write is refused
    const until = Date.now() + 3_500;
    let sawUsable = 0;
    while (Date.now() < until) {
      await s.addOutcomes('t', 0, { requests: 1, failures: 0 }, Date.now(), 10); // answered locally
      if (!s.degraded) sawUsable++;
      await sleep(20);
    }
    expect(count(lines(), 'state store degraded')).toBe(1);
    expect(count(lines(), 'state store recovered')).toBe(0);
    expect(sawUsable).toBeLessThanOrEqual(1); // the first call, before Redis refused it

    await server.admin().config('SET', 'maxmemory', '0');
    await eventually(() => !s.degraded, 3_000);
    expect(count(lines(), 'state store recovered')).toBe(1);
  });
});

describe('a Redis user that loses the events channel at run time (ACL)', () => {
  it('is a configuration problem, not an outage: one error line and no flapping while scripts cannot publish', async () => {
    await server.admin().call('ACL', 'SETUSER', 'chan', 'on', `>${PASSWORD}`, '~*', '&*', ...README_ACL);
    try {
      const { store: s, lines } = store(`redis://chan:${PASSWORD}@127.0.0.1:${server.redis().port}`);
      expect(await s.ready()).toBe(true);
      await server.admin().call('ACL', 'SETUSER', 'chan', 'resetchannels', '&elsewhere:*');
      const until = Date.now() + 3_500;
      let i = 0;
      while (Date.now() < until) {
        const now = Date.now();
        await s.casBreaker(`t${i}`, 0, { state: 'open', sinceMs: now, openUntilMs: now + 30_000, probeSuccesses: 0, generation: 1 });
        i++;
        await sleep(50);
      }
      expect(lines().filter((l) => l.level === 50).map((l) => l.problem)).toContain('permissions');
      expect(count(lines(), 'state store degraded')).toBe(1);
      expect(count(lines(), 'state store recovered')).toBe(0);
    } finally {
      await server.admin().call('ACL', 'DELUSER', 'chan');
    }
  });

  it('subscribes again once the ACL gives the channel back, so it hears the fleet without a restart', async () => {
    await server.admin().call('ACL', 'SETUSER', 'chan2', 'on', `>${PASSWORD}`, '~*', '&*', ...README_ACL);
    try {
      const keyPrefix = `m-${randomUUID()}`;
      const { store: a } = store(`redis://chan2:${PASSWORD}@127.0.0.1:${server.redis().port}`, keyPrefix);
      const { store: b } = store(server.redis().url, keyPrefix);
      expect(await a.ready()).toBe(true);
      expect(await b.ready()).toBe(true);
      // Redis drops the subscriber of a user that loses the channel; its reconnect is refused the SUBSCRIBE.
      await server.admin().call('ACL', 'SETUSER', 'chan2', 'resetchannels', '&elsewhere:*');
      await sleep(1_000);
      await server.admin().call('ACL', 'SETUSER', 'chan2', 'resetchannels', '&*');
      await sleep(2_500);
      a.getBreaker('p/m'); // A has looked at the target: it follows it from now on
      await sleep(200);
      const now = Date.now();
      const open: BreakerRecord = { state: 'open', sinceMs: now, openUntilMs: now + 30_000, probeSuccesses: 0, generation: 1 };
      expect(await b.casBreaker('p/m', 0, open)).toBe(true);
      await eventually(() => a.getBreaker('p/m')?.state === 'open', 2_000);
    } finally {
      await server.admin().call('ACL', 'DELUSER', 'chan2');
    }
  });
});

describe('the degraded warning', () => {
  it('names the error of this outage, not one left over from an earlier one', async () => {
    const own = await startRedis();
    const adminOwn = new Redis(own.url);
    try {
      const { store: s, lines } = store(own.url);
      expect(await s.ready()).toBe(true);
      await adminOwn.config('SET', 'maxmemory-policy', 'noeviction');
      await adminOwn.config('SET', 'maxmemory', '1');
      await s.addOutcomes('t', 0, { requests: 1, failures: 0 }, Date.now(), 10);
      expect(s.degraded).toBe(true);
      await adminOwn.config('SET', 'maxmemory', '0');
      await eventually(() => !s.degraded, 3_000);
      adminOwn.disconnect();
      own.kill(); // the connection closes; no reply error this time
      await eventually(() => s.degraded, 2_000);
      const warnings = lines().filter((l) => l.msg.startsWith('state store degraded'));
      expect(warnings).toHaveLength(2);
      expect(warnings[1]!.error?.message ?? '').not.toMatch(/OOM/);
    } finally {
      adminOwn.disconnect();
      own.kill();
    }
  });

  it('names a killed Redis as a lost connection, not a command timeout the store got over before it', async () => {
    const own = await startRedis();
    const adminOwn = new Redis(own.url);
    try {
      const { store: s, lines } = store(own.url);
      expect(await s.ready()).toBe(true);
      const budget = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 1 };
      // One late reply (timeout 100 ms, Redis paused for 400): no outage, answered locally.
      await adminOwn.call('CLIENT', 'PAUSE', '400', 'ALL');
      await s.takeRetry('r', budget, Date.now());
      expect(s.degraded).toBe(false);
      await sleep(500); // the pause is over
      // Then Redis answers: a call back well within the 100 ms timeout was (on a loaded machine, the next one may be).
      for (let answered = false, i = 0; !answered; i++) {
        expect(i).toBeLessThan(20);
        const start = Date.now();
        await s.takeRetry('r', budget, start);
        answered = Date.now() - start < 80;
      }
      expect(s.degraded).toBe(false);
      adminOwn.disconnect();
      own.kill(); // nothing in flight: the connection just closes, with no error of its own
      await eventually(() => s.degraded, 2_000);
      const warnings = lines().filter((l) => l.msg.startsWith('state store degraded'));
      expect(warnings).toHaveLength(1);
      expect(warnings[0]!.error?.message ?? '').not.toMatch(/timed out/);
    } finally {
      adminOwn.disconnect();
      own.kill();
    }
  });
});

describe('classifying script ACL refusals (Redis 7)', () => {
  const reply = (message: string) => Object.assign(new Error(message), { name: 'ReplyError' });
  it('takes every way a script is refused for the ACL as a permissions problem', () => {
    for (const message of [
      "ERR The user executing the script can't run this command or subcommand script: 0123abcd, on @user_script:5.",
      "ERR The user executing the script can't access at least one of the keys mentioned in the command script: 0123abcd, on @user_script:5.",
      "ERR The user executing the script can't publish to the channel mentioned in the command script: 0123abcd, on @user_script:10.",
    ]) expect(configProblem(reply(message))?.kind, message).toBe('permissions');
    expect(configProblem(reply("OOM command not allowed when used memory > 'maxmemory'. script: 0123abcd, on @user_script:20."))).toBeUndefined();
  });
});

describe('a demand value in the fleet\'s hash that no instance writes (by hand, a bug, another build)', () => {
  it('counts for nothing, and the pool share it comes into stays a share, not NaN', async () => {
    const { store: s, keyPrefix } = store(server.redis().url);
    await eventually(async () => (await s.exchangeDemand('p', [1, 1], Date.now())) !== undefined, 5_000);
    // 400 digits: a number to Lua (inf), which its tostring writes as "inf", which Number() reads as NaN.
    await server.admin().hset(`${keyPrefix}:{pool/p}:demand-by-class`, 'other', `${'9'.repeat(400)},2:${Date.now()}`);
    const fleet = (await s.exchangeDemand('p', [1, 1], Date.now()))!;
    expect(fleet.instances).toBe(2);
    expect(fleet.totals).toEqual([1, 3]);
    const classes = [{ name: 'online', minShare: 0.7, maxQueue: 5 }, { name: 'batch', minShare: 0.1, maxQueue: 5 }];
    expect(fleetShare(24, classes, [1, 1], [Number.NaN, 3], 2)).toBeGreaterThan(0);
    expect(fleetShare(24, classes, [1, 1], [Number.POSITIVE_INFINITY, 3], 2)).toBeLessThanOrEqual(1);
  });
});
