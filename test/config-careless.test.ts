// The config file as a careless operator writes it: anchors and merge keys, names that every JavaScript object has,
// values YAML types by their looks, URLs and paths that load but that no request could use. Each either loads as
// meant or fails at start-up with the path, the line and what to write instead, never with a stack trace or a secret.
import { describe, expect, it } from 'vitest';
import { ConfigError, parseConfig } from '../src/config/load.ts';
import { configErrorOf, validConfigText } from './helpers/config-text.ts';

const env = { OPENAI_API_KEY: 'sk-live-SECRET-0123' };

const valid = validConfigText;

/** `valid()` with `from` replaced by `to` (a function, so "$$" stays "$$"). */
const edit = (from: string, to: string, text = valid()) => text.replace(from, () => to);

const configError = (text: string, e: NodeJS.ProcessEnv = env): ConfigError => configErrorOf(text, e);

describe('anchors and merge keys', () => {
  it('reads `<<: *defaults` as YAML 1.1 did, with an own key winning, from an `x-` block or another entry', () => {
    const text = `x-provider: &defaults
  family: openai
  apiKey: \${OPENAI_API_KEY}
  timeouts: { connectMs: 1000 }
providers:
  openai:
    <<: *defaults
    baseUrl: https://api.openai.com/v1
  backup:
    <<: *defaults
    baseUrl: https://backup.example.com/v1
    timeouts: { connectMs: 2000 }
routes:
  - &chat
    name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: openai }, { provider: backup } ]
    retry: { maxAttempts: 5 }
  - <<: *chat
    name: embeddings
    match: { path: /v1/embeddings }
    targets: [ { provider: openai } ]
`;
    const config = parseConfig(text, 'gw.yaml', env);
    expect(config.providers.backup).toMatchObject({ family: 'openai', apiKey: env.OPENAI_API_KEY, baseUrl: 'https://backup.example.com/v1', timeouts: { connectMs: 2000 } });
    expect(config.providers.openai!.timeouts.connectMs).toBe(1000);
    expect(config.routes[1]).toMatchObject({ name: 'embeddings', retry: { maxAttempts: 5 } });
  });

  it('points a mistake in an anchored block at its line, for each place that merges it', () => {
    const text = `providers:
  openai: &p
    family: openai
    apiKey: \${OPENAI_API_KEY}
    baseUrl: https://api.openai.com/v1
    maxConnections: -3
  backup:
    <<: *p
routes:
  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: openai }, { provider: backup } ] }
`;
    expect(configError(text).message.split('\n')).toEqual([
      'gw.yaml:6: providers.openai.maxConnections: must be > 0, got -3',
      'gw.yaml:6: providers.backup.maxConnections: must be > 0, got -3',
    ]);
  });

  it('points an alias to an anchor never set, set below it, or merged from a scalar at its line and path (the library said neither)', () => {
    const base = `x-timeouts: &timeouts { connectMs: 1000 }\nx-key: &key \${OPENAI_API_KEY}\n${valid()}`;
    const typo = edit('family: openai', 'family: openai\n    timeouts: { <<: *timeoutz }', base);
    expect(configError(typo).message).toBe('gw.yaml:6: providers.openai.timeouts: alias *timeoutz names no anchor set above it; did you mean *timeouts?');
    const below = `${edit('family: openai', 'family: openai\n    timeouts: *later')}x-later: &later { connectMs: 5 }\n`;
    expect(configError(below).message).toBe('gw.yaml:4: providers.openai.timeouts: alias *later comes before its anchor &later (line 11): move the anchored block above its first use');
    const scalar = edit('family: openai', 'family: openai\n    timeouts: { <<: *key }', base);
    const message = configError(scalar).message;
    expect(message).toBe('gw.yaml:6: providers.openai.timeouts: merge key << takes a mapping (or a list of aliases to mappings): *key is a single value');
    expect(message).not.toContain(env.OPENAI_API_KEY);
  });

  // Suite 64's question: an alias bomb ("billion laughs") was refused in the library's words, with no line.
  it('refuses an alias bomb at the line of the alias that expands past the limit, in its own words', () => {
    const bomb = ['x-a: &a [x, x, x, x, x, x, x, x, x, x]', 'x-b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]', 'x-c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]', 'x-d: [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]'].join('\n');
    const message = configError(`${bomb}\n${valid()}`).message;
    expect(message).toMatch(/^gw\.yaml:[34]: x-[cd]\[\d+\]: alias \*[bc] expands to more copies of anchored blocks than the gateway reads/);
    expect(message).not.toMatch(/resource exhaustion/);
  });

  it('says auth.keys maps names to strings (it said "map of name to object"), without the key a list held', () => {
    const message = configError(valid('auth:\n  keys: [ "${CLIENT_KEY}" ]\n'), { ...env, CLIENT_KEY: 'sg-client-SECRET-9' }).message;
    expect(message).toBe('gw.yaml:11: auth.keys: expected map of name to string, received list');
    expect(configError(valid('auth:\n  keys: { a: "k-1234567890" }\n  priority: batch\n')).message).toMatch(/auth\.priority: expected map of name to string, received string/);
    expect(configError('providers: []\nroutes: []\n').message).toMatch(/providers: expected map of name to object, received list/);
  });

  it('reports a tab in the indentation once, not the lines the parser misread after it', () => {
    const lines = configError(edit('    family: openai', '\tfamily: openai')).message.split('\n');
    expect(lines).toEqual(['gw.yaml:3:1: Tabs are not allowed as indentation']);
  });

  it('never prints a secret that an alias copied into another value', () => {
    const text = `x-key: &key \${OPENAI_API_KEY}\n${edit('baseUrl: https://api.openai.com/v1', 'baseUrl: *key')}`;
    const message = configError(text).message;
    expect(message).toBe('gw.yaml:5: providers.openai.baseUrl: expected a URL such as https://api.example.com/v1, received the value of $OPENAI_API_KEY');
  });
});

describe('names every JavaScript object has', () => {
  it('refuses a target, passthrough or priority naming toString, constructor or __proto__ (a TypeError and its stack trace before)', () => {
    for (const name of ['toString', 'constructor', '__proto__', 'hasOwnProperty']) {
      expect(configError(edit('{ provider: openai }', `{ provider: ${name} }`)).message, name).toBe(
        `gw.yaml:9: routes[0].targets[0].provider: unknown provider "${name}"; expected one of: openai`,
      );
      expect(configError(edit('    targets:', `    priority: ${name}\n    targets:`)).message, name).toMatch(/routes\[0\]\.priority: priority ".*" is not a class of provider "openai"/);
    }
    expect(configError(valid('passthrough: { provider: toString, paths: [/v1/files] }\n')).message).toBe(
      'gw.yaml:10: passthrough.provider: unknown provider "toString"; expected one of: openai',
    );
  });

  it('refuses __proto__ as a name, which was dropped without a word (a breaker override, a client key)', () => {
    const text = edit('family: openai', 'family: openai\n    breaker: { models: { __proto__: { openS: 1 } } }');
    expect(configError(text).message).toMatch(/^gw\.yaml:4: providers\.openai\.breaker\.models\.__proto__: cannot be a name here/);
  });

  it('says that no provider is defined rather than listing none', () => {
    expect(configError(`providers: {}\n${valid().slice(valid().indexOf('routes:'))}`).message).toBe(
      'gw.yaml:5: routes[0].targets[0].provider: unknown provider "openai": `providers` defines none',
    );
  });
});

describe('values YAML types by their looks', () => {
  it('types an unquoted ${VAR} without the line break a file written by echo leaves', () => {
    const text = valid('server:\n  port: ${PORT}\n');
    expect(parseConfig(text, 'gw.yaml', { ...env, PORT: '8081\n' }).server.port).toBe(8081);
    expect(parseConfig(text, 'gw.yaml', { ...env, PORT: ' 8081 ' }).server.port).toBe(8081);
  });

  it('keeps a quoted number\'s hint on one line', () => {
    const message = configError(valid('server:\n  port: "${PORT}"\n'), { ...env, PORT: '8081\n' }).message;
    expect(message.split('\n')).toHaveLength(1);
    expect(message).toMatch(/server\.port: expected number, received string \(the value of \$PORT\); write it without quotes/);
  });

  it('says to quote a key or name that YAML read as a number or boolean, without repeating it', () => {
    const message = configError(valid(), { OPENAI_API_KEY: '20240101' }).message;
    expect(message).toBe('gw.yaml:5: providers.openai.apiKey: expected string, received number; put it in quotes (also a "${VAR}") so YAML reads it as text');
    expect(message).not.toContain('20240101');
  });

  it('quotes the text found where a number, list or map belongs, except at a credential\'s key or from the environment', () => {
    expect(configError(edit('port: 8080', 'port: "eighty"', valid('server: { port: 8080 }\n'))).message).toBe(
      'gw.yaml:10: server.port: expected number, received string ("eighty")',
    );
    expect(configError(valid().replace('targets: [ { provider: openai } ]', 'targets: openai')).message).toBe(
      'gw.yaml:9: routes[0].targets: expected list, received string ("openai")',
    );
    const secret = configError(valid('auth: { keys: sk-client-SECRET-42 }\n')).message;
    expect(secret).toMatch(/auth\.keys: expected map of name to \w+, received string$/);
    expect(secret).not.toContain('SECRET');
    expect(configError(valid('    timeoutMs: ${T}\n'), { ...env, T: 'soon' }).message).toBe(
      'gw.yaml:10: routes[0].timeoutMs: expected number, received string (the value of $T)',
    );
  });

  it('quotes a number with a fraction where a whole number belongs, as it quotes text', () => {
    expect(configError(valid('    timeoutMs: 1500.5\n')).message).toBe('gw.yaml:10: routes[0].timeoutMs: expected integer, received number (1500.5)');
    expect(configError(valid(), { OPENAI_API_KEY: '2024.5' }).message).not.toContain('2024.5');
  });

  it('says to write true or false for yes, no, on, off', () => {
    expect(configError(edit('family: openai', 'family: openai\n    optional: yes')).message).toBe(
      'gw.yaml:4: providers.openai.optional: expected boolean, received string ("yes"); write true or false',
    );
  });

  it('names .inf, .nan and an empty value instead of "expected number, received number"', () => {
    expect(configError(valid('    timeoutMs: .inf\n')).message).toBe('gw.yaml:10: routes[0].timeoutMs: expected number, received .inf (infinity)');
    expect(configError(valid('    timeoutMs: .nan\n')).message).toBe('gw.yaml:10: routes[0].timeoutMs: expected number, received .nan (not a number)');
    expect(configError(valid('server:\n  port: ${PORT}\n'), { ...env, PORT: '' }).message).toBe('gw.yaml:11: server.port: expected number, received an empty string');
  });

  it('reports a huge number once, with the key\'s own bound', () => {
    expect(configError(valid('    timeoutMs: 1e20\n')).message).toBe('gw.yaml:10: routes[0].timeoutMs: must be <= 2147483647, got 100000000000000000000');
  });

  it('says what a retryOn entry may be: an HTTP status from 400 to 599, network or timeout (it listed the words only)', () => {
    const expected = 'expected an HTTP status as a whole number from 400 to 599 (503, not 5xx) or one of: network, timeout';
    expect(configError(valid('    retry: { retryOn: [429, 5xx] }\n')).message).toBe(`gw.yaml:10: routes[0].retry.retryOn[1]: ${expected}, received "5xx"`);
    expect(configError(valid('    retry: { retryOn: [429, "503"] }\n')).message).toBe(`gw.yaml:10: routes[0].retry.retryOn[1]: ${expected}, received "503"; write it without quotes so YAML reads it as a number`);
    expect(configError(valid('    retry: { retryOn: [429.5, true] }\n')).message.split('\n')).toEqual([
      `gw.yaml:10: routes[0].retry.retryOn[0]: ${expected}, received 429.5`,
      `gw.yaml:10: routes[0].retry.retryOn[1]: ${expected}, received true`,
    ]);
    // A word near one it takes is still guessed; a status out of range still names the bound it breaks.
    expect(configError(valid('    retry: { retryOn: [netwrk, 600] }\n')).message.split('\n')).toEqual([
      `gw.yaml:10: routes[0].retry.retryOn[0]: ${expected}, received "netwrk"; did you mean "network"?`,
      'gw.yaml:10: routes[0].retry.retryOn[1]: must be <= 599, got 600',
    ]);
  });

  it('reports a left-out family as a missing key', () => {
    expect(configError(edit('    family: openai\n', '')).message).toBe('gw.yaml:2: providers.openai: missing required key "family" (expected one of: openai, anthropic, azure-openai)');
  });
});

describe('settings that load but with which every request would fail', () => {
  it('refuses a baseUrl that is a whole endpoint (…/chat/completions was asked for twice)', () => {
    expect(configError(edit('https://api.openai.com/v1', 'https://api.openai.com/v1/chat/completions')).message).toBe(
      'gw.yaml:4: providers.openai.baseUrl: ends in the endpoint /chat/completions, which the gateway adds to it: write the API\'s base, e.g. https://api.openai.com/v1',
    );
    const anthropic = edit('family: openai', 'family: anthropic', edit('https://api.openai.com/v1', 'https://api.anthropic.com/v1/messages'));
    expect(configError(anthropic.replace('{ provider: openai }', '{ provider: openai, model: claude-sonnet-4-6 }')).message).toMatch(/baseUrl: ends in the endpoint \/messages/);
  });

  it('refuses a baseUrl with a query or fragment, which was dropped from every request, without quoting it', () => {
    const message = configError(edit('https://api.openai.com/v1', '"https://proxy.example.com/v1?key=s3cret"')).message;
    expect(message).toBe('gw.yaml:4: providers.openai.baseUrl: holds a query (?...) or fragment (#...), which is never sent');
  });

  it('refuses an azure-openai baseUrl that holds the deployment path the gateway writes', () => {
    const azure = edit('family: openai', 'family: azure-openai\n    apiVersion: "2024-10-21"', edit('https://api.openai.com/v1', 'https://x.openai.azure.com/openai/deployments/gpt-4o'));
    expect(configError(azure.replace('{ provider: openai }', '{ provider: openai, model: gpt-4o }')).message).toMatch(
      /providers\.openai\.baseUrl: azure-openai takes the resource's endpoint alone, e\.g\. https:\/\/example\.openai\.azure\.com/,
    );
  });

  it('refuses a route path with a trailing slash, on which no SDK request arrives', () => {
    expect(configError(edit('path: /v1/chat/completions', 'path: /v1/chat/completions/')).message).toBe(
      'gw.yaml:8: routes[0].match.path: "/v1/chat/completions/" ends in "/", which clients never send: write /v1/chat/completions',
    );
  });

  it('refuses a route that an earlier route of the same path and every model hides', () => {
    const text = valid(`  - name: chat-mini
    match: { path: /v1/chat/completions, models: [gpt-4o-mini] }
    targets: [ { provider: openai } ]
`);
    expect(configError(text).message).toBe(
      'gw.yaml:11: routes[1].match: route "chat-mini" is never used: route "chat" before it takes every model on /v1/chat/completions; give that one match.models, or put this one first',
    );
    // Put first, it takes its model and the open route takes the rest.
    const ordered = `providers:
  openai: { family: openai, baseUrl: https://api.openai.com/v1, apiKey: k }
routes:
  - { name: chat-mini, match: { path: /v1/chat/completions, models: [gpt-4o-mini] }, targets: [ { provider: openai } ] }
  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: openai } ] }
`;
    expect(parseConfig(ordered, 'gw.yaml', {}).routes).toHaveLength(2);
  });

  it('keeps a route without match.models behind one of `*`: it serves the requests that name no model (moderations, images)', async () => {
    const { createRouter } = await import('../src/routing/router.ts');
    const text = `providers:
  openai: { family: openai, baseUrl: https://api.openai.com/v1, apiKey: k }
routes:
  - { name: named, match: { path: /v1/moderations, models: ["*"] }, targets: [ { provider: openai } ] }
  - { name: unnamed, match: { path: /v1/moderations }, targets: [ { provider: openai } ] }
`;
    const router = createRouter(parseConfig(text, 'gw.yaml', {}));
    expect(router.match('/v1/moderations', undefined)).toMatchObject({ route: { name: 'unnamed' } });
    expect(router.match('/v1/moderations', 'omni-moderation-latest')).toMatchObject({ route: { name: 'named' } });
    // Behind `*`, a route that names models is never used.
    expect(configError(text.replace('match: { path: /v1/moderations }', 'match: { path: /v1/moderations, models: [x] }')).message).toMatch(/route "unnamed" is never used/);
  });

  it('says once that a route or passthrough path needs its leading "/", and what to write (a second line called it no plain path)', () => {
    expect(configError(edit('path: /v1/chat/completions', 'path: v1/embeddings')).message).toBe(
      'gw.yaml:8: routes[0].match.path: must start with "/", received "v1/embeddings"; write "/v1/embeddings"',
    );
    expect(configError(valid('passthrough: { provider: openai, paths: [v1/files] }\n')).message).toBe(
      'gw.yaml:10: passthrough.paths[0]: must start with "/", received "v1/files"; write "/v1/files"',
    );
    // No guess that would itself be refused: a parameter is no plain path, with the slash or without.
    expect(configError(edit('path: /v1/chat/completions', 'path: "v1/files/:id"')).message).toBe(
      'gw.yaml:8: routes[0].match.path: must start with "/", received "v1/files/:id"',
    );
  });

  it('refuses a passthrough method listed twice (fastify ended start-up on it with a stack trace)', () => {
    expect(configError(valid('passthrough: { provider: openai, paths: [/v1/files], methods: [GET, POST, GET] }\n')).message).toBe(
      'gw.yaml:10: passthrough.methods[2]: "GET" is listed already (passthrough.methods[0])',
    );
  });
});

describe('the listening address', () => {
  it('refuses a provider on port 0, which no connection reaches', () => {
    expect(configError(edit('https://api.openai.com/v1', 'http://127.0.0.1:0/v1')).message).toMatch(/gw\.yaml:4: providers\.openai\.baseUrl: has port 0/);
  });

  // Found by suite 64: a zero-width space or a right-to-left mark pasted after a baseUrl loaded (the URL parser
  // percent-encodes it into the path), and every request got the provider's 404.
  it('refuses a baseUrl holding an invisible character, and still takes an international host name', () => {
    for (const [ch, name] of [['\u200b', 'U+200B'], ['\u200f', 'U+200F'], ['\u2060', 'U+2060']] as const) {
      expect(configError(edit('https://api.openai.com/v1', `https://api.openai.com/v1${ch}`)).message, name).toMatch(new RegExp(`gw\\.yaml:4: providers\\.openai\\.baseUrl: holds an invisible character \\(${name.replace('+', '\\+')}`));
    }
    expect(parseConfig(edit('https://api.openai.com/v1', 'https://bücher.example/v1'), 'gw.yaml', env).providers.openai!.baseUrl).toBe('https://bücher.example/v1');
  });

  it('refuses an empty server.host, on which Node would listen on every interface', () => {
    const text = `server: { host: "\${HOST}" }\n${valid()}`;
    expect(configError(text, { ...env, HOST: '' }).message).toMatch(/gw\.yaml:1: server\.host: must not be empty/);
  });

  it('refuses a server.allowedHosts entry that no Host name can equal (a port, a scheme, a "*." pattern): every proxied request got 403', () => {
    for (const name of ['gateway.corp.example:8443', 'https://gateway.corp.example', '*.corp.example']) {
      expect(configError(`server: { allowedHosts: ["${name}"] }\n${valid()}`).message, name).toMatch(/gw\.yaml:1: server\.allowedHosts\[0\]: expected a host name alone/);
    }
    expect(parseConfig(`server: { allowedHosts: [gateway.corp.example, "*"] }\n${valid()}`, 'gw.yaml', env).server.allowedHosts).toEqual(['gateway.corp.example', '*']);
  });
});
