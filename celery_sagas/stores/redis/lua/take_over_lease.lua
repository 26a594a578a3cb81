-- take_over_lease: grant a bucket's lease to a new holder, expired or not, atomically, but
-- only while its newest grant is still the one the caller judged gone (docs/design.md §5);
-- the fencing number is bumped, so the old holder's fenced writes are refused from now on,
-- and the saved cursor is handed to the new holder.
--
-- KEYS[1]  lease hash      {<prefix>:<b>}:lease:<name>  (owner, token, expires_at_ms, fence, cursor)
-- ARGV[1]  owner
-- ARGV[2]  token           (fresh random string chosen by the caller)
-- ARGV[3]  expected_fence  (decimal integer: the grant being taken over)
-- ARGV[4]  expires_at_ms   (decimal integer, now_ms + lease duration)
--
-- Returns {'moved'} when the lease's fence is not ARGV[3] (a newer grant came first, or the
-- lease was never granted; nothing written), else {'granted', fence, cursor}: fence an
-- integer, cursor a string or nil. The stored token is never returned.

local h = redis.call('HMGET', KEYS[1], 'fence', 'cursor')
if h[1] ~= ARGV[3] then
  return {'moved'}
end
local fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', ARGV[2], 'expires_at_ms', ARGV[4])
return {'granted', fence, h[2]}
