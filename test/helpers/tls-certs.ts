// Throwaway certificates for tests of https:// providers, made with the machine's openssl in a temp dir (never kept):
// a private CA and, for 127.0.0.1, a certificate it signed, one it signed for another name, one it signed that has
// expired, and a self-signed one.
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export interface TestCerts {
  dir: string;
  /** The private CA's certificate (PEM), and its file: what `tls.caFile` names. */
  ca: string;
  caFile: string;
  /** The servers' one key (PEM). */
  key: string;
  /** Signed by the CA for IP 127.0.0.1. */
  good: string;
  /** Signed by the CA for DNS other.example only. */
  wrongName: string;
  /** Signed by the CA for IP 127.0.0.1, valid in January 2020 only. */
  expired: string;
  /** For IP 127.0.0.1, signed by its own key. */
  selfSigned: string;
  remove(): void;
}

export function makeTestCerts(): TestCerts {
  const dir = mkdtempSync(join(tmpdir(), 'stormgate-tls-'));
  const openssl = (...args: string[]) => execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];
  openssl('req', '-x509', ...ec, '-keyout', 'ca.key', '-out', 'ca.pem', '-days', '2', '-subj', '/CN=stormgate test CA');
  openssl('req', ...ec, '-keyout', 'server.key', '-out', 'server.csr', '-subj', '/CN=127.0.0.1');
  writeFileSync(join(dir, 'ip.ext'), 'subjectAltName=IP:127.0.0.1\n');
  writeFileSync(join(dir, 'name.ext'), 'subjectAltName=DNS:other.example\n');
  const sign = (out: string, ext: string) =>
    openssl('x509', '-req', '-in', 'server.csr', '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial', '-out', out, '-days', '2', '-extfile', ext);
  sign('good.pem', 'ip.ext');
  sign('wrong-name.pem', 'name.ext');
  openssl('req', '-x509', '-key', 'server.key', '-out', 'self.pem', '-days', '2', '-subj', '/CN=127.0.0.1', '-addext', 'subjectAltName=IP:127.0.0.1');
  // `openssl x509` takes no start date: `openssl ca` does, with a database of its own.
  mkdirSync(join(dir, 'db'));
  writeFileSync(join(dir, 'db/index.txt'), '');
  writeFileSync(join(dir, 'db/serial'), '01\n');
  writeFileSync(
    join(dir, 'ca.cnf'),
    '[ca]\ndefault_ca = d\n[d]\ndatabase = db/index.txt\nserial = db/serial\nnew_certs_dir = db\ndefault_md = sha256\npolicy = p\ncopy_extensions = copy\n[p]\ncommonName = supplied\n',
  );
  openssl('req', '-new', '-key', 'server.key', '-out', 'expired.csr', '-subj', '/CN=127.0.0.1', '-addext', 'subjectAltName=IP:127.0.0.1');
  openssl('ca', '-batch', '-config', 'ca.cnf', '-cert', 'ca.pem', '-keyfile', 'ca.key', '-in', 'expired.csr', '-out', 'expired.pem', '-startdate', '20200101000000Z', '-enddate', '20200102000000Z');
  const read = (f: string) => readFileSync(join(dir, f), 'utf8');
  return {
    dir,
    ca: read('ca.pem'),
    caFile: join(dir, 'ca.pem'),
    key: read('server.key'),
    good: read('good.pem'),
    wrongName: read('wrong-name.pem'),
    expired: read('expired.pem'),
    selfSigned: read('self.pem'),
    remove: () => rmSync(dir, { recursive: true, force: true }),
  };
}
