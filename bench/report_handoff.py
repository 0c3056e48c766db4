"""The hand-off section of make bench's report, and its Rust pool rows
(report.py renders them)."""

import rust_pool
from cells import HANDOFF_C, HANDOFF_VARIANTS, LARGE_PAYLOADS, PAYLOADS, SMALL_PAYLOADS
from figures import (LABEL, PAYLOAD_LABEL, cell_stats, f_num, f_ratio, f_spread,
                     handoff_stats, md_others, overhead, ratio, table)


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
