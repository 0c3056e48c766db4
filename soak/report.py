#!/usr/bin/python3
"""Writes SOAK.md and soak.png from the results of soak.py.

  /usr/bin/python3 soak/report.py [bench/out/soak.json [OUT_DIR]]

re-renders without running anything (OUT_DIR defaults to bench/).
"""

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path


def table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def mib(kib):
    return f"{kib / 1024:.1f}"


def expected_of(res):
    return {k["name"]: set(k["expected"]) for k in res["kinds"]}


def md_requests(res):
    exp = expected_of(res)
    kinds = [k["name"] for k in res["kinds"]]
    by_minute = defaultdict(Counter)     # minute -> (kind, ok|bad) -> n
    totals = Counter()                   # (kind, outcome) -> n
    for m, k, o, n in res["counts"]:
        by_minute[m][(k, "ok" if o in exp[k] else "bad")] += n
        totals[(k, o)] += n
    rows = []
    for m in range(res["minutes"]):
        c = by_minute.get(m, Counter())
        cells = []
        for k in kinds:
            ok, bad = c[(k, "ok")], c[(k, "bad")]
            cells.append(f"{ok}" + (f" **+{bad} bad**" if bad else ""))
        total = sum(c.values())
        rows.append([m + 1, total] + cells)
    out = ["Requests that ended in each minute, by kind: those with an outcome "
           "their kind may give, and **bad** ones (any other).", "",
           table(["min", "all"] + kinds, rows), ""]
    rows = []
    for k in kinds:
        outs = sorted(o for (kk, o) in totals if kk == k)
        rows.append([k, ", ".join(f"{o} {totals[(k, o)]}" + ("" if o in exp[k] else " **(bad)**")
                                  for o in outs) or "none",
                     ", ".join(sorted(exp[k]))])
    out += ["Outcomes over the whole run:", "", table(["kind", "outcomes", "may give"], rows), ""]
    return "\n".join(out)


def md_samples(res):
    rows = []
    by_t = defaultdict(list)
    for s in res["samples"]:
        by_t[s["t"]].append(s)
    lates = [t for t in by_t if by_t[t][0].get("phase") == "late"]
    first = min(lates) if lates else None
    for t in sorted(by_t):
        ss = by_t[t]
        ws = sorted((s for s in ss if s["role"] == "worker"), key=lambda s: s["pid"])
        ms = [s for s in ss if s["role"] == "master"]
        phase = ss[0].get("phase", "")
        cells = [f"{min(int(t // 60) + 1, res['minutes'])}", f"{t:.0f}",
                 f"{ws[0]['gen'] if ws else '-'}",
                 phase + (" (baseline)" if t == first else "")]
        for w in ws[:2]:
            cells.append(f"{w['pid']}: {mib(w['rss_kib'])} MiB, {w['fds']} fds, "
                         f"{w['threads']} thr")
        while len(cells) < 6:
            cells.append("-")
        m = ms[0] if ms else None
        cells.append(f"{mib(m['rss_kib'])} MiB, {m['fds']} fds, {m['threads']} thr" if m else "-")
        if ws and not ws[0].get("quiet", True):
            cells[3] += " (not quiet)"
        rows.append(cells)
    return table(["min", "t (s)", "generation", "sample", "worker A", "worker B", "master"], rows)


def md_bounds(res):
    m = res["measured"]
    b = res["bounds"]
    rows = []
    for role, key in (("worker", "worker_rss_growth_mib"), ("master", "master_rss_growth_mib")):
        x = m.get(role)
        if not x:
            rows.append([f"{role} RSS growth over the run", "no samples", f"≤ {b[key]} MiB", "✗"])
            continue
        ok = x["growth_mib"] <= b[key]
        rows.append([f"{role} RSS growth over the run (late samples, "
                     + ("largest of the serving workers)" if role == "worker" else "master)"),
                     f"{x['growth_mib']:+.1f} MiB ({x['base_rss_mib']:.1f} → "
                     f"{x['peak_rss_mib']:.1f}, {x['samples']} later samples)",
                     f"≤ {b[key]} MiB", "✓" if ok else "✗"])
        for what in ("fds", "threads"):
            changed = x.get(f"{what}_changed", 0)
            rows.append([f"{role} {what}", f"warm-up {', '.join(map(str, x[what]))}; "
                         f"{changed} later samples differ", "constant",
                         "✓" if not changed and len(x[what]) == 1 else "✗"])
    g = m.get("generation")
    if g:
        ok = g["max_growth_mib"] is None or g["max_growth_mib"] <= g["bound_mib"]
        rows.append(["worker RSS growth within a generation (early → late sample)",
                     "no pairs" if g["max_growth_mib"] is None else
                     f"largest {g['max_growth_mib']:+.1f} MiB, median "
                     f"{g['median_growth_mib']:+.1f} MiB ({g['pairs']} workers)",
                     f"≤ {g['bound_mib']} MiB", "✓" if ok else "✗"])
    rows.append(["old workers gone after a reload", "see failures" if any(
        "still running" in f for f in res["failures"]) else "all",
        f"within {b['exit_after_reload_s']} s", "✗" if any(
        "still running" in f for f in res["failures"]) else "✓"])
    return table(["bound", "measured", "limit", ""], rows)


def md_metrics(res):
    keys = ("tasks_pushed_total", "tasks_completed_total", "task_errors_total",
            "tasks_rejected_total", "tasks_timed_out_total", "tasks_abandoned_total",
            "accept_gate_pauses_total", "accepted_connections_total")
    rows = []
    for m in sorted(res["metrics"], key=int):
        s = res["metrics"][m]
        rows.append([int(m) + 1] + [f"{s.get(k, 0):.0f}" for k in keys])
    if not rows:
        return "(no scrape)"
    return table(["min"] + [k.replace("_total", "") for k in keys], rows)


def md_log(res):
    lv = res["log_levels"]
    out = ["Lines by level: " + (", ".join(f"{k} {v}" for k, v in sorted(lv.items())) or "none"),
           ""]
    if res["log_shapes"]:
        out += ["The most frequent lines at warn and above (numbers as N):", "",
                table(["level", "n", "line"],
                      [[lvl, n, "`" + shp.replace("|", "\\|").replace("`", "'") + "`"]
                       for lvl, shp, n in res["log_shapes"]]), ""]
    return "\n".join(out)


def render(res, out_dir):
    out_dir = Path(out_dir)
    mach = res["machine"]
    verdict = "PASS" if res["passed"] else "FAIL"
    reloads = res["reloads"]
    took = [r["took"] for r in reloads if r["took"] is not None]
    md = [
        "# Soak: every feature at once, with reloads",
        "",
        f"**Verdict: {verdict}.** "
        + (f"{len(res['failures'])} failure(s) below." if res["failures"] else
           "No unexpected outcome, no lost request, no fatal or unexpected log line, "
           "every resource bound held."),
        "",
        f"Written by `make soak` (soak/soak.py; docs/testing.md, \"Soak\") on {res['started']}: "
        f"{res['seconds']} s, a reload (HUP) every {res['reload_every']:.0f} s "
        f"({len(reloads)} reloads, new workers serving after "
        + (f"{min(took):.2f}–{max(took):.2f} s" if took else "—")
        + f"), {res['clients']} mixed clients (a mean pause of {res.get('pace', 0.06)} s "
        f"between requests), a kept-alive static client and a "
        f"metrics scraper (every 2 s), seed {res['seed']}. Machine: {mach['nproc']} cores "
        f"({mach['cpu']}), kernel {mach['kernel']}, {mach['nginx']}, "
        f"commit {mach['commit']}, load average at the end {' '.join(mach['loadavg'])}.",
        "",
    ]
    if res.get("injected"):
        md += [f"**Faults injected on purpose** (`--inject`): {', '.join(res['injected'])}.", ""]
    md += [
        "## Failures",
        "",
    ]
    md += [f"* {f}" for f in res["failures"]] or ["None."]
    if res["unexpected"]:
        md += ["", f"Unexpected outcomes ({res['n_unexpected']}; the first "
               f"{len(res['unexpected'])}):", "",
               table(["t (s)", "kind", "outcome", "detail"],
                     [[u["t"], u["kind"], u["outcome"],
                       "`" + u["detail"].replace("|", "\\|").replace("`", "'") + "`"]
                      for u in res["unexpected"]])]
    if res["log_fatal"] or res["log_unexpected"]:
        md += ["", "Log lines that fail the soak:", "", "```"]
        md += [line for _, line in res["log_fatal"]] + res["log_unexpected"][:20]
        md += ["```"]
    md += ["", "## Bounds", "", md_bounds(res), "",
           "Each generation of workers is sampled 10 s after the reload that started "
           "it (early) and just before the next reload or the end (late), with no "
           "request in flight, after a full collection of each worker's event-loop Lua "
           "state and 1 s for idle pool threads to trim. The first generation's late "
           "sample (after 30 s of every kind) is the baseline of the run.", "",
           "## Requests", "", md_requests(res),
           f"Posted `count` tasks: {res['counters']['posted']} queued, "
           f"{res['counters']['posted_done']} ran (queued posts are dropped when a "
           "worker exits at a reload, so fewer may run).", "",
           "## Workers and master", "",
           "RSS, open fds and threads of each serving worker (its pid) and of the "
           "master at each sample; a new generation of workers starts at each reload.",
           "", md_samples(res), "",
           "![RSS, fds, threads and requests per minute](soak.png)", "",
           "## Metrics", "",
           "`thread_pool_status` at the end of each minute (the last scrape; both "
           "workers and every pool, summed; counters start afresh at each reload):",
           "", md_metrics(res), "",
           "## Error log", "", md_log(res),
           "## Request kinds", "",
           table(["kind", "what", "may give", "weight"],
                 [[k["name"], k["what"], ", ".join(k["expected"]), k["weight"] or "own loop"]
                  for k in res["kinds"]]),
           "", "## Configuration", "", "```nginx", res["conf"].rstrip(), "```", ""]
    (out_dir / "SOAK.md").write_text("\n".join(md))
    plot(res, out_dir / "soak.png")


def plot(res, path):
    try:
        import matplotlib
    except ImportError:
        print(f"(no matplotlib: {path.name} not drawn; make bench-deps installs it)")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_rss, ax_fd, ax_req) = plt.subplots(3, 1, figsize=(10, 10))
    samples = res["samples"]
    workers = [s for s in samples if s["role"] == "worker"]
    masters = [s for s in samples if s["role"] == "master"]
    cmap = plt.get_cmap("tab10")
    for i, g in enumerate(sorted({s["gen"] for s in workers})):
        for phase, face in (("early", "none"), ("late", cmap(i % 10))):
            ws = [s for s in workers if s["gen"] == g and s.get("phase", "late") == phase]
            ax_rss.scatter([s["t"] / 60 for s in ws], [s["rss_kib"] / 1024 for s in ws],
                           facecolors=face, edgecolors=cmap(i % 10), s=22)
    ax_rss.scatter([], [], facecolors="none", edgecolors="gray", label="worker, early sample")
    ax_rss.scatter([], [], color="gray", label="worker, late sample")
    ax_rss.plot([s["t"] / 60 for s in masters], [s["rss_kib"] / 1024 for s in masters],
                color="black", marker=".", label="master")
    m = res["measured"].get("worker")
    if m:
        ax_rss.axhline(m["base_rss_mib"] + res["bounds"]["worker_rss_growth_mib"],
                       color="tab:red", linestyle="--", linewidth=1,
                       label="bound over the run (late samples)")
    ax_rss.set_ylabel("RSS (MiB)")
    ax_rss.set_title("RSS: serving workers (a colour per generation) and master")
    ax_rss.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    ax_rss.set_ylim(bottom=0)
    for who, ss, style in (("worker", workers, "o"), ("master", masters, "s")):
        for what, color in (("fds", "tab:blue"), ("threads", "tab:orange")):
            ax_fd.scatter([s["t"] / 60 for s in ss], [s[what] for s in ss], marker=style,
                          facecolors="none" if who == "master" else color,
                          edgecolors=color, s=26, label=f"{who} {what}")
    ax_fd.set_ylabel("count")
    ax_fd.set_title("Open fds and threads per process")
    ax_fd.set_ylim(bottom=0)
    ax_fd.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    for ax in (ax_rss, ax_fd):
        ax.set_xlabel("minutes")
    exp = expected_of(res)
    per = defaultdict(Counter)
    bad = Counter()
    for mnt, k, o, n in res["counts"]:
        per[k][mnt] += n
        if o not in exp[k]:
            bad[mnt] += n
    minutes = list(range(res["minutes"]))
    bottom = [0] * len(minutes)
    for i, k in enumerate(sorted(per, key=lambda k: -sum(per[k].values()))):
        vals = [per[k][mm] for mm in minutes]
        ax_req.bar([mm + 1 for mm in minutes], vals, bottom=bottom, label=k,
                   color=plt.get_cmap("tab20")(i % 20))
        bottom = [a + b for a, b in zip(bottom, vals)]
    if any(bad.values()):
        ax_req.plot([mm + 1 for mm in minutes], [bad[mm] for mm in minutes],
                    color="red", marker="x", label="bad")
    step = max(1, len(minutes) // 15)
    ax_req.set_xticks([mm + 1 for mm in minutes[::step]])
    ax_req.set_xlabel("minute")
    ax_req.set_ylabel("requests")
    ax_req.set_title("Requests by kind and minute")
    ax_req.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7, ncol=2)
    fig.suptitle(f"make soak: {'PASS' if res['passed'] else 'FAIL'}")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


if __name__ == "__main__":
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "bench/out/soak.json"
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).resolve().parent.parent / "bench"
    render(json.loads(src.read_text()), out)
