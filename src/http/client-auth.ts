// Who may spend the providers' keys: with `auth.keys` set, a request must carry one of the gateway's client keys,
// the way it would carry a provider key (the SDKs' `apiKey`). Without it, anyone who reaches the port uses the
// company's keys; that is for a gateway on a loopback address or behind a proxy that authenticates.
import { createHash } from 'node:crypto';
import type { IncomingHttpHeaders } from 'node:http';

type ClientAuth = (headers: IncomingHttpHeaders) => { ok: true; client: string } | { ok: false; reason: 'missing' | 'invalid' };

/**
 * The key a client sent: `Authorization: Bearer` (the OpenAI SDKs), `api-key` (Azure's), `x-api-key` (Anthropic's),
 * so any SDK a team already uses works with its `apiKey` option. An `authorization` of another scheme (the Basic
 * credentials of a proxy in front) or an empty one holds no client key: the other two headers are still read.
 */
export function presentedKey(headers: IncomingHttpHeaders): string | undefined {
  const bearer = headers.authorization === undefined ? undefined : /^Bearer[ \t]+(\S.*)$/i.exec(headers.authorization)?.[1]?.trim();
  if (bearer) return bearer;
  for (const name of ['x-api-key', 'api-key'] as const) {
    const value = headers[name];
    if (typeof value === 'string' && value.trim() !== '') return value.trim();
  }
  return undefined;
}

/**
 * Keys are compared by their SHA-256, looked up in a map: the time taken depends on the digest, not on how many of
 * the secret's characters a guess got right, and a check costs one hash however many clients there are.
 */
const digest = (key: string): string => createHash('sha256').update(key).digest('base64');

/** The check for `keys` (client name to key), or undefined when no key is configured (the gateway is open). */
export function clientAuth(keys: Readonly<Record<string, string>> | undefined): ClientAuth | undefined {
  if (keys === undefined || Object.keys(keys).length === 0) return undefined;
  const byDigest = new Map(Object.entries(keys).map(([name, key]) => [digest(key), name]));
  return (headers) => {
    const key = presentedKey(headers);
    if (key === undefined) return { ok: false, reason: 'missing' };
    const client = byDigest.get(digest(key));
    return client === undefined ? { ok: false, reason: 'invalid' } : { ok: true, client };
  };
}

/**
 * `url` without the query parameters whose value is the client's key (`?key=`, `?api-key=`, as Gemini's and Azure's
 * clients write it, or the key alone): the headers that carry a client key never reach a provider, and the query, forwarded as it is,
 * handed the gateway's client key to every provider's logs. A value is the key percent-decoded either way: with a `+`
 * read as a space (a form) or as itself (a base64 key, `openssl rand -base64`, written into the URL unencoded, whose
 * `+` a form decoder turned into a space, so the key went on). The other parameters go on as they came, byte for byte.
 * A URL that holds no such parameter is returned as it is.
 */
export function withoutKeyInQuery(url: string, key: string): string {
  const q = url.indexOf('?');
  if (q < 0) return url;
  const params = url.slice(q + 1).split('&');
  const kept = params.filter((param) => !holdsKey(param, key));
  if (kept.length === params.length) return url;
  const query = kept.join('&');
  return url.slice(0, q) + (query === '' ? '' : `?${query}`);
}

/**
 * Whether one `name=value` of a query holds `key` as its value, read as a form would or with `+` kept; a parameter
 * with no `=` (`?sk-...`, the key pasted after the `?`) is read as a value too.
 */
function holdsKey(param: string, key: string): boolean {
  const raw = param.slice(param.indexOf('=') + 1);
  return decoded(raw.replaceAll('+', ' ')).trim() === key || decoded(raw).trim() === key;
}

/** A percent-decoded query value; one with a malformed escape (`%zz`) as it is. */
function decoded(raw: string): string {
  try {
    return decodeURIComponent(raw);
  } catch {
    return raw;
  }
}
