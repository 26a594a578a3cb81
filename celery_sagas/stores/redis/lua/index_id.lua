-- index_id: add an existing record to its bucket's id index (the backfill of records written
-- before the index existed), atomically: never indexes a record deleted meanwhile.
--
-- KEYS[1]  record hash    {<prefix>:<b>}:r:<kind>:<id>
-- KEYS[2]  id index       {<prefix>:<b>}:i:<kind>                  (zset, score 0: by id)
-- KEYS[3]  creation index {<prefix>:<b>}:c:<kind>  (zset; a record missing from it is added at
--          its current updated_at_ms: its true creation time was never stored)
-- ARGV[1]  record id
--
-- Returns 1 when the id was added to either index, 0 when the record is absent or was indexed
-- in both already.

local updated = redis.call('HGET', KEYS[1], 'updated_at_ms')
if not updated then
  return 0
end
local born = redis.call('ZADD', KEYS[3], 'NX', updated, ARGV[1])
if redis.call('ZADD', KEYS[2], 0, ARGV[1]) + born > 0 then
  return 1
end
return 0
