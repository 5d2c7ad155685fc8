// After `npm test`: greps the gateway logs of the whole test run for the credentials the tests used. Any hit fails.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { TEST_LOG_DIR, TEST_SECRETS } from '../test/helpers/test-secrets.ts';

const dir = resolve(TEST_LOG_DIR);
if (!existsSync(dir)) {
  console.error(`check-test-logs: ${dir} does not exist; run the tests first`);
  process.exit(1);
}
const leaks: string[] = [];
let lines = 0;
for (const file of readdirSync(dir)) {
  const text = readFileSync(join(dir, file), 'utf8');
  lines += text.split('\n').length - 1;
  for (const secret of TEST_SECRETS) if (text.includes(secret)) leaks.push(`${file}: ${secret}`);
}
if (leaks.length > 0) {
  console.error(`check-test-logs: credentials found in the gateway logs of this test run: ${leaks.join(', ')}`);
  process.exit(1);
}
if (lines < 100) {
  console.error(`check-test-logs: only ${lines} log lines were collected; the secrecy check saw too little`);
  process.exit(1);
}
console.log(`check-test-logs: ${lines} gateway log lines from the test run hold none of the ${TEST_SECRETS.length} test credentials`);
