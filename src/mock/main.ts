// CLI of the mock provider: `npm run mock -- --port 9000 --error 503:0.3 --latency-ms 50`.
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { assertFaultSpec, isErrorStatus, type ErrorRule, type FaultSpec } from './faults.ts';
import { startMock } from './server.ts';

const USAGE = `usage: npm run mock -- [options]
  --port N              port (default 9000; 0 picks a free one)
  --host H              host (default 127.0.0.1)
  --latency-ms N        delay before every answer that is not a fault (errors, brownouts and 429s come at once)
  --capacity N          requests in flight beyond N get 429
  --rate-limit-rpm N    requests per minute per model, a token bucket refilled continuously; beyond it 429
  --rate-limit-tpm N    tokens per minute per model (body bytes / 4 + max_tokens); beyond it 429
  --rate-limit-retry-after  the rate limit's 429s carry retry-after-ms and retry-after (OpenAI's usually carry none)
  --rate-limit-burst-seconds N  seconds' worth each rate limit bucket holds, over 0 to 60 (default 60: a minute's worth)
  --error STATUS:RATE   error rule, repeatable, e.g. --error 503:0.3 --error 429:0.1 (STATUS 400 to 599;
                        --error 529 is Anthropic's overloaded_error on /v1/messages)
  --error-after-chunks N  streams send the API's own error event after N content chunks and end (no [DONE])
  --reset-rate R        share of requests whose socket is closed before any byte (the client sees "other side closed")
  --hang-rate R         share of requests never answered
  --faults JSON         full fault spec (the flags above override its fields; --error rules come after its errors);
                        an error rule's own headers: {"errors":[{"status":503,"headers":{"x-should-retry":"false"}}]}
  --faults-file PATH    fault spec from a JSON file
  --api-key KEY         require this key (Bearer or x-api-key)
  --quiet               no notes on stderr
Control at runtime: GET/PUT/PATCH /_mock/faults (e.g. PATCH {"rateLimit":{"requestsPerMinute":60}}), GET /_mock/stats,
GET /_mock/requests, POST /_mock/reset, POST /_mock/brownout {"mode":"503","durationMs":15000} (defaults 503 and 10000; "durationMs":0 ends one, its answer's "ended" naming the mode that ran;
modes 503, 429, hang and 529: Anthropic's 529 overloaded_error on /v1/messages, elsewhere OpenAI's documented overload,
503 "The engine is currently overloaded")`;

function num(name: string, value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  // Number('') is 0: an empty value (`--latency-ms=`) would otherwise run the scenario without the fault.
  const n = value.trim() === '' ? NaN : Number(value);
  if (!Number.isFinite(n) || n < 0) throw new Error(`--${name} must be a non-negative number, got "${value}"`);
  return n;
}

/** "503:0.3" -> { status: 503, rate: 0.3 }; the rate defaults to 1. */
function parseErrorFlag(flag: string): ErrorRule {
  const parts = flag.split(':');
  const [status, rate] = parts;
  const s = Number(status);
  // `503:` is no rate (Number('') is 0: a rule that never fires), and `503:0.3:9` has a part too many.
  const r = rate === undefined ? 1 : rate.trim() === '' ? NaN : Number(rate);
  // The status rule is the spec's (assertFaultSpec), so a flag and a PUT /_mock/faults refuse the same rules.
  if (parts.length > 2 || !isErrorStatus(s) || !Number.isFinite(r) || r < 0 || r > 1) {
    throw new Error(`--error expects STATUS:RATE such as 503:0.3, got "${flag}"`);
  }
  return { status: s, rate: r };
}

/** A fault spec read as JSON, checked before the other flags are merged into it; an error names the flag. */
function specFrom(flag: string, read: () => string): FaultSpec {
  try {
    const spec: unknown = JSON.parse(read());
    assertFaultSpec(spec);
    return spec;
  } catch (err) {
    throw new Error(`${flag}: ${err instanceof Error ? err.message : String(err)}`);
  }
}

/** Builds the fault spec from the flags: --faults/--faults-file first, then the single-field flags. */
function faultsFromArgs(values: Record<string, string | boolean | string[] | undefined>): FaultSpec {
  let spec: FaultSpec = {};
  if (typeof values['faults-file'] === 'string') spec = specFrom('--faults-file', () => readFileSync(values['faults-file'] as string, 'utf8'));
  if (typeof values['faults'] === 'string') spec = specFrom('--faults', () => values['faults'] as string);
  const str = (k: string) => (typeof values[k] === 'string' ? values[k] : undefined);
  const latencyMs = num('latency-ms', str('latency-ms'));
  const capacity = num('capacity', str('capacity'));
  const resetRate = num('reset-rate', str('reset-rate'));
  const hangRate = num('hang-rate', str('hang-rate'));
  if (latencyMs !== undefined) spec.latencyMs = latencyMs;
  if (capacity !== undefined) spec.capacity = capacity;
  if (resetRate !== undefined) spec.resetRate = resetRate;
  if (hangRate !== undefined) spec.hangRate = hangRate;
  const errorAfterChunks = num('error-after-chunks', str('error-after-chunks'));
  if (errorAfterChunks !== undefined) spec.stream = { ...spec.stream, errorAfterChunks };
  const rpm = num('rate-limit-rpm', str('rate-limit-rpm'));
  const tpm = num('rate-limit-tpm', str('rate-limit-tpm'));
  const burstSeconds = num('rate-limit-burst-seconds', str('rate-limit-burst-seconds'));
  if (rpm !== undefined || tpm !== undefined || burstSeconds !== undefined || values['rate-limit-retry-after'] === true) {
    const rateLimit = { ...spec.rateLimit };
    if (rpm !== undefined) rateLimit.requestsPerMinute = rpm;
    if (tpm !== undefined) rateLimit.tokensPerMinute = tpm;
    if (burstSeconds !== undefined) rateLimit.burstSeconds = burstSeconds;
    if (values['rate-limit-retry-after'] === true) rateLimit.retryAfter = true;
    spec.rateLimit = rateLimit;
  }
  const errors = values['error'];
  if (Array.isArray(errors) && errors.length > 0) spec.errors = [...(spec.errors ?? []), ...errors.map(parseErrorFlag)];
  assertFaultSpec(spec);
  return spec;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      port: { type: 'string', default: '9000' },
      host: { type: 'string', default: '127.0.0.1' },
      'latency-ms': { type: 'string' },
      capacity: { type: 'string' },
      'rate-limit-rpm': { type: 'string' },
      'rate-limit-tpm': { type: 'string' },
      'rate-limit-retry-after': { type: 'boolean' },
      'rate-limit-burst-seconds': { type: 'string' },
      error: { type: 'string', multiple: true },
      'reset-rate': { type: 'string' },
      'hang-rate': { type: 'string' },
      'error-after-chunks': { type: 'string' },
      faults: { type: 'string' },
      'faults-file': { type: 'string' },
      'api-key': { type: 'string' },
      quiet: { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
    },
    strict: true,
  });
  if (values.help) {
    console.log(USAGE);
    return;
  }
  const mock = await startMock({
    port: num('port', values.port),
    host: values.host,
    faults: faultsFromArgs(values),
    apiKey: values['api-key'],
    quiet: values.quiet,
  });
  console.log(`stormgate mock provider listening on ${mock.url} (OpenAI base URL ${mock.url}/v1)`);

  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    if (!values.quiet) process.stderr.write(`[mock] ${signal}, closing\n`);
    mock.close().then(
      () => process.exit(0),
      () => process.exit(1),
    );
  };
  process.on('SIGINT', () => stop('SIGINT'));
  process.on('SIGTERM', () => stop('SIGTERM'));
}

main().catch((err: unknown) => {
  console.error(`mock: ${err instanceof Error ? err.message : String(err)}\n\n${USAGE}`);
  process.exit(1);
});
