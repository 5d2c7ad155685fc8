import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { parseDocument } from 'yaml';
import { referencedEnvVars } from '../src/config/interpolate.ts';
import { ConfigError, loadConfigFile, parseConfig } from '../src/config/load.ts';
import { describeZodIssues } from '../src/config/zod-issues.ts';
import { configErrorOf, validConfigText } from './helpers/config-text.ts';

const GATEWAY_YAML = resolve(import.meta.dirname, '../config/gateway.yaml');
const env = { OPENAI_API_KEY: 'sk-test' };

const valid = validConfigText;

const configError = (text: string, e: NodeJS.ProcessEnv = env): ConfigError => configErrorOf(text, e);

describe('loadConfigFile', () => {
  it('loads config/gateway.yaml as shipped, with defaults filled in', () => {
    const config = loadConfigFile(GATEWAY_YAML, env);
    expect(config.server).toMatchObject({ host: '127.0.0.1', port: 8080, bodyLimitBytes: 10485760, logLevel: 'info' });
    expect(config.providers.openai).toMatchObject({
      family: 'openai',
      baseUrl: 'https://api.openai.com/v1',
      apiKey: 'sk-test',
      timeouts: { connectMs: 5000, firstTokenMs: 30000, idleMs: 30000 },
      maxConnections: 128,
    });
    expect(config.routes.map((r) => [r.name, r.match.path])).toEqual([
      ['chat', '/v1/chat/completions'],
      ['embeddings', '/v1/embeddings'],
      ['completions', '/v1/completions'],
      ['responses', '/v1/responses'],
    ]);
    const embeddings = config.routes[1]!;
    expect(embeddings.retry.maxAttempts).toBe(3);
    expect(embeddings.retry.backoff).toEqual({ strategy: 'full-jitter', baseMs: 200, capMs: 3000 });
    expect(embeddings.timeoutMs).toBe(120000);
    expect(config.routes[0]!.retry.retryOn).toEqual([429, 500, 502, 503, 504, 520, 524, 529, 'network', 'timeout']);
  });

  it('takes the provider base URL from OPENAI_BASE_URL when set', () => {
    const config = loadConfigFile(GATEWAY_YAML, { ...env, OPENAI_BASE_URL: 'http://127.0.0.1:9999/v1' });
    expect(config.providers.openai!.baseUrl).toBe('http://127.0.0.1:9999/v1');
  });

  it('fails naming OPENAI_API_KEY, its key path and line when it is unset', () => {
    let error: unknown;
    try {
      loadConfigFile(GATEWAY_YAML, {});
    } catch (err) {
      error = err;
    }
    expect(error).toBeInstanceOf(ConfigError);
    const e = error as ConfigError;
    expect(e.code).toBe('STORMGATE_CONFIG_INVALID');
    expect(e.missingEnv).toEqual(['OPENAI_API_KEY']);
    expect(e.issues).toHaveLength(1);
    expect(e.message).toMatch(/gateway\.yaml:\d+: providers\.openai\.apiKey: environment variable OPENAI_API_KEY is not set$/);
  });

  it('reports a file that cannot be read as a ConfigError', () => {
    const dir = mkdtempSync(join(tmpdir(), 'stormgate-config-'));
    try {
      expect(() => loadConfigFile(join(dir, 'missing.yaml'), env)).toThrow(/missing\.yaml: cannot read the config file/);
      const file = join(dir, 'gw.yaml');
      writeFileSync(file, valid());
      expect(loadConfigFile(file, env).routes[0]!.name).toBe('chat');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('lists the variables a file references', () => {
    expect(referencedEnvVars(parseDocument('a: ${A}\nb: [ "${B:-x}", "$${C}" ]\nc: "${A}"\n'))).toEqual(['A', 'B']);
  });
});

describe('${VAR} interpolation', () => {
  const withKey = (apiKey: string, e: NodeJS.ProcessEnv) =>
    // A replacer function, because a replacement string would read "$$" as "$".
    parseConfig(valid().replace('${OPENAI_API_KEY}', () => apiKey), 'gw.yaml', e).providers.openai!.apiKey;

  it('reads a reference inside a default, as docker compose does, and names the variable that is missing', () => {
    expect(withKey('"${KEY:-${OTHER}}"', { OTHER: 'sk-other' })).toBe('sk-other');
    expect(withKey('"${KEY:-${OTHER}}"', { KEY: 'sk-key', OTHER: 'sk-other' })).toBe('sk-key');
    expect(withKey('"${KEY:-${OTHER:-sk-${LAST}-x}}"', { LAST: 'z' })).toBe('sk-z-x');
    expect(withKey('"${KEY:-$${literal}}"', {})).toBe('${literal}');
    expect(configError(valid().replace('${OPENAI_API_KEY}', () => '${KEY:-${OTHER}}'), {}).message).toMatch(/environment variable OTHER is not set/);
  });

  it('uses the default of ${VAR:-default} when VAR is unset or empty', () => {
    expect(withKey('"${KEY:-fallback}"', {})).toBe('fallback');
    expect(withKey('"${KEY:-fallback}"', { KEY: '' })).toBe('fallback');
    expect(withKey('"${KEY:-fallback}"', { KEY: 'set' })).toBe('set');
  });

  it('keeps an empty ${VAR} empty, since only an unset one is an error', () => {
    // An optional provider takes an empty key (it is then disabled); a required one is refused (below).
    const config = parseConfig(valid().replace('    apiKey: ${OPENAI_API_KEY}', '    apiKey: "${KEY}"\n    optional: true'), 'gw.yaml', { KEY: '' });
    expect(config.providers.openai!.apiKey).toBe('');
  });

  it('refuses an empty key of a required provider, and trims a key\'s line break but refuses one inside it', () => {
    expect(configError(valid(), { OPENAI_API_KEY: '' }).message).toMatch(/^gw\.yaml:\d: providers\.openai\.apiKey: is empty \(its variable may be set but empty\)/);
    expect(withKey('"${KEY}"', { KEY: 'sk-abc\n' })).toBe('sk-abc');
    expect(configError(valid(), { OPENAI_API_KEY: 'sk-a\nbc' }).message).toMatch(/apiKey: contains a line break/);
  });

  it('reads $${ as a literal ${ and substitutes nothing there', () => {
    expect(withKey('"$${KEY} and ${KEY}"', { KEY: 'v' })).toBe('${KEY} and v');
    expect(withKey('"a$$b$c"', {})).toBe('a$$b$c');
  });

  it('substitutes into string values only, so a value cannot add YAML structure', () => {
    const config = parseConfig(valid().replace('    apiKey:', '    anthropicVersion: "${V}"\n    apiKey:'), 'gw.yaml', { ...env, V: 'x\nevil: [1]\n{ a: b }' });
    expect(config.providers.openai!.anthropicVersion).toBe('x\nevil: [1]\n{ a: b }');
  });

  it('types an unquoted ${VAR} as YAML would type the value written there', () => {
    const text = valid().replace('providers:', 'server:\n  port: ${PORT:-9090}\nproviders:');
    expect(parseConfig(text, 'gw.yaml', env).server.port).toBe(9090);
    expect(parseConfig(text, 'gw.yaml', { ...env, PORT: '7070' }).server.port).toBe(7070);
  });

  it('says how to write a quoted ${VAR} that should be a number', () => {
    const text = valid().replace('providers:', 'server:\n  port: "${PORT}"\nproviders:');
    expect(configError(text, { ...env, PORT: '7070' }).message).toBe(
      'gw.yaml:2: server.port: expected number, received string (the value of $PORT); write it without quotes (${VAR} too, in block style: key: ${VAR}) so YAML reads it as a number',
    );
  });

  it('rejects passthrough to a non-OpenAI family or onto the gateway\'s own paths, and degraded answers off chat routes', () => {
    const anthropic = valid().replace('routes:', '  claude:\n    family: anthropic\n    baseUrl: https://api.anthropic.com\n    apiKey: k\nroutes:');
    expect(configError(anthropic + 'passthrough: { provider: claude, paths: [/v1/messages/batches] }\n').message).toMatch(
      /passthrough\.provider: passthrough forwards to openai-family providers only; "claude" is anthropic/,
    );
    expect(configError(valid() + 'passthrough: { provider: openai, paths: [/healthz] }\n').message).toMatch(/passthrough\.paths\[0\]: "\/healthz" is one of the gateway's own paths/);
    const embeddings = valid().replace('/v1/chat/completions', '/v1/embeddings');
    expect(configError(embeddings + '    degraded: { message: sorry }\n').message).toMatch(/routes\[0\]\.degraded: degraded answers are chat completions/);
  });

  it('rejects an anthropic target on OpenAI\'s other APIs, and any other family on Anthropic\'s /v1/messages', () => {
    const withClaude = (yaml: string) => yaml.replace('routes:', '  claude:\n    family: anthropic\n    baseUrl: https://api.anthropic.com\n    apiKey: k\nroutes:');
    const onPath = (path: string) => withClaude(valid().replace('/v1/chat/completions', path)).replace('{ provider: openai }', '{ provider: claude }');
    expect(configError(onPath('/v1/responses')).message).toMatch(/routes\[0\]\.targets\[0\]: anthropic targets serve \/v1\/chat\/completions and Anthropic's own API \(\/v1\/messages\), not \/v1\/responses/);
    expect(configError(onPath('/v1/completions')).message).toMatch(/not \/v1\/completions/);
    expect(configError(onPath('/v1/embeddings')).message).toMatch(/anthropic has no embeddings API/);
    expect(() => parseConfig(onPath('/v1/chat/completions'), 'gw.yaml', env)).not.toThrow();
    expect(() => parseConfig(onPath('/v1/messages'), 'gw.yaml', env)).not.toThrow();
    expect(() => parseConfig(onPath('/v1/messages/count_tokens'), 'gw.yaml', env)).not.toThrow();
    const openaiOnMessages = withClaude(valid().replace('/v1/chat/completions', '/v1/messages'));
    expect(configError(openaiOnMessages).message).toMatch(/routes\[0\]\.targets\[0\]: \/v1\/messages is Anthropic's Messages API, served by anthropic targets only; "openai" is openai/);
  });

  it('rejects a chat backup of the other API family without a model, which would be sent the client\'s gpt-4o in the outage it is for', () => {
    const withClaude = (yaml: string) => yaml.replace('routes:', '  claude:\n    family: anthropic\n    baseUrl: https://api.anthropic.com\n    apiKey: k\nroutes:');
    const targets = (list: string) => withClaude(valid().replace('targets: [ { provider: openai } ]', `targets: ${list}`));
    expect(configError(targets('[ { provider: openai }, { provider: claude } ]')).message).toMatch(
      /routes\[0\]\.targets\[1\]\.model: "claude" is of another API family than the first target \("openai"\), whose model names clients send: name the model it serves \(e\.g\. model: claude-sonnet-4-6\)/,
    );
    expect(configError(targets('[ { provider: claude }, { provider: openai } ]')).message).toMatch(/routes\[0\]\.targets\[1\]\.model: "openai" is of another API family .*model: gpt-4o/);
    const wider = withClaude(valid().replace('targets: [ { provider: openai } ]', 'targets: [ { provider: openai } ]\n    contextWindowFallback: { provider: claude }'));
    expect(configError(wider).message).toMatch(/routes\[0\]\.contextWindowFallback\.model: "claude" is of another API family/);
    // Named, or of the first target's family (clients' names are its own), the backup is fine.
    expect(() => parseConfig(targets('[ { provider: openai }, { provider: claude, model: claude-sonnet-4-6 } ]'), 'gw.yaml', env)).not.toThrow();
    expect(() => parseConfig(targets('[ { provider: claude }, { provider: claude, model: claude-haiku-4-5 } ]'), 'gw.yaml', env)).not.toThrow();
    expect(() => parseConfig(targets('[ { provider: openai }, { provider: openai, model: gpt-4.1 } ]'), 'gw.yaml', env)).not.toThrow();
    // A first target that names its own model leaves the client's names to the route: they are no family's.
    expect(() => parseConfig(targets('[ { provider: claude, model: claude-sonnet-4-6 }, { provider: openai } ]'), 'gw.yaml', env)).not.toThrow();
    // Weighted, every target without a model is sent the client's names as a first attempt: one family for all of them.
    const weighted = (list: string) => targets(list).replace('    targets:', '    strategy: weighted\n    targets:');
    expect(configError(weighted('[ { provider: claude, model: claude-sonnet-4-6 }, { provider: openai }, { provider: claude } ]')).message).toMatch(
      /routes\[0\]\.targets\[2\]\.model: "claude" is of another API family than a weighted target \("openai"\) that is also sent the model names clients send/,
    );
    expect(() => parseConfig(weighted('[ { provider: claude, model: claude-sonnet-4-6 }, { provider: openai }, { provider: openai } ]'), 'gw.yaml', env)).not.toThrow();
  });

  it('rejects a weighted /v1/responses route, whose follow-ups would reach a provider that never stored the conversation', () => {
    const two = valid().replace('/v1/chat/completions', '/v1/responses').replace('targets: [ { provider: openai } ]', 'strategy: weighted\n    targets: [ { provider: openai }, { provider: openai, model: gpt-4.1 } ]');
    expect(configError(two).message).toMatch(/routes\[0\]\.strategy: \/v1\/responses cannot spread requests \(weighted\)/);
  });

  it('reports every unset variable with the path and line where it is used', () => {
    const text = valid().replace('https://api.openai.com/v1', '${BASE_URL}');
    const e = configError(text, {});
    expect(e.missingEnv).toEqual(['BASE_URL', 'OPENAI_API_KEY']);
    expect(e.message.split('\n')).toEqual([
      'gw.yaml:4: providers.openai.baseUrl: environment variable BASE_URL is not set',
      'gw.yaml:5: providers.openai.apiKey: environment variable OPENAI_API_KEY is not set',
    ]);
  });

  it('rejects a malformed reference', () => {
    expect(configError(valid().replace('${OPENAI_API_KEY}', '"${OPENAI API KEY}"')).message).toContain(
      'gw.yaml:5: providers.openai.apiKey: invalid reference "${OPENAI API KEY}"',
    );
    expect(configError(valid().replace('${OPENAI_API_KEY}', '"${OPENAI_API_KEY"')).message).toContain('unterminated "${"');
  });
});

describe('config errors', () => {
  it('rejects an unknown key, pointing at its line and the closest valid key', () => {
    const e = configError(valid().replace('    apiKey:', '    timeoutz: {}\n    apiKey:'));
    expect(e.issues).toEqual([{ path: 'providers.openai', line: 5, message: 'unknown key "timeoutz"; did you mean "timeouts"?' }]);
    expect(e.message).toBe('gw.yaml:5: providers.openai: unknown key "timeoutz"; did you mean "timeouts"?');
  });

  it('lists the valid keys when no key is close', () => {
    expect(configError(valid('logging: {}\n')).message).toBe(
      'gw.yaml:10: unknown key "logging"; valid keys: server, providers, routes, passthrough, auth, state, drain, idempotency',
    );
  });

  it('points a renamed key to its new name', () => {
    const e = configError(valid('    timeout: 5000\n    retry:\n      attempts: 2\n'));
    expect(e.message.split('\n')).toEqual([
      'gw.yaml:10: routes[0]: unknown key "timeout"; it was renamed to "timeoutMs"',
      'gw.yaml:12: routes[0].retry: unknown key "attempts"; it was renamed to "maxAttempts"',
    ]);
  });

  it('names the path, line and expected type of a wrong value', () => {
    const e = configError(valid('    retry:\n      backoff: { capMs: "3s" }\n'));
    expect(e.message).toBe('gw.yaml:11: routes[0].retry.backoff.capMs: expected number, received string ("3s"); capMs is a plain number of milliseconds: write capMs: 3000');
  });

  it("refuses a pool that promises more than it has: minShare values over 1 in all, maxConcurrent over maxConnections", () => {
    const classes = (shares: string) => valid().replace('    apiKey:', `    pools:\n      classes: { ${shares} }\n    apiKey:`);
    expect(configError(classes('critical: { minShare: 0.5 }, online: { minShare: 0.5 }, batch: { minShare: 0.2 }')).message).toBe(
      'gw.yaml:6: providers.openai.pools.classes: the minShare values add up to 1.2 (critical 0.5, online 0.5, batch 0.2), more than the whole pool: expected at most 1 in all, as each is a share of maxConcurrent kept for its class under contention',
    );
    // undici would queue what the pool lets through beyond its connections, out of the pools' sight.
    expect(configError(valid().replace('    apiKey:', '    maxConnections: 8\n    pools: { maxConcurrent: 16 }\n    apiKey:')).message).toBe(
      "gw.yaml:6: providers.openai.pools.maxConcurrent: maxConcurrent (16) must not exceed maxConnections (8), or undici would queue behind the gateway's back",
    );
    // A sum of exactly 1, however the floating point adds it up, is the whole pool: allowed.
    expect(parseConfig(classes('online: { minShare: 0.1 }, batch: { minShare: 0.2 }, bulk: { minShare: 0.7 }'), 'gw.yaml', env).providers.openai!.pools.classes).toHaveProperty('bulk');
    // A class may never hold less than it is promised under contention.
    expect(configError(classes('online: { minShare: 0.5 }, batch: { minShare: 0.3, maxShare: 0.2 }')).message).toBe(
      "gw.yaml:6: providers.openai.pools.classes.batch.maxShare: maxShare (0.2) is below the class's minShare (0.3): expected at least minShare, as the class may never hold what it is promised under contention",
    );
    expect(parseConfig(classes('online: { minShare: 0.5 }, batch: { minShare: 0.1, maxShare: 0.8 }'), 'gw.yaml', env).providers.openai!.pools.classes['batch']).toEqual({ minShare: 0.1, maxShare: 0.8, maxQueue: 1000 });
  });

  it('says which plain number a duration written with a unit means, in the unit its key names', () => {
    const e = configError(
      valid('    timeoutMs: 1.5s\n    budget: { windowS: 500ms }\n').replace('    apiKey:', '    authHoldS: 2m\n    breaker: { openS: "30s" }\n    apiKey:'),
    );
    expect(e.message.split('\n')).toEqual([
      'gw.yaml:5: providers.openai.authHoldS: expected number, received string ("2m"); authHoldS is a plain number of seconds: write authHoldS: 120',
      'gw.yaml:6: providers.openai.breaker.openS: expected number, received string ("30s"); openS is a plain number of seconds: write openS: 30',
      'gw.yaml:12: routes[0].timeoutMs: expected number, received string ("1.5s"); timeoutMs is a plain number of milliseconds: write timeoutMs: 1500',
      'gw.yaml:13: routes[0].budget.windowS: expected number, received string ("500ms"); windowS is a plain number of seconds',
    ]);
    // Text that is no duration, or a key without a unit in its name, gets no guess.
    expect(configError(valid('    timeoutMs: soon\n')).message).toBe('gw.yaml:10: routes[0].timeoutMs: expected number, received string ("soon")');
    expect(configError(valid('    retry: { maxAttempts: 3s }\n')).message).toBe('gw.yaml:10: routes[0].retry.maxAttempts: expected number, received string ("3s")');
  });

  it('names lists and maps as the config reference and YAML do, not as JavaScript arrays and records', () => {
    expect(configError(valid().replace('targets: [ { provider: openai } ]', 'targets: openai')).message).toBe(
      'gw.yaml:9: routes[0].targets: expected list, received string ("openai")',
    );
    expect(configError('providers: []\nroutes: {}\n').message.split('\n')).toEqual([
      'gw.yaml:1: providers: expected map of name to object, received list',
      'gw.yaml:2: routes: expected list, received object',
    ]);
  });

  it('lists the options of an enum', () => {
    const e = configError(valid('    retry:\n      backoff: { strategy: jitter }\n'));
    expect(e.issues[0]).toEqual({
      path: 'routes[0].retry.backoff.strategy',
      line: 11,
      message: 'expected one of: full-jitter, equal-jitter, decorrelated-jitter, exponential, fixed, received "jitter"',
    });
  });

  it('says which bound a number breaks and what each retryOn entry may be', () => {
    const e = configError(valid('    retry:\n      maxAttempts: 0\n      retryOn: [200, flaky]\n'));
    expect(e.message.split('\n')).toEqual([
      'gw.yaml:11: routes[0].retry.maxAttempts: must be >= 1, got 0',
      'gw.yaml:12: routes[0].retry.retryOn[0]: must be >= 400, got 200',
      'gw.yaml:12: routes[0].retry.retryOn[1]: expected an HTTP status as a whole number from 400 to 599 (503, not 5xx) or one of: network, timeout, received "flaky"',
    ]);
  });

  it('reports a missing required key at its parent', () => {
    const e = configError(valid().replace('match: { path: /v1/chat/completions }', 'match: {}'));
    expect(e.message).toBe('gw.yaml:8: routes[0].match: missing required key "path" (expected string)');
  });

  it('repeats a wrong value in the message, but never the value of a credential key', () => {
    const bad = configError(valid().replace('family: openai', 'family: sk-secret'));
    expect(bad.message).toContain('expected one of: openai, anthropic, azure-openai, received "sk-secret"');
    expect(configError(valid().replace('${OPENAI_API_KEY}', '[sk-secret]')).message).not.toContain('sk-secret');
    const schema = z.strictObject({ apiKey: z.enum(['a', 'b']) });
    const data = { apiKey: 'sk-secret' };
    const [issue] = describeZodIssues(schema, schema.safeParse(data).error!.issues, data);
    expect(issue!.message).toBe('expected one of: a, b, received a string');
  });

  it('repeats a wrong value at every key named for a quantity, tokenBurst too, and still none at a credential\'s', () => {
    // tokenBurst holds "token" but a number of tokens, as tokensPerMinute does: its value is what to fix.
    const burst = configError(valid().replace('family: openai', 'family: openai\n    pools: { tokensPerMinute: 6000, tokenBurst: lots }'));
    expect(burst.message).toMatch(/pools\.tokenBurst: expected number, received string \("lots"\)/);
    const perMinute = configError(valid().replace('family: openai', 'family: openai\n    pools: { tokensPerMinute: lots }'));
    expect(perMinute.message).toMatch(/pools\.tokensPerMinute: expected number, received string \("lots"\)/);
    const schema = z.strictObject({ apiKey: z.number(), clientToken: z.number(), apiKeyMs: z.number() });
    const data = { apiKey: 'sk-secret', clientToken: 'sk-secret', apiKeyMs: '30s' };
    const messages = describeZodIssues(schema, schema.safeParse(data).error!.issues, data).map((i) => i.message);
    expect(messages.slice(0, 2)).toEqual(['expected number, received string', 'expected number, received string']);
    expect(messages[2]).toContain('"30s"');
  });

  it('repeats a wrong value at a client\'s rate in auth.limits, but none where auth holds a key', () => {
    // auth hides what it holds (client keys), but a client's limits are numbers: the text found is what to fix.
    const auth = (limits: string) => configError(valid(`auth:\n  keys: { agents: sk-agents-0123456789 }\n  limits: ${limits}\n`));
    expect(auth('{ agents: { requestsPerMinute: lots } }').message).toMatch(/auth\.limits\.agents\.requestsPerMinute: expected number, received string \("lots"\)$/);
    expect(auth('{ agents: { tokensPerMinute: 10k } }').message).toMatch(/auth\.limits\.agents\.tokensPerMinute: expected number, received string \("10k"\)$/);
    expect(auth('{ "*": { requestsPerMinute: 60, burst: 1.5 } }').message).toMatch(/auth\.limits\["\*"\]\.burst: expected integer, received number \(1\.5\)$/);
    // A key written where a client's limits belong, or where a client's key belongs, stays hidden.
    expect(auth('{ agents: sk-agents-0123456789 }').message).not.toContain('sk-agents');
    expect(configError(valid('auth: sk-secret-0123456789\n')).message).not.toContain('sk-secret');
    expect(configError(valid('auth:\n  keys: { agents: [sk-secret-0123456789] }\n')).message).not.toContain('sk-secret');
    expect(configError(valid('auth:\n  keys: { agents: 1234567890 }\n')).message).not.toContain('1234567890');
  });

  it('repeats a wrong URL without the password in it (a state.redis URL with a typo went to the log whole)', () => {
    const e = configError(valid('state:\n  redis: "redis://default:hunter2-PASSWORD@redis.internal:6379/0 "'));
    expect(e.message).not.toContain('hunter2-PASSWORD');
    expect(e.message).toContain('received "redis://default:[redacted]@redis.internal:6379/0 "');
    const bare = configError(valid('state:\n  redis: "redis://:hunter2-PASSWORD@redis.internal/x y"'));
    expect(bare.message).not.toContain('hunter2-PASSWORD');
  });

  it('masks a password that holds "/" or "@" written unescaped (a base64 secret) to its end, not to the first of them', () => {
    const slash = configError(valid('state:\n  redis: "redis://:hunter2/PASS+word==@redis.internal:6379/0 "'));
    expect(slash.message).not.toMatch(/hunter2|PASS/);
    expect(slash.message).toContain('received "redis://:[redacted]@redis.internal:6379/0 "');
    const at = configError(valid('state:\n  redis: "redis://default:hunter2@SECRET-TAIL@redis.internal:6379/0 "'));
    expect(at.message).not.toMatch(/hunter2|SECRET-TAIL/);
    expect(at.message).toContain('received "redis://default:[redacted]@redis.internal:6379/0 "');
  });

  it('rejects a target naming an unknown provider', () => {
    const e = configError(valid().replace('{ provider: openai }', '{ provider: anthropic }'));
    expect(e.message).toBe('gw.yaml:9: routes[0].targets[0].provider: unknown provider "anthropic"; expected one of: openai');
  });

  it('rejects a duplicate key with its line and column', () => {
    const e = configError(valid().replace('    family: openai\n', '    family: openai\n    family: openai\n'));
    expect(e.issues).toEqual([{ path: 'providers.openai', line: 4, col: 5, message: 'duplicate key "family"' }]);
    expect(e.message).toBe('gw.yaml:4:5: providers.openai: duplicate key "family"');
  });

  it('reports a YAML syntax error with its line and column', () => {
    const e = configError(valid().replace('match: { path: /v1/chat/completions }', 'match: { path: /v1/chat/completions'));
    expect(e.issues[0]!.line).toBe(9);
    expect(e.message).toMatch(/^gw\.yaml:9:\d+: /);
  });

  it('says how to write a ${VAR} that an unquoted flow mapping cannot hold', () => {
    const e = configError(`server: { host: 127.0.0.1, port: \${GW_PORT} }\n${valid()}`, { GW_PORT: '7070', OPENAI_API_KEY: 'sk-test' });
    expect(e.message).toBe(
      'gw.yaml:1: an unquoted ${VAR} inside a flow mapping or list ({ } or [ ]) is not valid YAML: quote it ("${VAR}") where the value is text, or write that mapping in block style (one key per line) where it is a number or true/false',
    );
  });

  it('keeps the parser\'s own words where a ${VAR} in quotes only looks like one in a flow mapping', () => {
    const e = configError(`server: { host: "a {b} \${H}", port: 1 }\nserver: { host: "x" }\n${valid()}`, { H: 'h', OPENAI_API_KEY: 'sk-test' });
    expect(e.message).toMatch(/duplicate key "server"/);
  });

  it('names the variable instead of echoing a value that came from the environment (it may be a secret)', () => {
    const text = valid().replace('baseUrl: https://api.openai.com/v1', 'baseUrl: "${OPENAI_API_KEY}"');
    const e = configError(text, { OPENAI_API_KEY: 'sk-live-SECRET' });
    expect(e.message).toBe('gw.yaml:4: providers.openai.baseUrl: expected a URL such as https://api.example.com/v1, received the value of $OPENAI_API_KEY');
  });

  it('reports a misspelt top-level key along with the key it leaves missing', () => {
    expect(configError(valid().replace('providers:', 'provider:')).message.split('\n')).toEqual([
      'gw.yaml:1: missing required key "providers" (expected map of name to object)',
      'gw.yaml:1: unknown key "provider"; did you mean "providers"?',
    ]);
  });

  it('keeps a message whole when a value from the environment is a short word, and reads a float ${VAR} as a number', () => {
    const e = configError(`server:\n  logLevel: \${L}\n${valid()}`, { ...env, L: 'e' });
    expect(e.message).toMatch(/server\.logLevel: expected one of: fatal, error, warn, info, debug, trace, silent, received the value of \$L/);
    const config = parseConfig(valid().replace('    apiKey:', '    authHoldS: ${HOLD}\n    apiKey:'), 'gw.yaml', { ...env, HOLD: '1.5' });
    expect(config.providers.openai!.authHoldS).toBe(1.5);
  });

  it('gives the flow-mapping hint when a quoted value comes before the ${VAR} on the line', () => {
    const e = configError(`server: { host: "127.0.0.1", port: \${PORT} }\n${valid()}`, { ...env, PORT: '7070' });
    expect(e.message).toMatch(/an unquoted \$\{VAR\} inside a flow mapping/);
  });

  it('reports an empty file', () => {
    expect(configError('# nothing here\n').message).toBe('gw.yaml:1: the file is empty; expected a mapping with `providers` and `routes`');
  });

  it('reports every problem at once, in line order', () => {
    const text = valid('    timeoutMs: soon\n').replace('family: openai', 'family: openia');
    expect(configError(text, {}).message.split('\n')).toEqual([
      'gw.yaml:3: providers.openai.family: expected one of: openai, anthropic, azure-openai, received "openia"; did you mean "openai"?',
      'gw.yaml:5: providers.openai.apiKey: environment variable OPENAI_API_KEY is not set',
      'gw.yaml:10: routes[0].timeoutMs: expected number, received string ("soon")',
    ]);
  });
});

describe('values that load but could not work', () => {
  const route = (extra: string) => `providers:
  openai: { family: openai, baseUrl: "https://api.openai.com/v1", apiKey: k }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: openai } ]
${extra}`;

  it('refuses a user and password in a baseUrl, which would never be sent', () => {
    expect(configError(valid().replace('https://api.openai.com/v1', 'https://user:pw@api.openai.com/v1')).message).toMatch(/providers\.openai\.baseUrl: holds a user or password/);
  });

  it('refuses a time past what a Node.js timer holds, which would fire after 1 ms', () => {
    expect(configError(route('    timeoutMs: 99999999999\n')).message).toMatch(/routes\[0\]\.timeoutMs: .*2147483647/);
    expect(configError(valid().replace('family: openai', 'family: openai\n    timeouts: { firstTokenMs: 9999999999 }')).message).toMatch(/timeouts\.firstTokenMs/);
  });

  it('refuses a margin that leaves no time and a backoff base above its cap', () => {
    expect(configError(route('    timeoutMs: 5000\n    deadlineMarginMs: 5000\n')).message).toMatch(/routes\[0\]\.deadlineMarginMs: must be less than timeoutMs/);
    expect(configError(route('    retry: { backoff: { baseMs: 5000, capMs: 100 } }\n')).message).toMatch(/backoff\.baseMs: must not exceed capMs/);
  });

  it('refuses a base URL that is not http(s) and a Redis setting that is no Redis', () => {
    expect(configError(valid().replace('https://api.openai.com/v1', 'ftp://example.com/v1')).message).toMatch(/providers\.openai\.baseUrl/);
    expect(configError(valid('state: { redis: "not a url" }\n')).message).toMatch(/state\.redis: expected a redis:\/\/ or rediss:\/\/ URL/);
    expect(configError(valid('state: { redis: { password: x } }\n')).message).toMatch(/state\.redis: needs `sentinels`/);
    // ioredis threw on this one at start-up, with a stack trace; the message must not quote the password.
    const broken = configError(valid('state: { redis: "redis://:s3cret-pw@[bad/0" }\n')).message;
    expect(broken).toMatch(/state\.redis: is not a valid URL/);
    expect(broken).not.toContain('s3cret-pw');
    expect(configError(valid('state: { redis: { sentinels: [ { host: s1, port: 26379 } ] } }\n')).message).toMatch(/state\.redis\.name: Sentinel needs/);
  });

  it('refuses a Redis URL whose path or db parameter is no database number, which ioredis sent as SELECT NaN and crashed on', () => {
    for (const url of ['redis://redis:6379/stormgate', 'redis://:s3cret-pw@redis:6379/abc', 'redis://redis:6379?db=one', 'rediss://redis:6379/%31']) {
      const message = configError(valid(`state: { redis: "${url}" }\n`)).message;
      expect(message, url).toMatch(/state\.redis: the path of a redis:\/\/ URL \(and a `db` parameter\) is the database number/);
      expect(message).not.toContain('s3cret-pw');
    }
    for (const url of ['redis://redis:6379', 'redis://redis:6379/', 'redis://:pw@redis:6379/3', 'redis://redis:6379/?db=2', 'rediss://user:pw@redis:6380/15']) {
      expect(() => parseConfig(valid(`state: { redis: "${url}" }\n`), 'gw.yaml', env), url).not.toThrow();
    }
  });

  it('takes passthrough: false as off, as breaker: false and park: false are, and still refuses true', () => {
    expect(parseConfig(valid('passthrough: false\n'), 'gw.yaml', env).passthrough).toBeUndefined();
    expect(configError(valid('passthrough: true\n')).message).toBe('gw.yaml:10: passthrough: expected one of: false, received true');
    expect(configError(valid('passthrough: { provider: openai }\n')).message).toBe('gw.yaml:10: passthrough: missing required key "paths" (expected list)');
  });

  it('refuses a passthrough path that covers a managed route', () => {
    expect(configError(valid('passthrough: { provider: openai, paths: [/v1] }\n')).message).toMatch(/passthrough\.paths\[0\]: "\/v1" covers the managed route path \/v1\/chat\/completions/);
  });
});
