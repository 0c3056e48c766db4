"""The updates section of make bench's report and its plot (report.py
renders them; run_updates.py measures): how soon a live update reaches
every thread of every worker at full load, what it costs the event loop,
the tasks that failed meanwhile, and the workers' RSS over many updates."""

from collections import Counter

from figures import f_num, f_range, median, table

# Every target of the section starts so: report.splice finds its rows.
TARGET_PREFIX = "live updates: "
# Allowed RSS growth per worker from the 100th update to the last.
RSS_BOUND_MIB = 4
# The update after which RSS should stay flat.
RSS_FROM = 100
PLOT = "updates.png"
LOAD_LABEL = {"sleep": "tasks sleeping", "spin": "tasks spinning"}


def percentile(xs, q):
    """The q-th percentile (nearest rank) of xs, None when empty."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    return xs[min(len(xs) - 1, max(0, -(-len(xs) * q // 100) - 1))]


def reach_ms(row):
    """ms from an update's call to the last thread of every worker moving
    to it: the largest of the workers' update_seconds."""
    secs = row.get("seconds")
    return max(secs.values()) * 1000 if secs and row.get("threads_at") == row.get(
        "threads") else None


def worker_ms(row, caller):
    """The caller's worker's update_seconds and the other's, in ms."""
    secs = row.get("seconds") or {}
    mine = secs.get(str(caller))
    other = [v for w, v in secs.items() if w != str(caller)]
    return (None if mine is None else mine * 1000, max(other) * 1000 if other else None)


def reach_row(label, rows, cell):
    reach = [reach_ms(r) for r in rows]
    mine, other = zip(*[worker_ms(r, r.get("worker")) for r in rows]) if rows else ((), ())
    caller = [r["wall_us"] / 1000 for r in rows if r.get("version")]
    runs = cell["runs"].values()
    run_ms = median(w["run_ms"] for w in runs)
    busy = median(w["busy"] for w in runs)
    return [label, len(rows), f_num(percentile(reach, 50)), f_num(percentile(reach, 99)),
            f_num(max((x for x in reach if x is not None), default=None)),
            f_num(percentile(mine, 50)), f_num(percentile(other, 50)),
            f_num(percentile(caller, 50)), f_num(percentile(caller, 99)),
            f_num(run_ms), "–" if busy is None else f"{busy * 100:.0f} %"]


def cpu_figures(rounds):
    """Per round of pairs: the caller's event-loop CPU µs per update beyond
    the dry request's, and the update threads'."""
    return ([(r["update_loop_us"] - r["dry_loop_us"]) / r["pairs"] for r in rounds if r["pairs"]],
            [(r["update_threads_us"] - r["dry_threads_us"]) / r["pairs"] for r in rounds
             if r["pairs"]])


def outside_cores(rows, i=None, before=1.0):
    """The cores processes other than the bench's took: over the whole
    series, or in the `before` seconds up to update i."""
    rows = [r for r in rows if "outside_cpu_s" in r]
    if len(rows) < 2:
        return None
    if i is None:
        a, b = rows[0], rows[-1]
    else:
        b = rows[i]
        a = next((r for r in rows if r["t"] >= b["t"] - before), rows[0])
    if b["t"] <= a["t"]:
        return None
    # per-process and machine ticks are counted apart: a quiet machine can
    # come out a little below 0
    return max(0.0, (b["outside_cpu_s"] - a["outside_cpu_s"]) / (b["t"] - a["t"]))


def md_late(label, rows, bound):
    """A line on the updates later than bound: when, and what the rest of
    the machine took then."""
    late = [i for i, r in enumerate(rows) if (reach_ms(r) or 0) > bound]
    if not late:
        return None
    near = [outside_cores(rows, i) for i in late]
    which = ", ".join(str(rows[i]["version"]) for i in late[:8]) + (", ..." if len(late) > 8
                                                                      else "")
    return (f"- {label}: {len(late)} of {len(rows)} beyond {bound} ms "
            f"(update{'s' if len(late) > 1 else ''} {which}), at "
            f"{f_num(rows[late[0]]['t'])}–{f_num(rows[late[-1]]['t'])} s into the series; "
            f"other processes took {f_range(near)} cores in the second before them, "
            f"{f_num(outside_cores(rows))} over the series")


def failure_row(label, cell):
    rows = cell["updates"]
    wrk = cell.get("wrk") or {}
    sock = sum(wrk.get(k, 0) for k in ("connect", "read", "write", "timeout"))
    pool = sum(cell["failures"].values())
    split = sum(n for k, n in cell["errors"].items() if "two updates" in k)
    other = sum(cell["errors"].values()) - split
    not_confirmed = sum(1 for r in rows if not r.get("version") or r.get("err"))
    return [label, len(rows), not_confirmed, f"{wrk.get('requests', 0):,}",
            wrk.get("status", 0), sock, pool, split, other], \
        wrk.get("status", 0) + sock + pool + split + other


def slope(ys):
    """The least-squares slope of ys (KiB) by index: KiB per update."""
    n = len(ys)
    if n < 2:
        return None
    mx, my = (n - 1) / 2, sum(ys) / n
    return sum((i - mx) * (y - my) for i, y in enumerate(ys)) / sum((i - mx) ** 2 for i in range(n))


def rss_rows(cell):
    """Per worker: RSS MiB at the start, after update RSS_FROM (or the
    first), at the end, the largest, and the end's growth over the
    RSS_FROM-th."""
    rows, growth = [], {}
    series = [r["rss_kib"] for r in cell["updates"] if "rss_kib" in r]
    if not series:
        return rows, growth
    at = series[min(RSS_FROM, len(series)) - 1]
    for pid, start in cell["rss_start_kib"].items():
        xs = [s[pid] for s in series]
        who = "caller's" if int(pid) == cell["caller_pid"] else "other"
        g = (xs[-1] - at[pid]) / 1024
        growth[who] = g
        rows.append([f"{who} worker", f"{start / 1024:.1f}", f"{at[pid] / 1024:.1f}",
                     f"{xs[-1] / 1024:.1f}", f"{max(xs) / 1024:.1f}",
                     f"{(xs[-1] - start) / 1024:+.2f}", f"{g:+.2f}",
                     f_num(slope(xs[min(RSS_FROM, len(xs)) - 1:]))])
    return rows, growth


def md_log(u):
    """Dead workers and the log lines at warn or worse, grouped."""
    out = []
    if not u.get("alive", True):
        out.append("- a worker process died during the section (see the lines below)")
    c = Counter(line.split("] ", 1)[-1].split(": ", 1)[-1][:300] for line in u.get("log", [])
                if "[notice]" not in line)
    out += [f"- ×{n} `{msg}`" for msg, n in c.most_common(10)]
    return ("Problems:\n\n" + "\n".join(out) + "\n") if out else \
        "No worker died; no error.log line at warn or worse.\n"


def md_updates(res, targets):
    u = res.get("updates")
    if not u:
        failed = res.get("failures", {}).get("updates")
        return f"Failed: `{failed['error']}`.\n" if failed else "Not run.\n"
    plan = res["plan"]
    cells = u["cells"]
    task = u["task_ms"]
    bound = task + 10
    out = [
        f"One nginx of {u['workers']} workers (`listen ... reuseport`), its Lua pool `upd` of "
        f"{u['threads']} threads in each (bench/lua/bench_updates.lua: a task runs {task} ms, "
        "sleeping in `usleep` or spinning on the clock; the update chunk replaces the "
        f"thread's state), under wrk on {u['conns']} connections (every thread busy, "
        f"{u['conns'] // (u['workers'] * u['threads'])} tasks per thread in flight), after "
        "a 2 s warm-up. Updates come one after another from one keep-alive connection (so "
        "from one worker), each `update_opts({ wait = 5 }, n)` and a random pause of up to "
        f"{task} ms; after each, the status page (`thread_pool_status`) gives every "
        "worker's `update_seconds` (from the update's call to the last of its threads "
        "moving to it) and every thread's version. *Every thread* is the larger of the "
        "two workers' `update_seconds`; *the caller's wait* is update_opts's time in "
        "the caller, which polls every 1, 2, 4, then 10 ms (lua/resty/threadpool.lua) and "
        "so returns later than the threads moved. The rule-set rows are the RSS cell's "
        f"(a fresh nginx, tasks sleeping): {u['strings']:,} strings of ~60 bytes per update, "
        f"every {u['code_every']}th with new handler code too (each thread then builds a new "
        "Lua state). Task run and busy: from the pool's run histogram over the cell, "
        "medians over workers.\n",
    ]
    rows = []
    for kind in ("sleep", "spin"):
        c = cells.get(kind)
        if c:
            rows.append(reach_row(LOAD_LABEL[kind], c["updates"], c))
    rss = cells.get("rss")
    if rss:
        plain = [r for r in rss["updates"] if not r["code"]]
        code = [r for r in rss["updates"] if r["code"]]
        rows.append(reach_row(f"rule set, {LOAD_LABEL['sleep']}", plain, rss))
        rows.append(reach_row(f"rule set + new code, {LOAD_LABEL['sleep']}", code, rss))
    out.append(table(["updates", "n", "every thread p50 ms", "p99 ms", "max ms",
                      "caller's worker p50 ms", "other worker p50 ms",
                      "caller's wait p50 ms", "p99 ms", "task run ms", "threads busy"], rows))
    late = []
    for label, key, pick in ((LOAD_LABEL["sleep"], "sleep", None),
                             (LOAD_LABEL["spin"], "spin", None),
                             ("rule set", "rss", False), ("rule set + new code", "rss", True)):
        c = cells.get(key)
        line = c and md_late(label, [r for r in c["updates"] if pick is None
                                     or r["code"] == pick], bound)
        if line:
            late.append(line)
    if late:
        out.append(f"Updates that took longer than the target ({bound} ms), and the cores "
                   "that processes other than the bench's (nginx, wrk, run.py) took from "
                   "the machine meanwhile (/proc/stat less theirs, stolen time included; "
                   "median [min–max] over the late updates):\n\n" + "\n".join(late) + "\n")
    for label, key, pick in ((f"{LOAD_LABEL['sleep']}", "sleep", None),
                             (f"{LOAD_LABEL['spin']}", "spin", None),
                             (f"rule set of {u['strings']:,} strings", "rss", False),
                             ("rule set + new code", "rss", True)):
        c = cells.get(key)
        if not c:
            continue
        reach = [reach_ms(r) for r in c["updates"] if pick is None or r["code"] == pick]
        p99 = percentile(reach, 99)
        missing = sum(1 for x in reach if x is None)
        targets.append((f"{TARGET_PREFIX}every thread of both workers runs an update within "
                        f"one task run + 10 ms ({bound} ms), p99, {label}",
                        f"p99 {f_num(p99)} ms, p50 {f_num(percentile(reach, 50))} ms, "
                        f"max {f_num(max((x for x in reach if x is not None), default=None))} "
                        f"ms over {len(reach)}"
                        + (f"; {missing} not reached by every thread" if missing else ""),
                        None if p99 is None else (p99 <= bound and not missing)))

    out.append("The event loop's CPU per update. *The call*: the caller's "
               "CLOCK_THREAD_CPUTIME_ID around each `update` call (bench_updates.lua's "
               f"/upd/cost: {plan['upd_cost']} calls without waiting, one every 2 ms, under "
               "the same load), with a version number or the rule set as arguments. "
               "*With the wait*: pairs of requests from the caller, one an update that waits "
               "for every thread, the other the same request without the update (dry), "
               "paced to last as long, the two in turns first; the caller's worker's "
               "event-loop thread CPU time (/proc schedstat) during each; per update, the "
               "sum over the updates less the sum over the dry ones, divided by the pairs: "
               "the call, the wait's polls and what else an update makes the event loop do "
               f"(the load's tasks served meanwhile cancel out); median [min–max] of "
               f"{plan['upd_cpu_rounds']} round(s) of {plan['upd_cpu_secs']} s. *Update "
               "threads*: the CPU of both workers' update threads (`tp updates`) per "
               "update, the same way. No target: figures to watch.\n")
    rows = []
    for kind in ("sleep", "spin"):
        c = cells.get(kind)
        if not c:
            continue
        small, big = c["cost"].get("0"), c["cost"].get(str(u["strings"]))
        loop, threads = cpu_figures(c["cpu"])
        rows.append([LOAD_LABEL[kind],
                     f"{f_num(small['p50_us'])} / {f_num(small['p99_us'])}" if small else "–",
                     f"{f_num(big['p50_us'])} / {f_num(big['p99_us'])}" if big else "–",
                     f_range(loop), f_range(threads),
                     f_num(median(r["pairs"] for r in c["cpu"]))])
    out.append(table(["load", "the call, version only: p50 / p99 µs",
                      f"the call, {u['strings']:,} strings: p50 / p99 µs",
                      "with the wait µs/update", "update threads µs/update",
                      "pairs per round"], rows))

    out.append("Failures while updating: updates whose wait did not confirm every thread "
               "(an error or the timeout), what wrk counted (requests, non-2xx answers, "
               "socket errors), the pool's failure counters over the cell (task errors, "
               "rejected, timed out, abandoned, overloaded, expired, failed updates: "
               "the status page, both workers), the tasks the handler saw run across two "
               "updates (answered 503) and the other push failures the handler counted.\n")
    rows, failed = [], 0
    for label, key in ((LOAD_LABEL["sleep"], "sleep"), (LOAD_LABEL["spin"], "spin"),
                       ("rule sets (RSS cell)", "rss")):
        c = cells.get(key)
        if c:
            row, n = failure_row(label, c)
            rows.append(row)
            failed += n
    out.append(table(["cell", "updates", "not confirmed", "wrk requests", "non-2xx",
                      "socket errors", "pool failure counters", "tasks split", "other"],
                     rows))
    errs = {k: n for c in cells.values() for k, n in c["errors"].items()}
    if errs:
        out.append("The handler's failures: " + "; ".join(f"`{k}` ×{n}" for k, n in errs.items())
                   + "\n")
    total = sum(len(c["updates"]) for c in cells.values())
    targets.append((f"{TARGET_PREFIX}no task fails while updates are made (0)",
                    f"{failed} over {total:,} updates", failed == 0))

    if rss:
        rows, growth = rss_rows(rss)
        n = len(rss["updates"])
        out.append(f"RSS of each worker (VmRSS) over the RSS cell's {n:,} updates: before the "
                   f"first (after the warm-up), after the {min(RSS_FROM, n)}th, after the last, "
                   "the largest after any, the growth from the start and from the "
                   f"{min(RSS_FROM, n)}th to the end (target: within {RSS_BOUND_MIB} MiB), "
                   f"and the least-squares slope from the {min(RSS_FROM, n)}th on (what a "
                   "longer series would add per update if it did not level off).\n")
        out.append(table(["worker", "start MiB", f"after {min(RSS_FROM, n)} MiB", "end MiB",
                          "max MiB", "end − start MiB", f"end − after {min(RSS_FROM, n)} MiB",
                          "KiB per update"], rows))
        worst = max(growth.values(), default=None)
        targets.append((f"{TARGET_PREFIX}worker RSS flat over {n:,} updates of a "
                        f"{u['strings']:,}-string rule set: growth from the "
                        f"{min(RSS_FROM, n)}th to the last ≤ {RSS_BOUND_MIB} MiB",
                        ", ".join(f"{w}: {g:+.2f} MiB" for w, g in growth.items()),
                        None if worst is None else worst <= RSS_BOUND_MIB))
    out.append(md_log(u))
    return "\n".join(out)


def plot_updates(res, out_dir, plt, note):
    """Per update: the time until every thread ran it, by cell; the
    workers' RSS over the RSS cell's updates."""
    u = res.get("updates")
    if not u:
        return
    cells = u["cells"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.2))
    for key, label in (("sleep", LOAD_LABEL["sleep"]), ("spin", LOAD_LABEL["spin"]),
                       ("rss", "rule sets, " + LOAD_LABEL["sleep"])):
        c = cells.get(key)
        if not c:
            continue
        xs = [(i + 1, reach_ms(r)) for i, r in enumerate(c["updates"])]
        xs = [(i, y) for i, y in xs if y is not None]
        ax1.plot([i for i, _ in xs], [y for _, y in xs], ".", markersize=3, label=label)
    ax1.axhline(u["task_ms"] + 10, color="tab:red", linestyle="--",
                label=f"target: task run + 10 ms ({u['task_ms'] + 10} ms)")
    ax1.set_yscale("log")
    ax1.set_xlabel("update")
    ax1.set_ylabel("ms until every thread ran it")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)
    rss = cells.get("rss")
    if rss:
        series = [r["rss_kib"] for r in rss["updates"] if "rss_kib" in r]
        for pid, start in rss["rss_start_kib"].items():
            who = "caller's worker" if int(pid) == rss["caller_pid"] else "other worker"
            ax2.plot(range(0, len(series) + 1), [start / 1024] + [s[pid] / 1024 for s in series],
                     label=who)
        ax2.set_xlabel("update")
        ax2.set_ylabel("VmRSS MiB")
        ax2.grid(True, alpha=0.3)
        ax2.legend(fontsize=8)
        ax2.set_title(f"rule sets of {u['strings']:,} strings")
    fig.suptitle(f"Live updates, {u['workers']} workers × {u['threads']} threads at full load"
                 + note)
    fig.tight_layout()
    fig.savefig(out_dir / PLOT, dpi=80)
    plt.close(fig)
