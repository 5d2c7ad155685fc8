// Review of 2026-12-05 of the config loader and the provider key's secrecy, as a new user meets them: a key the
// provider echoes in escaped form, a key written one level too high or too low, a CA file's problem without its line,
// a second YAML document, an optional provider whose variable is unset.
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadConfigFile, parseConfig } from '../src/config/load.ts';
import { withoutKey, withoutKeyCut } from '../src/providers/key-echo.ts';
import { configErrorOf, validConfigText } from './helpers/config-text.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { configServedBy, useStacks } from './helpers/stack.ts';

const env = { OPENAI_API_KEY: 'sk-live-SECRET-0123' };
const edit = (from: string, to: string, text = validConfigText()) => text.replace(from, () => to);

describe('a provider key echoed in escaped form', () => {
  // Base64 keys (Amazon Bedrock's API keys, many self-hosted servers') hold "/" and "+"; a key may hold any printable ASCII.
  const KEY = 'ABSKcmV2aWV3/Y2ZnLWtleQ+0123=';

  it('is taken out as JSON escapes it (PHP and Java "\\/", Go "\\u003c", any encoder "\\"" and "\\\\"), and as a URL encodes it', () => {
    const php = `{"error":{"message":"invalid key ${KEY.replaceAll('/', '\\/')}"}}`;
    expect(withoutKey(php, KEY)).toBe('{"error":{"message":"invalid key [redacted]"}}');
    expect(withoutKey(Buffer.from(php), KEY).toString()).toBe('{"error":{"message":"invalid key [redacted]"}}');
    const quoted = 'sk-a"b\\c<d>&e-0123';
    expect(withoutKey(JSON.stringify({ m: `key ${quoted}` }), quoted)).toBe('{"m":"key [redacted]"}');
    const go = JSON.stringify({ m: `key ${quoted}` }).replace(/[<>&]/g, (c) => `\\u00${c.charCodeAt(0).toString(16)}`);
    expect(withoutKey(go, quoted)).toBe('{"m":"key [redacted]"}');
    expect(withoutKey(`{"m":"Bearer ${encodeURIComponent(KEY)}"}`, KEY)).toBe('{"m":"Bearer [redacted]"}');
    // A cut body ending in the start of the escaped key.
    expect(withoutKeyCut(`{"m":"${KEY.replaceAll('/', '\\/').slice(0, 16)}`, KEY)).toBe('{"m":"[redacted]');
    // A key with none of those characters is looked for once, as before.
    expect(withoutKey('nothing here', 'sk-plain-key-0123')).toBe('nothing here');
  });

  const startStack = useStacks();
  const startProvider = useFakeProviders();

  it("is not in a provider's 400 that quotes it with JSON's escaped slashes", async () => {
    const provider = await startProvider((req, res) => {
      req.resume();
      req.on('end', () => {
        const auth = String(req.headers.authorization ?? '');
        res.writeHead(400, { 'content-type': 'application/json' });
        // PHP's json_encode, by default: "/" written "\/".
        res.end(JSON.stringify({ error: { message: `Incorrect API key provided: ${auth}`, type: 'invalid_request_error', param: null, code: null } }).replaceAll('/', '\\/'));
      });
    });
    const stack = await startStack({
      config: (mockUrl) => {
        const base = configServedBy(mockUrl, 'escaping', `${provider.origin}/v1`);
        return { ...base, providers: { ...base.providers, escaping: { ...base.providers.escaping!, apiKey: KEY } }, routes: base.routes.map((r) => ({ ...r, retry: { maxAttempts: 1 }, park: false })) };
      },
    });
    const res = await fetch(`${stack.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(res.status).toBe(400);
    const body = await res.text();
    expect(body).toContain('Incorrect API key provided');
    expect(body).not.toContain(KEY.replaceAll('/', '\\/'));
    expect(JSON.stringify(JSON.parse(body))).not.toContain(KEY);
  });
});

describe('a key written at the wrong level', () => {
  it('points to where it goes instead of to an unrelated key nearby (maxAttempts is not minAttemptMs)', () => {
    const lines = (extra: string) => configErrorOf(validConfigText(extra), env).message.split('\n');
    expect(lines('    maxAttempts: 3')).toEqual(['gw.yaml:10: routes[0]: unknown key "maxAttempts"; did you mean retry.maxAttempts?']);
    expect(lines('    retryOn: [429]')).toEqual(['gw.yaml:10: routes[0]: unknown key "retryOn"; did you mean retry.retryOn?']);
    expect(lines('    provider: openai')).toEqual(['gw.yaml:10: routes[0]: unknown key "provider"; did you mean targets[].provider or contextWindowFallback.provider?']);
    expect(lines('server:\n  host: 127.0.0.1\nport: 8080')).toEqual(['gw.yaml:12: unknown key "port"; did you mean server.port?']);
    const provider = (key: string) => configErrorOf(edit('    apiKey:', `    ${key}\n    apiKey:`), env).message.split('\n');
    expect(provider('connectMs: 1000')).toEqual(['gw.yaml:5: providers.openai: unknown key "connectMs"; did you mean timeouts.connectMs?']);
    expect(provider('requestsPerMinute: 600')).toEqual(['gw.yaml:5: providers.openai: unknown key "requestsPerMinute"; did you mean pools.requestsPerMinute?']);
    expect(provider('caFile: ca.pem')).toEqual(['gw.yaml:5: providers.openai: unknown key "caFile"; did you mean tls.caFile?']);
  });

  it('keeps the suggestions it made: a typo of a key of its own level, a renamed key', () => {
    expect(configErrorOf(validConfigText('    retyr: {}'), env).message).toBe('gw.yaml:10: routes[0]: unknown key "retyr"; did you mean "retry"?');
    expect(configErrorOf(validConfigText('    timeout: 1000'), env).message).toBe('gw.yaml:10: routes[0]: unknown key "timeout"; it was renamed to "timeoutMs"');
    // A key one letter off a key of its own level is that key misspelt, even where a level down has it as written.
    expect(configErrorOf(validConfigText().replace('providers:', 'provider:'), env).message).toContain('unknown key "provider"; did you mean "providers"?');
    expect(configErrorOf(validConfigText('    TimeoutMs: 1000'), env).message).toBe('gw.yaml:10: routes[0]: unknown key "TimeoutMs"; did you mean "timeoutMs"?');
  });
});

describe('the files and documents a config holds', () => {
  it("says a CA file that cannot be used at the caFile's line, as every other problem is said", () => {
    const dir = mkdtempSync(join(tmpdir(), 'sg-review-config-'));
    const file = join(dir, 'gw.yaml');
    writeFileSync(file, edit('https://api.openai.com/v1\n', `https://api.openai.com/v1\n    tls:\n      caFile: ${dir}\n`));
    expect(() => loadConfigFile(file, env)).toThrow(`${file}:6: providers.openai.tls.caFile: cannot read ${dir} (EISDIR)`);
  });

  it('says a second document (a --- line) is one too many, not which parser call to use', () => {
    const text = `${validConfigText()}---\n${validConfigText()}`;
    expect(configErrorOf(text, env).message).toBe('gw.yaml:10:1: the file holds more than one YAML document (this --- line starts another): the gateway reads one; remove the line and what follows it, or merge them into one mapping');
  });
});

describe('an optional provider whose variable is unset', () => {
  it('says how to let it start without the variable: ${VAR:-}', () => {
    const text = edit('    apiKey: ${OPENAI_API_KEY}', '    optional: true\n    apiKey: ${AZURE_KEY}');
    expect(configErrorOf(text, {}).message).toBe(
      'gw.yaml:6: providers.openai.apiKey: environment variable AZURE_KEY is not set; the provider is optional: write "${AZURE_KEY:-}" to start without it when the variable is unset',
    );
  });
});

describe('a number from the environment in a message', () => {
  it('is named by its variable, as a string from the environment is (README: never the value found of one from the environment)', () => {
    const numeric = { ...env, ACCOUNT_SECRET: '98765432109876' };
    expect(configErrorOf(edit('https://api.openai.com/v1', '${ACCOUNT_SECRET}'), numeric).message).toBe(
      'gw.yaml:4: providers.openai.baseUrl: expected string, received number (the value of $ACCOUNT_SECRET); put it in quotes (also a "${VAR}") so YAML reads it as text',
    );
    expect(configErrorOf(validConfigText('server:\n  port: ${ACCOUNT_SECRET}'), numeric).message).toBe('gw.yaml:11: server.port: must be <= 65535, got the value of $ACCOUNT_SECRET');
    // A number written in the file is still shown.
    expect(configErrorOf(validConfigText('server:\n  port: 98765432109876'), numeric).message).toBe('gw.yaml:11: server.port: must be <= 65535, got 98765432109876');
  });
});

describe('a provider key written as the header it goes in', () => {
  it('is refused at start-up: "Bearer ${KEY}" would be sent as "Bearer Bearer sk-..." and every request would get a 401', () => {
    expect(configErrorOf(edit('apiKey: ${OPENAI_API_KEY}', 'apiKey: "Bearer ${OPENAI_API_KEY}"'), env).message).toBe(
      'gw.yaml:5: providers.openai.apiKey: starts with "Bearer ", which the gateway writes itself (Authorization: Bearer <key>; x-api-key or api-key for anthropic and azure-openai): write the key alone, e.g. "${OPENAI_API_KEY}"',
    );
    expect(configErrorOf(edit('apiKey: ${OPENAI_API_KEY}', 'apiKey: "bearer ${OPENAI_API_KEY}"'), env).message).not.toContain(env.OPENAI_API_KEY);
  });

  it('is refused when it is a shell-style $VAR, which is text: the provider would be sent "$OPENAI_API_KEY"', () => {
    expect(configErrorOf(edit('apiKey: ${OPENAI_API_KEY}', 'apiKey: $OPENAI_API_KEY'), env).message).toBe(
      'gw.yaml:5: providers.openai.apiKey: is "$OPENAI_API_KEY", which is text, not a reference to the variable: write ${OPENAI_API_KEY}',
    );
    // Elsewhere $VAR stays text, as the README says.
    expect(parseConfig(edit('{ provider: openai }', '{ provider: openai, model: $MODEL }'), 'gw.yaml', env).routes[0]!.targets[0]!.model).toBe('$MODEL');
  });
});
