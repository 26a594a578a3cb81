-- acquire_lease: grant a bucket's lease unless an unexpired one exists, atomically; every
-- grant bumps the fencing number, and the saved cursor is handed to the new holder.
--
-- KEYS[1]  lease hash      {<prefix>:<b>}:lease:<name>  (owner, token, expires_at_ms, fence, cursor)
-- ARGV[1]  owner
-- ARGV[2]  token           (fresh random string chosen by the caller)
-- ARGV[3]  now_ms          (decimal integer, milliseconds since the epoch)
-- ARGV[4]  expires_at_ms   (decimal integer, now_ms + lease duration)
--
-- Returns {'held'} while an unexpired lease exists (nothing written), else
-- {'granted', fence, cursor}: fence an integer, cursor a string or nil.
-- The stored token is never returned.

local h = redis.call('HMGET', KEYS[1], 'expires_at_ms', 'fence', 'cursor')
if h[1] then
  local at = tonumber(h[1])
  if at == nil then
    return redis.error_reply('lease ' .. KEYS[1] .. ' has a non-integer expiry')
  end
  if at > tonumber(ARGV[3]) then
    return {'held'}
  end
end
if h[2] and not string.match(h[2], '^[0-9]+$') then
  return redis.error_reply('fence of ' .. KEYS[1] .. ' is not an integer')
end
local fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', ARGV[2], 'expires_at_ms', ARGV[4])
return {'granted', fence, h[3]}
