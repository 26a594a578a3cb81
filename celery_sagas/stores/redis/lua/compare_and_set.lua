-- compare_and_set: replace a record if its stored version is the expected one, atomically:
-- move it between state (and label) indexes, set or clear its due time, clear its notes, and
-- refuse a write under a stale fence.
--
-- KEYS[1]  record hash                    {<prefix>:<b>}:r:<kind>:<id>
-- KEYS[2]  index of the believed state    {<prefix>:<b>}:s:<kind>:<ARGV[7]>
-- KEYS[3]  index of the new state         {<prefix>:<b>}:s:<kind>:<ARGV[4]>
-- KEYS[4]  label index, believed state    {<prefix>:<b>}:l:<kind>:<ARGV[7]>:<ARGV[8]> (if labelled)
-- KEYS[5]  label index, new state         {<prefix>:<b>}:l:<kind>:<ARGV[4]>:<ARGV[8]> (if labelled)
-- KEYS[6]  due index                      {<prefix>:<b>}:d:<kind>
-- KEYS[7]  optional: the lease hash       {<prefix>:<b>}:lease:<name> the write is fenced by
-- ARGV[1]  record id
-- ARGV[2]  expected stored version (decimal integer)
-- ARGV[3]  new version             (decimal integer, ARGV[2] + 1)
-- ARGV[4]  new state
-- ARGV[5]  new updated_at_ms       (decimal integer, milliseconds since the epoch)
-- ARGV[6]  new body                (JSON text)
-- ARGV[7]  the state the caller believes is stored (the state KEYS[2] and KEYS[4] index)
-- ARGV[8]  label ('' for none): must equal the stored label
-- ARGV[9]  new due_at_ms ('' for none)
-- ARGV[10] with KEYS[7] only: the fencing number of the writer's grant
--
-- Returns {status, detail}; only 'written' wrote anything:
--   {'written', ''}    replaced, re-indexed, notes cleared
--   {'same', ''}       the stored record already equals the new one (a retried write)
--   {'stale', ''}      the stored version is not ARGV[2], or the label differs
--   {'absent', ''}     no record
--   {'fenced', n}      the lease was granted again since (n = newest fencing number)
--   {'moved', state}   version matches but the stored state is not ARGV[7]: call again
--   {'corrupt', why}   KEYS[1] is not a well-formed record hash

local refusal = (#KEYS == 7 and fence_refusal(KEYS[7], ARGV[10])) or not_a_record(KEYS[1])
if refusal then
  return refusal
end
local f = redis.call('HMGET', KEYS[1], 'id', 'version', 'state', 'updated_at_ms', 'body',
  'label', 'due_at_ms', 'nn')
if not (f[1] and f[2] and f[3] and f[4] and f[5]) then
  return {'corrupt', 'missing field'}
end
if f[1] ~= ARGV[1] then
  return {'corrupt', 'id field does not match the key'}
end
if not string.match(f[2], '^[1-9][0-9]*$') then
  return {'corrupt', 'version is not a positive integer'}
end
local label = f[6] or ''
local due = f[7] or ''
local notes = tonumber(f[8] or '0') or 0

if f[2] ~= ARGV[2] then
  if f[2] == ARGV[3] and f[3] == ARGV[4] and f[4] == ARGV[5] and f[5] == ARGV[6]
      and label == ARGV[8] and due == ARGV[9] and notes == 0 then
    return {'same', ''}
  end
  return {'stale', ''}
end
if label ~= ARGV[8] then
  return {'stale', ''}
end
if f[3] ~= ARGV[7] then
  return {'moved', f[3]}
end

redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
if label ~= '' then
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('ZADD', KEYS[5], ARGV[5], ARGV[1])
end
if ARGV[9] ~= '' then
  redis.call('ZADD', KEYS[6], ARGV[9], ARGV[1])
  redis.call('HSET', KEYS[1], 'due_at_ms', ARGV[9])
elseif due ~= '' then
  redis.call('ZREM', KEYS[6], ARGV[1])
  redis.call('HDEL', KEYS[1], 'due_at_ms')
end
for i = 1, notes do
  redis.call('HDEL', KEYS[1], 'n:' .. i)
end
if notes > 0 then
  redis.call('HDEL', KEYS[1], 'nn')
end
redis.call('HSET', KEYS[1], 'version', ARGV[3], 'state', ARGV[4],
  'updated_at_ms', ARGV[5], 'body', ARGV[6])
return {'written', ''}
