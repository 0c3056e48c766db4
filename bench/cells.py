"""The cells of make bench, shared by run.py (which runs them) and
report.py (which renders them): variants, payloads and concurrencies."""

VARIANTS = ("inline", "rwt", "tp")
# The hand-off section also runs push_tasks, BATCH (64) tasks per call
# (bench/lua/bench_handoff.lua); for large strings push_task on a pool
# that copies them (tpc); for small ones post_task (tpp); for those of
# rust_pool.PAYLOADS push_task on a Rust pool (tpr).
HANDOFF_VARIANTS = VARIANTS + ("tpb",)
PAYLOADS = ("16", "1024", "65536", "1048576", "table")
# Payloads of the zero-copy (tpc) and post_task (tpp) rows.
LARGE_PAYLOADS = ("65536", "1048576")
SMALL_PAYLOADS = ("16", "1024")
HANDOFF_C = (1, 8, 64)
THROUGHPUT_C = (1, 8, 32, 128)
# The WAF cell's variants: none builds the request table and scans nothing
# (the cost around the scan), inline is the Lua WAF on the event loop, tp
# the Lua WAF in a pool, rust the Rust WAF in a pool.
WAF_VARIANTS = ("none", "inline", "tp", "rust")

# The stream section: an output of STREAM_MIB in chunks of STREAM_CHUNK
# bytes over HTTP, streamed or whole; and chunks of STREAM_SIZES read
# inside nginx from one stream or as one push_task each.
STREAM_MIB = 64
STREAM_CHUNK = 65536
STREAM_MODES = ("stream", "whole")
STREAM_SIZES = (1024, 65536)
