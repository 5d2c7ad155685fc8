// Whether a request that asked `expect: 100-continue` is told to send its body. Told to continue, curl uploads all of
// it, then reads an answer its headers had already decided.
import type { IncomingHttpHeaders } from 'node:http';
import { contentEncoding } from './request-body.ts';

/** Where the request goes, as far as its body matters. */
interface BodyPath {
  /** A managed route's path: a JSON body (application/json, in an encoding the gateway decodes) or 415. */
  managed: boolean;
  /** A passthrough path: the body goes to the provider as it comes, whatever its size or type. */
  passthrough: boolean;
}

/**
 * False when the headers decide the answer without the body: a content-length past bodyLimitBytes (413, on any path
 * but the passthrough's), or, on a managed path, a content-type other than JSON, none, or a content-encoding the
 * gateway cannot decode (415). The answer then goes out before the upload, and the connection closes after it.
 */
export function continueWanted(headers: IncomingHttpHeaders, path: BodyPath, bodyLimitBytes: number): boolean {
  if (path.passthrough) return true;
  if (Number(headers['content-length']) > bodyLimitBytes) return false;
  return !path.managed || (isJson(headers['content-type']) && decodable(headers['content-encoding']));
}

/** The media type fastify's JSON parser takes: application/json, any case, with or without parameters. */
function isJson(contentType: string | undefined): boolean {
  return contentType?.split(';', 1)[0]!.trim().toLowerCase() === 'application/json';
}

function decodable(encoding: string | undefined): boolean {
  try {
    contentEncoding(encoding);
    return true;
  } catch {
    return false;
  }
}
