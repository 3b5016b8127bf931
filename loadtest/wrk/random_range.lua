-- wrk script: GET one random byte range per request.
--   wrk -s random_range.lua URL -- OBJECT_SIZE RANGE_SIZE [ALIGN] [SEED]
-- Offsets are uniform over the object, multiples of ALIGN (default RANGE_SIZE:
-- fixed-size records, as a loader reads them; 1 = any byte offset). Every request
-- asks for exactly RANGE_SIZE bytes, so bytes/request tells a 206 from a 200.
local here = debug.getinfo(1, "S").source:sub(2):match("(.*/)") or "./"
local common = dofile(here .. "common.lua")

local size, range, align, slots

setup = common.setup

function init(args)
  size = tonumber(args[1])
  range = tonumber(args[2])
  align = tonumber(args[3] or range)
  common.seed(tonumber(args[4] or 1))
  slots = math.floor((size - range) / align) + 1
end

function request()
  local offset = (math.random(slots) - 1) * align
  return wrk.format(nil, nil, {Range = "bytes=" .. offset .. "-" .. (offset + range - 1)})
end

function done(summary, latency, requests)
  common.done(summary, latency, requests, {ranges_per_request = 1, range_bytes = range})
end
