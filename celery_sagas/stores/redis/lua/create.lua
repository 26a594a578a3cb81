-- create: insert a record if its key is absent and index it under its state, atomically.
--
-- KEYS[1]  record hash    {<prefix>:<kind>:<bucket>}:r:<id>
-- KEYS[2]  state index    {<prefix>:<kind>:<bucket>}:s:<state>  (sorted set, score updated_at_ms)
-- ARGV[1]  record id
-- ARGV[2]  version        (decimal integer >= 1)
-- ARGV[3]  state
-- ARGV[4]  updated_at_ms  (decimal integer, milliseconds since the epoch)
-- ARGV[5]  body           (JSON text)
--
-- Returns 1 when the record was inserted, 0 when KEYS[1] exists (whatever it holds);
-- nothing is written in that case.

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'version', ARGV[2], 'state', ARGV[3],
  'updated_at_ms', ARGV[4], 'body', ARGV[5])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
return 1
