-- delete: remove a record and its index entries if its stored version is the expected one,
-- atomically (refused under a stale fence).
--
-- KEYS[1]  record hash                    {<prefix>:<b>}:r:<kind>:<id>
-- KEYS[2]  index of the believed state    {<prefix>:<b>}:s:<kind>:<ARGV[3]>
-- KEYS[3]  label index, believed state    {<prefix>:<b>}:l:<kind>:<ARGV[3]>:<ARGV[4]> (if labelled)
-- KEYS[4]  due index                      {<prefix>:<b>}:d:<kind>
-- KEYS[5]  id index                       {<prefix>:<b>}:i:<kind>
-- KEYS[6]  creation index                 {<prefix>:<b>}:c:<kind>
-- KEYS[7]  optional: the lease hash       {<prefix>:<b>}:lease:<name> the delete is fenced by
-- ARGV[1]  record id
-- ARGV[2]  expected stored version (decimal integer)
-- ARGV[3]  the state the caller believes is stored
-- ARGV[4]  the label the caller believes is stored ('' for none)
-- ARGV[5]  with KEYS[7] only: the fencing number of the writer's grant
--
-- Returns {status, detail}; only 'deleted' wrote anything: {'deleted', ''}, {'stale', ''},
-- {'absent', ''}, {'fenced', n}, {'moved', state + '\n' + label} (call again with those),
-- {'corrupt', why}.

local refusal = (#KEYS == 7 and fence_refusal(KEYS[7], ARGV[5])) or not_a_record(KEYS[1])
if refusal then
  return refusal
end
local f = redis.call('HMGET', KEYS[1], 'id', 'version', 'state', 'label')
if f[1] ~= ARGV[1] or not f[2] or not f[3] then
  return {'corrupt', 'missing or mismatched field'}
end
if f[2] ~= ARGV[2] then
  return {'stale', ''}
end
local label = f[4] or ''
if f[3] ~= ARGV[3] or label ~= ARGV[4] then
  return {'moved', f[3] .. '\n' .. label}
end
redis.call('ZREM', KEYS[2], ARGV[1])
if label ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[1])
end
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('DEL', KEYS[1])
return {'deleted', ''}
