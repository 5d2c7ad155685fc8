// The connection that hears the fleet's changes: it only receives, so it has its own liveness check and its own retry
// of a refused channel, apart from the command connection's health.
import { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { RedisConnection } from './redis-client.ts';
import { configProblem, safeError } from './redis-errors.ts';
import type { RedisHealth } from './redis-health.ts';
import { decodeChange, type ChangeMessage } from './redis-keys.ts';

/** After Redis refused the events channel (ACL), how often the subscriber asks again, so a fixed ACL is picked up. */
const SUBSCRIBE_RETRY_MS = 1000;
/**
 * How often the subscriber connection is asked for a PING, and how long its answer may take before the connection is
 * replaced (see #checkSubscriber). Off the request path: generous, so a slow Redis does not churn connections.
 */
const SUBSCRIBER_CHECK_MS = 5000;
const SUBSCRIBER_ANSWER_MS = 2000;

interface RedisSubscriberDeps {
  sub: RedisConnection;
  /** The events channel (RedisKeys.events). */
  channel: string;
  /** The store's id, which tags its own messages. */
  id: string;
  /** Where configuration problems and connection errors are reported, and whether the store is closed. */
  health: RedisHealth;
  logger: Logger | undefined;
  /** A change another instance made. */
  onChange: (change: ChangeMessage) => void;
  /** A change of this instance's own, heard back (a write Redis ran late, after its answer had timed out). */
  onOwnChange?: (change: ChangeMessage) => void;
  /** Subscribed (again): messages sent while not subscribed are lost. */
  onSubscribed: () => void;
}

export class RedisSubscriber {
  readonly #deps: RedisSubscriberDeps;
  #subscribeTimer: NodeJS.Timeout | undefined;
  readonly #subscriberTimer: NodeJS.Timeout;
  #subscriberAsked = false;
  #subscribed = false;

  constructor(deps: RedisSubscriberDeps) {
    this.#deps = deps;
    const { sub, health } = deps;
    sub.on('ready', () => void this.#subscribe());
    sub.on('close', () => (this.#subscribed = false));
    sub.on('error', (err: unknown) => health.connectionError(err, false));
    sub.on('node error', (err: unknown) => health.connectionError(err, false));
    sub.on('message', (channel: string, message: string) => this.#onMessage(channel, message));
    this.#subscriberTimer = setInterval(() => this.#checkSubscriber(), SUBSCRIBER_CHECK_MS).unref();
  }

  get subscribed(): boolean {
    return this.#subscribed;
  }

  close(): void {
    clearTimeout(this.#subscribeTimer);
    clearInterval(this.#subscriberTimer);
  }

  #onMessage(channel: string, message: string): void {
    if (channel !== this.#deps.channel) return;
    const change = decodeChange(message);
    if (!change) return;
    // Our own changes already fired when we made them.
    if (change.src === this.#deps.id) this.#deps.onOwnChange?.(change);
    else this.#deps.onChange(change);
  }

  async #subscribe(): Promise<void> {
    const { sub, health } = this.#deps;
    try {
      await sub.subscribe(this.#deps.channel);
      this.#subscribed = true;
    } catch (err) {
      const problem = configProblem(err);
      if (problem) {
        health.reportProblem(problem);
        // The connection stays up, so no reconnect would ask again: ask again until the ACL allows the channel.
        clearTimeout(this.#subscribeTimer);
        this.#subscribeTimer = setTimeout(() => {
          if (!health.closed && !this.#subscribed && sub.status === 'ready') void this.#subscribe();
        }, SUBSCRIBE_RETRY_MS).unref();
      } else this.#deps.logger?.warn({ error: safeError(err) }, 'state store could not subscribe to changes; will retry on reconnect');
      return;
    }
    // Messages sent while we were not subscribed are lost; read the current state instead.
    this.#deps.onSubscribed();
  }

  /**
   * A subscriber only receives, so one whose connection died without closing (its traffic dropped for good: a firewall
   * that forgot it, the old address of a replaced Redis pod) would go unnoticed for hours (TCP keepalive): the store,
   * back on Redis through a new command connection, would report itself not degraded and never again hear a breaker
   * or hold-off another instance changes. A PING it does not answer in time replaces it; the resubscribe re-reads the
   * state. (A Cluster's subscriber is ioredis's own connection, which a PING on the Cluster would not reach.)
   */
  #checkSubscriber(): void {
    const { sub, health } = this.#deps;
    if (health.closed || this.#subscriberAsked || !this.#subscribed || !(sub instanceof Redis) || sub.status !== 'ready') return;
    this.#subscriberAsked = true;
    // Its own timer, not ioredis's commandTimeout: that is per connection, and a SUBSCRIBE it timed out would still be
    // run by a slow Redis, leaving the connection subscribed while the store thinks not.
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), SUBSCRIBER_ANSWER_MS).unref()));
    // An error reply is an answer too: the connection is alive.
    void Promise.race([sub.ping().then(() => true, () => true), late]).then((answered) => {
      clearTimeout(timer);
      this.#subscriberAsked = false;
      if (answered || health.closed || sub.status !== 'ready') return;
      this.#deps.logger?.debug('state store: the subscriber connection does not answer; reconnecting it');
      sub.disconnect(true);
    });
  }
}
