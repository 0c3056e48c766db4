"""Writes bench/FAIRNESS.md and bench/fairness_*.png from fairness.py's
results (also: python3 bench/fairness_report.py re-renders
bench/out/fairness.json)."""

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent

TALK = """The talk (120 workers direct against 20 workers x 6 threads; 100/200/400
connections; 10 s timeout), thumbnails timed out:

| mode | 100 | 200 | 400 |
|------|-----|-----|-----|
| Thread | 0.00 % | 20.83 % | 67.51 % |
| Thread + reuseport | 0.00 % | 0.11 % | 14.87 % |
| Direct (inline) | 0.07 % | 0.15 % | 0.69 % |
"""


def ms(x):
    return "-" if x is None else f"{x:.0f}"


def spread(xs, fmt):
    """Per-worker values: all of them for a few workers, else min/median/max."""
    if len(xs) <= 6:
        return "/".join(fmt(x) for x in xs)
    s = sorted(xs)
    return f"{fmt(s[0])} .. {fmt(s[len(s) // 2])} .. {fmt(s[-1])} (min..med..max)"


def table(rows):
    out = ["| mode | load (conns) | thumb timeouts | static timeouts | thumb/s "
           "| thumb p50/p99 ms | static p50/p99 ms | accepted % per worker "
           "| in flight mean (max) per worker |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t, s = r["thumb"], r["static"]
        acc_total = sum(r["acc"]) or 1
        acc = spread([100 * a / acc_total for a in r["acc"]], lambda x: f"{x:.0f}")
        fly = spread(list(zip(r["fly_mean"], r["fly_max"])),
                     lambda p: f"{p[0]:.1f} ({p[1]})")
        out.append(
            f"| {r['mode']} | {r['load']}x ({r['conns']}) "
            f"| {t['timeout_pct']:.2f} % | {s['timeout_pct']:.2f} % "
            f"| {t['per_sec']:.0f} | {ms(t['p50'])}/{ms(t['p99'])} "
            f"| {ms(s['p50'])}/{ms(s['p99'])} | {acc} | {fly} |")
    return "\n".join(out)


def plots(results):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    sim = [r for r in results if r["kind"] == "sim"]
    modes = list(dict.fromkeys(r["mode"] for r in sim))
    made = []
    for fname, title, key, ylabel in (
            ("fairness_timeouts.png", "Thumbnail timeouts by load",
             lambda r: r["thumb"]["timeout_pct"], "thumbnails timed out (%)"),
            ("fairness_static.png", "Static p99 latency by load",
             lambda r: r["static"]["p99"] or 0, "static p99 (ms)")):
        fig, ax = plt.subplots(figsize=(7, 4))
        for m in modes:
            rows = [r for r in sim if r["mode"] == m]
            ax.plot([r["load"] for r in rows], [key(r) for r in rows],
                    marker="o", label=m)
        ax.set_xlabel("connections / threads")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(BENCH / fname, dpi=90)
        plt.close(fig)
        made.append(fname)
    return made


def write(meta, results):
    sim = [r for r in results if r["kind"] == "sim"]
    real = [r for r in results if r["kind"] == "real"]
    images = plots(results)
    sim_to = sim[0]["timeout_ms"] if sim else 0
    real_to = real[0]["timeout_ms"] if real else 0
    parts = [
        "# Fairness across workers: the talk's timeout table, scaled",
        "",
        f"Written by `make fairness` ({'QUICK=1 smoke run' if meta['quick'] else 'full run'}, "
        f"{meta['date']}, {meta['cpus']} CPUs, Linux {meta['kernel']}, load average at the end "
        f"{', '.join(f'{x:.1f}' for x in meta['load_avg'])}). Raw numbers: "
        "`bench/out/fairness.json`.",
        "",
        TALK,
        "## Set-up",
        "",
        f"- Thread modes: 4 workers x 6 threads (24 threads); Direct: 24 workers, the "
        "talk's \"as many workers as threads\" (120 against 20 x 6), so that both have "
        "the same capacity.",
        f"- The task sleeps {meta['service_ms']} ms in `usleep` (through `ffi.C.usleep`): "
        "it simulates service time, not CPU, so that 24 busy threads fit on 2 cores. "
        "Capacity: 24 / 50 ms = 480 tasks/s. In Direct mode the sleep blocks the event "
        "loop, as CPU work inline would.",
        "- Closed-loop client (Python asyncio): half the connections request `/task` "
        f"back to back, half request `/static` with a {meta['service_ms']} ms pause; "
        + ("connections are kept (HTTP/1.1 keep-alive), so a connection stays on the "
           "worker that accepted it; " if meta.get("keepalive") else
           "each request on a new connection (HTTP/1.0, KEEPALIVE=0), so every request "
           "is an accept the workers compete for; ")
        + f"a request not answered within {sim_to} ms counts as a "
        "timeout and its connection is closed (a new one replaces it).",
        "- Load: connections as a multiple of the thread count.",
        "- Per worker: connections accepted (a shared-dict counter of first requests, "
        "as % of all), tasks in flight (each worker's count in a shared dict, sampled "
        "every 100 ms: mean and max).",
        "",
        "## Simulated service time",
        "",
        table(sim),
        "",
    ]
    for img in images:
        parts += [f"![{img}]({img})", ""]
    parts += [
        "## The real thumbnail handler (small scale)",
        "",
        "nginx-conf/thumb.lua (1200x800 original to 300x200 with a watermark, "
        "ImageMagick through nginx-conf/magick.lua): Thread modes 2 workers x 2 "
        "threads, Direct 4 workers; load as a multiple of 4; timeout "
        f"{real_to} ms; here the work is CPU, so the 2 cores are the limit.",
        "",
        table(real),
        "",
    ]
    (BENCH / "FAIRNESS.md").write_text("\n".join(parts))


if __name__ == "__main__":
    data = json.loads((BENCH / "out/fairness.json").read_text())
    write(data["meta"], data["results"])
    sys.exit(0)
