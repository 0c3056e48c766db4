"""The PNG plots of make bench's report (report.py renders them)."""

import rust_pool
from cells import HANDOFF_C, PAYLOADS, THROUGHPUT_C, VARIANTS, WAF_VARIANTS
from figures import (LABEL, PAYLOAD_LABEL, WAF_LABEL, cell_stats, overhead, waf_stats,
                     wrk_agg)
from report_stream import PLOT as STREAM_PLOT
from report_stream import plot_stream
from report_updates import PLOT as UPDATES_PLOT
from report_updates import plot_updates

COLORS = {"inline": "tab:gray", "rwt": "tab:blue", "tp": "tab:orange",
          "tpc": "tab:red", "tpb": "tab:green", rust_pool.VARIANT: "tab:purple"}
# The variants of the latency and throughput plots.
PLOTTED = VARIANTS + (rust_pool.VARIANT,)
WAF_COLORS = {"none": "tab:gray", "inline": "tab:blue", "tp": "tab:orange", "rust": "tab:red"}

PLOTS = ("handoff_latency.png", "handoff_throughput.png", "handoff_cost.png",
         "hol_latency.png", "sort_throughput.png", "waf_cpu.png", STREAM_PLOT,
         UPDATES_PLOT)


# The plots of sections that a run of them alone can put into the report
# there is (report.splice).
SECTION_PLOTS = {"updates": (UPDATES_PLOT, plot_updates)}


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def section_plots(res, out_dir, sections):
    """Only the plots of `sections` (of SECTION_PLOTS): their names."""
    plt = pyplot()
    note = f" ({res['mode']} run, {res['machine']['nproc']} CPUs)"
    done = []
    for s in sections:
        name, plot = SECTION_PLOTS[s]
        (out_dir / name).unlink(missing_ok=True)
        plot(res, out_dir, plt, note)
        if (out_dir / name).exists():
            done.append(name)
    return done


def handoff_axis(ax, p):
    """A hand-off plot's panel for payload p: log-log by concurrency."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(HANDOFF_C, [str(c) for c in HANDOFF_C])
    ax.set_title(PAYLOAD_LABEL[p])
    ax.set_xlabel("concurrency (light threads)")
    ax.grid(True, which="both", alpha=0.3)


def plots(res, out_dir):
    plt = pyplot()

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

    plot_stream(res, out_dir, plt, note)
    plot_updates(res, out_dir, plt, note)
