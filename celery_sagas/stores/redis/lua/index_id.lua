-- index_id: add an existing record to its bucket's id index (the backfill of records written
-- before the index existed), atomically: never indexes a record deleted meanwhile.
--
-- KEYS[1]  record hash    {<prefix>:<b>}:r:<kind>:<id>
-- KEYS[2]  id index       {<prefix>:<b>}:i:<kind>                  (zset, score 0: by id)
-- ARGV[1]  record id
--
-- Returns 1 when the id was added, 0 when the record is absent or the id was indexed already.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
return redis.call('ZADD', KEYS[2], 0, ARGV[1])
