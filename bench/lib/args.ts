// A bench's command line: its options, --help, and a mistake said in one line with the usage, not a stack trace.
import { parseArgs, type ParseArgsConfig } from 'node:util';

type Options = NonNullable<ParseArgsConfig['options']>;

/** Parses the bench's options; prints `usage` and exits on --help (0) or a bad option (2). */
export function benchArgs<T extends Options>(options: T, usage: string) {
  const args = process.argv.slice(2);
  if (args.includes('--help') || args.includes('-h')) {
    process.stdout.write(usage);
    process.exit(0);
  }
  try {
    return parseArgs({ args, options, strict: true }).values;
  } catch (err) {
    process.stderr.write(`${(err as Error).message}\n${usage}`);
    process.exit(2);
  }
}
