"""The stream section of make bench's report and its plot (report.py
renders them): a large output streamed or whole, and the cost of a chunk
against a push_task of the same size."""

import rust_pool
from cells import STREAM_MODES, STREAM_SIZES
from figures import PAYLOAD_LABEL, f_num, f_range, f_ratio, median, table

POOL_LABEL = {"stream_lua": "Lua pool", rust_pool.POOL: "Rust pool"}
MODE_LABEL = {"stream": "streamed", "whole": "whole", "task": "push_task per chunk"}
# The streamed response's peak RSS above the worker's before: the chunks
# in flight (16 unread of 64 KiB, the pool's default) and nginx's output
# buffers, with room for the allocator.
RSS_BOUND_MIB = 8
PLOT = "stream_ttfb.png"


def http_figures(runs):
    """The figures of an HTTP cell's rounds: times in ms, the peak RSS
    growth in MiB, MB/s over the whole response."""
    return dict(ttfb=[r["ttfb_ms"] for r in runs], total=[r["total_ms"] for r in runs],
                rss=[(r["rss_peak_kib"] - r["rss_before_kib"]) / 1024 for r in runs],
                mbs=[r["bytes"] / r["total_ms"] / 1000 for r in runs])


def drain_figures(runs):
    """MB/s and the event loop's CPU µs per chunk of a drain cell's rounds."""
    return dict(mbs=[r["bytes"] / r["elapsed_us"] for r in runs],
                loop=[r["loop_cpu_us"] / r["chunks"] for r in runs])


def md_stream(res, targets):
    s = res.get("stream")
    if not s:
        return "Not run.\n"
    rounds = res["plan"]["stream_rounds"]
    out = [
        f"A {s['mib']} MiB output made in a pool thread in {s['chunk'] // 1024} KiB "
        "chunks (bench/lua/bench_stream.lua, bench/rust-upper) and sent as one "
        "response over loopback: **streamed**, each chunk printed and flushed as "
        "`s:read()` gives it; **whole**, every chunk read and joined first, as a "
        "caller without streams must (one push_task returns at most 16 MiB). "
        "A fresh nginx per cell, so that the worker's peak RSS (VmHWM) is the "
        f"cell's own; {rounds} round(s), pools and modes alternating; medians "
        "[min–max]. Time to the first byte of the response and to its end, "
        "from a client that sends the request on a new connection.\n",
    ]
    rows = []
    for pool, label in POOL_LABEL.items():
        if pool in s["skipped"]:
            rows.append([label, "–", f"left out: {s['skipped'][pool]}", "", "", ""])
            continue
        figs = {m: http_figures(s["http"].get(f"{pool}|{m}", [])) for m in STREAM_MODES}
        for m in STREAM_MODES:
            f = figs[m]
            rows.append([label, MODE_LABEL[m], f_range(f["ttfb"]), f_range(f["total"]),
                         f_range(f["mbs"]), f_range(f["rss"])])
        ttfb = {m: median(figs[m]["ttfb"]) for m in STREAM_MODES}
        ok = None if None in ttfb.values() else ttfb["stream"] <= 0.1 * ttfb["whole"]
        targets.append((f"{label}: time to first byte streamed ≤ 0.1× whole's "
                        f"({s['mib']} MiB)", f"{f_num(ttfb['stream'])} ms against "
                        f"{f_num(ttfb['whole'])} ms", ok))
        rss = median(figs["stream"]["rss"])
        targets.append((f"{label}: peak RSS growth streaming {s['mib']} MiB ≤ "
                        f"{RSS_BOUND_MIB} MiB", f"{f_num(rss)} MiB (whole: "
                        f"{f_num(median(figs['whole']['rss']))} MiB)",
                        None if rss is None else rss <= RSS_BOUND_MIB))
    out.append(table(["pool", "response", "first byte ms", "total ms", "MB/s",
                      "peak RSS growth MiB"], rows))
    out.append(f"Inside nginx, no HTTP: {s['drain_mib']} MiB read as the chunks of one "
               "stream, against the same bytes as one push_task per chunk, one after "
               "another (a round to warm up, then the rounds above). MB/s over the "
               "wall time; the event loop's CPU time (CLOCK_THREAD_CPUTIME_ID) per "
               "chunk or task.\n")
    rows = []
    for pool, label in POOL_LABEL.items():
        if pool in s["skipped"]:
            continue
        for size in STREAM_SIZES:
            f = {m: drain_figures(s["drain"].get(f"{pool}|{m}|{size}", []))
                 for m in ("stream", "task")}
            loop = {m: median(f[m]["loop"]) for m in f}
            r = None if None in loop.values() or not loop["task"] else loop["stream"] / loop["task"]
            rows.append([label, PAYLOAD_LABEL[str(size)], f_range(f["stream"]["mbs"]),
                         f_range(f["task"]["mbs"]), f_range(f["stream"]["loop"]),
                         f_range(f["task"]["loop"]), f_ratio(r)])
            targets.append((f"{label}: event-loop CPU per {PAYLOAD_LABEL[str(size)]} "
                            "chunk ≤ 1.0× a push_task's of the same size",
                            f_ratio(r), None if r is None else r <= 1.0))
    out.append(table(["pool", "chunk", "streamed MB/s", "push_task MB/s",
                      "streamed loop µs/chunk", "push_task loop µs/task",
                      "ratio"], rows))
    out.append("How soon a handler sees its caller let go: waiting in `send` while its "
               "reader, having read one chunk of a stream bound to 1, calls `s:close()`; "
               "waiting in `receive` while its reader's `s:read(0.02)` times out. µs "
               "from the caller's call returning to the handler's `send` or `receive` "
               "returning (CLOCK_MONOTONIC on both sides; negative: before the caller's "
               "call returned, the stream being closed just before), over every trial "
               "of every round. The tests check only that the handler sees it.\n")
    rows = []
    for pool, label in POOL_LABEL.items():
        for how, what in (("close", "s:close(), handler in send"),
                          ("timeout", "read timeout, handler in receive")):
            c = s.get("cancel", {}).get(f"{pool}|{how}")
            if not c:
                continue
            late = c["late_us"]
            mid = median(late)
            rows.append([label, what, len(late), c["missed"], f_range(late)])
            targets.append((f"{label}: a handler waiting in a stream sees its caller's "
                            f"{how} within 1 ms (median)", f"{f_num(mid)} µs",
                            None if mid is None else mid < 1000))
    out.append(table(["pool", "the caller lets go by", "trials", "missed",
                      "µs after, median [min–max]"], rows))
    return "\n".join(out)


def plot_stream(res, out_dir, plt, note):
    """Time to first byte and to the end, streamed against whole, by pool."""
    s = res.get("stream")
    if not s:
        return
    pools = [p for p in POOL_LABEL if p not in s["skipped"]]
    if not pools:
        return
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.2
    for i, pool in enumerate(pools):
        for j, m in enumerate(STREAM_MODES):
            f = http_figures(s["http"].get(f"{pool}|{m}", []))
            x = i + (j - 0.5) * 2 * width
            color = "tab:green" if m == "stream" else "tab:gray"
            ax.bar(x - width / 2, median(f["ttfb"]) or 0, width, color=color,
                   label=f"{MODE_LABEL[m]}: first byte" if i == 0 else None)
            ax.bar(x + width / 2, median(f["total"]) or 0, width, color=color, alpha=0.45,
                   hatch="//", label=f"{MODE_LABEL[m]}: total" if i == 0 else None)
    ax.set_xticks(range(len(pools)), [POOL_LABEL[p] for p in pools])
    ax.set_yscale("log")
    ax.set_ylabel("ms (median)")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(f"{s['mib']} MiB in {s['chunk'] // 1024} KiB chunks: time to first "
                 "byte, streamed vs whole" + note)
    fig.tight_layout()
    fig.savefig(out_dir / PLOT, dpi=80)
    plt.close(fig)
