-- wrk script for the gateway-overhead benchmark: POST the body in $BENCH_BODY with an API key
-- from $BENCH_API_KEY, and print one JSON line of results (latencies in microseconds).
wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY")
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. (os.getenv("BENCH_API_KEY") or "none")

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
