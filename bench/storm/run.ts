// One run of one scenario in one mode: a fresh mock provider (and gateway) in their own processes, a short warm-up,
// then steady traffic, the brownout at a fixed moment, recovery, and what the mock counted per second.
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { request } from 'undici';
import type { MockRequestLog, MockStats } from '../../src/mock/server.ts';
import { cpuWindow, readCpu, type CpuWindow } from '../lib/cpu.ts';
import { startGatewayProcess, startMockProcess, type Child } from '../lib/processes.ts';
import { scanGatewayLog, type GatewayLogSummary } from './gateway-log.ts';
import { gatewayConfig, MIN_ATTEMPT_MS, type Mode, type Scenario } from './scenarios.ts';
import { runTraffic, type TrafficResult } from './traffic.ts';

export interface RunResult {
  scenario: string;
  mode: Mode;
  /** ms since the epoch: first arrival, brownout start and end (as sent to the mock), last arrival. */
  startAt: number;
  brownoutAt: number;
  brownoutEndAt: number;
  arrivalsEndAt: number;
  traffic: TrafficResult;
  /** The mock's arrivals and endings per unix second. */
  upstream: MockStats['perSecond'];
  upstreamTotal: number;
  upstreamMaxInflight: number;
  /** Upstream requests that stayed open longer than the client's timeout, among the mock's last 10000. */
  upstreamPastDeadline: { count: number; of: number; maxMs: number };
  cpu: CpuWindow;
  /** CPU of the mock and (through the gateway) of the gateway over the run, in cores. */
  mockCores: number | undefined;
  gatewayCores: number | undefined;
  gatewayLog: GatewayLogSummary | undefined;
}

async function control(mockUrl: string, method: 'GET' | 'POST', path: string, body?: unknown): Promise<unknown> {
  const res = await request(`${mockUrl}${path}`, {
    method,
    headers: { 'content-type': 'application/json' },
    ...(body !== undefined && { body: JSON.stringify(body) }),
  });
  const json: unknown = await res.body.json();
  if (res.statusCode !== 200) throw new Error(`mock ${method} ${path} answered ${res.statusCode}: ${JSON.stringify(json)}`);
  return json;
}

/** A few requests before the clock starts: cold JIT and empty pools should not be part of the steady phase. */
async function warmUp(url: string): Promise<void> {
  for (let batch = 0; batch < 5; batch++) {
    await Promise.all(
      Array.from({ length: 20 }, async () => {
        const res = await request(`${url}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', authorization: 'Bearer sk-bench' },
          body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'warm-up' }] }),
        });
        await res.body.dump();
        if (res.statusCode !== 200) throw new Error(`warm-up request to ${url} answered ${res.statusCode}`);
      }),
    );
  }
}

async function runOnce(s: Scenario, mode: Mode, workDir: string): Promise<RunResult> {
  const tag = `${s.name}-${mode}`;
  const mock = await startMockProcess({ faults: s.faults, logFile: join(workDir, `${tag}.mock.log`) });
  let gateway: Child | undefined;
  const gatewayLogFile = join(workDir, `${tag}.gateway.log`);
  try {
    if (mode === 'gateway' || mode === 'gateway-rate') {
      const rpm = mode === 'gateway-rate' ? s.gatewayRequestsPerMinute : undefined;
      gateway = await startGatewayProcess({
        mockUrl: mock.url,
        configFile: join(workDir, `${tag}.gateway.yaml`),
        logFile: gatewayLogFile,
        config: (port, mockUrl) => gatewayConfig(port, mockUrl, 'info', rpm),
      });
    }
    const front = gateway ?? mock;
    await warmUp(front.url);
    await control(mock.url, 'POST', '/_mock/reset');

    // Start on a whole second, so the phases line up with the mock's per-second counts.
    const startAt = Math.ceil(Date.now() / 1000) * 1000 + 1000;
    const durationMs = s.steadyMs + s.brownoutMs + s.recoveryMs;
    const pids = [process.pid, mock.proc.pid!, ...(gateway ? [gateway.proc.pid!] : [])];
    let brownoutAt = 0;
    const brownout = setTimeout(() => {
      brownoutAt = Date.now();
      control(mock.url, 'POST', '/_mock/brownout', { mode: s.brownoutMode, durationMs: s.brownoutMs }).catch((err: unknown) => {
        process.stderr.write(`brownout request failed: ${String(err)}\n`);
      });
    }, startAt + s.steadyMs - Date.now());
    const cpuBefore = readCpu(mock.proc.pid!, pids);
    const gatewayBefore = gateway ? readCpu(gateway.proc.pid!, pids) : undefined;
    const traffic = await runTraffic({
      baseURL: `${front.url}/v1`,
      kind: mode === 'direct-naive' ? 'naive' : 'sdk',
      rate: s.rate,
      startAt,
      durationMs,
      timeoutMs: s.clientTimeoutMs,
      drainMs: s.drainMs,
    });
    clearTimeout(brownout);
    const cpu = cpuWindow(cpuBefore, readCpu(mock.proc.pid!, pids), availableParallelism());
    const gatewayCpu = gatewayBefore && gateway ? cpuWindow(gatewayBefore, readCpu(gateway.proc.pid!, pids), availableParallelism()) : undefined;
    const wallMs = Date.now() - startAt;
    const cores = (ms: number | undefined) => (ms === undefined ? undefined : ms / wallMs);
    const stats = (await control(mock.url, 'GET', '/_mock/stats')) as MockStats;
    const log = (await control(mock.url, 'GET', '/_mock/requests')) as MockRequestLog[];
    const durations = log.filter((e) => e.endedAt !== undefined && e.path === '/v1/chat/completions').map((e) => e.endedAt! - e.receivedAt);
    // 100 ms of slack for the two processes' timers; anything beyond it outlived the client's own timeout.
    const late = durations.filter((ms) => ms > s.clientTimeoutMs + 100);
    return {
      scenario: s.name,
      mode,
      startAt,
      brownoutAt,
      brownoutEndAt: brownoutAt + s.brownoutMs,
      arrivalsEndAt: startAt + durationMs,
      traffic,
      upstream: stats.perSecond,
      upstreamTotal: stats.byPath['/v1/chat/completions'] ?? 0,
      upstreamMaxInflight: stats.maxInflight,
      upstreamPastDeadline: { count: late.length, of: durations.length, maxMs: Math.max(0, ...durations) },
      cpu,
      mockCores: cores(cpu.serverMs),
      gatewayCores: cores(gatewayCpu?.serverMs),
      gatewayLog: undefined,
    };
  } finally {
    await gateway?.stop();
    await mock.stop();
  }
}

/** Runs a scenario in one mode and, for the gateway, reads what its log says about the run. */
export async function runMode(s: Scenario, mode: Mode, workDir: string): Promise<RunResult> {
  const r = await runOnce(s, mode, workDir);
  if (mode === 'gateway' || mode === 'gateway-rate') r.gatewayLog = scanGatewayLog(join(workDir, `${s.name}-${mode}.gateway.log`), { minAttemptMs: MIN_ATTEMPT_MS, clientTimeoutMs: s.clientTimeoutMs });
  return r;
}
