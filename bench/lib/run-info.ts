// What every benchmark report says about its run: progress lines on stderr, and the commit it measured.
import { execFileSync } from 'node:child_process';

export function log(line: string): void {
  process.stderr.write(`${line}\n`);
}

/** The short commit, marked when src/ has uncommitted changes (the figures then belong to no commit). */
export function commit(): string {
  try {
    const sha = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
    const dirty = execFileSync('git', ['status', '--porcelain', '--', 'src'], { encoding: 'utf8' }).trim() !== '';
    return dirty ? `${sha} (src/ has uncommitted changes)` : sha;
  } catch {
    return 'unknown';
  }
}
