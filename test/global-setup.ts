// Runs once before the whole test run: a fresh directory where every gateway the tests start also writes its log
// lines; `npm run posttest` (scripts/check-test-logs.ts) then fails the run if any key the tests used is in them.
import { mkdirSync, rmSync } from 'node:fs';
import { resolve } from 'node:path';
import { TEST_LOG_DIR } from './helpers/test-secrets.ts';

export default function setup(): void {
  const dir = resolve(TEST_LOG_DIR);
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  process.env.STORMGATE_TEST_LOG_DIR = dir;
}
