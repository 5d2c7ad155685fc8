// A UTF-8 byte order mark (EF BB BF) before a JSON body: some servers (a .NET or PowerShell one in front of a model,
// a proxy that re-encodes) write one. JSON.parse refuses it, and so would an SDK's, so it is skipped wherever the
// gateway reads JSON, and dropped from what it passes on. A view, never a copy: the check is three bytes.

/** `body` without a leading UTF-8 byte order mark; the same buffer when it has none. */
export function withoutBom(body: Buffer): Buffer {
  return bomLength(body) === 0 ? body : body.subarray(3);
}

/** 3 when `body` starts with a UTF-8 byte order mark, else 0. */
export function bomLength(body: Uint8Array): number {
  return body.length >= 3 && body[0] === 0xef && body[1] === 0xbb && body[2] === 0xbf ? 3 : 0;
}
