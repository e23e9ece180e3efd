-- Completes an in-flight record if ARGV[1] still owns it.
-- KEYS[1]: the record; ARGV[1]: owner token (16 bytes);
-- ARGV[2]: encoded outcome; ARGV[3]: retention in milliseconds.
-- The record layout is idem-core's record/codec.rs, version 1:
-- byte 1 version, byte 2 state ('I' or 'C'), in flight: bytes 3-18 owner,
-- bytes 19-50 fingerprint; completed: version, 'C', fingerprint, outcome.
local current = redis.call('GET', KEYS[1])
if not current
  or string.sub(current, 1, 2) ~= '\1I'
  or string.sub(current, 3, 18) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], '\1C' .. string.sub(current, 19, 50) .. ARGV[2], 'PX', ARGV[3])
return 1
