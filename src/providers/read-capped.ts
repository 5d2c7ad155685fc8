// A body read into memory up to a cap: an upstream answer or error must never hold more than the gateway allows.

/** An upstream error body is read (for its code, and to take a quoted key out) up to this much: errors are small. */
export const MAX_ERROR_BODY_BYTES = 64 * 1024;

/**
 * The body's first maxBytes; `whole` is false when there was more (the rest is discarded: the body is destroyed), or
 * when its connection broke off and `keepBroken` says to keep what came: an error answer's status and headers (a
 * 429's retry-after) already say what it is, and must not be lost to a cut in its wording. A break `keepBroken` does
 * not keep (the request's own end: its deadline, its client gone, the attempt's timer) is thrown. With `gapMs`, a body
 * silent that long is destroyed: a break like any other.
 */
export async function readCapped(
  body: AsyncIterable<Buffer> & { destroy(err?: Error): void },
  maxBytes: number,
  keepBroken?: () => boolean,
  gapMs?: number,
): Promise<{ bytes: Buffer; whole: boolean }> {
  const chunks: Buffer[] = [];
  let size = 0;
  const gap = gapMs === undefined ? undefined : setTimeout(() => body.destroy(new Error(`no byte of the body for ${gapMs} ms`)), gapMs);
  try {
    for await (const chunk of body) {
      gap?.refresh();
      if (size + chunk.length > maxBytes) {
        chunks.push(chunk.subarray(0, maxBytes - size));
        body.destroy();
        return { bytes: Buffer.concat(chunks), whole: false };
      }
      chunks.push(chunk);
      size += chunk.length;
    }
  } catch (err) {
    if (!keepBroken?.()) throw err;
    return { bytes: Buffer.concat(chunks, size), whole: false };
  } finally {
    clearTimeout(gap);
  }
  return { bytes: Buffer.concat(chunks, size), whole: true };
}
