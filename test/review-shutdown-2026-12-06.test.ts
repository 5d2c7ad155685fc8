// A second adversarial review of the drain (SIGTERM), readiness and Redis outages, against the real gateway process
// and the bundled mock: the defects it found, each pinned by a test that failed before its fix.
// - An answer to a request already in flight when SIGTERM came, written during the drain, said `Connection:
//   keep-alive`: only requests that arrived after SIGTERM were told to close. The keep-alive client sent its next
//   request into the draining instance (the load balancer never saw it), and once preStopMs was over that request met
//   the idle-connection sweep: a reset, which fetch and other clients do not retry for a POST
//   (src/http/close-sweep.ts closeAfterAnswers, called by src/http/drain.ts as the drain begins).
// - A retry's backoff that began before SIGTERM and ended within minAttemptMs of the grace period's end sent its
//   attempt anyway: cut at the grace end, it went upstream for nothing (the provider may have run it) and its client
//   got the same 503 gateway_draining, later. The one wait rule is checked again when such a wait is over
//   (src/pipeline/target-attempts.ts); a wait begun after SIGTERM was already checked before it (review-today-8).
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { useOneGatewayProcess } from './helpers/gateway-process.ts';
import { ask, busyOnceThen, configFor } from './helpers/one-provider.ts';
import { useStacks } from './helpers/stack.ts';

const one = useOneGatewayProcess();
const startProvider = useFakeProviders();
const stack = useStacks();

/** A chat request (streamed or not) to the gateway: its status, its Connection header and its whole body. */
async function chat(url: string, stream: boolean): Promise<{ status: number; connection: string | null; body: string }> {
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream }),
  });
  return { status: r.status, connection: r.headers.get('connection'), body: await r.text() };
}

describe('SIGTERM while requests are in flight upstream (their answers not started yet)', () => {
  it('answers them during the drain with Connection: close, as it does the requests that arrive after SIGTERM', async () => {
    // The mock answers after 1.5 s; SIGTERM comes 300 ms in, and preStopMs outlasts the answers.
    const { url } = await one.start({ faults: { latencyMs: 1_500, stream: { chunks: 2 } }, drain: { preStopMs: 4_000, graceMs: 2_000 } });
    const answers = Promise.all([chat(url, false), chat(url, true)]);
    await sleep(300);
    const exited = one.gateway!.exited;
    one.gateway!.proc.kill('SIGTERM');
    const [whole, streamed] = await answers;
    expect(whole).toMatchObject({ status: 200, connection: 'close' });
    expect(streamed).toMatchObject({ status: 200, connection: 'close' });
    expect(streamed.body.trimEnd().endsWith('data: [DONE]')).toBe(true);
    expect(await exited).toBe(0);
  });
});

describe('SIGTERM while a retry waits out its backoff', () => {
  it('does not send the retry when its wait ends with less than minAttemptMs left before the grace end: 503 gateway_draining at once', async () => {
    // The first attempt fails at once and its retry would take 2 s; the fixed 1.5 s backoff begins before the drain.
    // The drain comes 300 ms in: the grace period ends at 1.8 s, 300 ms after the wait (minAttemptMs: 1 s).
    const p = await startProvider(busyOnceThen(2_000));
    const s = await stack({ config: configFor(p.origin, { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 1_500, capMs: 1_500 } }, minAttemptMs: 1_000 }, { drain: { preStopMs: 500, graceMs: 1_000 } }) });
    const answer = ask(s.url);
    await sleep(300);
    const drained = s.gateway.drain();
    expect(await answer).toMatchObject({ status: 503, code: 'gateway_draining' });
    // Nothing was sent that the grace end would cut.
    expect(p.hits()).toBe(1);
    await drained;
  });
});
