// Headers as Node and undici hand them over: a name seen twice is an array. Every part of the gateway reads the first
// value, as the SDKs and providers send one; one helper, so no reader forgets the array case.

export type HeaderBag = Record<string, string | string[] | undefined>;

/** The header's first value; undefined when absent. */
export function firstHeader(headers: HeaderBag, name: string): string | undefined {
  const v = headers[name];
  return Array.isArray(v) ? v[0] : v;
}
