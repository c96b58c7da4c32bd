"""The Lua scripts of the stream slots in Redis (``services/stream_slots.py``): each step on a
student's set is one script, atomic, one round trip.

``TAKE``: a question's try for a slot, its rate counted first and its class's version checked
or kept. ``TAKE_SEEN``: the same try with the asker's session read in it, for the event loop's
admission of a page's question (``services/loop_admission.py``): the try is made for the
anonymous owner the session key names, in the class the page showed, and the session's value
comes back with it, one round trip where reading the session and then trying took two; nothing
is counted where the session is not stored. ``GIVE_BACK`` undoes such a try when the session
says otherwise (a logged-in user, another class). ``HAND_OVER``: a slot passed from an answer
nobody listens to any more to a new question.
"""

from typing import Any

from redis.exceptions import ResponseError

from assistant.cache import count_lua
from assistant.loop_redis import LoopCommands

# Now, in ms: ARGV[1] when given (tests), else Redis's own clock, so that every worker's slots
# expire on one clock whatever the skew between the workers' hosts.
_NOW = """
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""
# take(the student's set; the rate's count, if any, counted first (as SharedRedisCache.count_hit
# counts); the class's version, if any (with the count)).
# ARGV: now (ms) or "", ttl (ms), limit (0: no cap, nothing held), request id, holders shown,
# the rate's limit, the rate's count's time to live (ms); the class's version, "check" or
# "keep", the version's time to live (ms).
# Its reply: {1} taken; {0, holders} all taken; {-1} over the rate; {-2} the class's version to
# check is not this one (nothing counted).
_TAKE_FUNCTION = (
    """
local function take(slots, counted, class)
  if class then
    if ARGV[9] == 'check' then
      if redis.call('GET', class) ~= ARGV[8] then
        return {-2}
      end
    else
      redis.call('SET', class, ARGV[8], 'NX', 'PX', tonumber(ARGV[10]))
    end
  end
  if counted then
"""
    + count_lua("counted", "ARGV[7]")
    + """
    if count > tonumber(ARGV[6]) then
      return {-1}
    end
  end
  if tonumber(ARGV[3]) == 0 then
    return {1}
  end
"""
    + _NOW
    + """
  redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
  local ttl = tonumber(ARGV[2])
  if redis.call('ZSCORE', slots, ARGV[4]) or redis.call('ZCARD', slots) < tonumber(ARGV[3]) then
    redis.call('ZADD', slots, now + ttl, ARGV[4])
    redis.call('PEXPIRE', slots, ttl)
    return {1}
  end
  return {0, redis.call('ZRANGE', slots, 0, tonumber(ARGV[5]) - 1)}
end
"""
)
# KEYS: the student's set, the rate's count (if any), the class's version (if any, with it).
TAKE = _TAKE_FUNCTION + "return take(KEYS[1], KEYS[2], KEYS[3])\n"
# KEYS: the session's, then TAKE's. Its reply: {-3} when the session is not stored (nothing
# counted), else {the session's value, TAKE's reply}.
TAKE_SEEN = (
    _TAKE_FUNCTION
    + """
local session = redis.call('GET', KEYS[1])
if not session then
  return {-3}
end
return {session, take(KEYS[2], KEYS[3], KEYS[4])}
"""
)
# KEYS: the student's set, the rate's count. ARGV: the request id. A TAKE (or TAKE_SEEN) undone:
# its slot given back, its count taken off (a count left at nothing is deleted, never left
# without its time to live).
GIVE_BACK = """
redis.call('ZREM', KEYS[1], ARGV[1])
if redis.call('DECR', KEYS[2]) <= 0 then
  redis.call('DEL', KEYS[2])
end
return 1
"""
# KEYS[1]: the student's set. ARGV: now (ms) or "", ttl (ms), the holder, the new request id.
HAND_OVER = (
    _NOW
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZREM', KEYS[1], ARGV[3]) == 0 then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[4])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return 1
"""
)


async def script_on_loop(
    commands: LoopCommands, script: Any, keys: list[str], args: list[str | int]
) -> Any:
    """``script`` (redis-py's ``Script``) run by the loop's client: by its digest, and by its
    text where Redis has not got it (it started afresh, or its scripts were flushed), which
    Redis keeps for the next."""
    try:
        return await commands.send("EVALSHA", script.sha, len(keys), *keys, *args)
    except ResponseError as error:
        if not str(error).startswith("NOSCRIPT"):
            raise
    return await commands.send("EVAL", script.script, len(keys), *keys, *args)
