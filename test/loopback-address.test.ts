// One rule for "an address only this machine reaches", shared by the Host check (src/http/host-header.ts) and the
// start-up warning for a gateway without client keys (src/main.ts): they had a copy each, spelling ::1 differently.
import { describe, expect, it } from 'vitest';
import { isLoopback } from '../src/http/host-header.ts';

describe('isLoopback', () => {
  it.each(['localhost', 'LOCALHOST', '127.0.0.1', '127.8.9.10', '::1', '[::1]', '0:0:0:0:0:0:0:1', '::ffff:127.0.0.1', '::FFFF:127.0.0.2'])('%s is loopback', (a) => {
    expect(isLoopback(a)).toBe(true);
  });
  it.each(['0.0.0.0', '::', '10.0.0.1', '128.0.0.1', '::ffff:10.0.0.1', 'gateway.internal', 'localhost.example.com', '127.0.0.1.nip.io', ''])('%s is not', (a) => {
    expect(isLoopback(a)).toBe(false);
  });
});
