// The overhead bench's command line (test/readme-audit-49 checks every bench's --help against the README): the
// gateway's node flags are an option, and a mistaken option is said in one line with the usage, exit 2, before
// anything is built or started.
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

const run = async (script: string, args: string[]) =>
  promisify(execFile)(process.execPath, ['--import', 'tsx', script, ...args], { timeout: 30_000 }).then(
    ({ stdout, stderr }) => ({ code: 0, stdout, stderr }),
    (e: { code?: number; stdout: string; stderr: string }) => ({ code: e.code, stdout: e.stdout, stderr: e.stderr }),
  );

describe('bench command lines', () => {
  it('npm run bench -- --help lists every option, --node-flags among them', async () => {
    const r = await run('bench/overhead.ts', ['--help']);
    expect(r.code).toBe(0);
    for (const option of ['--rounds N', '--strict', '--profile', '--node-flags "FLAGS"']) expect(r.stdout).toContain(option);
  }, 40_000);

  it('a mistaken option exits 2 with the usage, and starts nothing', async () => {
    const r = await run('bench/overhead.ts', ['--node-flag', '--max-semi-space-size=64']);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/Unknown option '--node-flag'/);
    expect(r.stderr).toContain('usage: npm run bench --');
  }, 40_000);
});
