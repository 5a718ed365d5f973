-- wrk script for the gateway-overhead benchmark: POST the bodies in $BENCH_BODIES (one per line)
-- in turn, with an API key from $BENCH_API_KEY, and print one JSON line of results (latencies in
-- microseconds). The requests are formatted once per thread; each request takes the next one.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. (os.getenv("BENCH_API_KEY") or "none")

local prepared = {}
local next_index = 1

function init(args)
   for body in string.gmatch(os.getenv("BENCH_BODIES") or "", "[^\n]+") do
      prepared[#prepared + 1] = wrk.format(nil, nil, nil, body)
   end
   if #prepared == 0 then
      error("BENCH_BODIES holds no body")
   end
end

function request()
   local req = prepared[next_index]
   next_index = next_index % #prepared + 1
   return req
end

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      'BENCH_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"p50_us":%d,"p90_us":%d,' ..
      '"p99_us":%d,"mean_us":%.1f,"max_us":%d,"err_connect":%d,"err_read":%d,' ..
      '"err_write":%d,"err_status":%d,"err_timeout":%d}\n',
      summary.requests, summary.duration, summary.bytes, latency:percentile(50),
      latency:percentile(90), latency:percentile(99), latency.mean, latency.max,
      e.connect, e.read, e.write, e.status, e.timeout))
end
