// The client's x-stormgate-timeout-ms, checked where a request's deadline is taken (a managed route, a passthrough path).
import { GatewayError } from '../errors.ts';
import { firstHeader, type HeaderBag } from '../header-bag.ts';
import { timeoutHeaderMs } from '../policy/deadline.ts';
import { printable } from './request-body.ts';

/** A deadline the client asked for but wrote wrong must not be ignored in silence: the request would run for minutes. */
export function checkTimeoutHeader(headers: HeaderBag): void {
  const text = firstHeader(headers, 'x-stormgate-timeout-ms');
  if (text === undefined) return;
  if (timeoutHeaderMs(text) === undefined) {
    throw new GatewayError('bad_request', `x-stormgate-timeout-ms must be a positive number of milliseconds, got "${printable(text, 40)}"`);
  }
}
