// TLS to a provider: the CA its certificate is checked against (`tls.caFile`, read once at start-up) and whether a
// certificate must verify at all. undici takes these as Node's tls.connect options, directly or inside the egress
// proxy's tunnel (requestTls).
import { readCaFile } from '../config/ca-file.ts';
import type { ProviderConfig } from '../config/schema.ts';

interface ProviderTls {
  /** The CA certificates (PEM), in place of Node's public roots; unset: Node's roots. */
  ca?: string;
  rejectUnauthorized: boolean;
}

/** The provider's TLS options; a caFile that cannot be used fails start-up, naming the field and the file. */
export function providerTls(name: string, config: ProviderConfig): ProviderTls {
  const tls = config.tls;
  if (!tls?.caFile) return { rejectUnauthorized: tls?.rejectUnauthorized ?? true };
  const read = readCaFile(tls.caFile);
  if ('problem' in read) throw new Error(`providers.${name}.tls.caFile: ${read.problem}`);
  return { ca: read.pem, rejectUnauthorized: tls.rejectUnauthorized };
}
