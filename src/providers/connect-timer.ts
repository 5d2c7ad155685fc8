// The connect timeout of a provider's connections, on a timer of its own. undici's `connect.timeout` runs on its fast
// timers, which tick every half second: a `connectMs` of 300 fired after 500 to 1000 ms, so a provider that took
// 900 ms to accept was not timed out at all, and one that never accepted cost three times the configured wait. The
// egress proxy's tunnel is bounded by the same timer (egress-proxy.ts).
import type { Socket } from 'node:net';
import type { ConnectionOptions } from 'node:tls';
import { buildConnector, errors } from 'undici';
import { keepTlsAlert } from './tls-alert.ts';

/** Starts a connection and returns how to close what it had opened when the time is up. */
type StartConnect = (opts: buildConnector.Options, callback: buildConnector.Callback) => () => void;

/**
 * A connector that fails with undici's ConnectTimeoutError after `connectMs` (so it is read as a connect timeout);
 * `where` names the way in its message, and `mapError` may turn the connection's own errors into clearer ones. A
 * connection made after the time is up is closed.
 */
export function boundedConnector(start: StartConnect, connectMs: number, where: (opts: buildConnector.Options) => string, mapError?: (err: Error) => Error): buildConnector.connector {
  return (opts, callback) => {
    let settled = false;
    let cancel = () => {};
    const timer = setTimeout(() => {
      settled = true;
      cancel();
      callback(new errors.ConnectTimeoutError(`Connect Timeout Error (${where(opts)}, timeout: ${connectMs}ms)`), null);
    }, connectMs);
    try {
      cancel = start(opts, (...args: Parameters<buildConnector.Callback>) => {
        if (settled) {
          args[1]?.destroy();
          return;
        }
        settled = true;
        clearTimeout(timer);
        const [err, socket] = args;
        if (socket) keepTlsAlert(socket);
        if (err && mapError) callback(mapError(err), null);
        else callback(...args);
      });
    } catch (err) {
      // undici's Client reports a connector's throw as the connection's error: the timer must not report it again
      // later (a second connect error, while its next connection may be under way).
      settled = true;
      clearTimeout(timer);
      throw err;
    }
  };
}

/** undici's own connector (TCP, TLS with `tls`: the provider's CA, ...) with no timer of its own, bounded by `connectMs`. */
export function timedConnector(connectMs: number, tls: ConnectionOptions = {}): buildConnector.connector {
  const connect = buildConnector({ ...tls, timeout: 0 });
  return boundedConnector(
    (opts, callback) => {
      // undici's connector returns the socket it is opening (its types say void): closed at once when the time is up.
      const socket = connect(opts, callback) as unknown as Socket | undefined;
      return () => socket?.destroy();
    },
    connectMs,
    (opts) => `attempted address: ${opts.hostname}:${opts.port}`,
  );
}
