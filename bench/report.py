#!/usr/bin/python3
"""Writes bench/REPORT.md and the PNG plots from the results of run.py.

  /usr/bin/python3 bench/report.py [bench/out/results.json]

re-renders without running anything.
"""

import json
import math
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ beside the sources
import rust_pool  # noqa: E402
from cells import (HANDOFF_C, HANDOFF_VARIANTS, LARGE_PAYLOADS, PAYLOADS,  # noqa: E402
                   SMALL_PAYLOADS, THROUGHPUT_C, VARIANTS, WAF_VARIANTS)

LABEL = {"inline": "inline", "rwt": "run_worker_thread", "tp": "push_task",
         "tpb": "push_tasks ×64", "tpc": "push_task, copying",
         "tpp": "post_task", rust_pool.VARIANT: "push_task, Rust pool"}
COLORS = {"inline": "tab:gray", "rwt": "tab:blue", "tp": "tab:orange",
          "tpc": "tab:red", "tpb": "tab:green", rust_pool.VARIANT: "tab:purple"}
# The variants of the latency and throughput plots.
PLOTTED = VARIANTS + (rust_pool.VARIANT,)
PAYLOAD_LABEL = {"16": "16 B", "512": "512 B", "1024": "1 KiB", "65536": "64 KiB",
                 "1048576": "1 MiB", "table": "table (1,000 entries)"}
PLOTS = ("handoff_latency.png", "handoff_throughput.png", "handoff_cost.png",
         "hol_latency.png", "sort_throughput.png", "waf_cpu.png")
WAF_LABEL = {"none": "no scan (request table only)", "inline": "Lua + PCRE, inline",
             "tp": "Lua + PCRE, push_task", "rust": "Rust regex, push_task"}
WAF_COLORS = {"none": "tab:gray", "inline": "tab:blue", "tp": "tab:orange", "rust": "tab:red"}


# ---- numbers -------------------------------------------------------------

def hist_percentile(cell, q):
    """The q-th percentile (0-100) of a merged histogram, in µs (the
    geometric middle of its bucket), or None without samples."""
    total = sum(cell["hist"].values())
    if not total:
        return None
    bpo = cell["buckets_per_octave"]
    need = q / 100 * total
    seen = 0
    for b in sorted(cell["hist"], key=int):
        seen += cell["hist"][b]
        if seen >= need:
            return 2 ** ((int(b) + 0.5) / bpo) / 1000
    return None


# A hand-off cell's figures per round: tasks/s, CPU µs per task of the
# event loop, of the pool threads and of both (the worker), round-trip p50,
# and the cores other processes took meanwhile.
FIGURES = ("rate", "loop_us", "threads_us", "worker_us", "p50", "others")


def per_task(cell):
    """The FIGURES of one round of a hand-off cell (bench_handoff.lua's
    answer, its histogram as merged by run.merge_handoff)."""
    secs = cell["elapsed_ns"] / 1e9
    n = cell["ok"] + cell["failed"]
    loop = cell["loop_cpu_us"] / n if n else None
    threads = cell["threads_cpu_us"] / n if n else None
    return dict(rate=cell["ok"] / secs if secs else 0.0, loop_us=loop,
                threads_us=threads,
                worker_us=None if loop is None else loop + threads,
                p50=hist_percentile(cell, 50), others=cell.get("others_cores"))


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def medians(rounds):
    """Each of FIGURES as the median of the rounds' (per_task), with the
    rounds kept for their spread."""
    s = {k: median(r[k] for r in rounds) for k in FIGURES}
    s["rounds"] = rounds
    return s


def handoff_stats(cell, rounds=None):
    """A hand-off cell's medians (the cell as one round without rounds);
    its round-trip percentiles from the samples of all rounds."""
    s = medians(rounds or [per_task(cell)])
    s.update(p50=hist_percentile(cell, 50), p99=hist_percentile(cell, 99),
             failed=cell["failed"], errors=cell["errors"])
    return s


def overhead(s, inline):
    """Hand-off overhead per task: the worker's CPU (event loop + pool
    threads) minus the inline handler's."""
    if not (s and inline) or None in (s["worker_us"], inline["loop_us"]):
        return None
    return s["worker_us"] - inline["loop_us"]


def wrk_agg(runs):
    """Rounds of one wrk measurement: mean of rates and percentiles, max
    of maxima, sums of counts. Latencies in ms."""
    if not runs:
        return None
    mean = lambda k: statistics.fmean(r[k] for r in runs)
    return dict(rps=mean("rps"), ok_rps=mean("ok_rps"),
                p50=mean("p50") / 1000, p90=mean("p90") / 1000,
                p99=mean("p99") / 1000, p999=mean("p999") / 1000,
                max=max(r["max"] for r in runs) / 1000,
                requests=sum(r["requests"] for r in runs),
                non2xx=sum(r["status"] for r in runs),
                sock_errors=sum(r["connect"] + r["read"] + r["write"] + r["timeout"]
                                for r in runs))


def ratio(a, b):
    if a is None or b is None or not b:
        return None
    return a / b


# ---- formatting ------------------------------------------------------------

def f_num(x, digits=3):
    """A number with `digits` significant digits, thousands separated."""
    if x is None:
        return "–"
    if x == 0:
        return "0"
    mag = int(math.floor(math.log10(abs(x))))
    places = max(0, digits - 1 - mag)
    return f"{x:,.{places}f}"


def f_ratio(x):
    return "–" if x is None else f"{x:.2f}×"


def f_spread(s, k):
    """Figure k of a cell: its median, and the [min–max] of its rounds."""
    xs = [r[k] for r in s["rounds"] if r[k] is not None] if s else []
    if not xs:
        return "–"
    return f_num(s[k]) + (f" [{f_num(min(xs))}–{f_num(max(xs))}]" if len(xs) > 1 else "")


def table(head, rows):
    out = ["| " + " | ".join(head) + " |",
           "|" + "|".join("---:" if i else "---" for i in range(len(head))) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


def mark(ok):
    if ok is None:
        return "**n/a**"
    return "**met**" if ok else "**missed**"


# ---- sections ------------------------------------------------------------

def md_machine(res):
    m = res["machine"]
    info = res.get("nginx_info", {})
    v = info.get("ngx_lua_version")
    lua = f"{v // 1000000}.{v // 1000 % 1000}.{v % 1000}" if v else "?"
    lines = [
        f"- Mode: **{res['mode']}** ({', '.join(res['sections'])}), started "
        f"{res['started']}, {res['seconds']} s; load average "
        f"{' '.join(res['loadavg_start'])} before, {' '.join(res['loadavg_end'])} after"
        + (" — **the machine was busy: compare variants side by side only**"
           if float(res["loadavg_start"][0]) > 0.5 else ""),
        f"- Machine: {m['nproc']} CPUs ({m['cpu']}), "
        f"{m['mem_total_kib'] // 1024} MiB, kernel {m['kernel']}",
        f"- {m['nginx']}, 1 worker; lua-nginx-module {lua}; "
        f"{info.get('luajit', 'LuaJIT ?')}; "
        f"{m['rustc']}; module at {m['commit']}",
        f"- Load generator: {m['wrk'].split(' Copyright')[0]} (closed loop; its `done()` callback "
        "prints percentiles as JSON, bench/wrk_json.lua); the hand-off section "
        "measures inside nginx (bench/lua/bench_handoff.lua). Python "
        f"{m['python']}.",
        "- Pools: `thread_pool rwt threads=2` for ngx.run_worker_thread "
        "(`lua_worker_thread_vm_pool_size 100`, the default), `thread_pool tp "
        "threads=2` for push_task; both with nginx's default max_queue 65536.",
    ]
    return "\n".join(lines) + "\n"


def md_others(rounds, nproc):
    """What other processes took of the machine during the hand-off cells
    (rounds: {cell: [per_task, ...]})."""
    others = [r["others"] for rs in rounds.values() for r in rs if r.get("others") is not None]
    if not others:
        return ""
    return (f"Other processes (and time stolen by the hypervisor) took "
            f"{f_num(median(others))} of the {nproc} cores in the median cell, "
            f"{f_num(max(others))} at most: the more they take, the more CPU "
            "every variant spends per task (bench/ANALYSIS.md, \"Measuring the "
            "hand-off\").\n")


def cell_stats(h, v, c, p):
    """handoff_stats of the hand-off cell (variant, C, payload), or None."""
    key = f"{v}|{c}|{p}"
    cell = h["cells"].get(key)
    return handoff_stats(cell, h.get("rounds", {}).get(key)) if cell else None


def md_handoff(res, targets):
    h = res.get("handoff")
    if not h:
        return "Not run.\n"
    plan = res["plan"]
    out = [
        "One request runs C light threads (`ngx.thread.spawn`); each hands the "
        "trivial task (uppercase the string; for the table, a copy with every "
        "string uppercased) to the variant in a plain loop, reading the clock "
        "(`clock_gettime(CLOCK_MONOTONIC)` through the FFI) around one call in "
        "16 where a call hands over one string of 16 B or 1 KiB and around every "
        "call otherwise, so that the timing does not add to the figures it "
        "measures. "
        f"{plan['handoff_rounds']} round(s) of {plan['handoff_ms']} ms per cell, "
        "the variants alternating; tasks/s and CPU per task are medians of the "
        "rounds ([min–max] beside tasks/s), tasks/s = tasks / wall time; "
        "percentiles come from the timed calls of all rounds, in a histogram "
        "with ~1% buckets. Each variant runs in an nginx of its own, so that "
        "none runs on LuaJIT traces another left (bench/ANALYSIS.md). Inline "
        "runs on the event loop, so its light threads never overlap: its C is "
        "nominal.\n",
    ]
    out.append(md_others(h.get("rounds", {}), res["machine"]["nproc"]))

    def stats(v, c, p):
        return cell_stats(h, v, c, p)

    for p in PAYLOADS:
        rows = []
        for c in HANDOFF_C:
            st = {v: stats(v, c, p) for v in HANDOFF_VARIANTS}
            if not any(st.values()):
                continue
            row = [c]
            for v in HANDOFF_VARIANTS:
                s = st[v]
                row += [f_spread(s, "rate"), f_num(s and s["p50"]), f_num(s and s["p99"])]
            rate = {v: st[v] and st[v]["rate"] for v in HANDOFF_VARIANTS}
            row += [f_ratio(ratio(rate["tp"], rate["rwt"])),
                    f_ratio(ratio(rate["tpb"], rate["rwt"])),
                    f_ratio(ratio(rate["tp"], rate["inline"]))]
            fails = {v: s["failed"] for v, s in st.items() if s and s["failed"]}
            row.append(", ".join(f"{LABEL[v]} {n}" for v, n in fails.items()) or "0")
            rows.append(row)
        head = ["C"]
        for v in HANDOFF_VARIANTS:
            head += [f"{LABEL[v]} tasks/s", "p50 µs", "p99 µs"]
        head += ["push_task / run_worker_thread", f"{LABEL['tpb']} / run_worker_thread",
                 "push_task / inline", "failed"]
        out.append(f"### Payload {PAYLOAD_LABEL[p]}\n\n" + table(head, rows))

    rows = []
    for p in PAYLOADS:
        for c in HANDOFF_C:
            st = {v: stats(v, c, p) for v in HANDOFF_VARIANTS}
            if not any(st.values()):
                continue
            row = [PAYLOAD_LABEL[p], c]
            for v in HANDOFF_VARIANTS:
                row.append(f_num(st[v] and st[v]["loop_us"]))
                if v != "inline":
                    row.append(f_num(st[v] and st[v]["threads_us"]))
            for v in ("rwt", "tp", "tpb"):
                row.append(f_num(overhead(st[v], st["inline"])))
            rows.append(row)
    out.append("### CPU time per task\n\n"
               "Event loop: `getrusage(RUSAGE_THREAD)` of the worker's main thread "
               "around the cell (µs per task, all of it on the event loop: what "
               "other requests wait for). Pool threads: the run time of the "
               "worker's other threads, from `/proc/PID/task/TID/schedstat` (ns). "
               "Medians of the rounds. Both grow when other processes compete "
               "for the cores (bench/ANALYSIS.md, \"Measuring the hand-off\").\n\n"
               + "Hand-off overhead: event loop + pool threads per task, minus the "
               "inline handler's CPU per task (what the hand-off itself costs).\n\n"
               + table(["payload", "C", "inline loop µs", "run_worker_thread loop µs",
                        "its threads µs", "push_task loop µs", "its threads µs",
                        f"{LABEL['tpb']} loop µs", "its threads µs",
                        "overhead rwt µs", "overhead push_task µs",
                        "overhead push_tasks µs"], rows))

    rows = []
    for p in LARGE_PAYLOADS:
        for c in HANDOFF_C:
            zc, cp, rwt, inline = (stats(v, c, p) for v in ("tp", "tpc", "rwt", "inline"))
            if not (zc and cp):
                continue
            o = {v: overhead(s, inline) for v, s in (("tp", zc), ("tpc", cp), ("rwt", rwt))}
            rows.append([PAYLOAD_LABEL[p], c, f_spread(zc, "rate"), f_spread(cp, "rate"),
                         f_ratio(ratio(zc["rate"], cp["rate"])),
                         f_ratio(ratio(zc["rate"], rwt and rwt["rate"])),
                         f_num(o["tp"]), f_num(o["tpc"]), f_num(o["rwt"]),
                         f_ratio(ratio(o["tp"], o["rwt"]))])
    if rows:
        out.append("### Zero-copy strings\n\n"
                   "push_task on the same handler with `thread_pool_zero_copy` at its "
                   "default (16k: the argument and the result are read in place) and "
                   "`off` (both copied into the payloads), alternating with the other "
                   "variants. Overheads as above.\n\n"
                   + table(["payload", "C", "zero-copy tasks/s", "copying tasks/s",
                            "zero-copy / copying", "zero-copy / run_worker_thread",
                            "overhead zero-copy µs", "overhead copying µs",
                            "overhead rwt µs", "zero-copy / rwt overhead"], rows))

    rows = []
    for p in SMALL_PAYLOADS:
        for c in HANDOFF_C:
            post, push = stats("tpp", c, p), stats("tp", c, p)
            if not post:
                continue
            rows.append([PAYLOAD_LABEL[p], c, f_spread(post, "rate"), f_num(post["p50"]),
                         f_num(post["loop_us"]), f_num(post["threads_us"]),
                         f_spread(push, "rate"), f_num(push and push["loop_us"])])
    if rows:
        out.append("### post_task\n\n"
                   "C light threads post the task in a loop (sleeping 1 ms when the "
                   "queue is full); the cell ends once the pool has run every posted "
                   "task, so tasks/s counts tasks run. p50 is the post call itself.\n\n"
                   + table(["payload", "C", "post_task tasks/s", "post call p50 µs",
                            "loop µs per task", "threads µs per task",
                            "push_task tasks/s", "push_task loop µs"], rows))

    handoff_targets(h, targets)
    out.append(md_rust_pool(h, targets))

    probe = h.get("probe128", {})
    if probe:
        rows = []
        for v, cell in probe.items():
            s = handoff_stats(cell)
            errs = "; ".join(f"`{k}` ×{n}" for k, n in s["errors"].items()) or "none"
            rows.append([LABEL[v], f_num(s["rate"]), cell["ok"], s["failed"], errs])
        out.append("### Past run_worker_thread's VM pool: C = 128, 16 B\n\n"
                   "run_worker_thread takes one Lua VM per task in flight from a "
                   "pool of `lua_worker_thread_vm_pool_size` (100) and fails at once "
                   "with \"no available Lua vm\" when none is free (no queueing); at "
                   "C = 64 every task gets one. push_task queues up to max_queue.\n\n"
                   + table(["variant", "tasks/s", "done", "failed", "errors"], rows))
    return "\n".join(out)


def md_rust_pool(h, targets):
    """The Rust pool's rows: its hand-off overhead beside the Lua pool's and
    run_worker_thread's, and its sequential round trip beside theirs and
    lua-resty-ffi's published figure."""
    rv = rust_pool.VARIANT
    out = ["### Rust pool\n\n"
           f"{LABEL[rv]}: the same push_task call, with the same arguments "
           "(`\"upper\"`, the string), on a pool of 2 threads whose handler is the "
           "Rust library of bench/rust-upper (`thread_pool_process_by_rust`), which "
           "upper-cases the string as `string.upper` does; each variant alternates "
           "with the others as above. Both pools read a 64 KiB argument in place; "
           "the Rust handler writes its result into the results payload, which the "
           "event loop copies into a Lua string, where the Lua pool's 64 KiB result "
           "is read in place. Worker CPU: event loop + pool threads per task. "
           "Overheads as above: the inline Lua handler's CPU is subtracted from "
           "every variant's, so the Rust pool's also holds the Rust handler's own "
           "work minus the Lua one's: below zero where upper-casing in Rust costs "
           "that much less than in Lua (64 KiB).\n"]
    why = h.get("skipped", {}).get(rv)
    if why or not any(k.startswith(rv + "|") for k in h["cells"]):
        return out[0] + f"\nSkipped: {why or 'not in this run'}.\n"
    rows = []
    for p in rust_pool.PAYLOADS:
        for c in HANDOFF_C:
            st = {v: cell_stats(h, v, c, p) for v in ("inline", "rwt", "tp", rv)}
            shown = ("rwt", "tp", rv)
            rows.append([PAYLOAD_LABEL[p], c, f_spread(st["tp"], "rate"),
                         f_spread(st[rv], "rate"), f_num(st["tp"] and st["tp"]["loop_us"]),
                         f_num(st[rv] and st[rv]["loop_us"])]
                        + [f_num(st[v] and st[v]["worker_us"]) for v in shown]
                        + [f_num(overhead(st[v], st["inline"])) for v in shown]
                        + [f_ratio(ratio(st[rv] and st[rv]["worker_us"],
                                         st["tp"] and st["tp"]["worker_us"]))])
    out.append(table(["payload", "C", "Lua pool tasks/s", "Rust pool tasks/s",
                      "Lua pool loop µs", "Rust pool loop µs", "worker rwt µs",
                      "worker Lua pool µs", "worker Rust pool µs", "overhead rwt µs",
                      "overhead Lua pool µs", "overhead Rust pool µs",
                      "Rust / Lua pool worker CPU"], rows))
    rows = []
    for p in rust_pool.SEQUENTIAL_PAYLOADS:
        st = [cell_stats(h, v, 1, p) for v in rust_pool.SEQUENTIAL_VARIANTS]
        rows.append([PAYLOAD_LABEL[p]] + [f_num(s and s[q]) for s in st for q in ("p50", "p99")]
                    + [f_num(rust_pool.FFI_US) if p == rust_pool.FFI_PAYLOAD else "–"])
    head = ["payload"]
    for v in rust_pool.SEQUENTIAL_VARIANTS:
        head += [f"{LABEL[v]} p50 µs", "p99 µs"]
    out.append("Sequential round trip: one light thread (C = 1) calling in a loop; "
               "p50 and p99 of the timed calls. lua-resty-ffi's figure is the one it "
               f"publishes ({rust_pool.FFI_SOURCE}: 100,000 sequential calls of 512 B "
               "to its Go echo runtime in 1.18 s on one CPU), not measured here, on "
               "other hardware.\n\n"
               + table(head + ["lua-resty-ffi, published µs"], rows))
    a = cell_stats(h, rv, 1, rust_pool.FFI_PAYLOAD)
    a = a and a["p50"]
    targets.append((f"{LABEL[rv]} round trip at C = 1, "
                    f"{PAYLOAD_LABEL[rust_pool.FFI_PAYLOAD]}: p50 ≤ lua-resty-ffi's published "
                    f"{f_num(rust_pool.FFI_US)} µs", f"{f_num(a)} µs",
                    a is not None and a <= rust_pool.FFI_US))
    return "\n".join(out)


def handoff_targets(h, targets):
    """The hand-off targets, each beside run_worker_thread's figure in the
    same run (medians of the rounds)."""
    def figure(v, c, p, k):
        s = cell_stats(h, v, c, p)
        if k == "overhead":
            return overhead(s, cell_stats(h, "inline", c, p))
        return s and s[k]

    def target(what, rows):
        """rows: (measured, whether it meets the target) for each cell."""
        if rows:
            targets.append((what, ", ".join(m for m, _ in rows), all(ok for _, ok in rows)))

    def versus(what, k, cells, bound, unit=""):
        """push_task's figure k against run_worker_thread's: their ratio
        at most `bound` (at least, for tasks/s)."""
        rows = []
        for c, p in cells:
            a, b = figure("tp", c, p, k), figure("rwt", c, p, k)
            r = ratio(a, b)
            ok = r is not None and (r >= bound if k == "rate" else r <= bound)
            rows.append((f"{PAYLOAD_LABEL[p]} C={c}: {f_num(a)} vs {f_num(b)}{unit} "
                         f"({f_ratio(r)})", ok))
        target(what, rows)

    versus("push_task event-loop CPU per task ≤ 1.0× run_worker_thread's: 16 B at "
           "C = 8 and 64, 1 KiB and 64 KiB at C = 8", "loop_us",
           ((8, "16"), (64, "16"), (8, "1024"), (8, "65536")), 1.0, " µs")
    versus("push_task worker CPU per task (event loop + pool threads) ≤ 1.0× "
           "run_worker_thread's: 16 B at C = 8 and 64, 1 KiB at C = 8", "worker_us",
           ((8, "16"), (64, "16"), (8, "1024")), 1.0, " µs")
    versus("push_task tasks/s ≥ 1× run_worker_thread's, every payload at C = 8 and 64",
           "rate", [(c, p) for p in PAYLOADS for c in (8, 64)], 1.0)
    rows = []
    for c in (8, 64):
        loop, a, b = figure("tpb", c, "16", "loop_us"), figure("tpb", c, "16", "rate"), \
            figure("rwt", c, "16", "rate")
        r = ratio(a, b)
        rows.append((f"C={c}: {f_num(loop)} µs, {f_ratio(r)}",
                     loop is not None and loop <= 0.5 and r is not None and r >= 3))
    target(f"{LABEL['tpb']}, 16 B at C = 8 and 64: ≤ 0.5 µs event-loop CPU per task "
           "and ≥ 3× run_worker_thread's tasks/s", rows)
    a, b = figure("tp", 1, "16", "p50"), figure("rwt", 1, "16", "p50")
    target("push_task round trip at C = 1, 16 B: p50 ≤ 10 µs",
           [(f"{f_num(a)} µs (run_worker_thread {f_num(b)} µs)", a is not None and a <= 10)])
    for p, bound in (("65536", 1.0), ("1048576", 0.5)):
        versus(f"push_task hand-off overhead ≤ {bound}× run_worker_thread's, "
               f"{PAYLOAD_LABEL[p]}, every C", "overhead",
               [(c, p) for c in HANDOFF_C], bound, " µs")


def md_hol(res, targets):
    h = res.get("hol")
    if not h:
        return "Not run.\n"
    plan = res["plan"]
    runs = h["runs"]
    out = [
        f"A heavy wrk (8 connections, 2 threads) on `/WORKLOAD/VARIANT` and, "
        f"0.5 s later, a measured wrk (4 connections, 1 thread, "
        f"{plan['hol_secs']} s) on `/static` (`return 200`) or `/light` "
        f"(a little Lua, always on the event loop); {plan['hol_rounds']} "
        f"round(s), variants alternating; percentiles are means over rounds, "
        f"max the max; the unloaded baseline is measured before and after each "
        f"round. Sort: {res['sort_n']:,} random numbers (nginx-conf/"
        "sort.lua). "
        + ("WAF: nginx-conf/waf.lua with waf_rules.lua on a GET with query "
           f"`{res['waf_query']}`." if "waf" in h["workloads"] else
           "WAF: not run (nginx-conf/waf.lua and waf_rules.lua are not there "
           "yet; the section turns on by itself when they are).") + "\n",
    ]
    base = {t: wrk_agg(runs.get(f"unloaded|{t}")) for t in ("static", "light")}
    rows = [["unloaded", "–"]
            + [x for t in ("static", "light") for x in
               ([f_num(base[t]["p50"]), f_num(base[t]["p99"]), f_num(base[t]["max"]), "1.00×"]
                if base[t] else ["–"] * 4)]
            + ["–", "–", "–"]]
    for w in h["workloads"]:
        for v in VARIANTS:
            row = [w, LABEL[v]]
            for t in ("static", "light"):
                a = wrk_agg(runs.get(f"{w}|{v}|{t}"))
                if not a:
                    row += ["–"] * 4
                    continue
                if not a["requests"]:
                    # Blocked for the whole window: no latency to report.
                    row += ["none done", f"> {plan['hol_secs'] * 1000:,} ", "–", "∞"]
                    continue
                row += [f_num(a["p50"]), f_num(a["p99"]), f_num(a["max"]),
                        f_ratio(ratio(a["p99"], base[t] and base[t]["p99"]))]
            heavy = wrk_agg(runs.get(f"{w}|{v}|static|heavy", [])
                            + runs.get(f"{w}|{v}|light|heavy", []))
            row += [f_num(heavy and heavy["ok_rps"]), f_num(heavy and heavy["p99"]),
                    heavy["non2xx"] if heavy else "–"]
            rows.append(row)
    head = ["heavy load", "variant",
            "static p50 ms", "p99 ms", "max ms", "p99 ÷ unloaded",
            "light p50 ms", "p99 ms", "max ms", "p99 ÷ unloaded",
            "heavy ok req/s", "heavy p99 ms", "heavy non-2xx"]
    out.append(table(head, rows))
    if h.get("errors"):
        out.append("Heavy-handler failures: " + "; ".join(
            f"`{k}` ×{n}" for k, n in h["errors"].items()) + "\n")

    for w in h["workloads"]:
        a = wrk_agg(runs.get(f"{w}|tp|static"))
        if a and base["static"]:
            r = ratio(a["p99"], base["static"]["p99"])
            targets.append((f"static p99 under the {w} load (push_task) within 3× "
                            "of unloaded p99",
                            f"{f_num(a['p99'])} ms vs {f_num(base['static']['p99'])} ms "
                            f"({f_ratio(r)})", r is not None and r <= 3))
    return "\n".join(out)


def md_policy(res, targets):
    pol = res.get("policy")
    if not pol:
        return "Not run.\n"
    runs = pol["runs"]
    rows, base = [], None
    stats = {}
    for p in pol["policies"]:
        un, st, hv = (wrk_agg(runs.get(f"{p}|{k}")) for k in ("unloaded", "static", "heavy"))
        if not (un and st and hv):
            continue
        stats[p] = (st["p99"] / un["p99"] if un["p99"] else None, hv["ok_rps"],
                    un["p99"], st["p99"])
        if p == "normal nice=0":
            base = hv["ok_rps"]
    for p, (slow, rps, un_p99, st_p99) in stats.items():
        rows.append([f"`{p}`", f_num(un_p99), f_num(st_p99), f_num(slow), f_num(rps),
                     f_ratio(ratio(rps, base))])
        ok = slow is not None and slow <= 3 and base and rps >= 0.9 * base
        targets.append((f"static p99 under the sort load ≤ 3× unloaded, sort ≥ 90 % "
                        f"of nice 0's requests/s: `thread_pool_scheduling tp {p}`",
                        f"{f_num(slow)}×, {f_ratio(ratio(rps, base))}", bool(ok)))
    return ("One nginx per setting of `thread_pool_scheduling` for the pool that "
            "runs the sort (push_task, 8 connections); a measured wrk on `/static` "
            "(4 connections) unloaded, then during the sort; settings alternate "
            "round by round.\n\n"
            + table(["setting", "static p99 unloaded ms", "under the sort ms",
                     "÷ unloaded", "sort req/s", "sort ÷ nice 0"], rows))


def md_throughput(res, targets):
    t = res.get("throughput")
    if not t:
        return "Not run.\n"
    plan = res["plan"]
    out = [f"wrk on `/sort/VARIANT?n={res['sort_n']}` for {plan['tput_secs']} s per "
           f"cell, {plan['tput_rounds']} round(s), variants alternating; ok req/s "
           "counts 2xx answers only (a failure answers 503). non-2xx is what wrk "
           "counted; the failures below are what nginx counted, answers wrk "
           "no longer waited for included.\n"]
    rows, ratios = [], []
    for c in THROUGHPUT_C:
        a = {v: wrk_agg(t["runs"].get(f"{v}|{c}")) for v in VARIANTS}
        row = [c]
        for v in VARIANTS:
            row += ([f_num(a[v]["ok_rps"]), f_num(a[v]["p99"]), a[v]["non2xx"]]
                    if a[v] else ["–"] * 3)
        r_rwt = ratio(a["tp"] and a["tp"]["ok_rps"], a["rwt"] and a["rwt"]["ok_rps"])
        r_inl = ratio(a["tp"] and a["tp"]["ok_rps"], a["inline"] and a["inline"]["ok_rps"])
        row += [f_ratio(r_rwt), f_ratio(r_inl)]
        rows.append(row)
        ratios.append((c, r_rwt))
    head = ["connections"]
    for v in VARIANTS:
        head += [f"{LABEL[v]} ok req/s", "p99 ms", "non-2xx"]
    head += ["push_task / run_worker_thread", "push_task / inline"]
    out.append(table(head, rows))
    errs = [f"C={k.split('|')[1]} {LABEL[k.split('|')[0]]}: "
            + "; ".join(f"`{m.split(': ', 1)[-1]}` ×{n}" for m, n in e.items())
            for k, e in t.get("errors", {}).items() if e]
    if errs:
        out.append("Failures: " + " — ".join(errs) + "\n")
    if any(r is not None for _, r in ratios):
        targets.append(("sort throughput, push_task ≥ run_worker_thread at every "
                        "concurrency",
                        ", ".join(f"C={c}: {f_ratio(r)}" for c, r in ratios),
                        all(r is not None and r >= 1 for _, r in ratios)))
    return "\n".join(out)


def md_memory(res, targets):
    m = res.get("memory")
    if not m:
        return "Not run.\n"
    rows_by = {(r["kind"], r["threads"]): r for r in m["rows"]}
    none = rows_by.get(("none", 0))
    out = [f"Worker VmRSS, one nginx start per row: idle once the thread count "
           f"and RSS stop moving, then after {m['tasks']:,} tasks (1 KiB, C=8) "
           "of the variant (row 0: the same loop inline, no pool). Average per "
           "thread = (idle − idle without pools) ÷ threads, one-off costs "
           "included. run_worker_thread's VMs are "
           "created per task in flight, not per thread, so its idle threads "
           "hold no Lua state.\n"]
    rows = []
    for n in sorted({r["threads"] for r in m["rows"]}):
        row = [n]
        for kind in (("none",) if n == 0 else ("tp", "rwt")):
            r = rows_by.get((kind, n))
            if not r:
                row += ["–"] * 4
                continue
            delta = ((r["rss_idle_kib"] - none["rss_idle_kib"]) / n / 1024
                     if none and n else None)
            row += [f"{r['rss_idle_kib'] / 1024:.1f}", f"{r['rss_after_kib'] / 1024:.1f}",
                    "–" if delta is None else f"{delta:.2f}",
                    f"{r['threads_idle']}/{r['threads_after']}"]
        if n == 0:
            row += ["–"] * 4
        rows.append(row)
    head = ["pool threads",
            "push_task idle MiB", "after MiB", "avg per thread MiB", "OS threads idle/after",
            "run_worker_thread idle MiB", "after MiB", "avg per thread MiB",
            "OS threads idle/after"]
    out.append(table(head, rows))
    bad = [r for r in m["rows"] if r["failed"] or not r["alive"]]
    for r in bad:
        out.append(f"- {r['kind']} {r['threads']} threads: {r['failed']} failed "
                   f"{r['errors']}, worker alive: {r['alive']}\n")
    # Each thread's own cost: the slope between the smallest and largest
    # pools; the first thread also pays one-off costs (the module's code and
    # data pages, a malloc arena), shown by the 1-thread row.
    tps = sorted((r["threads"], r["rss_idle_kib"]) for r in m["rows"]
                 if r["kind"] == "tp")
    if len(tps) >= 2 and tps[-1][0] > tps[0][0]:
        (n0, r0), (n1, r1) = tps[0], tps[-1]
        slope = (r1 - r0) / (n1 - n0) / 1024
        fixed = (r0 - none["rss_idle_kib"]) / 1024 - slope * n0 if none else None
        out.append(f"Each idle push_task thread adds {slope:.2f} MiB (slope from "
                   f"{n0} to {n1} threads); the pool's one-off cost on top is "
                   + ("–" if fixed is None else f"{fixed:.2f} MiB") + ".\n")
        targets.append(("idle push_task thread RSS under 2 MiB each",
                        f"{slope:.2f} MiB per thread ({n0}→{n1} threads), plus "
                        + ("–" if fixed is None else f"{fixed:.2f} MiB")
                        + " once per pool", slope < 2))
    return "\n".join(out)


def waf_stats(runs):
    """A WAF variant's medians over rounds: requests/s and CPU µs per
    request of the event loop, of the pool threads and of both."""
    if not runs:
        return None
    loop = median(r["loop_us"] for r in runs)
    threads = median(r["threads_us"] for r in runs)
    return dict(rps=median(r["rps"] for r in runs), loop_us=loop, threads_us=threads,
                worker_us=median(r["loop_us"] + r["threads_us"] for r in runs),
                non2xx=sum(r["status"] for r in runs), rounds=len(runs))


def md_waf(res, targets):
    w = res.get("waf")
    if not w:
        return "Not run.\n"
    plan = res["plan"]
    st = {v: waf_stats(w["runs"].get(v)) for v in WAF_VARIANTS}
    base = st["none"]
    out = [f"wrk ({w['connections']} connections, {plan['waf_secs']} s per cell, "
           f"{plan['waf_rounds']} round(s), variants alternating) sends {w['requests']} "
           "requests in turn, benign and malicious (run.py's WAF_REQUESTS), to "
           "`/wafcpu/VARIANT/...`: the request table of nginx-conf/waf_http.lua, scanned by "
           "the 1,505 rules of nginx-conf/waf_rules.lua in Lua with PCRE (waf.lua, "
           "inline or in a Lua pool) or in Rust with the regex crate (examples/waf-rust, "
           "in a Rust pool). CPU per request: the worker's main thread (event loop) and "
           "its other threads (pools), from schedstat, over the requests wrk counted; "
           "medians of the rounds. WAF CPU = worker CPU minus the no-scan variant's.\n"]
    rows = []
    for v in WAF_VARIANTS:
        s = st[v]
        if v in w.get("skipped", {}):
            rows.append([WAF_LABEL[v], "skipped", "–", "–", "–", "–", "–"])
            continue
        if not s:
            continue
        rows.append([WAF_LABEL[v], f_num(s["rps"]), f_num(s["loop_us"]), f_num(s["threads_us"]),
                     f_num(s["worker_us"]),
                     f_num(base and s["worker_us"] - base["worker_us"]), s["non2xx"]])
    out.append(table(["variant", "req/s", "event loop µs/req", "pool threads µs/req",
                      "worker µs/req", "WAF CPU µs/req", "non-2xx"], rows))
    for v, why in w.get("skipped", {}).items():
        out.append(f"- {WAF_LABEL[v]}: skipped, {why}.\n")
    if w.get("errors"):
        out.append("Failures: " + "; ".join(f"`{k}` ×{n}" for k, n in w["errors"].items()) + "\n")
    lua, rust = st["tp"], st["rust"]
    if lua and rust and base:
        r = ratio(rust["worker_us"] - base["worker_us"], lua["worker_us"] - base["worker_us"])
        targets.append(("WAF CPU per request, Rust regex ÷ Lua + PCRE (both in a pool)",
                        f"{f_num(rust['worker_us'] - base['worker_us'])} vs "
                        f"{f_num(lua['worker_us'] - base['worker_us'])} µs ({f_ratio(r)})",
                        r is not None and r <= 1))
    return "\n".join(out)


def md_problems(res):
    """Everything that went wrong: failed sections, crashed workers and
    the error.log lines, grouped."""
    out = []
    for s, f in res.get("failures", {}).items():
        out.append(f"- Section **{s}** failed: `{f['error']}`")
        out += [f"  - `{line[:300]}`" for line in f["log"][-10:]]
    for s in ("handoff", "hol", "throughput", "waf"):
        sec = res.get(s)
        if sec and not sec.get("alive", True):
            out.append(f"- Section **{s}**: the worker process died during the run "
                       "(see the log lines below)")
    logs = {}
    for s in ("handoff", "hol", "throughput", "waf"):
        if res.get(s):
            logs[s] = res[s].get("log", [])
    for name, lines in res.get("memory", {}).get("log", {}).items():
        logs[name] = lines
    for name, lines in logs.items():
        # strip the timestamp and pids so equal messages group
        c = Counter(line.split("] ", 1)[-1].split(": ", 1)[-1][:300] for line in lines
                    if "[notice]" not in line)
        for msg, n in c.most_common(10):
            out.append(f"- {name}: ×{n} `{msg}`")
    return ("\n".join(out) if out else "None: no failed section, no dead worker, "
            "no error.log line at warn or worse.") + "\n"


# ---- plots -----------------------------------------------------------------

def handoff_axis(ax, p):
    """A hand-off plot's panel for payload p: log-log by concurrency."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(HANDOFF_C, [str(c) for c in HANDOFF_C])
    ax.set_title(PAYLOAD_LABEL[p])
    ax.set_xlabel("concurrency (light threads)")
    ax.grid(True, which="both", alpha=0.3)


def plots(res, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Only once matplotlib is there: a Python without it stops above and
    # leaves the committed plots alone. A section that did not run leaves
    # no plot behind.
    for p in PLOTS:
        (out_dir / p).unlink(missing_ok=True)
    note = f" ({res['mode']} run, {res['machine']['nproc']} CPUs)"
    h = res.get("handoff")
    if h:
        for name, what in (("handoff_latency.png", "latency"),
                           ("handoff_throughput.png", "rate")):
            fig, axes = plt.subplots(1, len(PAYLOADS), figsize=(18, 4.2))
            for ax, p in zip(axes, PAYLOADS):
                for v in PLOTTED:
                    st = [cell_stats(h, v, c, p) for c in HANDOFF_C]
                    if not any(st):
                        continue
                    if what == "latency":
                        for q, style in (("p50", "-"), ("p99", "--")):
                            ax.plot(HANDOFF_C, [s and s[q] for s in st], style,
                                    marker="o", color=COLORS[v],
                                    label=f"{LABEL[v]} {q}")
                    else:
                        ax.plot(HANDOFF_C, [s and s["rate"] for s in st], "-",
                                marker="o", color=COLORS[v], label=LABEL[v])
                handoff_axis(ax, p)
            axes[0].set_ylabel("round trip µs" if what == "latency" else "tasks/s")
            axes[0].legend(fontsize=7)
            fig.suptitle(("Hand-off round-trip latency, p50 (solid) and p99 (dashed)"
                          if what == "latency" else "Hand-off throughput") + note)
            fig.tight_layout()
            fig.savefig(out_dir / name, dpi=80)
            plt.close(fig)

    if h:
        fig, axes = plt.subplots(1, len(PAYLOADS), figsize=(18, 4.2))
        for ax, p in zip(axes, PAYLOADS):
            for v in ("rwt", "tp", "tpc", "tpb", rust_pool.VARIANT):
                ys = [overhead(cell_stats(h, v, c, p), cell_stats(h, "inline", c, p))
                      for c in HANDOFF_C]
                if any(y is not None for y in ys):
                    ax.plot(HANDOFF_C, ys, "-", marker="o", color=COLORS[v], label=LABEL[v])
            handoff_axis(ax, p)
            ax.legend(fontsize=7)
        axes[0].set_ylabel("hand-off overhead, CPU µs per task")
        fig.suptitle("Hand-off cost: event loop + pool threads per task, minus the inline "
                     "handler's" + note)
        fig.tight_layout()
        fig.savefig(out_dir / "handoff_cost.png", dpi=80)
        plt.close(fig)

    hol = res.get("hol")
    if hol:
        runs = hol["runs"]
        fig, axes = plt.subplots(len(hol["workloads"]), 2, squeeze=False,
                                 figsize=(12, 4.2 * len(hol["workloads"])))
        for wi, w in enumerate(hol["workloads"]):
            for ti, t in enumerate(("static", "light")):
                ax = axes[wi][ti]
                groups = [("unloaded", wrk_agg(runs.get(f"unloaded|{t}")))]
                groups += [(LABEL[v], wrk_agg(runs.get(f"{w}|{v}|{t}"))) for v in VARIANTS]
                qs = ("p50", "p99", "max")
                for qi, q in enumerate(qs):
                    xs = [gi + (qi - 1) * 0.27 for gi in range(len(groups))]
                    ax.bar(xs, [g[1][q] if g[1] else 0 for g in groups], width=0.27,
                           label=q)
                ax.set_xticks(range(len(groups)), [g[0] for g in groups])
                ax.set_yscale("log")
                ax.set_ylabel("latency ms")
                ax.set_title(f"/{t} while {w} runs, by variant")
                ax.grid(True, axis="y", which="both", alpha=0.3)
                ax.legend(fontsize=8)
        fig.suptitle("Head of line: latency of cheap requests under CPU-heavy load" + note)
        fig.tight_layout()
        fig.savefig(out_dir / "hol_latency.png", dpi=80)
        plt.close(fig)

    tput = res.get("throughput")
    if tput:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
        for v in VARIANTS:
            a = [wrk_agg(tput["runs"].get(f"{v}|{c}")) for c in THROUGHPUT_C]
            axes[0].plot(THROUGHPUT_C, [x and x["ok_rps"] for x in a], marker="o",
                         color=COLORS[v], label=LABEL[v])
            axes[1].plot(THROUGHPUT_C, [x and x["p99"] for x in a], marker="o",
                         color=COLORS[v], label=LABEL[v])
        for ax, yl in zip(axes, ("ok requests/s", "p99 ms")):
            ax.set_xscale("log")
            ax.set_xticks(THROUGHPUT_C, [str(c) for c in THROUGHPUT_C])
            ax.set_xlabel("concurrent connections")
            ax.set_ylabel(yl)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        axes[1].set_yscale("log")
        fig.suptitle(f"Sort of {res['sort_n']:,} numbers: throughput vs concurrency" + note)
        fig.tight_layout()
        fig.savefig(out_dir / "sort_throughput.png", dpi=80)
        plt.close(fig)

    w = res.get("waf")
    if w:
        st = {v: waf_stats(w["runs"].get(v)) for v in WAF_VARIANTS}
        shown = [v for v in WAF_VARIANTS if st[v]]
        if shown:
            fig, ax = plt.subplots(figsize=(8, 4.2))
            xs = range(len(shown))
            loop = [st[v]["loop_us"] for v in shown]
            ax.bar(xs, loop, color=[WAF_COLORS[v] for v in shown], label="event loop")
            ax.bar(xs, [st[v]["threads_us"] for v in shown], bottom=loop,
                   color=[WAF_COLORS[v] for v in shown], alpha=0.45, hatch="//",
                   label="pool threads")
            ax.set_xticks(xs, [WAF_LABEL[v] for v in shown], fontsize=8)
            ax.set_ylabel("CPU µs per request")
            ax.grid(True, axis="y", alpha=0.3)
            ax.legend(fontsize=8)
            skipped = ", ".join(WAF_LABEL[v] for v in w.get("skipped", {}))
            ax.set_title("WAF CPU per request" + (f" ({skipped}: skipped)" if skipped else ""),
                         fontsize=9)
            fig.suptitle("WAF: 1,505 rules, Lua + PCRE vs Rust regex" + note)
            fig.tight_layout()
            fig.savefig(out_dir / "waf_cpu.png", dpi=80)
            plt.close(fig)


# ---- the report --------------------------------------------------------------

def render(res, out_dir):
    out_dir = Path(out_dir)
    targets = []
    body = {
        "handoff": md_handoff(res, targets),
        "hol": md_hol(res, targets),
        "policy": md_policy(res, targets),
        "throughput": md_throughput(res, targets),
        "memory": md_memory(res, targets),
        "waf": md_waf(res, targets),
    }
    plots(res, out_dir)
    images = [p for p in PLOTS if (out_dir / p).exists()]
    doc = [
        "# ngx_threadpool benchmark: push_task vs inline Lua vs ngx.run_worker_thread\n",
        "Generated by `make bench` (bench/run.py"
        + (", QUICK=1: short smoke durations, numbers are indicative only"
           if res["mode"] == "quick" else "")
        + "). Compare variants within this run only: they alternate round by "
        "round, so they saw the same machine.\n",
        "## Machine and versions\n", md_machine(res),
        "## Targets\n",
        table(["target", "measured", "status"],
              [(t, m, mark(ok)) for t, m, ok in targets]) if targets else "No section ran.\n",
        "## Hand-off overhead\n", body["handoff"],
        "## Head of line\n", body["hol"],
        "## Pool-thread scheduling\n", body["policy"],
        "## CPU throughput (sort)\n", body["throughput"],
        "## Memory\n", body["memory"],
        "## WAF: Lua + PCRE against Rust's regex\n", body["waf"],
        "## Errors, crashes and log lines\n", md_problems(res),
        "## Plots\n",
        "\n".join(f"![{p}]({p})" for p in images) + "\n",
    ]
    # The written analysis (bounds, profiles, what each optimisation did)
    # is kept by hand next to the generated numbers.
    analysis = Path(__file__).resolve().parent / "ANALYSIS.md"
    if analysis.exists():
        doc.append(analysis.read_text())
    (out_dir / "REPORT.md").write_text("\n".join(doc))


if __name__ == "__main__":
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "out/results.json"
    render(json.loads(src.read_text()), Path(__file__).resolve().parent)
