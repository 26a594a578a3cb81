-- renew_lease: extend an unexpired lease held with the same owner and token, atomically.
--
-- KEYS[1]  lease hash      {<prefix>:<b>}:lease:<name>  (owner, token, expires_at_ms, fence, cursor)
-- ARGV[1]  owner
-- ARGV[2]  token
-- ARGV[3]  now_ms          (decimal integer, milliseconds since the epoch)
-- ARGV[4]  expires_at_ms   (decimal integer, the new expiry: now_ms + lease duration)
--
-- Returns {'renewed', fence, cursor} (fence a decimal string, cursor a string or nil), or
-- {'lost'} when the lease is absent, expired, or held by another owner or token (nothing
-- written). The stored token is never returned.

local h = redis.call('HMGET', KEYS[1], 'owner', 'token', 'expires_at_ms', 'fence', 'cursor')
local at = tonumber(h[3] or '')
if not h[1] or at == nil or h[1] ~= ARGV[1] or h[2] ~= ARGV[2] or at <= tonumber(ARGV[3]) then
  return {'lost'}
end
redis.call('HSET', KEYS[1], 'expires_at_ms', ARGV[4])
return {'renewed', h[4] or '0', h[5]}
