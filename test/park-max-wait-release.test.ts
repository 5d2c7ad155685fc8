// A request whose park.maxWaitMs runs out after the hold-off it parked for has ended, while the requests parked before
// it are still being let go at the target's limit: it waited for a slot, not for its deadline (20 s away) nor for a
// hold-off (over). Its load_shed is counted as stormgate_shed_total{reason="max_wait"}, not "deadline", its message
// names park.maxWaitMs, and its log line names as held off only the target still held off, the other as at capacity.
import { describe, expect, it } from 'vitest';
import { askFirstThenParked, heldOffBackupStack, untilHeldOff } from './helpers/held-off-backup.ts';
import { useExtraMocks, useGateways } from './helpers/stack.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();

describe('a parked request whose park.maxWaitMs runs out behind the release after a hold-off', () => {
  it('is shed as max_wait, not deadline, and its line names as held off only the target still held off', { timeout: 40_000 }, async () => {
    // The primary asks once for a 3 s pause, then takes 2 s per answer with room for one at a time; the backup asks for
    // 30 s pauses, so it stays held off throughout. park.maxWaitMs (4 s) runs out after the primary's pause, for a
    // request parked at any time during it: with a 1 s pause and fixed sleeps, a loaded machine sent the later requests
    // after the pause had ended, into the primary's pool queue, where nothing was shed.
    const { url, logs } = await heldOffBackupStack(startMock, startGateway, { latencyMs: 2_000, maxAttempts: 1, holdOffS: 3, maxWaitMs: 4_000 });
    // The first request starts both hold-offs (the primary's 429, then the backup's); the later ones, sent once both
    // are in force, park for the primary and, when its hold-off ends, leave one at a time: the last are still parked
    // when park.maxWaitMs runs out.
    const answers = await askFirstThenParked(url, () => untilHeldOff(url, ['primary/gpt-4o', 'backup/gpt-4o']));
    const shed = answers.filter((a) => a.code === 'load_shed');
    expect(shed.length).toBeGreaterThan(0);
    for (const a of shed) {
      expect(a.status).toBe(503);
      expect(a.message).toContain('park.maxWaitMs');
      expect(a.message).not.toContain('deadline');
    }
    const metrics = await (await fetch(`${url}/metrics`)).text();
    expect(metrics).toMatch(new RegExp(`^stormgate_shed_total\\{priority="online",reason="max_wait"\\} ${shed.length}$`, 'm'));
    expect(metrics).toMatch(/^stormgate_shed_total\{priority="online",reason="deadline"\} 0$/m);
    const lines = logs.map((l) => JSON.parse(l) as { msg?: string; errorCode?: string; skipped?: Array<{ target: string; reason: string }> });
    const shedLines = lines.filter((l) => l.errorCode === 'load_shed');
    expect(shedLines).toHaveLength(shed.length);
    // The primary is named for what held the request there last (capacity), not for the hold-off that had ended.
    for (const l of shedLines) {
      expect(l.skipped).toEqual([
        { target: 'primary/gpt-4o', reason: expect.stringContaining('at capacity') },
        { target: 'backup/gpt-4o', reason: expect.stringContaining('held off') },
      ]);
    }
  });
});
