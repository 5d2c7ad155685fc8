#!/usr/bin/env node
// CLI: load the config, build the server, listen, shut down gracefully.
//   stormgate --config config/gateway.yaml      (or STORMGATE_CONFIG=...)
//   stormgate --check --config <file>           (validate the config and exit: 0 valid, 2 not)
import { parseArgs } from 'node:util';
import type { buildServer } from './server.ts';
import { isLoopback } from './http/host-header.ts';

const DEFAULT_CONFIG = 'config/gateway.yaml';
const USAGE = 'usage: stormgate [-c, --config <file>] [-p, --port <n>] [--check]   (config default: $STORMGATE_CONFIG or config/gateway.yaml; --port: in place of server.port; --check: validate the config, print its warnings and exit, 0 when valid)\n';

/** Where src/early-signals.mjs, loaded before tsx by `npm start`, keeps a signal heard before this module ran. */
const EARLY_SIGNALS = Symbol.for('stormgate.earlySignals');

/** A SIGINT this long after shutdown began is a person's second Ctrl-C, not npm's copy of the first: exit at once. */
const FORCE_AFTER_MS = 1_000;

/** A problem the person starting the gateway can fix, said in one line (no stack trace): exit code 2. */
class StartupError extends Error {}

async function main(): Promise<void> {
  // Signals are heard from here on, before the gateway's modules load (a second on a busy machine) and while the server
  // is built (start-up waits up to a second for Redis): Node's default would kill the process (exit 143, Redis
  // connections dropped mid-handshake), and as a container's PID 1 without an init it would ignore the signal.
  let running: App | undefined;
  let building = false;
  let closing: string | undefined;
  let closingAt = 0;
  const shutdown = (signal: string) => {
    if (closing !== undefined) {
      // A Ctrl-C pressed again, once the first has had a moment: the person at the terminal will not wait for the
      // drain (streams of minutes). Not sooner: npm passes on the signal its process group got, so one Ctrl-C reaches
      // the gateway twice within milliseconds.
      if (signal === 'SIGINT' && Date.now() - closingAt >= FORCE_AFTER_MS) {
        process.stderr.write('stormgate: SIGINT again: exiting now, without waiting for the requests in flight\n');
        process.exit(130);
      }
      // Any other repeat changes nothing: npm doubles every signal (Ctrl-C; systemd's KillMode=control-group signals
      // every process), and with `once` the second fell to Node's default and killed the process mid-drain: every
      // stream cut with a reset, exit 143 or 130.
      running?.log.info({ signal, closing }, 'signal ignored: already shutting down');
      return;
    }
    closing = signal;
    closingAt = Date.now();
    if (running) stop(running, signal);
    // Nothing built yet (the modules and the config still loading, a second or two under tsx on a busy machine):
    // nothing to close, so the process ends now rather than once the imports are done.
    else if (!building) stoppedBeforeBuild(signal);
    // Otherwise the server is being built: the rest of main() closes what was built.
  };
  process.on('SIGTERM', () => shutdown('SIGTERM'));
  process.on('SIGINT', () => shutdown('SIGINT'));
  // A signal heard while tsx and this module loaded (npm start: src/early-signals.mjs).
  const early = (globalThis as { [EARLY_SIGNALS]?: { takeOver(): string | undefined } })[EARLY_SIGNALS]?.takeOver();
  if (early !== undefined) shutdown(early);
  let values: { config?: string; port?: string; help?: boolean; check?: boolean };
  try {
    ({ values } = parseArgs({ options: { config: { type: 'string', short: 'c' }, port: { type: 'string', short: 'p' }, help: { type: 'boolean', short: 'h' }, check: { type: 'boolean' } }, strict: true }));
  } catch (err) {
    throw new StartupError(`${(err as Error).message}\n${USAGE}`);
  }
  if (values.help) {
    process.stdout.write(USAGE);
    return;
  }
  // An empty --config (a variable that expanded to nothing) names no file; an empty STORMGATE_CONFIG is unset.
  if (values.config === '') throw new StartupError(`--config needs a file name\n${USAGE}`);
  const file = values.config ?? (process.env.STORMGATE_CONFIG || DEFAULT_CONFIG);
  const portFlag = values.port === undefined ? undefined : Number(values.port);
  if (portFlag !== undefined && !(/^\d+$/.test(values.port!) && portFlag <= 65_535)) throw new StartupError(`--port takes a port number from 0 to 65535, got "${values.port}"\n${USAGE}`);
  const { ConfigError, UnreadableConfigError, loadConfigFile } = await import('./config/load.ts');
  let config;
  try {
    config = loadConfigFile(file);
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`stormgate: ${err instanceof UnreadableConfigError ? 'cannot read config' : 'invalid config'}\n${err.message}\n`);
      // A variable a client key reads is a secret of the operator's choosing: the demo (no provider keys) is no way around it.
      const others = err.missingEnv.filter((name) => !err.clientKeyEnv.includes(name));
      if (others.length > 0) {
        // The demo is a source checkout's (tsx, the mock's scripts): the built image (dist/, no dev dependencies) has none.
        const demo = import.meta.url.endsWith('.ts') && err.providerKeyEnv.length > 0 ? ', or run `npm run demo` to try the gateway with the bundled mock provider and no keys' : '';
        process.stderr.write(`\nSet ${others.join(', ')} in the environment${demo}.\n`);
      }
      if (err.clientKeyEnv.length > 0) {
        const them = err.clientKeyEnv.length === 1 ? 'a client key' : 'client keys';
        process.stderr.write(`\nSet ${err.clientKeyEnv.join(', ')} in the environment: ${them} (auth.keys), the secret a client sends the gateway as its API key, of your choosing (not a provider's key).\n`);
      }
      process.exit(2);
    }
    throw err;
  }
  // One config file for several instances on one machine (or an example tried beside a running gateway).
  if (portFlag !== undefined) config = { ...config, server: { ...config.server, port: portFlag } };
  // As `nginx -t`: for CI and a config review, without binding the port or waiting for Redis.
  if (values.check) {
    const { configWarnings } = await import('./config/warnings.ts');
    for (const warning of configWarnings(config)) process.stderr.write(`stormgate: warning: ${warning}\n`);
    const count = (n: number, what: string) => `${n} ${what}${n === 1 ? '' : 's'}`;
    process.stdout.write(`stormgate: config ${file} is valid (${count(config.routes.length, 'route')}, ${count(Object.keys(config.providers).length, 'provider')})\n`);
    return;
  }
  const server = await import('./server.ts');
  building = true;
  const app = await server.buildServer(config);
  running = app;
  if (closing !== undefined) {
    app.log.info({ signal: closing }, 'stopped during start-up');
    await app.close();
    process.exit(0);
  }
  // Node's default for SIGHUP is to exit at once, cutting every request and stream; operators send it to reload, and
  // a closing terminal sends it too. There is no reload: the signal is logged and ignored.
  process.on('SIGHUP', () => app.log.warn('SIGHUP ignored: the config is read at start only; restart the gateway (SIGTERM drains) to apply a change'));
  const { host, port } = config.server;
  const portFrom = portFlag === undefined ? `server.port in ${file}` : '--port';
  const address = await app.listen({ host, port }).catch((err: NodeJS.ErrnoException) => {
    const why: Record<string, string> = {
      EADDRINUSE: `port ${port} is in use on ${host} (${portFrom})`,
      EACCES: `no permission to listen on port ${port} (${portFrom}; ports below 1024 need privileges)`,
      EADDRNOTAVAIL: `${host} is not an address of this machine (server.host in ${file})`,
      ENOTFOUND: `${host} does not resolve (server.host in ${file})`,
    };
    const reason = err.code !== undefined ? why[err.code] : undefined;
    throw reason ? new StartupError(`cannot listen: ${reason}`) : err;
  });
  app.log.info({ address, config: file, routes: config.routes.map((r) => r.name), ...(config.auth && { clients: Object.keys(config.auth.keys) }) }, 'stormgate listening');
  if (!config.auth && !isLoopback(host)) {
    app.log.warn(`listening on ${host} without auth.keys: anyone who reaches this port uses the providers' keys; set auth.keys (${file}) or put an authenticating proxy in front`);
  }
}

type App = Awaited<ReturnType<typeof buildServer>>;

function stoppedBeforeBuild(signal: string): never {
  process.stderr.write(`stormgate: stopped during start-up (${signal})\n`);
  process.exit(0);
}

function stop(app: App, signal: string): void {
  app.log.info({ signal }, 'shutting down');
  // SIGINT (a person at a terminal) closes at once; SIGTERM (an orchestrator) drains.
  (signal === 'SIGTERM' ? app.drain() : app.close()).then(
    () => process.exit(0),
    (err: unknown) => {
      app.log.error({ err }, 'shutdown failed');
      process.exit(1);
    },
  );
}

main().catch((err: unknown) => {
  if (err instanceof StartupError) {
    process.stderr.write(`stormgate: ${err.message}\n`);
    process.exit(2);
  }
  process.stderr.write(`stormgate: ${(err as Error)?.stack ?? String(err)}\n`);
  process.exit(1);
});
