#!/usr/bin/env node
// CLI: load the config, build the server, listen, shut down gracefully.
//   stormgate --config config/gateway.yaml      (or STORMGATE_CONFIG=...)
import { parseArgs } from 'node:util';
import { ConfigError, loadConfigFile } from './config/load.ts';
import { buildServer } from './server.ts';

const DEFAULT_CONFIG = 'config/gateway.yaml';

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: { config: { type: 'string', short: 'c' }, help: { type: 'boolean', short: 'h' } },
    strict: true,
  });
  if (values.help) {
    process.stdout.write('usage: stormgate [--config <file>]   (default: $STORMGATE_CONFIG or config/gateway.yaml)\n');
    return;
  }
  const file = values.config ?? process.env.STORMGATE_CONFIG ?? DEFAULT_CONFIG;
  let config;
  try {
    config = loadConfigFile(file);
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`stormgate: invalid config\n${err.message}\n`);
      if (err.missingEnv.length > 0) {
        process.stderr.write(
          `\nSet ${err.missingEnv.join(', ')} in the environment, or run \`npm run demo\` to try the gateway with the bundled mock provider and no keys.\n`,
        );
      }
      process.exit(2);
    }
    throw err;
  }
  const app = await buildServer(config);
  let closing = false;
  const shutdown = (signal: string) => {
    if (closing) return;
    closing = true;
    app.log.info({ signal }, 'shutting down');
    // SIGINT (a person at a terminal) closes at once; SIGTERM (an orchestrator) drains.
    (signal === 'SIGTERM' ? app.drain() : app.close()).then(
      () => process.exit(0),
      (err: unknown) => {
        app.log.error({ err }, 'shutdown failed');
        process.exit(1);
      },
    );
  };
  process.once('SIGTERM', () => shutdown('SIGTERM'));
  process.once('SIGINT', () => shutdown('SIGINT'));
  // Node's default for SIGHUP is to exit at once, cutting every request and stream; operators send it to reload, and
  // a closing terminal sends it too. There is no reload: the signal is logged and ignored.
  process.on('SIGHUP', () => app.log.warn('SIGHUP ignored: the config is read at start only; restart the gateway (SIGTERM drains) to apply a change'));
  const address = await app.listen({ host: config.server.host, port: config.server.port });
  app.log.info({ address, config: file, routes: config.routes.map((r) => r.name) }, 'stormgate listening');
}

main().catch((err: unknown) => {
  process.stderr.write(`stormgate: ${(err as Error)?.stack ?? String(err)}\n`);
  process.exit(1);
});
