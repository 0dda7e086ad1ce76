"""The Redis backend's Lua scripts and key names, shared by both flavours.

Each primitive's check and change must happen as one step on the server (a
compare-and-delete that reads the owner and then deletes is a race if it is two
commands), and each should cost one round trip. A Lua script gives both, where
WATCH/MULTI needs several round trips and retries under contention. The scripts
touch only the keys they are given, all carrying the lock's hash tag, so they
stay valid on Redis Cluster; channels travel as arguments, since PUBLISH is not
bound to a slot.

The scripts read expiry and arrival time from the server (`PX`, `PTTL`,
`TIME`), never from a client, so clients with skewed clocks still agree. Using
`TIME` before writing needs script effects replication: the default since
Redis 5 and the only mode since Redis 7 (`redis.replicate_commands()` turns it
on for 3.2 to 4).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from corral.core.placement import CACHE_LOCK
from corral.errors import ConfigError

__all__ = [
    "ACQUIRE",
    "CACHE_INVALIDATE",
    "CACHE_RAISE_GENERATION",
    "CACHE_READ",
    "CACHE_READ_GIVEN_GENERATION",
    "DEFAULT_PREFIX",
    "EXTEND",
    "FORCE_RELEASE",
    "HEAD_PREFIX",
    "INSPECT",
    "LEAVE_QUEUE",
    "REDLOCK_FENCE",
    "RELEASE",
    "SEM_ACQUIRE",
    "SEM_EXTEND",
    "SEM_FORCE_RELEASE",
    "SEM_INSPECT",
    "SEM_LEAVE_QUEUE",
    "SEM_RELEASE",
    "LockKeys",
    "SemaphoreKeys",
    "cache_gen_key",
    "cache_key",
    "cache_pattern",
    "check_prefix",
    "feed_channel",
    "lock_keys",
    "semaphore_keys",
]

DEFAULT_PREFIX = "corral"
# A release message "head:<owner>" wakes only that waiter of a fair lock.
HEAD_PREFIX = "head:"


class LockKeys(NamedTuple):
    """Everything one lock name uses on the server."""

    lock: str
    """`"<token>:<owner>"` with a PX TTL; `"<token>:"` while closed by `hold_for`."""
    fence: str
    """The last fencing token handed out, kept as long as the lock's TTL (see ACQUIRE)."""
    queue: str
    """Fair waiters, scored by arrival number (a ZSET keeps them in order)."""
    queue_expiry: str
    """The same waiters, scored by the server time (ms) their place expires."""
    channel: str
    """Pub/sub channel announcing that the lock became free (for waiters on the feed)."""
    signal: str
    """A list holding at most one wake-up token: a release pushes it, one blocked waiter
    outside the queue pops it (`BLPOP`), in the order they blocked."""
    waiting: str
    """Set (for a few seconds) by every failed attempt: someone may wait, so a release
    must wake; without it, a release spends nothing on wake-ups."""
    wake_prefix: str
    """Followed by an owner id: the list that wakes that queued waiter alone."""

    def wake(self, owner: str) -> str:
        return f"{self.wake_prefix}{owner}"


_SURROGATES = re.compile("[\ud800-\udfff]")


def _tag(name: str) -> str:
    # Redis hashes the text between the first "{" and the next "}"; an escaped name
    # can hold neither, so every key of one lock hashes the same non-empty tag, and
    # escaping "%" first keeps distinct names distinct. A lone surrogate (a valid
    # `str`, but no UTF-8) is escaped too, so every name can be sent.
    escaped = name.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")
    return _SURROGATES.sub(lambda m: f"%u{ord(m.group()):04X}", escaped)


def lock_keys(prefix: str, name: str) -> LockKeys:
    """The keys of lock `name`, e.g. `corral:{report}:lock`, all in one cluster slot."""
    base = f"{prefix}:{{{_tag(name)}}}"
    return LockKeys(
        lock=f"{base}:lock",
        fence=f"{base}:fence",
        queue=f"{base}:queue",
        queue_expiry=f"{base}:queue:expiry",
        channel=f"{base}:released",
        signal=f"{base}:signal",
        waiting=f"{base}:waiting",
        wake_prefix=f"{base}:wake:",
    )


def feed_channel(prefix: str) -> str:
    """A channel nobody publishes on; subscribing to it keeps a listener's connection busy."""
    return f"{prefix}:feed"


def check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str) or not prefix:
        raise ConfigError(f"prefix must be a non-empty str, got {prefix!r}")
    if "{" in prefix or "}" in prefix:
        # A brace in the prefix would become the hash tag and put every lock in one slot.
        raise ConfigError(f"prefix must not contain '{{' or '}}', got {prefix!r}")
    return prefix


# How long the marker that someone waits lives after the last failed attempt, as a
# multiple of the longest pause between a waiter's attempts (its periodic re-check).
WAITING_PAUSES = 3

# Lua, shared by the scripts that free a lock or change its queue's head: wake whoever
# may take the lock now. A live head of the queue is woken alone, by a push to its own
# list (and a feed message naming it); with no live head, one token goes to the shared
# list, which wakes the waiter that blocked on it first. Nothing is spent when no
# attempt failed recently (nobody waits). KEYS: queue, queue_expiry, signal, waiting;
# ARGV: the wake-list prefix, the channel.
_WAKE = """
if redis.replicate_commands then redis.replicate_commands() end
local function wake(queue, queue_expiry, signal, waiting, wake_prefix, channel, why)
  if redis.call('EXISTS', waiting) == 0 then return end
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  while head do
    local expires = tonumber(redis.call('ZSCORE', queue_expiry, head))
    if expires and expires > now then
      local list = wake_prefix .. head
      redis.call('DEL', list)
      redis.call('RPUSH', list, 1)
      redis.call('PEXPIRE', list, expires - now)
      redis.call('PUBLISH', channel, '%HEAD%' .. head)
      return
    end
    -- A dead waiter's place: drop it, so the wake-up reaches the live one behind it.
    redis.call('ZREM', queue, head)
    redis.call('ZREM', queue_expiry, head)
    head = redis.call('ZRANGE', queue, 0, 0)[1]
  end
  redis.call('DEL', signal)
  redis.call('RPUSH', signal, 1)
  redis.call('PEXPIRE', signal, math.max(redis.call('PTTL', waiting), 1000))
  redis.call('PUBLISH', channel, why)
end
"""

# KEYS: lock, fence, queue, queue_expiry, waiting
# ARGV: owner, ttl (ms), queue ttl (ms, or "" for an attempt outside the queue), wake list
#       of this owner, how long the "someone waits" marker lives (ms)
# Returns {1, token} when acquired; else {0, the holder's PTTL in ms, or -2 when the
# lock is free but another waiter is ahead in the queue}.
#
# Every attempt respects the queue: a free lock goes to the queue's live head, never
# to an attempt from outside it (that is what keeps the default lock from starving a
# waiter that joined the queue). Expired places are dropped first, so a dead waiter
# holds the queue up only until its place expires.
#
# The token is the last one plus one, but never less than the server time in
# microseconds. The last one is kept only as long as the lock's TTL: afterwards the
# server's clock alone keeps tokens increasing, so a name used once leaves nothing
# behind. (It also covers a counter lost with a restart or a failover.)
ACQUIRE = """
if redis.replicate_commands then redis.replicate_commands() end
local owner, ttl, queue_ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local pttl = redis.call('PTTL', KEYS[1])
if pttl ~= -2 and not queue_ttl then
  redis.call('SET', KEYS[5], 1, 'PX', ARGV[5])
  return {0, pttl}
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local function purge()
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)) do
    redis.call('ZREM', KEYS[3], gone)
    redis.call('ZREM', KEYS[4], gone)
  end
end
if queue_ttl then
  purge()
  if not redis.call('ZSCORE', KEYS[3], owner) then
    local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
    local arrival = 1
    if last[2] then arrival = tonumber(last[2]) + 1 end
    redis.call('ZADD', KEYS[3], arrival, owner)
  end
  redis.call('ZADD', KEYS[4], now + queue_ttl, owner)
  for _, key in ipairs({KEYS[3], KEYS[4]}) do
    if redis.call('PTTL', key) < queue_ttl then redis.call('PEXPIRE', key, queue_ttl) end
  end
  if pttl ~= -2 then
    redis.call('SET', KEYS[5], 1, 'PX', ARGV[5])
    return {0, pttl}
  end
end
local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
if head and not queue_ttl then
  local expires = tonumber(redis.call('ZSCORE', KEYS[4], head))
  if not expires or expires <= now then
    purge()
    head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  end
end
if head then
  if head ~= owner then
    redis.call('SET', KEYS[5], 1, 'PX', ARGV[5])
    return {0, -2}
  end
  redis.call('ZREM', KEYS[3], owner)
  redis.call('ZREM', KEYS[4], owner)
  redis.call('DEL', ARGV[4])
end
local token = math.max(
  (tonumber(redis.call('GET', KEYS[2])) or 0) + 1,
  tonumber(time[1]) * 1000000 + tonumber(time[2]))
token = string.format('%d', token)
redis.call('SET', KEYS[2], token, 'PX', ttl)
redis.call('SET', KEYS[1], token .. ':' .. owner, 'PX', ttl)
return {1, tonumber(token)}
"""

# KEYS: lock, queue, queue_expiry, signal, waiting
# ARGV: owner, hold_for (ms; 0 deletes), channel, wake-list prefix
# Returns 1 released (OK), 0 nobody holds it (EXPIRED), -1 another owner does (LOST).
RELEASE = (
    _WAKE
    + """
local value = redis.call('GET', KEYS[1])
if not value then return 0 end
local sep = string.find(value, ':', 1, true)
if not sep or string.sub(value, sep + 1) ~= ARGV[1] then return -1 end
local hold = tonumber(ARGV[2])
if hold > 0 then
  redis.call('SET', KEYS[1], string.sub(value, 1, sep), 'PX', hold)
  return 1
end
redis.call('DEL', KEYS[1])
wake(KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[4], ARGV[3], 'released')
return 1
"""
)

# KEYS: lock
# ARGV: owner, ttl (ms)
# Returns 1 extended (OK), 0 nobody holds it (EXPIRED), -1 another owner does (LOST).
EXTEND = """
local value = redis.call('GET', KEYS[1])
if not value then return 0 end
local sep = string.find(value, ':', 1, true)
if not sep or string.sub(value, sep + 1) ~= ARGV[1] then return -1 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

# KEYS: lock
# Returns nil when free, else {value, PTTL in ms}, read at one instant.
INSPECT = """
local value = redis.call('GET', KEYS[1])
if not value then return false end
return {value, redis.call('PTTL', KEYS[1])}
"""

# KEYS: lock, queue, queue_expiry, signal, waiting
# ARGV: channel, wake-list prefix
# Returns 1 when something was held (and any waiters were told), else 0.
FORCE_RELEASE = (
    _WAKE
    + """
if redis.call('DEL', KEYS[1]) == 1 then
  wake(KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[2], ARGV[1], 'forced')
  return 1
end
return 0
"""
)

# KEYS: queue, queue_expiry, signal, waiting, lock
# ARGV: owner, channel, wake-list prefix
# Returns 1 when the owner was at the head of a free lock's queue (the next waiter was
# told to try), else 0. While the lock is held, its release will wake the next.
LEAVE_QUEUE = (
    _WAKE
    + """
local head = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('DEL', ARGV[3] .. ARGV[1])
if head == ARGV[1] and redis.call('EXISTS', KEYS[5]) == 0 then
  wake(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[3], ARGV[2], 'left')
  return 1
end
return 0
"""
)


def _fill(script: str) -> str:
    return script.replace("%HEAD%", HEAD_PREFIX)


ACQUIRE = _fill(ACQUIRE)
RELEASE = _fill(RELEASE)
FORCE_RELEASE = _fill(FORCE_RELEASE)
LEAVE_QUEUE = _fill(LEAVE_QUEUE)


# -- semaphores ---------------------------------------------------------------------


class SemaphoreKeys(NamedTuple):
    """Everything one semaphore name uses on the server.

    They carry the same hash tag as the lock of that name (one cluster slot) and
    an infix of their own, so a lock and a semaphore of one name never meet.
    """

    slots: str
    """The taken slots: a ZSET of owners (or `HELD` + token) scored by expiry (server ms)."""
    owners: str
    """A hash: each slot's member -> its token, and `LIMIT` -> the holders' limit."""
    fence: str
    """The last token handed out, kept at least as long as the longest live slot."""
    queue: str
    """Queued waiters, scored by arrival number."""
    queue_expiry: str
    """The same waiters, scored by the server time (ms) their place expires."""
    channel: str
    """Pub/sub channel announcing freed slots (for waiters on the feed)."""
    signal: str
    """A list of wake-up tokens for waiters outside the queue, one per slot they may take."""
    waiting: str
    """Set (for a few seconds) by every failed attempt: only then do releases wake anyone."""
    wake_prefix: str
    """Followed by an owner id: the list that wakes that queued waiter alone."""

    def wake(self, owner: str) -> str:
        return f"{self.wake_prefix}{owner}"


def semaphore_keys(prefix: str, name: str) -> SemaphoreKeys:
    """The keys of semaphore `name`, e.g. `corral:{report}:sem:slots`, in the lock's slot."""
    base = f"{prefix}:{{{_tag(name)}}}:sem"
    return SemaphoreKeys(
        slots=f"{base}:slots",
        owners=f"{base}:owners",
        fence=f"{base}:fence",
        queue=f"{base}:queue",
        queue_expiry=f"{base}:queue:expiry",
        channel=f"{base}:released",
        signal=f"{base}:signal",
        waiting=f"{base}:waiting",
        wake_prefix=f"{base}:wake:",
    )


# A slot kept closed by `release(hold_for=...)` is the member HELD + its token, and the
# limit is the owners hash's field LIMIT: both start with a NUL, which no owner id holds.
HELD = "\0held:"
LIMIT = "\0limit"
# At most this many wake-up tokens wait in a semaphore's shared list (one per slot a
# waiter outside the queue may take); waiters beyond it re-check on their own timers.
MAX_SIGNAL_TOKENS = 64

# Lua shared by the semaphore scripts. Every expiry is the server's (`TIME`, in ms);
# a slot is live while its score is above now. `keep` gives the slot keys the expiry of
# their longest live slot, and never lets the fence expire before it, so a name used
# once leaves nothing once its slots are gone, and tokens increase while any slot lives.
_SEM = """
if redis.replicate_commands then redis.replicate_commands() end
local HELD, LIMIT = string.char(0) .. 'held:', string.char(0) .. 'limit'
local function clock()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000), time
end
-- Drop expired slots; how many are taken now (the limit goes with the last one).
local function purge(slots, owners, now)
  local gone = redis.call('ZRANGEBYSCORE', slots, '-inf', now)
  if #gone > 0 then
    for _, member in ipairs(gone) do redis.call('HDEL', owners, member) end
    redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
  end
  local taken = redis.call('ZCARD', slots)
  if taken == 0 then redis.call('DEL', owners) end
  return taken
end
local function keep(slots, owners, fence, now)
  local last = redis.call('ZRANGE', slots, -1, -1, 'WITHSCORES')[2]
  if not last then
    redis.call('DEL', owners)
    return
  end
  redis.call('PEXPIREAT', slots, last)
  redis.call('PEXPIREAT', owners, last)
  if redis.call('PTTL', fence) < tonumber(last) - now then
    redis.call('PEXPIREAT', fence, last)
  end
end
-- The caller's slot is gone: LOST (-1) when every slot is taken now, else EXPIRED (0).
local function gone(slots, owners)
  local limit = tonumber(redis.call('HGET', owners, LIMIT))
  if limit and redis.call('ZCARD', slots) >= limit then return -1 end
  return 0
end
local function drop_places(queue, queue_expiry, now)
  for _, place in ipairs(redis.call('ZRANGEBYSCORE', queue_expiry, '-inf', now)) do
    redis.call('ZREM', queue, place)
    redis.call('ZREM', queue_expiry, place)
  end
end
-- `free` slots are free now: wake whoever may take one. The first `free` live places of
-- the queue each get a push to their own list (and a feed message naming them); the
-- slots left over after the queue's waiters go to waiters outside the queue, one token
-- each in the shared list. Nothing is spent when no attempt failed recently.
local function wake(queue, queue_expiry, signal, waiting, wake_prefix, channel, free, why, now)
  if free <= 0 or redis.call('EXISTS', waiting) == 0 then return 0 end
  drop_places(queue, queue_expiry, now)
  for _, head in ipairs(redis.call('ZRANGE', queue, 0, free - 1)) do
    local list = wake_prefix .. head
    if redis.call('LLEN', list) == 0 then redis.call('RPUSH', list, 1) end
    local expires = tonumber(redis.call('ZSCORE', queue_expiry, head)) or (now + 1000)
    redis.call('PEXPIRE', list, math.max(expires - now, 1))
    redis.call('PUBLISH', channel, '%HEAD%' .. head)
  end
  local others = math.min(free - redis.call('ZCARD', queue), %MAX_TOKENS%)
  if others > 0 then
    for _ = redis.call('LLEN', signal) + 1, others do redis.call('RPUSH', signal, 1) end
    redis.call('PEXPIRE', signal, math.max(redis.call('PTTL', waiting), 1000))
    redis.call('PUBLISH', channel, why)
  end
  return 1
end
"""

# KEYS: slots, owners, fence, queue, queue_expiry, waiting, signal
# ARGV: owner, ttl (ms), limit, queue ttl (ms, or ""), wake list of this owner, how long
#       the "someone waits" marker lives (ms)
# Returns {1, token} when a slot was taken; else {0, ms until the soonest slot frees}
# when all are taken, {0, -2} when free slots are left to queued waiters ahead, or
# {0, -3, limit} when the holders took their slots with another limit.
#
# Of `free` free slots, the queue's first `free` live waiters may take one each; an
# attempt from outside the queue may take one only when fewer waiters are queued.
# Tokens come from the fence, as the lock's do from its own: the last one plus one,
# never less than the server time in microseconds. A failed attempt empties the shared
# wake-up list and its own: it just saw that no slot was left for a waiter like it, so
# those tokens are stale, and every release from now on pushes a fresh one.
SEM_ACQUIRE = (
    _SEM
    + """
local owner, ttl, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local queue_ttl = tonumber(ARGV[4])
local now, time = clock()
local taken = purge(KEYS[1], KEYS[2], now)
if taken > 0 then
  local stored = tonumber(redis.call('HGET', KEYS[2], LIMIT))
  if stored and stored ~= limit then return {0, -3, stored} end
end
local function refuse(answer)
  redis.call('SET', KEYS[6], 1, 'PX', ARGV[6])
  redis.call('DEL', KEYS[7], ARGV[5])
  return {0, answer}
end
if queue_ttl then
  drop_places(KEYS[4], KEYS[5], now)
  if not redis.call('ZSCORE', KEYS[4], owner) then
    local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
    local arrival = 1
    if last[2] then arrival = tonumber(last[2]) + 1 end
    redis.call('ZADD', KEYS[4], arrival, owner)
  end
  redis.call('ZADD', KEYS[5], now + queue_ttl, owner)
  for _, key in ipairs({KEYS[4], KEYS[5]}) do
    if redis.call('PTTL', key) < queue_ttl then redis.call('PEXPIRE', key, queue_ttl) end
  end
end
if taken >= limit then
  local soonest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]
  return refuse(tonumber(soonest) - now)
end
local free = limit - taken
local ahead
if queue_ttl then
  ahead = redis.call('ZRANK', KEYS[4], owner)
else
  ahead = redis.call('ZCARD', KEYS[4])
  if ahead >= free then
    drop_places(KEYS[4], KEYS[5], now)
    ahead = redis.call('ZCARD', KEYS[4])
  end
end
if ahead >= free then return refuse(-2) end
if queue_ttl then
  redis.call('ZREM', KEYS[4], owner)
  redis.call('ZREM', KEYS[5], owner)
end
redis.call('DEL', ARGV[5])
local token = math.max(
  (tonumber(redis.call('GET', KEYS[3])) or 0) + 1,
  tonumber(time[1]) * 1000000 + tonumber(time[2]))
token = string.format('%d', token)
redis.call('SET', KEYS[3], token, 'PX', math.max(redis.call('PTTL', KEYS[3]), ttl))
redis.call('ZADD', KEYS[1], now + ttl, owner)
redis.call('HSET', KEYS[2], owner, token)
redis.call('HSET', KEYS[2], LIMIT, limit)
keep(KEYS[1], KEYS[2], KEYS[3], now)
return {1, tonumber(token)}
"""
)

# KEYS: slots, owners, fence, queue, queue_expiry, signal, waiting
# ARGV: owner, hold_for (ms; 0 frees the slot), channel, wake-list prefix
# Returns 1 released (OK), 0 the slot is gone and one is free (EXPIRED), -1 the slot is
# gone and every slot is taken (LOST).
SEM_RELEASE = (
    _SEM
    + """
local owner = ARGV[1]
local now = clock()
local taken = purge(KEYS[1], KEYS[2], now)
if not redis.call('ZSCORE', KEYS[1], owner) then return gone(KEYS[1], KEYS[2]) end
local token = redis.call('HGET', KEYS[2], owner) or '0'
redis.call('ZREM', KEYS[1], owner)
redis.call('HDEL', KEYS[2], owner)
local hold = tonumber(ARGV[2])
if hold > 0 then
  redis.call('ZADD', KEYS[1], now + hold, HELD .. token)
  redis.call('HSET', KEYS[2], HELD .. token, token)
  keep(KEYS[1], KEYS[2], KEYS[3], now)
  return 1
end
local limit = tonumber(redis.call('HGET', KEYS[2], LIMIT)) or taken
keep(KEYS[1], KEYS[2], KEYS[3], now)
wake(KEYS[4], KEYS[5], KEYS[6], KEYS[7], ARGV[4], ARGV[3], limit - taken + 1, 'released', now)
return 1
"""
)

# KEYS: slots, owners, fence
# ARGV: owner, ttl (ms)
# Returns 1 extended (OK), 0 gone with a slot free (EXPIRED), -1 gone and full (LOST).
SEM_EXTEND = (
    _SEM
    + """
local now = clock()
purge(KEYS[1], KEYS[2], now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return gone(KEYS[1], KEYS[2]) end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
keep(KEYS[1], KEYS[2], KEYS[3], now)
return 1
"""
)

# KEYS: slots, owners
# Returns nil when no slot is taken, else {limit, then member, ms left, token for each
# live slot}, read at one instant. Writes nothing.
SEM_INSPECT = """
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
if #live == 0 then return false end
local answer = {redis.call('HGET', KEYS[2], string.char(0) .. 'limit') or ''}
for i = 1, #live, 2 do
  answer[#answer + 1] = live[i]
  answer[#answer + 1] = tostring(tonumber(live[i + 1]) - now)
  answer[#answer + 1] = redis.call('HGET', KEYS[2], live[i]) or ''
end
return answer
"""

# KEYS: slots, owners, fence, queue, queue_expiry, signal, waiting
# ARGV: channel, wake-list prefix
# Returns how many slots were taken (and wakes the waiters that may take them).
SEM_FORCE_RELEASE = (
    _SEM
    + """
local now = clock()
local taken = purge(KEYS[1], KEYS[2], now)
if taken == 0 then return 0 end
local limit = tonumber(redis.call('HGET', KEYS[2], LIMIT)) or taken
redis.call('DEL', KEYS[1], KEYS[2])
wake(KEYS[4], KEYS[5], KEYS[6], KEYS[7], ARGV[2], ARGV[1], limit, 'forced', now)
return taken
"""
)

# KEYS: slots, owners, fence, queue, queue_expiry, signal, waiting
# ARGV: owner, channel, wake-list prefix
# Returns 1 when the owner was among the waiters a free slot let in (the waiters that may
# take the free slots now were told to try), else 0.
SEM_LEAVE_QUEUE = (
    _SEM
    + """
local owner = ARGV[1]
local now = clock()
drop_places(KEYS[4], KEYS[5], now)
local rank = redis.call('ZRANK', KEYS[4], owner)
redis.call('ZREM', KEYS[4], owner)
redis.call('ZREM', KEYS[5], owner)
redis.call('DEL', ARGV[3] .. owner)
if not rank then return 0 end
local taken = purge(KEYS[1], KEYS[2], now)
local free
if taken == 0 then
  free = redis.call('ZCARD', KEYS[4]) + 1  -- every slot is free: anyone may try
else
  free = (tonumber(redis.call('HGET', KEYS[2], LIMIT)) or taken) - taken
end
if rank >= free then return 0 end
return wake(KEYS[4], KEYS[5], KEYS[6], KEYS[7], ARGV[3], ARGV[2], free, 'left', now)
"""
)


def _fill_sem(script: str) -> str:
    return _fill(script).replace("%MAX_TOKENS%", str(MAX_SIGNAL_TOKENS))


SEM_ACQUIRE = _fill_sem(SEM_ACQUIRE)
SEM_RELEASE = _fill_sem(SEM_RELEASE)
SEM_EXTEND = _fill_sem(SEM_EXTEND)
SEM_FORCE_RELEASE = _fill_sem(SEM_FORCE_RELEASE)
SEM_LEAVE_QUEUE = _fill_sem(SEM_LEAVE_QUEUE)


# -- cache entries ------------------------------------------------------------------
#
# An entry is a plain string with a PX expiry (the `keep` of `cache_store`), under
# `<prefix>:cache:<key>`; a namespace's generation is a counter under
# `<prefix>:cachegen:<gen_key>`, never expiring (losing it would bring back entries
# written before a `clear`). Keys are escaped as lock names are: the escaped text holds
# no "{" or "}", so a cache key never carries a hash tag and never meets a lock's or a
# semaphore's keys (every one of which has one), and a lone surrogate can be sent. On
# Redis Cluster an entry is `<prefix>:cache:{<its recompute lock's name>}` instead: the
# tag puts it in its lock's slot, and the `cache:` before it keeps it apart from the
# lock's own keys, which begin `<prefix>:{`.


def cache_key(prefix: str, key: str, *, tagged: bool = False) -> str:
    """The Redis key of cache entry `key`, e.g. `corral:cache:users:42`.

    `tagged` (Redis Cluster) gives it the hash tag of the entry's recompute lock,
    `corral:cache:{<lock name>}`, so a read that claims the lock touches one slot.
    """
    if tagged:
        return f"{prefix}:cache:{{{_tag(CACHE_LOCK + key)}}}"
    return f"{prefix}:cache:{_tag(key)}"


def cache_gen_key(prefix: str, gen_key: str) -> str:
    """The Redis key holding the generation of a cache namespace."""
    return f"{prefix}:cachegen:{_tag(gen_key)}"


_GLOB = re.compile(r"([*?\[\]\\])")


def cache_pattern(prefix: str, key_prefix: str, *, tagged: bool = False) -> str:
    """A SCAN MATCH pattern for the entries whose keys start with `key_prefix`.

    The escaping maps each character on its own, so the escaped prefix is a prefix of
    every escaped key that starts with it; glob characters are then quoted. A tagged
    key's closing brace is left out: the prefix is a prefix of the text inside it.
    """
    stored = cache_key(prefix, key_prefix, tagged=tagged)
    if tagged:
        stored = stored[:-1]
    return _GLOB.sub(r"\\\1", stored) + "*"


# Lua shared by the cache scripts: the fields of an entry's header (corral.core.envelope),
# or nil when the bytes are not an entry of format c1. Offsets are 1-based here: magic
# 1-2, fresh_until 3-19, retry_until 20-36, delta 37-48, generation 49-64, codec 65,
# newline 66. A field counts only when it is made of what `encode` writes (digits and a
# dot) and parses: Python's float() would take a few more spellings (signs, spaces,
# exponents) that no corral writer produces, and Lua's tonumber() would take hex.
_HEADER = """
local function header(v)
  if not v or string.len(v) < 66 or string.sub(v, 1, 2) ~= 'c1'
      or string.sub(v, 66, 66) ~= '\\n' or string.byte(v, 65) > 127 then
    return nil
  end
  local fields = {}
  for i, span in ipairs({{3, 19}, {20, 36}, {37, 48}, {49, 64}}) do
    local text = string.sub(v, span[1], span[2])
    local pattern = '^[0-9.]+$'
    if i == 4 then pattern = '^[0-9]+$' end
    if not string.find(text, pattern) then return nil end
    fields[i] = tonumber(text)
    if not fields[i] then return nil end
  end
  return fields
end
"""

# KEYS: entry, generation, then (with a claim) the claimed lock's keys as ACQUIRE takes
#       them (lock, fence, queue, queue_expiry, waiting) and the claiming owner's wake
#       list (ACQUIRE's ARGV[4], declared here as the key it is)
# ARGV: due_before (seconds, "" for no claim), then (with a claim) ACQUIRE's arguments
#       but the wake list: owner, ttl (ms), queue ttl (""), the marker's life (ms)
# Returns {entry or nil, generation or nil, -1} when nothing was claimed, else
# {entry, generation, then ACQUIRE's answer: 1 and the token, or 0 and the holder's
# PTTL (or -2)}.
#
# The entry is due, exactly as `envelope.claim_due` says, when it is missing, not an
# entry of format c1, written under another generation, or neither fresh nor held back
# by a remembered error at due_before. Then the claim is the lock's own acquisition:
# ACQUIRE's text, run as a function with the lock's keys and arguments in place of the
# script's, so its tokens, queue and wake-ups are the lock's and `release` wakes its
# waiters as usual. MGET, not GET: a key of another type reads as missing, as it does
# for `cache_fetch`, instead of failing the script.
_CLAIMING = (
    "if redis.replicate_commands then redis.replicate_commands() end\n"
    + _HEADER
    + "local function acquire(KEYS, ARGV)\n"
    + ACQUIRE
    + "\nend\n"
)

CACHE_READ = (
    _CLAIMING
    + """
local found = redis.call('MGET', KEYS[1], KEYS[2])
local entry, stored = found[1], found[2]
if ARGV[1] == '' then return {entry, stored, -1} end
local generation = tonumber(stored) or 0
local fields = header(entry)
if fields and fields[4] == generation
    and math.max(fields[1], fields[2]) > tonumber(ARGV[1]) then
  return {entry, stored, -1}
end
local attempt = acquire(
  {KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]}, {ARGV[2], ARGV[3], ARGV[4], KEYS[8], ARGV[5]})
return {entry, stored, attempt[1], attempt[2]}
"""
)

# KEYS: entry
# ARGV: keep (ms; 0 deletes)
# Returns 1 when an entry was there (now stale, or deleted), else 0.
#
# fresh_until is rewritten in place (SETRANGE at offset 2) and everything else stays
# byte for byte; bytes that are not an entry (or a key of another type) are deleted,
# as is any entry when keep is 0. Only the header is read, never the value.
CACHE_INVALIDATE = (
    _HEADER
    + """
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then return 0 end
local keep = tonumber(ARGV[1])
if keep > 0 and kind == 'string' and header(redis.call('GETRANGE', KEYS[1], 0, 65)) then
  redis.call('SETRANGE', KEYS[1], 2, '0000000000.000000')
  redis.call('PEXPIRE', KEYS[1], keep)
  return 1
end
redis.call('DEL', KEYS[1])
return 1
"""
)


# -- quorum locks over independent masters (redis+redlock://) -------------------------

# KEYS: lock, fence
# ARGV: owner, token (the acquisition's: the largest its granting masters issued), ttl (ms)
# Returns 1 when the owner still holds the lock here (now under that token), else 0.
#
# Raises this master's counter to at least the token, for as long as the lock's TTL
# (never shortening a longer life), so its next token is larger, and rewrites the
# owner's lock value with the token, so anyone who reads this master sees the
# acquisition's token. Run on a majority, this is what keeps tokens increasing across
# acquisitions whose majorities differ: any two majorities share a master.
REDLOCK_FENCE = """
local token = tonumber(ARGV[2])
local fence = tonumber(redis.call('GET', KEYS[2])) or 0
if fence < token then
  local keep = math.max(redis.call('PTTL', KEYS[2]), tonumber(ARGV[3]))
  redis.call('SET', KEYS[2], ARGV[2], 'PX', keep)
end
local value = redis.call('GET', KEYS[1])
if not value then return 0 end
local sep = string.find(value, ':', 1, true)
if not sep or string.sub(value, sep + 1) ~= ARGV[1] then return 0 end
local pttl = redis.call('PTTL', KEYS[1])
-- Expiring this very millisecond (or, never here, kept without one): not stamped, so the
-- write-back never leaves a grant without an expiry.
if pttl <= 0 then return 0 end
redis.call('SET', KEYS[1], ARGV[2] .. ':' .. ARGV[1], 'PX', pttl)
return 1
"""


# -- a namespace's generation on every server of a pool ---------------------------------

# KEYS: a namespace's generation
# ARGV: at least this generation (decimal)
# Returns the generation after the step, as text: max(the stored one, ARGV[1]). Text, not
# a Lua number: a generation is an integer above 2^53 only in theory, but a float must
# never round it. A value that is not a number is returned as it is, unchanged, for the
# client to report (another program's key under the same prefix).
CACHE_RAISE_GENERATION = """
local stored = redis.call('GET', KEYS[1])
if stored and not string.match(stored, '^%d+$') then return stored end
local current = stored or '0'
local wanted = ARGV[1]
if #wanted > #current or (#wanted == #current and wanted > current) then
  redis.call('SET', KEYS[1], wanted)
  return wanted
end
return current
"""

# KEYS: entry, then the claimed lock's keys as ACQUIRE takes them (lock, fence, queue,
#       queue_expiry, waiting) and the claiming owner's wake list
# ARGV: due_before (seconds), owner, ttl (ms), queue ttl (""), the marker's life (ms),
#       the namespace generation the caller takes as current
# Returns {entry or nil, -1} when the entry is not due, else {entry, then ACQUIRE's
# answer}.
#
# CACHE_READ for Redis Cluster, where the generation key lives in another slot than
# the entry (a script may touch one slot only): the caller reads the generation beside
# this script, in the same round trip, and says which generation it expects; it runs
# the script again when the two differ (see the cluster backend's `cache_read`).
CACHE_READ_GIVEN_GENERATION = (
    _CLAIMING
    + """
local entry = redis.call('MGET', KEYS[1])[1]
local fields = header(entry)
if fields and fields[4] == tonumber(ARGV[6])
    and math.max(fields[1], fields[2]) > tonumber(ARGV[1]) then
  return {entry, -1}
end
local attempt = acquire(
  {KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]}, {ARGV[2], ARGV[3], ARGV[4], KEYS[7], ARGV[5]})
return {entry, attempt[1], attempt[2]}
"""
)
