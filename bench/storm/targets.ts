// The targets for the gateway, as checks on the figures. Scenario 1 (503 brownout) has the full list;
// scenario 2 (hang) checks what the issue promises there: no new storm at recovery and no answer after a deadline.
import { percent } from '../lib/stats.ts';
import type { RunFigures } from './figures.ts';
import type { Mode } from './scenarios.ts';

export interface TargetCheck {
  scenario: string;
  name: string;
  value: string;
  target: string;
  pass: boolean;
}

const pct = (x: number) => percent(x);

export function checkBrownout503(scenario: string, f: Record<Mode, RunFigures>, openS: number, gatewayLate: number | undefined): TargetCheck[] {
  const g = f.gateway;
  const bestDirect = Math.max(f['direct-sdk'].successRate, f['direct-naive'].successRate);
  return [
    { scenario, name: 'amplification during the brownout', value: g.amplification.toFixed(2), target: '≤ 1.15', pass: g.amplification <= 1.15 },
    { scenario, name: 'peak upstream rate during the brownout / steady state', value: g.peakBrownoutRatio.toFixed(2), target: '≤ 1.00', pass: g.peakBrownoutRatio <= 1 },
    {
      scenario,
      name: 'success rate (every client deadline outlasts the brownout)',
      value: pct(g.successRate),
      target: `≥ 99% and > best direct (${pct(bestDirect)})`,
      pass: g.successRate >= 0.99 && g.successRate > bestDirect,
    },
    { scenario, name: 'upstream 429s in the 10 s after recovery', value: pct(g.share429After), target: '< 1%', pass: g.share429After < 0.01 },
    {
      scenario,
      name: 'success back above 99% per second after recovery',
      value: g.recoveryS === null ? 'never' : `${g.recoveryS} s`,
      target: `≤ openS + 2 = ${openS + 2} s`,
      pass: g.recoveryS !== null && g.recoveryS <= openS + 2,
    },
    lateCheck(scenario, g, gatewayLate),
  ];
}

/**
 * Counted at the client, which is what users see; the gateway's own log says how many of them it answered late by its
 * own clock (the rest are the load generator reading its answers late on a busy machine).
 */
function lateCheck(scenario: string, g: RunFigures, gatewayLate: number | undefined): TargetCheck {
  const own = gatewayLate === undefined ? '' : ` (gateway's log: ${gatewayLate} answered after the client's timeout)`;
  return { scenario, name: 'requests answered after their client\'s deadline', value: `${g.lateAnswers}${own}`, target: '0', pass: g.lateAnswers === 0 };
}

export function checkHang(
  scenario: string,
  f: Record<Mode, RunFigures>,
  gatewayLate: number | undefined,
  upstreamPastDeadline: { count: number; of: number },
): TargetCheck[] {
  const g = f.gateway;
  return [
    {
      scenario,
      name: 'upstream requests that outlived their client\'s deadline (mock\'s log)',
      value: `${upstreamPastDeadline.count} of ${upstreamPastDeadline.of}`,
      target: '0',
      pass: upstreamPastDeadline.count === 0,
    },
    { scenario, name: 'upstream 429s in the 10 s after recovery', value: pct(g.share429After), target: '< 1%', pass: g.share429After < 0.01 },
    lateCheck(scenario, g, gatewayLate),
  ];
}

/** Scenario 3: paced under the provider's rate, the gateway's recovery meets (almost) none of its 429s. */
export function checkRateLimit(scenario: string, f: Record<Mode, RunFigures>): TargetCheck[] {
  const g = f['gateway-rate'];
  return [
    { scenario, name: 'upstream 429s in the 10 s after recovery (pools.requestsPerMinute)', value: pct(g.share429After), target: '< 1%', pass: g.share429After < 0.01 },
    { scenario, name: 'success rate (pools.requestsPerMinute)', value: pct(g.successRate), target: `≥ 99%`, pass: g.successRate >= 0.99 },
  ];
}

export function checkPropagation(p99Ms: number): TargetCheck {
  return { scenario: 'propagation', name: 'breaker change on A seen by B through Redis, p99', value: `${p99Ms.toFixed(1)} ms`, target: '< 100 ms', pass: p99Ms < 100 };
}
