// A TLS alert the provider sends just after a handshake the gateway took as done. In TLS 1.3 the client's handshake
// ends before the server has checked it: a server that asks for a client certificate (mutual TLS) refuses one that
// is missing only then, with a `certificate_required` alert. Node emits the alert's error without closing the socket;
// undici, which had sent the request on it, ignores an error while a request runs and reports the end that follows as
// `other side closed` (UND_ERR_SOCKET). The alert's code was lost: the request read as one that may have run, it was
// retried to the same answer, counted against the breaker, and the client was told the provider could not be reached.
import type { Socket } from 'node:net';

/** Closes a provider's connection with the TLS error it raises, so that undici fails the request with that error's code. */
export function keepTlsAlert(socket: Socket): void {
  socket.on('error', (err: Error & { code?: unknown }) => {
    if (!socket.destroyed && typeof err.code === 'string' && err.code.startsWith('ERR_SSL_')) socket.destroy(err);
  });
}
