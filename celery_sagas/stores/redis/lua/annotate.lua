-- annotate: append a note to a record and bump its version, atomically, without the caller
-- reading it first; returns the record as written. State, body, timestamps and indexes stay.
--
-- KEYS[1]  record hash    {<prefix>:<b>}:r:<kind>:<id>
-- ARGV[1]  record id
-- ARGV[2]  the note       (one line of text)
-- ARGV[3]  expected stored version ('' for any)
-- ARGV[4]  the most notes a record holds (decimal integer)
--
-- Returns the record hash as a flat field/value array (HGETALL order) after the write, or
-- {} when the record is absent, at another version, holds ARGV[4] notes already, or is not a
-- well-formed record hash (the caller then reads it and reports what it finds).

if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then
  return {}
end
local f = redis.call('HMGET', KEYS[1], 'id', 'version', 'nn')
if f[1] ~= ARGV[1] or not f[2] or not string.match(f[2], '^[1-9][0-9]*$') then
  return {}
end
if ARGV[3] ~= '' and f[2] ~= ARGV[3] then
  return {}
end
local notes = tonumber(f[3] or '0') or 0
if notes >= tonumber(ARGV[4]) then
  return {}
end
notes = notes + 1
redis.call('HSET', KEYS[1], 'n:' .. notes, ARGV[2], 'nn', notes,
  'version', tostring(tonumber(f[2]) + 1))
return redis.call('HGETALL', KEYS[1])
