-- checkpoint_lease: save (or clear) the scan cursor of an unexpired lease held with the same
-- owner and token, atomically; the cursor outlives the lease for the next holder.
--
-- KEYS[1]  lease hash      {<prefix>:<b>}:lease:<name>  (owner, token, expires_at_ms, fence, cursor)
-- ARGV[1]  owner
-- ARGV[2]  token
-- ARGV[3]  now_ms          (decimal integer, milliseconds since the epoch)
-- ARGV[4]  '1' to save ARGV[5], '0' to clear the cursor
-- ARGV[5]  cursor          (opaque string; ignored when ARGV[4] is '0')
--
-- Returns 1 when saved, 0 when the lease is absent, expired or held by another owner or
-- token (nothing written).

local h = redis.call('HMGET', KEYS[1], 'owner', 'token', 'expires_at_ms')
local at = tonumber(h[3] or '')
if not h[1] or at == nil or h[1] ~= ARGV[1] or h[2] ~= ARGV[2] or at <= tonumber(ARGV[3]) then
  return 0
end
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[1], 'cursor', ARGV[5])
else
  redis.call('HDEL', KEYS[1], 'cursor')
end
return 1
