// The operator's lines about hold-offs that start: a target held off again and again (5% 429s with 300 ms hints: up to
// three starts a second) is one line at its first start, then one line per window that counts the starts since, not a
// line per 429.
import pino from 'pino';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { HOLD_OFF_LOG_WINDOW_MS, HoldOffLog } from '../src/observability/hold-off-log.ts';
import type { HoldStart } from '../src/state/hold-offs.ts';
import { testLogSink } from './helpers/stack.ts';

const T = 1_700_000_000_000;

function logged() {
  const raw: string[] = [];
  const log = new HoldOffLog(pino({ level: 'debug' }, testLogSink(raw)), () => Date.now());
  return { log, lines: () => raw.map((l) => JSON.parse(l) as Record<string, unknown>) };
}

const start = (target: string, hintMs: number, extra: Partial<HoldStart> = {}): HoldStart => ({
  kind: 'hold-off', target, untilMs: Date.now() + hintMs, reason: 'status_429', status: 429, hintMs, ...extra,
});

describe('hold-off start lines', () => {
  beforeEach(() => vi.useFakeTimers({ now: T }));
  afterEach(() => vi.useRealTimers());

  it('writes the first start of a target at once, then one line per window counting the starts that followed', () => {
    const { log, lines } = logged();
    log.started(start('p/m', 300));
    expect(lines()).toEqual([expect.objectContaining({ level: 40, msg: 'hold-off started: the provider asked for a pause', target: 'p/m', status: 429, retryAfterMs: 300 })]);
    // Three starts a second for 25 s: 75 starts, three lines (the first, then one per window while they go on).
    for (let i = 1; i < 75; i++) {
      vi.advanceTimersByTime(333);
      log.started(start('p/m', i === 40 ? 900 : 300, i === 50 ? { reason: 'status_503', status: 503 } : {}));
    }
    vi.advanceTimersByTime(2 * HOLD_OFF_LOG_WINDOW_MS);
    const again = lines().filter((l) => l.msg === 'hold-off started again: the provider keeps asking for pauses');
    expect(lines()).toHaveLength(1 + again.length);
    expect(again.length).toBeLessThanOrEqual(3);
    expect(again.reduce((n, l) => n + (l.starts as number), 0)).toBe(74);
    for (const l of again) expect(l).toMatchObject({ level: 40, target: 'p/m', windowS: HOLD_OFF_LOG_WINDOW_MS / 1000, until: expect.any(String) });
    expect(again.map((l) => l.longestRetryAfterMs)).toContain(900);
    expect(again.flatMap((l) => l.statuses as number[])).toEqual(expect.arrayContaining([429, 503]));
  });

  it('writes nothing more for a lone start, and a start after a quiet window gets its own line again', () => {
    const { log, lines } = logged();
    log.started(start('p/m', 300));
    vi.advanceTimersByTime(3 * HOLD_OFF_LOG_WINDOW_MS);
    expect(lines()).toHaveLength(1);
    log.started(start('p/m', 300));
    expect(lines().map((l) => l.msg)).toEqual(['hold-off started: the provider asked for a pause', 'hold-off started: the provider asked for a pause']);
  });

  it('keeps targets, and a flex tier apart from its target, in windows of their own', () => {
    const { log, lines } = logged();
    log.started(start('p/m', 300));
    log.started(start('q/m', 300));
    log.started(start('p/m', 300, { tier: 'flex', reason: 'status_498', status: 498 }));
    expect(lines()).toHaveLength(3);
    log.started(start('p/m', 300));
    expect(lines()).toHaveLength(3);
  });

  it('writes the counts still open when it closes (a shutdown), and nothing after', () => {
    const { log, lines } = logged();
    log.started(start('p/m', 300));
    vi.advanceTimersByTime(400);
    log.started(start('p/m', 300));
    log.close();
    expect(lines().map((l) => [l.msg, l.starts])).toEqual([
      ['hold-off started: the provider asked for a pause', undefined],
      ['hold-off started again: the provider keeps asking for pauses', 1],
    ]);
    vi.advanceTimersByTime(2 * HOLD_OFF_LOG_WINDOW_MS);
    expect(lines()).toHaveLength(2);
  });
});
