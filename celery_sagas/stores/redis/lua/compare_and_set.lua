-- compare_and_set: replace a record if its stored version is the expected one, atomically,
-- moving it from its old state index to the new one (and refusing a write under a stale fence).
--
-- KEYS[1]  record hash           {<prefix>:<kind>:<bucket>}:r:<id>
-- KEYS[2]  index of the state the caller believes is stored (ARGV[7]), same bucket
-- KEYS[3]  index of the new state (ARGV[4]), same bucket
-- KEYS[4]  optional: fence counter {<prefix>:lease:<name>}:fence of the lease the write is
--          made under (another hash slot: fenced writes need a single Redis, not Cluster)
-- ARGV[1]  record id
-- ARGV[2]  expected stored version (decimal integer)
-- ARGV[3]  new version             (decimal integer, ARGV[2] + 1)
-- ARGV[4]  new state
-- ARGV[5]  new updated_at_ms       (decimal integer, milliseconds since the epoch)
-- ARGV[6]  new body                (JSON text)
-- ARGV[7]  the state the caller believes is stored (the state KEYS[2] indexes)
-- ARGV[8]  with KEYS[4] only: the fencing number of the writer's grant
--
-- Returns a two-element array {status, detail}; only 'written' wrote anything:
--   {'written', ''}    replaced and re-indexed
--   {'same', ''}       the stored record already equals the new one (a retried write)
--   {'stale', ''}      the stored version is not ARGV[2]
--   {'absent', ''}     no record
--   {'fenced', n}      the lease was granted again since (n = newest fencing number)
--   {'moved', state}   version matches but the stored state is not ARGV[7]: call again
--                      with that state's index as KEYS[2] and the state as ARGV[7]
--   {'corrupt', why}   KEYS[1] is not a well-formed record hash

if #KEYS == 4 then
  local counter = redis.call('GET', KEYS[4]) or '0'
  local newest = tonumber(counter)
  if newest == nil then
    return redis.error_reply('fence counter ' .. KEYS[4] .. ' is not an integer')
  end
  if newest > tonumber(ARGV[8]) then
    return {'fenced', counter}
  end
end

local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  return {'absent', ''}
end
if kind ~= 'hash' then
  return {'corrupt', 'a ' .. kind .. ' instead of a hash'}
end
local f = redis.call('HMGET', KEYS[1], 'id', 'version', 'state', 'updated_at_ms', 'body')
if not (f[1] and f[2] and f[3] and f[4] and f[5]) then
  return {'corrupt', 'missing field'}
end
if f[1] ~= ARGV[1] then
  return {'corrupt', 'id field does not match the key'}
end
if not string.match(f[2], '^[1-9][0-9]*$') then
  return {'corrupt', 'version is not a positive integer'}
end

if f[2] ~= ARGV[2] then
  if f[2] == ARGV[3] and f[3] == ARGV[4] and f[4] == ARGV[5] and f[5] == ARGV[6] then
    return {'same', ''}
  end
  return {'stale', ''}
end
if f[3] ~= ARGV[7] then
  return {'moved', f[3]}
end

redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[1], 'version', ARGV[3], 'state', ARGV[4],
  'updated_at_ms', ARGV[5], 'body', ARGV[6])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
return {'written', ''}
