-- wrk script: after the run, prints its statistics as one JSON line
-- prefixed with BENCH_JSON (latencies in microseconds) for bench/run.py.
done = function(summary, latency)
    local e = summary.errors
    io.write(string.format(
        'BENCH_JSON {"requests":%d,"duration_us":%d,"connect":%d,"read":%d,'
        .. '"write":%d,"status":%d,"timeout":%d,"p50":%d,"p90":%d,"p99":%d,'
        .. '"p999":%d,"max":%d,"mean":%.1f}\n',
        summary.requests, summary.duration, e.connect, e.read, e.write,
        e.status, e.timeout, latency:percentile(50), latency:percentile(90),
        latency:percentile(99), latency:percentile(99.9), latency.max,
        latency.mean))
end
