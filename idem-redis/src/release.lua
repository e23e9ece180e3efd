-- Deletes an in-flight record if ARGV[1] still owns it, so the next claim
-- may run. KEYS[1]: the record; ARGV[1]: owner token (16 bytes).
-- Layout as in complete.lua.
local current = redis.call('GET', KEYS[1])
if current
  and string.sub(current, 1, 2) == '\1I'
  and string.sub(current, 3, 18) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
