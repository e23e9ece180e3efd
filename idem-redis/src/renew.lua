-- Renews an in-flight record's lease if ARGV[1] still owns it: its expiry
-- becomes ARGV[2] milliseconds from now. KEYS[1]: the record; ARGV[1]: owner
-- token (16 bytes); ARGV[2]: lease in milliseconds. An expired record reads
-- as absent, so a lease that ran out is never renewed. Layout as in
-- complete.lua.
local current = redis.call('GET', KEYS[1])
if current
  and string.sub(current, 1, 2) == '\1I'
  and string.sub(current, 3, 18) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
