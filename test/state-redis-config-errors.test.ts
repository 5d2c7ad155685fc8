// A Redis that refuses the gateway's settings (a wrong or missing password, a database that does not exist) is a
// configuration problem, not an outage: the gateway still serves on local state, but says so at error level, once, names
// the setting to check, and never logs the password.
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { configProblem, safeError } from '../src/state/redis-errors.ts';
import type { BreakerRecord } from '../src/state/store.ts';
import { startRedis, type RedisHandle } from './helpers/redis-server.ts';
import { eventually, loggedStores, README_ACL } from './helpers/redis-stores.ts';
import { TEST_SECRETS } from './helpers/test-secrets.ts';

// Two of the run's known credentials, so the end-of-run log check looks for them too.
const PASSWORD = TEST_SECRETS[2]!;
const WRONG_PASSWORD = TEST_SECRETS[1]!;
const OPEN: BreakerRecord = { state: 'open', sinceMs: 1000, openUntilMs: 6000, probeSuccesses: 0, generation: 1 };
const BUDGET = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 1 };

let redis: RedisHandle;
let admin: Redis;
const store = loggedStores('c');

beforeAll(async () => {
  redis = await startRedis();
  admin = new Redis(redis.url);
  await admin.config('SET', 'requirepass', PASSWORD);
});
afterAll(async () => {
  admin?.disconnect();
  await redis?.stop();
});
afterEach(async () => {
  await admin.config('SET', 'requirepass', PASSWORD);
});



const hostPort = () => `127.0.0.1:${redis.port}`;


describe('Redis refuses the configured settings', () => {
  it('a wrong password: serves on local state, one error line naming the setting, no password, and recovers once Redis accepts it', async () => {
    const { store: s, raw, lines } = store(`redis://:${WRONG_PASSWORD}@${hostPort()}`);
    await eventually(() => s.degraded, 2_000);
    // Many reconnects (50 ms doubling, at most 2 s apart) later, still one line.
    await sleep(2_500);
    const errors = lines().filter((l) => l.level === 50);
    expect(errors).toHaveLength(1);
    expect(errors[0]).toMatchObject({ problem: 'credentials', setting: 'state.redis username/password' });
    expect(errors[0]!.msg).toMatch(/configuration problem, not an outage: check the username and password in state\.redis/);
    expect(lines().filter((l) => l.msg.startsWith('state store degraded'))).toHaveLength(1);
    expect(raw.join('')).not.toContain(WRONG_PASSWORD);
    expect(raw.join('')).not.toContain(PASSWORD);
    // Still serving, on local state.
    expect(await s.casBreaker('t', 0, OPEN)).toBe(true);
    expect(await s.takeRetry('r', BUDGET, Date.now())).toBe(true);

    await admin.config('SET', 'requirepass', WRONG_PASSWORD);
    await eventually(() => !s.degraded, 5_000);
    expect(raw.join('')).not.toContain(WRONG_PASSWORD);
  });

  it('no password where Redis needs one: one error line saying to set it', async () => {
    const { store: s, raw, lines } = store(`redis://${hostPort()}`);
    await eventually(() => s.degraded, 2_000);
    await sleep(1_500);
    const errors = lines().filter((l) => l.level === 50);
    expect(errors).toHaveLength(1);
    expect(errors[0]).toMatchObject({ problem: 'password-missing', setting: 'state.redis password' });
    expect(errors[0]!.msg).toMatch(/configuration problem/);
    expect(raw.join('')).not.toContain(PASSWORD);
  });

  it('a database index Redis does not have: one error line, and it stays off Redis instead of writing to db 0', async () => {
    const { store: s, keyPrefix, raw, lines } = store(`redis://:${PASSWORD}@${hostPort()}/99`);
    await eventually(() => s.degraded, 2_000);
    expect(await s.ready(300)).toBe(false);
    expect(await s.casBreaker('t', 0, OPEN)).toBe(true);
    await s.setHoldOff('t', Date.now() + 60_000);
    await sleep(1_200); // a probe or two later: still off Redis
    expect(s.degraded).toBe(true);
    expect(await admin.keys(`${keyPrefix}*`)).toEqual([]); // db 0, which the connection fell back to
    const errors = lines().filter((l) => l.level === 50);
    expect(errors).toHaveLength(1);
    expect(errors[0]).toMatchObject({ problem: 'database', setting: 'state.redis db' });
    expect(errors[0]!.msg).toMatch(/check the db index in state\.redis/);
    expect(raw.join('')).not.toContain(PASSWORD);
  });
});

describe('Redis refuses the commands the gateway needs (ACL)', () => {
  it('one error line naming the user\'s ACL, local state throughout, and no degraded/recovered flapping on each probe', async () => {
    await admin.call('ACL', 'SETUSER', 'noscripts', 'on', `>${PASSWORD}`, '~*', '&*', '+@all', '-@scripting');
    try {
      const { store: s, raw, lines } = store(`redis://noscripts:${PASSWORD}@${hostPort()}`);
      expect(await s.ready()).toBe(true);
      const until = Date.now() + 2_500;
      while (Date.now() < until) {
        const window = await s.addOutcomes('t', 0, { requests: 1, failures: 0 }, Date.now(), 10); // answered locally
        expect(window.requests).toBeGreaterThan(0);
        await sleep(100);
        expect(s.degraded).toBe(true);
      }
      const errors = lines().filter((l) => l.level === 50);
      expect(errors).toHaveLength(1);
      expect(errors[0]).toMatchObject({ problem: 'permissions', setting: 'the ACL of the state.redis user' });
      expect(lines().filter((l) => l.msg.startsWith('state store degraded'))).toHaveLength(1);
      expect(lines().filter((l) => l.msg.startsWith('state store recovered'))).toHaveLength(0);
      expect(raw.join('')).not.toContain(PASSWORD);
    } finally {
      await admin.call('ACL', 'DELUSER', 'noscripts');
    }
  });
});

describe('the ACL the README gives the gateway\'s Redis user', () => {

  it('is enough: every operation goes to Redis, nothing is refused', async () => {
    await admin.call('ACL', 'SETUSER', 'readme', 'on', `>${PASSWORD}`, '~*', '&*', ...README_ACL);
    try {
      const { store: s, lines } = store(`redis://readme:${PASSWORD}@${hostPort()}`);
      expect(await s.ready()).toBe(true);
      const now = Date.now();
      await s.addOutcomes('t', 0, { requests: 1, failures: 1 }, now, 10);
      expect(await s.casBreaker('t', 0, OPEN)).toBe(true);
      await s.setHoldOff('t', now + 60_000);
      expect(await s.takeRetry('r', BUDGET, now)).toBe(true);
      expect(await s.takePermit('t', 1, 5_000, now)).not.toBeNull();
      expect(s.degraded).toBe(false);
      expect(lines().filter((l) => l.level >= 40)).toEqual([]);
    } finally {
      await admin.call('ACL', 'DELUSER', 'readme');
    }
  });

  it('without one of its parts: one error line naming the user\'s ACL, even when a script is refused a command', async () => {
    // A script that may not run PEXPIRE is refused with an ERR, not a NOPERM.
    await admin.call('ACL', 'SETUSER', 'nokeyspace', 'on', `>${PASSWORD}`, '~*', '&*', ...README_ACL.filter((c) => c !== '+@keyspace'));
    try {
      const { store: s, lines } = store(`redis://nokeyspace:${PASSWORD}@${hostPort()}`);
      expect(await s.ready()).toBe(true);
      await s.addOutcomes('t', 0, { requests: 1, failures: 1 }, Date.now(), 10);
      await sleep(1_500);
      expect(lines().filter((l) => l.level === 50)).toMatchObject([{ problem: 'permissions' }]);
      expect(lines().filter((l) => l.msg.startsWith('state store recovered'))).toHaveLength(0);
    } finally {
      await admin.call('ACL', 'DELUSER', 'nokeyspace');
    }
  });
});

describe('classifying Redis errors', () => {
  const reply = (message: string, command = { name: 'auth', args: ['hunter2'] }) => Object.assign(new Error(message), { name: 'ReplyError', command });

  it('names configuration problems by the reply\'s code word, and leaves outages alone', () => {
    expect(configProblem(reply('WRONGPASS invalid username-password pair or user is disabled.'))?.kind).toBe('credentials');
    expect(configProblem(reply('ERR invalid password'))?.kind).toBe('credentials');
    expect(configProblem(new Error('Ready check failed: NOAUTH Authentication required.'))).toMatchObject({ kind: 'password-missing', redisError: 'NOAUTH Authentication required.' });
    expect(configProblem(reply("NOPERM User app has no permissions to run the 'evalsha' command"))?.kind).toBe('permissions');
    expect(configProblem(reply('ERR DB index is out of range'))?.kind).toBe('database');
    expect(configProblem(reply('ERR SELECT is not allowed in cluster mode'))?.kind).toBe('database');
    expect(configProblem(Object.assign(new Error('Failed to refresh slots cache.'), { lastNodeError: reply('WRONGPASS nope') }))?.kind).toBe('credentials');
    expect(configProblem(Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:6390'), { code: 'ECONNREFUSED' }))).toBeUndefined();
    expect(configProblem(new Error('Command timed out'))).toBeUndefined();
    expect(configProblem(reply('ERR wrong number of arguments'))).toBeUndefined();
  });

  it('describes an error without the command it failed', () => {
    const described = safeError(reply('WRONGPASS invalid username-password pair or user is disabled.'));
    expect(described).toEqual({ type: 'ReplyError', message: 'WRONGPASS invalid username-password pair or user is disabled.' });
    expect(JSON.stringify(described)).not.toContain('hunter2');
    expect(safeError(Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' }))).toEqual({ type: 'Error', message: 'connect ECONNREFUSED', code: 'ECONNREFUSED' });
  });
});
