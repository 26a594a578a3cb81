-- acquire_lease: grant a lease unless an unexpired one exists, atomically; every grant bumps
-- the fencing counter, and the saved cursor is handed to the new holder.
--
-- KEYS[1]  holder hash     {<prefix>:lease:<name>}:holder  (owner, token, expires_at_ms, fence)
-- KEYS[2]  fence counter   {<prefix>:lease:<name>}:fence   (integer, only ever incremented)
-- KEYS[3]  saved cursor    {<prefix>:lease:<name>}:cursor  (string; absent means none)
-- ARGV[1]  owner
-- ARGV[2]  token            (fresh random string chosen by the caller)
-- ARGV[3]  now_ms           (decimal integer, milliseconds since the epoch)
-- ARGV[4]  expires_at_ms    (decimal integer, now_ms + lease duration)
--
-- Returns {'held'} while an unexpired lease exists (nothing written), else
-- {'granted', fence, cursor}: fence an integer, cursor a string or nil.
-- The stored token is never returned.

local expires = redis.call('HGET', KEYS[1], 'expires_at_ms')
if expires then
  local at = tonumber(expires)
  if at == nil then
    return redis.error_reply('lease ' .. KEYS[1] .. ' has a non-integer expiry')
  end
  if at > tonumber(ARGV[3]) then
    return {'held'}
  end
end
local counter = redis.call('GET', KEYS[2])
if counter and not string.match(counter, '^[0-9]+$') then
  return redis.error_reply('fence counter ' .. KEYS[2] .. ' is not an integer')
end
local cursor = redis.call('GET', KEYS[3])

local fence = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', ARGV[2], 'expires_at_ms', ARGV[4],
  'fence', fence)
return {'granted', fence, cursor}
