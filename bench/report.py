#!/usr/bin/python3
"""Writes bench/REPORT.md and the PNG plots from the results of run.py.

  /usr/bin/python3 bench/report.py [bench/out/results.json]
  /usr/bin/python3 bench/report.py --splice bench/out/results-updates.json

re-renders without running anything; --splice puts the sections of a run
of them alone (run.py --sections ... --splice) into the REPORT.md there is.
"""

import json
import sys
from collections import Counter
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ beside the sources
from cells import THROUGHPUT_C, VARIANTS, WAF_VARIANTS  # noqa: E402
from figures import (LABEL, WAF_LABEL, f_num, f_ratio, mark, median,  # noqa: E402
                     ratio, table, waf_stats, wrk_agg)
from plots import PLOTS, plots, section_plots  # noqa: E402
from report_handoff import md_handoff  # noqa: E402
from report_stream import md_stream  # noqa: E402
from report_updates import TARGET_PREFIX as UPDATES_TARGETS  # noqa: E402
from report_updates import md_updates  # noqa: E402


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
    rerun = res.get("rerun")
    if rerun:
        lines.append(f"- Section **{rerun['section']}** is from a run of it alone "
                     f"(`bench/run.py --sections {rerun['section']}`), started "
                     f"{rerun['started']}, load average {' '.join(rerun['loadavg_start'])} "
                     "before: it failed in the run above, and was fixed")
    return "\n".join(lines) + "\n"


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


def md_mechanisms(res, targets):
    m = res.get("mechanisms")
    if not m:
        return "Not run.\n"
    n = m["tasks"]
    out = [f"A caller pushing {n:,} trivial tasks one after another to a pool of one "
           "thread (after 100 to warm up), per run: the event loop's sleeps (voluntary "
           "context switches of its thread: waits in epoll_wait) and the pool thread's "
           "write system calls (the eventfd). The event loop polls for a completion "
           "before it sleeps, and the pool thread writes the eventfd only while the "
           "event loop sleeps (src/handoff/notify.rs): without them both are one per "
           "task. The poll stops while completions come late, as on a busy machine "
           "(the cores other processes took are given), so these figures are "
           "`make bench`'s, not a test's.\n"]
    rows = [(i + 1, r["sleeps"], f"{r['sleeps'] / n:.3f}", r["writes"],
             f"{r['writes'] / n:.3f}", f_num(r.get("others_cores")))
            for i, r in enumerate(m["poll"])]
    out.append(table(["run", "event-loop sleeps", "per task", "pool-thread writes",
                      "per task", "others' cores"], rows))
    sleeps = median(r["sleeps"] / n for r in m["poll"])
    writes = median(r["writes"] / n for r in m["poll"])
    targets.append(("sequential push_task: event-loop sleeps per task under 0.9 "
                    "(the poll takes the completions)", f"{sleeps:.3f} (median of runs)",
                    sleeps < 0.9))
    targets.append(("sequential push_task: pool-thread eventfd writes per task under 0.5",
                    f"{writes:.3f} (median of runs)", writes < 0.5))
    c = m["cancel"]
    late = sorted(c["late_us"] or [])
    mid = median(late)
    out.append(f"A handler spinning on `cancelled()` while its caller's 20 ms timeout "
               f"runs out, {c['trials']} trials: it saw the flag {f_num(mid)} µs after "
               f"the caller's timeout returned in the median, "
               f"{f_num(late[0] if late else None)}–{f_num(late[-1] if late else None)} µs; "
               f"{c['missed']} tasks not run (taken after the timeout) or never seen "
               "(negative: seen before the caller's call returned, the flag being set "
               "just before). "
               "The tests check only that no look after the timeout misses the flag.\n")
    targets.append(("cancelled() seen within 1 ms of the caller's timeout (median)",
                    f"{f_num(mid)} µs", None if mid is None else mid < 1000))
    cost = m["cost"]
    out.append(f"`cancelled()` in a JIT-compiled loop of 10,000,000 calls in a pool "
               f"thread: {f_num(cost['ns'])} ns of the thread's CPU per call, loop "
               f"included ({cost['seen']} saw the flag set).\n")
    targets.append(("cancelled() under 50 ns per call (thread CPU)",
                    f"{f_num(cost['ns'])} ns", cost["ns"] < 50))
    runs = m.get("refuse") or []
    if runs:
        rows = [(i + 1, f"{r['calls']:,}", sum(r["other"].values()), f_num(r["p50_us"]),
                 f_num(r["p99_us"]), f_num(r["max_us"])) for i, r in enumerate(runs)]
        out.append("Deadline-aware admission: `push_task_timeout(0.45)` on that pool while "
                   "12 tasks of 50 ms wait (an expected wait of ~0.6 s), so that each is "
                   "refused with \"overloaded\"; the event loop's CPU time "
                   "(CLOCK_THREAD_CPUTIME_ID) in each call, per run. Under load, "
                   "bench/OVERLOAD.md counts the same in the overload cells.\n")
        out.append(table(["run", "calls", "not refused", "p50 µs", "p99 µs", "max µs"], rows))
        worst = max(r["max_us"] for r in runs)
        targets.append(("a push refused as \"overloaded\" costs the event loop under "
                        "1 ms (max of every call)", f"{f_num(worst)} µs (p50 "
                        f"{f_num(median(r['p50_us'] for r in runs))} µs)", worst < 1000))
    return "\n".join(out)


# The sections whose results keep their nginx's log lines and whether
# its worker lived (the memory section keeps a log per nginx).
LOGGED = ("handoff", "hol", "throughput", "waf", "mechanisms", "stream")


def md_problems(res):
    """Everything that went wrong: failed sections, crashed workers and
    the error.log lines, grouped."""
    out = []
    for s, f in res.get("failures", {}).items():
        out.append(f"- Section **{s}** failed: `{f['error']}`")
        out += [f"  - `{line[:300]}`" for line in f["log"][-10:]]
    for s in LOGGED:
        sec = res.get(s)
        if sec and not sec.get("alive", True):
            out.append(f"- Section **{s}**: the worker process died during the run "
                       "(see the log lines below)")
    logs = {}
    for s in LOGGED:
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


# ---- the report --------------------------------------------------------------

# The hand-off section as `make bench-trixie` measured it on Debian 13
# (lua-nginx-module 0.10.28 and its run_worker_thread), kept beside the
# report so that the next native run shows it again.
OTHER_RELEASE = "results-debian13.json"


def md_other_release(out_dir):
    path = Path(out_dir) / OTHER_RELEASE
    if not path.exists():
        return []
    other = json.loads(path.read_text())
    targets = []
    body = md_handoff(other, targets)
    return [
        "## Debian 13: the hand-off on lua-nginx-module 0.10.28\n",
        f"`make bench-trixie`: the hand-off section in the Debian 13 chroot (README, "
        f"\"Support\"), against that release's ngx.run_worker_thread; compare its "
        f"ratios with this report's, not its times (another run, another hour). "
        f"From bench/{OTHER_RELEASE}.\n",
        md_machine(other),
        table(["target", "measured", "status"],
              [(t, m, mark(ok)) for t, m, ok in targets]) if targets else "No target ran.\n",
        body,
    ]


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
        "mechanisms": md_mechanisms(res, targets),
        "stream": md_stream(res, targets),
        "updates": md_updates(res, targets),
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
        "## Mechanisms: the event loop's poll, cancellation\n", body["mechanisms"],
        "## Streams: a large output streamed or whole\n", body["stream"],
        SPLICED["updates"][0], body["updates"],
        "## Errors, crashes and log lines\n", md_problems(res),
        *md_other_release(out_dir),
        "## Plots\n",
        "\n".join(f"![{p}]({p})" for p in images) + "\n",
    ]
    # The written analysis (bounds, profiles, what each optimisation did)
    # is kept by hand next to the generated numbers.
    analysis = Path(__file__).resolve().parent / "ANALYSIS.md"
    if analysis.exists():
        doc.append(analysis.read_text())
    (out_dir / "REPORT.md").write_text("\n".join(doc))


# The sections a run of them alone can put into the report there is
# (splice): their heading, what renders them, and how their targets begin.
SPLICED = {"updates": ("## Live updates: how soon, at what cost, memory\n", md_updates,
                       UPDATES_TARGETS)}
ERRORS_HEADING = "## Errors, crashes and log lines\n"


def section_span(doc, heading, before):
    """Where the section `heading` of doc starts and ends; where `before`
    starts (both) when doc has no such section."""
    start = doc.find(heading)
    if start < 0:
        start = doc.index(before)
        return start, start
    return start, doc.index("\n## ", start) + 1


def splice(res, out_dir):
    """Puts the sections of res (a run of some of SPLICED alone) into the
    REPORT.md there is: each section's text, its rows of the targets
    table (in place of the ones it had), a line under the machine that
    says when and where it ran, and its plot. The rest stays."""
    out_dir = Path(out_dir)
    report = Path(out_dir) / "REPORT.md"
    doc = report.read_text()
    names = section_plots(res, out_dir, [s for s in res["sections"] if s in SPLICED])
    m = res["machine"]
    for s in res["sections"]:
        heading, md, prefix = SPLICED[s]
        targets = []
        body = md(res, targets)
        start, end = section_span(doc, heading, ERRORS_HEADING)
        doc = doc[:start] + heading + "\n" + body + "\n" + doc[end:]
        # its targets: the rows it had go, its rows come where the first
        # was, or at the end of the table
        lines = doc.split("\n")
        head = lines.index("## Targets")
        first = next(i for i in range(head + 1, len(lines)) if lines[i].startswith("|---"))
        last = next(i for i in range(first + 1, len(lines)) if not lines[i].startswith("| "))
        rows = lines[first + 1:last]
        old = [i for i, r in enumerate(rows) if r.startswith("| " + prefix)]
        at = old[0] if old else len(rows)
        rows = [r for r in rows if not r.startswith("| " + prefix)]
        rows[at:at] = [f"| {t} | {measured} | {mark(ok)} |" for t, measured, ok in targets]
        lines[first + 1:last] = rows
        # the line under the machine's
        note = (f"- Section **{s}** is from a run of it alone (`bench/run.py --sections {s} "
                f"--splice`, {res['mode']}), started {res['started']}, {res['seconds']} s, "
                f"load average {' '.join(res['loadavg_start'])} before, "
                f"{' '.join(res['loadavg_end'])} after; module at {m['commit']}")
        mine = [i for i, line in enumerate(lines) if line.startswith(f"- Section **{s}** ")]
        if mine:
            lines[mine[0]] = note
        else:
            targets_at = lines.index("## Targets")
            while not lines[targets_at - 1].startswith("- "):
                targets_at -= 1
            lines.insert(targets_at, note)
        doc = "\n".join(lines)
    for name in names:
        if f"]({name})" not in doc:
            end = doc.index("\n## ", doc.index("## Plots\n"))
            doc = doc[:end] + f"![{name}]({name})\n" + doc[end:]
    report.write_text(doc)


def splice_other_release(out_dir):
    """Puts the Debian 13 section into the REPORT.md there is, in place of
    the one it has or before its plots: for a machine that holds no
    results of its own run."""
    report = Path(out_dir) / "REPORT.md"
    doc = report.read_text()
    section = "\n".join(md_other_release(out_dir))
    start = doc.find("## Debian 13: ")
    if start < 0:
        start = end = doc.index("## Plots\n")
    else:
        end = doc.index("\n## ", start) + 1
    report.write_text(doc[:start] + section + "\n" + doc[end:])


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    args = sys.argv[1:]
    if args[:1] == ["--splice"] and len(args) == 2:
        splice(json.loads(Path(args[1]).read_text()), here)
        sys.exit(0)
    src = Path(args[0]) if args else here / "out/results.json"
    if src.exists():
        render(json.loads(src.read_text()), here)
    else:
        splice_other_release(here)
