-- _record: the checks every fenced record write begins with; _scripts.py puts this text after
-- the contract header of each script in RECORD_SCRIPTS (it touches only the keys it is given).

-- The reply refusing a write under a grant older than the newest of the lease hash
-- ``lease`` (``grant``: the writer's fencing number, decimal), or nil when none is newer.
local function fence_refusal(lease, grant)
  local newest = tonumber(redis.call('HGET', lease, 'fence') or '0')
  if newest == nil then
    return redis.error_reply('fence of ' .. lease .. ' is not an integer')
  end
  if newest > tonumber(grant) then
    return {'fenced', tostring(newest)}
  end
  return nil
end

-- The reply when ``key`` holds no record hash ({'absent', ''} or {'corrupt', why}), or nil.
local function not_a_record(key)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'none' then
    return {'absent', ''}
  end
  if kind ~= 'hash' then
    return {'corrupt', 'a ' .. kind .. ' instead of a hash'}
  end
  return nil
end
