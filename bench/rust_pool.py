"""make bench's Rust pool, shared by run.py and report.py: the hand-off
section's variant `tpr` is push_task on a pool whose handler is
bench/rust-upper, the Lua pool's trivial task (upper-case the string) in
Rust, called with the same arguments; and the published figure its
sequential round trip is set beside.
"""

from procs import RELEASE_DIR

VARIANT = "tpr"
POOL = "tpr"
LIB = RELEASE_DIR / "libbench_upper.so"
BUILD = "cargo build --release -p bench-upper"
# Its pool's handler, beside the Lua pool's in bench/nginx.conf.tmpl.
DIRECTIVE = f"thread_pool_process_by_rust {POOL} {LIB};"
# The payloads of its hand-off rows (every C, beside the Lua pool's).
PAYLOADS = ("16", "1024", "65536")
# The sequential round trip (C = 1): its payloads and variants.
SEQUENTIAL_PAYLOADS = ("16", "512")
SEQUENTIAL_VARIANTS = ("rwt", "tp", VARIANT)
# lua-resty-ffi's published figure, not measured here: 100,000 sequential
# calls of 512 B to its Go echo runtime in 1.18 s on one CPU.
FFI_US = 11.8
FFI_PAYLOAD = "512"
FFI_SOURCE = "https://github.com/kingluo/lua-resty-ffi/blob/main/benchmark.md"
