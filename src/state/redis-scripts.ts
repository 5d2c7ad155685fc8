// The Lua scripts of the Redis state store. Each multi-step operation is one script, so it is atomic across the fleet
// and costs one round trip; each touches the keys of one hash tag only, so it also runs on Redis Cluster. Time is
// always passed in (the caller's injected clock, which the store puts in Redis's clock where the two disagree:
// fleet-clock.ts), never read by a script, so both stores agree to the millisecond.
import type { Cluster, Redis } from 'ioredis';


// Sums the per-second fields `<kind>:<sec>` of a hash over the last windowS seconds (the current one included) and
// deletes older or malformed fields, so a hash never holds more than a window's worth of seconds.
const WINDOW_LUA = `
local function window(key, sec, windowS)
  local sums = {}
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    local kind, s = string.match(all[i], '^(%a+):(%-?%d+)$')
    s = tonumber(s)
    if s == nil or s <= sec - windowS then
      redis.call('HDEL', key, all[i])
    else
      sums[kind] = (sums[kind] or 0) + tonumber(all[i + 1])
    end
  end
  return sums
end
`;

/** KEYS: outcomes hash. ARGV: sec, windowS, requests, failures, ttlMs. Returns [requests, failures]. */
const ADD_OUTCOMES = `${WINDOW_LUA}
local key = KEYS[1]
if tonumber(ARGV[3]) ~= 0 then redis.call('HINCRBY', key, 'r:' .. ARGV[1], ARGV[3]) end
if tonumber(ARGV[4]) ~= 0 then redis.call('HINCRBY', key, 'f:' .. ARGV[1], ARGV[4]) end
local sums = window(key, tonumber(ARGV[1]), tonumber(ARGV[2]))
redis.call('PEXPIRE', key, ARGV[5])
return { sums.r or 0, sums.f or 0 }
`;

/**
 * KEYS: breaker hash. ARGV: expectedGeneration, ttlMs, channel, message, field, value, ...
 * Returns [1] when written (and published), else [0, field, value, ...] with the stored record, so the caller's stale
 * view heals on the spot. A missing record (expired, flushed, evicted) holds no fleet state to protect: any write
 * restores one, whatever generation the writer last saw; the other instances' next compare-and-set heals them.
 */
const CAS_BREAKER = `
local current = redis.call('HGET', KEYS[1], 'generation')
if current and tonumber(current) ~= tonumber(ARGV[1]) then
  local out = redis.call('HGETALL', KEYS[1])
  table.insert(out, 1, 0)
  return out
end
redis.call('HSET', KEYS[1], unpack(ARGV, 5))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return { 1 }
`;

/**
 * KEYS: permits zset, breaker hash. ARGV: nowMs, max, expiresAtMs, ttlMs, id, generation (of the breaker record the
 * caller judged by; empty: any). Returns the id; nil when all are taken; 0 when the record has moved on (another
 * instance reopened or closed the breaker, and the caller has not heard yet: its probe would be a second one; or the
 * caller's own view moved alone, on a write Redis never got).
 */
const TAKE_PERMIT = `
if ARGV[6] ~= '' then
  local g = redis.call('HGET', KEYS[2], 'generation')
  if g and tonumber(g) ~= tonumber(ARGV[6]) then return 0 end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return false end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[5])
-- Extend only: a short permit (a request near its deadline) must not take the set's longer permits with it.
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[4]) then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
return ARGV[5]
`;

/**
 * KEYS: hold-off key. ARGV: untilMs, ttlMs, channel, message, nowMs. Extends only.
 * Returns [1, untilMs, started] when extended (and published), else [0, storedUntilMs, 0]; `started` is 1 when no
 * hold-off was in force at nowMs (the key kept an ended one for its grace, or none): of instances told at once, only
 * the first one started it.
 */
const SET_HOLD_OFF = `
local current = redis.call('GET', KEYS[1])
if current and tonumber(current) >= tonumber(ARGV[1]) then return { 0, current, 0 } end
local started = 0
if not current or tonumber(current) <= tonumber(ARGV[5]) then started = 1 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return { 1, ARGV[1], started }
`;

/**
 * KEYS: an idempotency key. ARGV: the running record, its lifetime (ms). Returns the record already there (a request
 * running under the key, or how one ended), or nil when this call claimed the key. One script, not SET NX then GET: a
 * record that expires between the two would leave the caller neither the key nor a record to wait for.
 */
const CLAIM_KEY = `
local held = redis.call('GET', KEYS[1])
if held then return held end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
`;

/** Lua: is `held` the running claim of owner ARGV[1]? (The record's JSON starts with its state: state/kept-keys.ts.) */
const OWNS_CLAIM = `
local function owns(held)
  return held and string.sub(held, 1, 18) == '{"state":"running"' and string.find(held, '"owner":"' .. ARGV[1] .. '"', 1, true)
end
`;

/**
 * KEYS: an idempotency key. ARGV: owner, the claim's new lifetime (ms). Extends the owner's running claim only: a key
 * whose run has ended (its answer kept, or given back and claimed by another) keeps what it has.
 */
const RENEW_KEY = `${OWNS_CLAIM}
if owns(redis.call('GET', KEYS[1])) then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
`;

/**
 * KEYS: an idempotency key. ARGV: owner, the record, its lifetime (ms), and '1' when only the owner's claim or nothing
 * may be written over. Writes how the owner's run ended unless another request's running claim holds the key (taken
 * after the owner's lapsed): that run's answer is the one to keep. With '1', not over another run's answer either.
 */
const SETTLE_KEY = `${OWNS_CLAIM}
local held = redis.call('GET', KEYS[1])
if held and not owns(held) and (ARGV[4] == '1' or string.sub(held, 1, 18) == '{"state":"running"') then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
`;

/** KEYS: an idempotency key. ARGV: owner. Deletes the owner's running claim only (not another's, taken since it lapsed). */
const RELEASE_KEY = `${OWNS_CLAIM}
if owns(redis.call('GET', KEYS[1])) then return redis.call('DEL', KEYS[1]) end
return 0
`;

/**
 * KEYS: budget hash. ARGV: sec, windowS, ratio, floor, mode ('peek' | 'take' | 'force'), ttlMs, then pending request
 * counts not yet flushed as sec, n, ... (counted first, so a retry sees every request this instance has seen).
 * Returns [requests, retries, allowed] with retries as they were before this take.
 */
const BUDGET = `${WINDOW_LUA}
local key = KEYS[1]
for i = 7, #ARGV, 2 do redis.call('HINCRBY', key, 'r:' .. ARGV[i], ARGV[i + 1]) end
local sums = window(key, tonumber(ARGV[1]), tonumber(ARGV[2]))
local requests, retries = sums.r or 0, sums.x or 0
local allowed = retries + 1 <= math.max(tonumber(ARGV[3]) * requests, tonumber(ARGV[4]))
if ARGV[5] == 'force' or (ARGV[5] == 'take' and allowed) then
  redis.call('HINCRBY', key, 'x:' .. ARGV[1], 1)
end
redis.call('PEXPIRE', key, ARGV[6])
return { requests, retries, allowed and 1 or 0 }
`;

/**
 * KEYS: budget hash. ARGV: ttlMs, maxWindowS, field ('r' requests, 'x' retries), then sec, n, ... Adds batched
 * request counts, or retries taken on local state while Redis was away. Cleans stale seconds only when a new second's
 * field appears (about once a second per key), since it does not know the budget's window.
 */
const ADD_COUNTS = `${WINDOW_LUA}
local key = KEYS[1]
local created, newest = false, 0
for i = 4, #ARGV, 2 do
  if redis.call('HINCRBY', key, ARGV[3] .. ':' .. ARGV[i], ARGV[i + 1]) == tonumber(ARGV[i + 1]) then created = true end
  newest = math.max(newest, tonumber(ARGV[i]))
end
if created then window(key, newest, tonumber(ARGV[2])) end
redis.call('PEXPIRE', key, ARGV[1])
return 1
`;

// policy/client-rate.ts in Lua: the wait until `cost` units fit a rate, and the due time after spending them.
const CLIENT_RATE_LUA = `
local function waitFor(due, now, interval, burst, cost)
  local allowedAt = math.max(due, now) - (burst - cost) * interval
  if now < allowedAt then return allowedAt - now end
  return 0
end
local function spend(key, due, now, interval, cost)
  local nextDue = math.max(due, now) + cost * interval
  -- A give-back (negative cost) that leaves the bucket full: no key, as for a rate never used.
  if nextDue <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, string.format('%.3f', nextDue), 'PX', math.ceil(nextDue - now) + 1000)
  end
end
local function dueOf(key)
  return tonumber(redis.call('GET', key) or '0') or 0
end
-- A refusal's place in the queue of refused requests (KEYS[3]); returns the ms until it, rounded up. A told time a
-- second past (TOLD_KEPT_MS) is forgotten, as its key's expiry forgets it by Redis's clock.
local function queued(own, slot, now, ahead)
  local last = dueOf(KEYS[3])
  if now >= last + 1000 then last = 0 end
  local told = math.min(math.max(own, last + slot), own + ahead)
  redis.call('SET', KEYS[3], string.format('%.3f', told), 'PX', math.ceil(told - now) + 1000)
  return math.ceil(told - now)
end
`;

/**
 * KEYS: the client's requests key, its tokens key, its told key (one hash tag). ARGV: nowMs, then per rate its
 * intervalMs and burst (0 and 0: no such rate), then how far past its own wait a refusal may be told (QUEUE_AHEAD_MS). policy/client-rate.ts's `admitClient`, atomic across the fleet, so the
 * queue of refused requests is the fleet's: returns [0] when admitted (the request counted), else [ms until its turn,
 * rounded up; 1 requests or 2 tokens refused] with the told time stored and the rates as they were.
 */
const ADMIT_CLIENT = `${CLIENT_RATE_LUA}
local now = tonumber(ARGV[1])
local reqInterval, reqBurst = tonumber(ARGV[2]), tonumber(ARGV[3])
local tokInterval, tokBurst = tonumber(ARGV[4]), tonumber(ARGV[5])
local reqDue = dueOf(KEYS[1])
local tokenWait, requestWait = 0, 0
if tokInterval > 0 then tokenWait = waitFor(dueOf(KEYS[2]), now, tokInterval, tokBurst, 1) end
if reqInterval > 0 then requestWait = waitFor(reqDue, now, reqInterval, reqBurst, 1) end
if tokenWait > 0 or requestWait > 0 then
  local by, slot = 2, 0
  if tokenWait < requestWait then by, slot = 1, reqInterval end
  return { queued(now + math.max(tokenWait, requestWait), slot, now, tonumber(ARGV[6])), by }
end
if reqInterval > 0 then spend(KEYS[1], reqDue, now, reqInterval, 1) end
return { 0 }
`;

/**
 * KEYS: as ADMIT_CLIENT's. ARGV: nowMs, the request rate's intervalMs (0: none), the token rate's intervalMs and burst,
 * the request's estimated tokens, QUEUE_AHEAD_MS. policy/client-rate.ts's `reserveTokens`, atomic across the fleet:
 * returns [0] when the estimate fits (spent), else [ms until its turn (a slot: the estimate's time), rounded up; 2]
 * with the told time stored, the
 * request counted by ADMIT_CLIENT given back (if its key is still there: else the bucket is full anyway) and the
 * token rate as it was.
 */
const RESERVE_TOKENS = `${CLIENT_RATE_LUA}
local now, reqInterval = tonumber(ARGV[1]), tonumber(ARGV[2])
local tokInterval, tokBurst, estimate = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local tokDue = dueOf(KEYS[2])
local cost = math.min(estimate, tokBurst)
local wait = waitFor(tokDue, now, tokInterval, tokBurst, cost)
if wait > 0 then
  local waitMs = queued(now + wait, cost * tokInterval, now, tonumber(ARGV[6]))
  local reqDue = redis.call('GET', KEYS[1])
  if reqInterval > 0 and reqDue then spend(KEYS[1], tonumber(reqDue), now, reqInterval, -1) end
  return { waitMs, 2 }
end
spend(KEYS[2], tokDue, now, tokInterval, estimate)
return { 0 }
`;

/**
 * KEYS: the client's tokens key. ARGV: nowMs, intervalMs, tokens. Spends them, past the burst if need be; negative
 * tokens give some back (a reservation settled for less).
 */
const SPEND_TOKENS = `${CLIENT_RATE_LUA}
spend(KEYS[1], dueOf(KEYS[1]), tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]))
return 1
`;

/**
 * KEYS: demand hash. ARGV: instance id, demand, nowMs, staleMs. Writes this instance's demand, drops instances not
 * heard from within staleMs, and returns [sum of demand, instances].
 */
const EXCHANGE_DEMAND = `
local key = KEYS[1]
local now, stale = tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('HSET', key, ARGV[1], ARGV[2] .. ':' .. ARGV[3])
local all = redis.call('HGETALL', key)
local totals, n = {}, 0
for i = 1, #all, 2 do
  local d, t = string.match(all[i + 1], '^([%d.,]+):(%d+)$')
  if d == nil or now - tonumber(t) > stale then
    redis.call('HDEL', key, all[i])
  else
    local k = 1
    for v in string.gmatch(d, '[^,]+') do
      -- A value no instance writes (digits enough to be inf) counts for nothing: inf would reach the share as NaN.
      local x = tonumber(v)
      if x == nil or x ~= x or x == math.huge then x = 0 end
      totals[k] = (totals[k] or 0) + x
      k = k + 1
    end
    n = n + 1
  end
end
redis.call('PEXPIRE', key, stale * 2)
local out = {}
for k = 1, #totals do out[k] = tostring(totals[k]) end
return { table.concat(out, ','), n }
`;

/**
 * KEYS: probe key. ARGV: ttlMs. The degraded store's health check: a script that writes, as every operation of the store
 * does, so a Redis that answers reads but refuses writes (OOM under noeviction, a read-only replica, CLIENT PAUSE WRITE,
 * an ACL without scripting) is not taken for one that is back.
 */
const PROBE = `
redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
return 1
`;

type Arg = string | number | Buffer;

/** The scripts as methods on the client, after `defineScripts`. */
interface ScriptCommands {
  sgAddOutcomes(key: string, ...args: Arg[]): Promise<[number, number]>;
  sgCasBreaker(key: string, ...args: Arg[]): Promise<[number, ...string[]]>;
  sgTakePermit(permitsKey: string, breakerKey: string, ...args: Arg[]): Promise<string | null | 0>;
  sgSetHoldOff(key: string, ...args: Arg[]): Promise<[number, string, number]>;
  sgBudget(key: string, ...args: Arg[]): Promise<[number, number, number]>;
  sgAddCounts(key: string, ...args: Arg[]): Promise<number>;
  sgExchangeDemand(key: string, ...args: Arg[]): Promise<[string, number]>;
  sgAdmitClient(requestsKey: string, tokensKey: string, toldKey: string, ...args: Arg[]): Promise<[number, number?]>;
  sgReserveTokens(requestsKey: string, tokensKey: string, toldKey: string, ...args: Arg[]): Promise<[number, number?]>;
  sgSpendTokens(key: string, ...args: Arg[]): Promise<number>;
  sgProbe(key: string, ...args: Arg[]): Promise<number>;
  sgClaimKey(key: string, ...args: Arg[]): Promise<string | null>;
  sgRenewKey(key: string, ...args: Arg[]): Promise<number>;
  sgReleaseKey(key: string, ...args: Arg[]): Promise<number>;
  sgSettleKey(key: string, ...args: Arg[]): Promise<number>;
}

/** ioredis defines a variant of every script that answers bulk strings as Buffers: a kept answer is bytes, not text. */
interface BufferCommands {
  sgClaimKeyBuffer(key: string, ...args: Arg[]): Promise<Buffer | null>;
}

export type ScriptClient = (Redis | Cluster) & ScriptCommands & BufferCommands;

/** Registers every script on the client (ioredis sends EVALSHA and falls back to EVAL after a Redis restart). */
export function defineScripts(client: Redis | Cluster): ScriptClient {
  const scripts = {
    sgAddOutcomes: ADD_OUTCOMES,
    sgCasBreaker: CAS_BREAKER,
    sgTakePermit: TAKE_PERMIT,
    sgSetHoldOff: SET_HOLD_OFF,
    sgBudget: BUDGET,
    sgAddCounts: ADD_COUNTS,
    sgExchangeDemand: EXCHANGE_DEMAND,
    sgAdmitClient: ADMIT_CLIENT,
    sgReserveTokens: RESERVE_TOKENS,
    sgSpendTokens: SPEND_TOKENS,
    sgProbe: PROBE,
    sgClaimKey: CLAIM_KEY,
    sgRenewKey: RENEW_KEY,
    sgReleaseKey: RELEASE_KEY,
    sgSettleKey: SETTLE_KEY,
  } satisfies Record<keyof ScriptCommands, string>;
  // Every script touches one target's keys (one hash tag, one Cluster slot); the permit script reads its breaker too.
  // The client scripts read both of a client's rates and its told time (one hash tag).
  for (const [name, lua] of Object.entries(scripts)) client.defineCommand(name, { numberOfKeys: name === 'sgAdmitClient' || name === 'sgReserveTokens' ? 3 : name === 'sgTakePermit' ? 2 : 1, lua });
  return client as ScriptClient;
}
