-- wrk script: GET a batch of random fixed-size samples per request, as one
-- multi-range request (Range: bytes=a-b,c-d,...; RFC 9110 multipart/byteranges).
--   wrk -s multi_range.lua URL -- OBJECT_SIZE SAMPLE_SIZE PER_REQUEST [SEED]
-- Samples are distinct, aligned to SAMPLE_SIZE, and listed in ascending order
-- (what a client library does with a batch of indices).
local here = debug.getinfo(1, "S").source:sub(2):match("(.*/)") or "./"
local common = dofile(here .. "common.lua")

local size, sample, batch, slots

setup = common.setup

function init(args)
  size = tonumber(args[1])
  sample = tonumber(args[2])
  batch = tonumber(args[3])
  common.seed(tonumber(args[4] or 1))
  slots = math.floor(size / sample)
end

function request()
  local picked, seen = {}, {}
  while #picked < batch do
    local i = math.random(slots) - 1
    if not seen[i] then
      seen[i] = true
      picked[#picked + 1] = i
    end
  end
  table.sort(picked)
  local parts = {}
  for k, i in ipairs(picked) do
    local offset = i * sample
    parts[k] = offset .. "-" .. (offset + sample - 1)
  end
  return wrk.format(nil, nil, {Range = "bytes=" .. table.concat(parts, ",")})
end

function done(summary, latency, requests)
  common.done(summary, latency, requests, {ranges_per_request = batch, range_bytes = sample})
end
