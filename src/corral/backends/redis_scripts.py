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

from corral.errors import ConfigError

__all__ = [
    "ACQUIRE",
    "DEFAULT_PREFIX",
    "EXTEND",
    "FORCE_RELEASE",
    "HEAD_PREFIX",
    "INSPECT",
    "LEAVE_QUEUE",
    "RELEASE",
    "LockKeys",
    "check_prefix",
    "feed_channel",
    "lock_keys",
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
