-- create: insert a record if its key is absent and index it, atomically.
--
-- KEYS[1]  record hash    {<prefix>:<b>}:r:<kind>:<id>
-- KEYS[2]  state index    {<prefix>:<b>}:s:<kind>:<state>          (zset, score updated_at_ms)
-- KEYS[3]  label index    {<prefix>:<b>}:l:<kind>:<state>:<label>  (used when ARGV[6] ~= '')
-- KEYS[4]  due index      {<prefix>:<b>}:d:<kind>                  (used when ARGV[7] ~= '')
-- KEYS[5]  id index       {<prefix>:<b>}:i:<kind>                  (zset, score 0: by id)
-- KEYS[6]  creation index {<prefix>:<b>}:c:<kind>                  (zset, score ARGV[4])
-- ARGV[1]  record id
-- ARGV[2]  version        (decimal integer >= 1)
-- ARGV[3]  state
-- ARGV[4]  updated_at_ms  (decimal integer, milliseconds since the epoch)
-- ARGV[5]  body           (JSON text)
-- ARGV[6]  label          ('' for none)
-- ARGV[7]  due_at_ms      ('' for none; decimal integer, milliseconds since the epoch)
--
-- Returns 1 when the record was inserted, 0 when KEYS[1] exists (whatever it holds);
-- nothing is written in that case.

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'version', ARGV[2], 'state', ARGV[3],
  'updated_at_ms', ARGV[4], 'body', ARGV[5])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
redis.call('ZADD', KEYS[5], 0, ARGV[1])
redis.call('ZADD', KEYS[6], ARGV[4], ARGV[1])
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[1], 'label', ARGV[6])
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
end
if ARGV[7] ~= '' then
  redis.call('HSET', KEYS[1], 'due_at_ms', ARGV[7])
  redis.call('ZADD', KEYS[4], ARGV[7], ARGV[1])
end
return 1
