// Runs before `npm test`: makes sure the server binaries the integration tests start are installed. It installs them
// (Debian/Ubuntu, as root) or says exactly how to; it never starts a service, since every test starts its own.
import { spawnSync } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { delimiter, join } from 'node:path';

/** Binaries the tests start, and the Debian package that provides each. Add a row for a new one (e.g. prometheus). */
const REQUIRED: ReadonlyArray<{ binary: string; debianPackage: string; alsoIn?: readonly string[] }> = [
  { binary: 'redis-server', debianPackage: 'redis-server' },
  // redis-cli forms the throwaway Redis Cluster of test/state-redis-cluster.test.ts; openssl makes its TLS certificates.
  { binary: 'redis-cli', debianPackage: 'redis-tools' },
  { binary: 'openssl', debianPackage: 'openssl' },
  // prometheus: test/observability-prometheus.test.ts starts one and runs promtool on the shipped config and rules.
  { binary: 'prometheus', debianPackage: 'prometheus' },
  { binary: 'promtool', debianPackage: 'prometheus' },
  // nginx: test/third-party-suite-28.test.ts puts a real one in front of gateways. Debian installs it in /usr/sbin,
  // which a non-root PATH often leaves out; test/helpers/nginx.ts looks there too.
  { binary: 'nginx', debianPackage: 'nginx-light', alsoIn: ['/usr/sbin'] },
];

/** True when `name` is an executable file in a PATH directory (or in one of `alsoIn`). */
function onPath(name: string, alsoIn: readonly string[] = []): boolean {
  return [...(process.env.PATH ?? '').split(delimiter), ...alsoIn].some((dir) => {
    if (!dir) return false;
    try {
      accessSync(join(dir, name), constants.X_OK);
      return true;
    } catch {
      return false;
    }
  });
}

/** Runs a command with inherited output; exits the script if it fails. */
function run(command: string, args: string[]): void {
  const result = spawnSync(command, args, { stdio: 'inherit', env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' } });
  if (result.status !== 0) {
    console.error(`ensure-services: \`${[command, ...args].join(' ')}\` failed (${result.error?.message ?? `exit ${result.status}`})`);
    process.exit(1);
  }
}

const missing = REQUIRED.filter((r) => !onPath(r.binary, r.alsoIn));
if (missing.length > 0) {
  const packages = [...new Set(missing.map((r) => r.debianPackage))];
  const binaries = missing.map((r) => r.binary).join(', ');
  const isRoot = process.getuid?.() === 0;
  if (!isRoot || !onPath('apt-get')) {
    const how = onPath('apt-get') ? `sudo apt-get install -y ${packages.join(' ')}` : `your package manager (Debian: apt-get install -y ${packages.join(' ')})`;
    console.error(`ensure-services: the tests need ${binaries}, which is not installed. Install it with:\n\n  ${how}\n`);
    process.exit(1);
  }
  console.log(`ensure-services: installing ${packages.join(', ')} for the tests`);
  run('apt-get', ['update']);
  run('apt-get', ['install', '-y', ...packages]);
  const still = missing.filter((r) => !onPath(r.binary, r.alsoIn));
  if (still.length > 0) {
    console.error(`ensure-services: ${still.map((r) => r.binary).join(', ')} still not on PATH after installing`);
    process.exit(1);
  }
}
