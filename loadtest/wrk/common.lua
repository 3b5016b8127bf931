-- Shared by the hubspoke benchmark's wrk scripts (loaded with dofile from the
-- script's directory): per-thread seeding and a JSON summary on stdout.
local M = {}

local threads = {}
local counter = 0

-- Give every thread an id, so that its random sequence differs from the others'.
function M.setup(thread)
  counter = counter + 1
  thread:set("thread_id", counter)
  table.insert(threads, thread)
end

function M.seed(base)
  local id = tonumber(thread_id) or 1
  math.randomseed(base * 7919 + id * 104729)
  -- LuaJIT's first values after seeding are poorly mixed; skip a few.
  for _ = 1, 10 do math.random() end
end

-- Print one line "WRK_JSON {...}" that loadtest/bench.py parses.
function M.done(summary, latency, requests, extra)
  local e = summary.errors
  local parts = {
    string.format('"requests":%d', summary.requests),
    string.format('"bytes":%d', summary.bytes),
    string.format('"duration_us":%d', summary.duration),
    string.format('"errors_connect":%d', e.connect),
    string.format('"errors_read":%d', e.read),
    string.format('"errors_write":%d', e.write),
    string.format('"errors_status":%d', e.status),
    string.format('"errors_timeout":%d', e.timeout),
    string.format('"latency_mean_us":%.1f', latency.mean),
    string.format('"latency_max_us":%d', latency.max),
    string.format('"latency_p50_us":%d', latency:percentile(50)),
    string.format('"latency_p90_us":%d', latency:percentile(90)),
    string.format('"latency_p99_us":%d', latency:percentile(99)),
    string.format('"latency_p999_us":%d', latency:percentile(99.9)),
  }
  for k, v in pairs(extra or {}) do
    table.insert(parts, string.format('"%s":%s', k, tostring(v)))
  end
  io.write("WRK_JSON {" .. table.concat(parts, ",") .. "}\n")
end

return M
