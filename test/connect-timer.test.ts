// The connect timer of a provider's connections (providers/connect-timer.ts): whatever way a connection attempt ends,
// undici hears of it once, and no timer is left behind.
import { afterEach, describe, expect, it, vi } from 'vitest';
import type { buildConnector } from 'undici';
import { boundedConnector } from '../src/providers/connect-timer.ts';

const opts = { hostname: 'provider.example', host: 'provider.example', protocol: 'https:', port: '443' } as buildConnector.Options;

afterEach(() => vi.useRealTimers());

describe('boundedConnector', () => {
  it('leaves no timer to call back a second time when the connection fails as it starts (a throw)', () => {
    vi.useFakeTimers();
    const callback = vi.fn();
    const connector = boundedConnector(
      () => {
        throw new Error('bad connect options');
      },
      300,
      () => 'provider.example:443',
    );
    // undici's Client catches a connector's throw and reports it as the connection's error: that is the one report.
    expect(() => connector(opts, callback)).toThrow('bad connect options');
    expect(vi.getTimerCount()).toBe(0);
    vi.advanceTimersByTime(1_000);
    expect(callback).not.toHaveBeenCalled();
  });

  it('fails with a connect timeout at connectMs and closes what was opened', () => {
    vi.useFakeTimers();
    const callback = vi.fn();
    const cancel = vi.fn();
    const connector = boundedConnector(() => cancel, 300, (o) => `attempted address: ${o.hostname}:${o.port}`);
    connector(opts, callback);
    vi.advanceTimersByTime(299);
    expect(callback).not.toHaveBeenCalled();
    vi.advanceTimersByTime(1);
    expect(cancel).toHaveBeenCalledOnce();
    expect(callback).toHaveBeenCalledOnce();
    expect(callback.mock.calls[0]![0]).toMatchObject({ code: 'UND_ERR_CONNECT_TIMEOUT' });
    expect(vi.getTimerCount()).toBe(0);
  });
});
