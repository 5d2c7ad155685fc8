// Loaded before tsx by `npm start` (exec node --import ./src/early-signals.mjs --import tsx src/main.ts). Loading tsx and
// the gateway's TypeScript takes up to a second or two on a busy machine, and a SIGTERM or SIGINT in that time killed
// the process by Node's default (exit 143; as a container's PID 1, the signal was ignored and the gateway started
// anyway). Heard from here, the signal is kept for main.ts, which hands over to its own handlers and stops at once.
// Plain JavaScript: it must run before tsx is there to read TypeScript.
const heard = [];
const handlers = ['SIGTERM', 'SIGINT'].map((name) => {
  const handler = () => heard.push(name);
  process.on(name, handler);
  return [name, handler];
});

globalThis[Symbol.for('stormgate.earlySignals')] = {
  /** The first signal heard before main.ts took over, if any; this module's handlers are removed. */
  takeOver() {
    for (const [name, handler] of handlers) process.removeListener(name, handler);
    return heard[0];
  },
};
