// Mutation testing of the config modules no earlier round changed (interpolate, anchors, unknown-key, zod-issues,
// locate) and of the HTTP guards (host-header, loop-guard, method-guard, expect-continue, byte-order-mark,
// timeout-header, close-sweep): 96 hand mutants, 55 killed by the suite, 28 by the tests here, 11 equivalent, 2 left (a
// 4-edit key guess, a pipelined request's late finish). Each test names the behaviour its mutant would have broken.
// One bug: a proxy that is no URL (`proxy: 10.0.0.1:3128`) was also told its password held a stray %.
// Equivalent: anchors' later-anchor offset (an alias after its anchor resolves), RENAMED_KEYS at the root (none there),
// "password" in SECRET_KEY (no such key), a union two of whose options fit (none in the schema), `[a-z]S$` (no key ends
// in a capital pair), "Too big" stripped (bound() words every origin the schema has), the merge walk's cycle guard
// (toJS refuses a cycle first), the Host name's 4-letter pre-check and its [IPv6] branch, exposeHeadRoute (no guard
// holds GET without HEAD), the Via filter of this instance's own entry (admission answers such a request at once).
import { once } from 'node:events';
import { createServer, type IncomingMessage } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import Fastify from 'fastify';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import { configErrorOf, validConfigText } from './helpers/config-text.ts';
import { GatewayError } from '../src/errors.ts';
import { bomLength, withoutBom } from '../src/http/byte-order-mark.ts';
import { closeSweep } from '../src/http/close-sweep.ts';
import { continueWanted } from '../src/http/expect-continue.ts';
import { hostAllowance, hostHeaderFault } from '../src/http/host-header.ts';
import { methodGuard } from '../src/http/method-guard.ts';
import { checkTimeoutHeader } from '../src/http/timeout-header.ts';

const env = { OPENAI_API_KEY: 'sk-test' };
const lines = (text: string, e: NodeJS.ProcessEnv = env) => configErrorOf(text, e).message.split('\n');
/** The valid text with `extra` under the openai provider, after its apiKey. */
const withProvider = (extra: string) => validConfigText().replace('    apiKey: ${OPENAI_API_KEY}\n', () => `    apiKey: \${OPENAI_API_KEY}\n${extra}`);
/** The valid text with its baseUrl written as `value` (a function replacement: `$$` stays as written). */
const withBaseUrl = (value: string) => validConfigText().replace('https://api.openai.com/v1', () => value);

describe('${...} references', () => {
  it('refuses ${VAR:default} (a colon without the dash) instead of reading VAR with no default', () => {
    expect(lines(withBaseUrl('"${OPENAI_BASE:https://api.openai.com/v1}"'))).toEqual([
      'gw.yaml:4: providers.openai.baseUrl: invalid reference "${OPENAI_BASE:https://api.openai.com/v1}"; expected ${NAME} or ${NAME:-default}',
    ]);
  });

  it('reads $${ in a default as a literal ${ that needs no closing brace of its own', () => {
    expect(parseConfig(withBaseUrl('"https://h/${UNSET:-a$${b}"'), 'gw.yaml', env).providers.openai!.baseUrl).toBe('https://h/a${b');
  });

  it('names the variable a default took a wrong value from, not the empty one before it', () => {
    expect(lines(withBaseUrl('"${EMPTY:-${FALLBACK}}"'), { ...env, EMPTY: '', FALLBACK: 'ftp://x' })).toEqual([
      'gw.yaml:4: providers.openai.baseUrl: expected a URL such as https://api.example.com/v1, received the value of $FALLBACK',
    ]);
  });

  it('says where an unset variable is inside a merged mapping, the merge key written <<', () => {
    const text = validConfigText().replace('    family: openai\n    baseUrl: https://api.openai.com/v1\n', () => '    <<: { family: openai, baseUrl: "${NOPE}" }\n');
    expect(lines(text)).toEqual(['gw.yaml:3: providers.openai["<<"].baseUrl: environment variable NOPE is not set']);
  });
});

describe('anchors and merge keys', () => {
  it("points a scalar in a block list of merge sources at its own line, named by its alias", () => {
    const text = `x-a: &a { b: 1 }\nx-s: &s 5\nx-m:\n  <<:\n    - *a\n    - *s\n${validConfigText()}`;
    expect(lines(text)).toEqual(['gw.yaml:6: x-m: merge key << takes a mapping (or a list of aliases to mappings): *s is a single value']);
  });

  it("names an unknown alias by the list index it sits at", () => {
    const text = validConfigText().replace('    targets: [ { provider: openai } ]\n', '    targets: [ { provider: openai }, *nope ]\n');
    expect(lines(text)).toEqual(['gw.yaml:9: routes[0].targets[1]: alias *nope names no anchor set above it']);
  });
});

describe('the key meant by an unknown key', () => {
  it('is not guessed from a start that two keys share (api: apiVersion or apiKey)', () => {
    expect(lines(withProvider('    api: x\n'))).toEqual([expect.stringMatching(/^gw\.yaml:6: providers\.openai: unknown key "api"; valid keys: family, optional, apiVersion,/)]);
  });

  it('is the one key that three letters start', () => {
    expect(lines(withProvider('    timeouts: { res: 5 }\n'))).toEqual(['gw.yaml:6: providers.openai.timeouts: unknown key "res"; did you mean "responseMs"?']);
  });

  it('is found two edits away from a four-letter word', () => {
    expect(lines(validConfigText('    nmae: x\n'))).toEqual(['gw.yaml:10: routes[0]: unknown key "nmae"; did you mean "name"?']);
  });

  it('is the one key that the word starts, in any case', () => {
    expect(lines(validConfigText('    DEADLINE: 5\n'))).toEqual(['gw.yaml:10: routes[0]: unknown key "DEADLINE"; did you mean "deadlineMarginMs"?']);
  });
});

describe('a wrong value', () => {
  it("beyond a whole number's safe range is refused at that bound when the key has no maximum of its own", () => {
    expect(lines(validConfigText('server: { bodyLimitBytes: 100000000000000000000 }\n'))).toEqual([
      'gw.yaml:10: server.bodyLimitBytes: must be <= 9007199254740991, got 100000000000000000000',
    ]);
  });

  it('of YAML 1.1\'s off where a boolean belongs says to write true or false', () => {
    expect(lines(withProvider('    optional: off\n'))).toEqual(['gw.yaml:6: providers.openai.optional: expected boolean, received string ("off"); write true or false']);
  });

  it('of an empty list that needs one item says "1 item"', () => {
    expect(lines(validConfigText().replace('targets: [ { provider: openai } ]', 'targets: []'))).toEqual(['gw.yaml:9: routes[0].targets: needs at least 1 item']);
  });

  it("at a proxy that is no URL says what a proxy URL looks like, and nothing about a password it does not have", () => {
    expect(lines(withProvider('    proxy: 10.0.0.1:3128\n'))).toEqual([
      'gw.yaml:6: providers.openai.proxy: expected an http:// or https:// proxy URL such as http://proxy.example.com:3128 (SOCKS is not supported), or "" for none, received "10.0.0.1:3128"',
    ]);
  });
});

describe('the Host header', () => {
  const request = (minor: number, rawHeaders: string[]) => {
    const headers: Record<string, string> = {};
    for (let i = 0; i < rawHeaders.length; i += 2) headers[rawHeaders[i]!.toLowerCase()] ??= rawHeaders[i + 1]!;
    return { httpVersionMajor: 1, httpVersionMinor: minor, headers, rawHeaders } as unknown as IncomingMessage;
  };

  it('may be left out of an HTTP/1.0 request (a health check), not out of an HTTP/1.1 one', () => {
    expect(hostHeaderFault(request(0, []))).toBeUndefined();
    expect(hostHeaderFault(request(1, []))).toBe('an HTTP/1.1 request needs a Host header');
  });

  it('names set in server.allowedHosts are the only DNS names answered on every address too (0.0.0.0), as the README says', () => {
    expect(hostAllowance({ host: '0.0.0.0' })).toBeUndefined();
    const allowed = hostAllowance({ host: '0.0.0.0', allowedHosts: ['gw.example.com'] })!;
    expect(allowed('gw.example.com:8080')).toBe(true);
    // A DNS name is the same name in capitals (curl sends the URL's as typed).
    expect(allowed('GW.Example.COM:8080')).toBe(true);
    expect(allowed('rebind.attacker.example')).toBe(false);
  });
});

describe('the 405 guard of a path', () => {
  /** An app with the guard of `url` alone; the answer to `method` on `path`, the guard's error as the gateway's errors show it. */
  async function answer(url: string, allowed: string[], method: string, path: string) {
    const app = Fastify();
    app.setErrorHandler((err, _request, reply) => {
      if (!(err instanceof GatewayError)) throw err;
      void reply.code(err.status).headers(err.headers).send({ code: err.code, message: err.message });
    });
    methodGuard(app, url, allowed);
    try {
      const res = await app.inject({ method: method as 'GET', url: path });
      return { status: res.statusCode, allow: res.headers.allow, body: res.json() as { code?: string; message?: string } };
    } finally {
      await app.close();
    }
  }

  it('answers PATCH 405 with allow, like every method the path does not serve', async () => {
    expect(await answer('/v1/chat/completions', ['POST'], 'PATCH', '/v1/chat/completions')).toEqual({
      status: 405,
      allow: 'POST',
      body: { code: 'method_not_allowed', message: 'PATCH is not allowed on /v1/chat/completions; use POST' },
    });
  });

  it('names a path of any model as /{model}, not the route pattern', async () => {
    const res = await answer('/v1/models/*', ['GET', 'HEAD'], 'POST', '/v1/models/gpt-4o');
    expect(res.body.message).toBe('POST is not allowed on /v1/models/{model}; use GET or HEAD');
  });
});

describe('expect: 100-continue', () => {
  const managed = { managed: true, passthrough: false };
  const json = { 'content-type': 'application/json' };

  it('is answered continue for a passthrough upload past bodyLimitBytes, which passthrough paths do not apply', () => {
    expect(continueWanted({ 'content-length': '5000000' }, { managed: false, passthrough: true }, 1000)).toBe(true);
  });

  it('is answered continue off the managed paths whatever the content type: fastify reads a 404\'s body before answering', () => {
    expect(continueWanted({ 'content-type': 'text/plain', 'content-length': '10' }, { managed: false, passthrough: false }, 1000)).toBe(true);
    expect(continueWanted({ 'content-type': 'text/plain', 'content-length': '10' }, managed, 1000)).toBe(false);
  });

  it('is answered continue for a JSON type written with a space before its parameters, which fastify parses', () => {
    expect(continueWanted({ 'content-type': 'application/json ; charset=utf-8', 'content-length': '10' }, managed, 1000)).toBe(true);
  });

  it('is answered continue for a body of exactly bodyLimitBytes, and not one byte more', () => {
    expect(continueWanted({ ...json, 'content-length': '1000' }, managed, 1000)).toBe(true);
    expect(continueWanted({ ...json, 'content-length': '1001' }, managed, 1000)).toBe(false);
  });
});

describe('a byte order mark', () => {
  it('is EF BB BF only: a text that starts with another character of that block (U+FEC9, an Arabic letter) keeps it', () => {
    const arabic = Buffer.from('\ufec9 error', 'utf8');
    expect([...arabic.subarray(0, 3)]).toEqual([0xef, 0xbb, 0x89]);
    expect(bomLength(arabic)).toBe(0);
    expect(withoutBom(arabic)).toBe(arabic);
  });
});

describe('a malformed x-stormgate-timeout-ms', () => {
  it('is quoted in the 400 as the client wrote it, up to 40 characters', () => {
    const quoted = (text: string) => {
      try {
        checkTimeoutHeader({ 'x-stormgate-timeout-ms': text });
      } catch (err) {
        return (err as GatewayError).message;
      }
      return undefined;
    };
    expect(quoted('30 seconds')).toBe('x-stormgate-timeout-ms must be a positive number of milliseconds, got "30 seconds"');
    expect(quoted('x'.repeat(41))).toBe(`x-stormgate-timeout-ms must be a positive number of milliseconds, got "${'x'.repeat(40)}..."`);
    expect(quoted('1500')).toBeUndefined();
  });
});

describe('the sweep of a closing server', () => {
  it('lets an answer already under way finish when the request\'s body is still arriving at the cut', async () => {
    // The answer's head goes out at once and its end 300 ms later; the client sent 10 of its 100 body bytes.
    const server = createServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/plain', 'content-length': '5' });
      res.write('an');
      setTimeout(() => res.end('swe'), 300);
    });
    const sweep = closeSweep(server, () => false, 20);
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    const socket = connect((server.address() as AddressInfo).port, '127.0.0.1');
    let received = '';
    socket.on('data', (chunk: Buffer) => (received += chunk.toString()));
    socket.on('error', () => {});
    socket.write('POST /up HTTP/1.1\r\nHost: x\r\ncontent-length: 100\r\n\r\n0123456789');
    while (!received.includes('an')) await new Promise((r) => setTimeout(r, 10));
    sweep.start();
    sweep.cutUnfinishedBodies();
    server.close();
    await once(socket, 'close');
    sweep.stop();
    expect(received).toMatch(/^HTTP\/1\.1 200 OK\r\n[^]*\r\n\r\nanswe$/);
  });
});
