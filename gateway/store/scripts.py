"""The Redis store's Lua scripts, each atomic over keys of one hash tag: ``judge`` (admission) and batch
settlement, on Redis's own clock so replicas share rate windows. Counters are hashes {spent, reserved},
windows hashes {unix second: count}; numbers travel as strings, to keep every digit.
"""

from __future__ import annotations

from typing import Any

from gateway.store.interface import WINDOW_S, Ask

# KEYS: window keys, cap keys, then (with caps) a marker key for this reservation. ARGV: #windows, #caps,
# #levels, window seconds, cap ttl, then limit and amount per window, limit per cap, and the levels
# (amounts to try in order; the first that fits every cap is reserved). The marker holds the amount for
# a few minutes, so a client that timed out can cancel the reservation if the script ran after all.
# Replies {status, index, second, retry-after seconds, spent and reserved per cap}.
ADMIT_LUA = """
local nw, nc, nl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local window, ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local bucket = clock[1]
local oldest = tonumber(bucket) - window + 1
local counters = {}
for i = 1, nc do
  local v = redis.call('HMGET', KEYS[nw + i], 'spent', 'reserved')
  counters[i] = {tonumber(v[1]) or 0, tonumber(v[2]) or 0}
end
local function reply(status, index, wait)
  local out = {status, index, tonumber(bucket), string.format('%.17g', wait)}
  for i = 1, nc do
    out[#out + 1] = string.format('%.17g', counters[i][1])
    out[#out + 1] = string.format('%.17g', counters[i][2])
  end
  return out
end
local a = 6
for i = 1, nw do
  local limit, amount = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  a = a + 2
  local fields = redis.call('HGETALL', KEYS[i])
  local used, live = 0, {}
  for j = 1, #fields, 2 do
    local b, n = tonumber(fields[j]), tonumber(fields[j + 1])
    if b < oldest then
      redis.call('HDEL', KEYS[i], fields[j])
    else
      used = used + n
      live[#live + 1] = {b, n}
    end
  end
  local excess = used + amount - limit
  if excess > 0 then
    table.sort(live, function(x, y) return x[1] < y[1] end)
    local wait = window
    for _, entry in ipairs(live) do
      excess = excess - entry[2]
      if excess <= 0 then
        wait = math.max(0, entry[1] + window - now)
        break
      end
    end
    return reply('limited', i - 1, wait)
  end
end
local chosen = -1
if nc > 0 then
  local first = a + nc
  for l = 1, nl do
    local amount = tonumber(ARGV[first + l - 1])
    local fits = true
    for i = 1, nc do
      local limit = tonumber(ARGV[a + i - 1])
      local committed = counters[i][1] + counters[i][2]
      if committed >= limit or committed + amount > limit then
        fits = false
        break
      end
    end
    if fits then
      chosen = l - 1
      break
    end
  end
  if chosen < 0 then
    return reply('exhausted', -1, 0)
  end
  for i = 1, nc do
    counters[i][2] = tonumber(redis.call('HINCRBYFLOAT', KEYS[nw + i], 'reserved', ARGV[first + chosen]))
    redis.call('EXPIRE', KEYS[nw + i], ttl)
  end
  redis.call('SET', KEYS[nw + nc + 1], ARGV[first + chosen], 'EX', 300)
end
a = 6
for i = 1, nw do
  redis.call('HINCRBYFLOAT', KEYS[i], bucket, ARGV[a + 1])
  redis.call('EXPIRE', KEYS[i], window * 2)
  a = a + 2
end
return reply('ok', chosen, 0)
"""

# KEYS: the replica's applied-sequence key, counter keys, one window key per window entry, then per
# cancel a reservation marker and its cap keys. ARGV: sequence, #counters, #window entries, #cancels,
# counter ttl, window seconds, then spent and reserved deltas per counter, second and delta per window
# entry, and the number of cap keys per cancel. A sequence at or below the one already applied changes
# nothing (a resent batch), which makes every batch count exactly once.
# Replies {previously applied sequence, spent and reserved per counter}.
SETTLE_LUA = """
local seq, nc, nw, nx = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local ttl, window = tonumber(ARGV[5]), tonumber(ARGV[6])
local previous = tonumber(redis.call('GET', KEYS[1]) or '0')
local function release(key, amount)
  if tonumber(redis.call('HINCRBYFLOAT', key, 'reserved', amount)) < 1e-12 then
    redis.call('HSET', key, 'reserved', '0')
  end
end
if seq > previous then
  local a = 7
  for i = 1, nc do
    local key = KEYS[1 + i]
    if tonumber(ARGV[a]) ~= 0 then
      redis.call('HINCRBYFLOAT', key, 'spent', ARGV[a])
    end
    if tonumber(ARGV[a + 1]) ~= 0 then
      release(key, ARGV[a + 1])
    end
    redis.call('EXPIRE', key, ttl)
    a = a + 2
  end
  local oldest = tonumber(redis.call('TIME')[1]) - window + 1
  for i = 1, nw do
    local key, second = KEYS[1 + nc + i], ARGV[a]
    if tonumber(second) >= oldest and redis.call('HEXISTS', key, second) == 1 then
      if tonumber(redis.call('HINCRBYFLOAT', key, second, ARGV[a + 1])) <= 0 then
        redis.call('HDEL', key, second)
      end
    end
    a = a + 2
  end
  local k = 1 + nc + nw
  for i = 1, nx do
    local count = tonumber(ARGV[a])
    local amount = redis.call('GET', KEYS[k + 1])
    if amount then
      redis.call('DEL', KEYS[k + 1])
      for j = 1, count do
        release(KEYS[k + 1 + j], '-' .. amount)
      end
    end
    a = a + 1
    k = k + 1 + count
  end
  redis.call('SET', KEYS[1], ARGV[1], 'EX', 604800)
end
local out = {tostring(previous)}
for i = 1, nc do
  local v = redis.call('HMGET', KEYS[1 + i], 'spent', 'reserved')
  out[#out + 1] = v[1] or '0'
  out[#out + 1] = v[2] or '0'
end
return out
"""

# Budget counters raised to at least the ledger's totals (Redis came back empty, or a replica starts).
# KEYS: counters. ARGV: ttl, then each counter's floor (spent per the ledger). A maximum, never a sum:
# every replica may run it, any number of times, and spend Redis already holds is not counted twice.
# Replies the number of counters raised.
FLOOR_LUA = """
local ttl = tonumber(ARGV[1])
local raised = 0
for i = 1, #KEYS do
  local floor = tonumber(ARGV[i + 1])
  local spent = tonumber(redis.call('HGET', KEYS[i], 'spent')) or 0
  if floor > spent then
    redis.call('HSET', KEYS[i], 'spent', ARGV[i + 1])
    redis.call('EXPIRE', KEYS[i], ttl)
    raised = raised + 1
  end
end
return raised
"""


def admit_args(ask: Ask, ttl_s: int) -> list[Any]:
    """ADMIT_LUA's ARGV for ``ask``, counters kept ``ttl_s`` seconds."""
    args: list[Any] = [len(ask.windows), len(ask.keys), len(ask.levels), WINDOW_S, ttl_s]
    for charge in ask.windows:
        args += [repr(float(charge.limit)), repr(float(charge.amount))]
    args += [repr(float(limit)) for limit in ask.limits]
    args += [repr(float(level)) for level in ask.levels]
    return args
