"""The numbers of make bench's report and how they are written: labels,
per-task figures, medians, ratios and tables, shared by report.py, the
sections it renders (report_handoff.py, plots.py) and compare.py."""

import math
import statistics

import rust_pool

LABEL = {"inline": "inline", "rwt": "run_worker_thread", "tp": "push_task",
         "tpb": "push_tasks ×64", "tpc": "push_task, copying",
         "tpp": "post_task", rust_pool.VARIANT: "push_task, Rust pool"}
PAYLOAD_LABEL = {"16": "16 B", "512": "512 B", "1024": "1 KiB", "65536": "64 KiB",
                 "1048576": "1 MiB", "table": "table (1,000 entries)"}
WAF_LABEL = {"none": "no scan (request table only)", "inline": "Lua + PCRE, inline",
             "tp": "Lua + PCRE, push_task", "rust": "Rust regex, push_task"}


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


def f_range(xs):
    """Figures of several rounds: their median, and [min–max] for more
    than one."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return "–"
    return f_num(median(xs)) + (f" [{f_num(min(xs))}–{f_num(max(xs))}]" if len(xs) > 1 else "")


def f_spread(s, k):
    """Figure k of a cell: its median, and the [min–max] of its rounds."""
    return f_range(r[k] for r in s["rounds"]) if s else "–"


def table(head, rows):
    out = ["| " + " | ".join(head) + " |",
           "|" + "|".join("---:" if i else "---" for i in range(len(head))) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


def mark(ok):
    if ok is None:
        return "**n/a**"
    return "**met**" if ok else "**missed**"


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
