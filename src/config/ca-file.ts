// A provider's CA file (`providers.<name>.tls.caFile`), read and checked: by the loader, which reports a file that cannot
// be used as a config problem (file, field, what is wrong), and by the provider's client, which trusts what it holds.
import { readFileSync } from 'node:fs';
import { X509Certificate } from 'node:crypto';
import type { Config } from './schema.ts';
import { formatPath, type ConfigIssue } from './errors.ts';

/**
 * A CA file's PEM, or what is wrong with it, in words for the operator (the path, the errno; never its content).
 * `shown` is how the words name the file: the path, unless it came from the environment (caFileIssues).
 */
export function readCaFile(file: string, shown = file): { pem: string } | { problem: string } {
  let pem: string;
  try {
    pem = readFileSync(file, 'utf8');
  } catch (err) {
    return { problem: `cannot read ${shown} (${(err as NodeJS.ErrnoException).code ?? 'unreadable'})` };
  }
  // Node takes a file with no certificate in it without a word, and then trusts nothing: every handshake failed.
  if (!pem.includes('-----BEGIN CERTIFICATE-----')) return { problem: `${shown} holds no PEM certificate (-----BEGIN CERTIFICATE-----)` };
  // Nor does it say when a certificate does not parse (a truncated copy): the first one, at least, is parsed here.
  try {
    new X509Certificate(pem);
  } catch (err) {
    return { problem: `${shown} holds a certificate that does not parse (${(err as { code?: string }).code ?? 'invalid'})` };
  }
  return { pem };
}

/**
 * Every provider's caFile that cannot be used, as config issues; `at` is the data path, for the issue's line. `shown`
 * names the file at `at` in the words (load.ts: as the file writes it, when a variable gave it).
 */
export function caFileIssues(config: Config, shown: (at: string[], file: string) => string = (_at, file) => file): Array<ConfigIssue & { at: string[] }> {
  return Object.entries(config.providers).flatMap(([name, p]) => {
    const at = ['providers', name, 'tls', 'caFile'];
    const read = p.tls?.caFile ? readCaFile(p.tls.caFile, shown(at, p.tls.caFile)) : undefined;
    return read && 'problem' in read ? [{ at, path: formatPath(at), message: read.problem }] : [];
  });
}
