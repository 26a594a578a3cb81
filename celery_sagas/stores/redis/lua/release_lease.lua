-- release_lease: free a lease held with the same owner and token, atomically, even past its
-- expiry; the fencing number and the saved cursor stay.
--
-- KEYS[1]  lease hash      {<prefix>:<b>}:lease:<name>  (owner, token, expires_at_ms, fence, cursor)
-- ARGV[1]  owner
-- ARGV[2]  token
--
-- Returns 1 when released, 0 when absent or held by another owner or token (nothing written).

local h = redis.call('HMGET', KEYS[1], 'owner', 'token')
if not h[1] or h[1] ~= ARGV[1] or h[2] ~= ARGV[2] then
  return 0
end
redis.call('HDEL', KEYS[1], 'owner', 'token', 'expires_at_ms')
return 1
