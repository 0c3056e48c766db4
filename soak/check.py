"""The soak's verdict: the error log's lines, the resource bounds, and
the request outcomes, as pure functions of what soak.py collected (so
that soak/test_soak.py can check them without nginx).

The bounds and why they are what they are: docs/testing.md, "Soak".
"""

import re
from collections import Counter

# Each generation of workers is sampled twice: "early", EARLY_S after the
# reload that started it, and "late", just before the next reload (or at
# the end); always with no request in flight, after a full collection of
# each worker's event-loop Lua state. The first generation is the warm-up:
# its late sample is the baseline of the run.
#
# Over the run: the largest RSS of the serving workers at any later late
# sample may exceed the baseline's by at most this.
WORKER_RSS_GROWTH_MIB = 48
# Within a generation: a worker's RSS at its late sample may exceed its
# early one by at most this.
GEN_RSS_GROWTH_MIB = 40
# The master's RSS (it reads the configuration again at each reload) may
# grow by at most this over the run.
MASTER_RSS_GROWTH_MIB = 8
# Open fds and threads of every serving worker at every sample, and of the
# master, equal the baseline's.
#
# A worker of an old generation must have exited this long after the
# reload that replaced it (its requests end in under 2 s).
EXIT_AFTER_RELOAD_S = 20

# Lines that end the soak wherever they appear (error.log or stderr).
FATAL = [
    ("crash", re.compile(r"exited on signal|Segmentation fault|core dumped")),
    ("worker exit code", re.compile(r"exited with (fatal )?code [1-9]")),
    ("alert", re.compile(r"\[alert\]")),
    ("emerg", re.compile(r"\[emerg\]")),
    ("panic", re.compile(r"panic", re.I)),
    ("rust abort", re.compile(r"fatal runtime error|Rust cannot catch|"
                              r"memory allocation of \d+ bytes failed")),
    ("heap corruption", re.compile(r"munmap_chunk|double free|free\(\): |"
                                   r"malloc\(\): |corrupted (size|double)")),
]
# error and crit lines the load causes on purpose; any other fails.
EXPECTED_ERRORS = [
]
LEVEL = re.compile(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d \[(\w+)\] ")


def shape(line):
    """A log line without its time, pids, numbers and addresses: lines
    that differ only there count as one."""
    line = re.sub(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d ", "", line)
    line = re.sub(r"0x[0-9a-f]+", "0x…", line)
    line = re.sub(r"\d+(\.\d+)?", "N", line)
    return line[:200]


class LogScan:
    """Reads error.log as it grows: counts lines by level and shape, and
    keeps the fatal and unexpected ones."""

    def __init__(self, strip=None):
        self.strip = strip             # a path to write as @REPO@ in shapes
        self.levels = Counter()
        self.shapes = Counter()        # (level, shape) -> n, warn and worse
        self.fatal = []                # (reason, line), the first 50
        self.n_fatal = 0
        self.unexpected = []           # error/crit lines not expected
        self.n_unexpected = 0
        self.partial = ""

    def feed(self, text, final=False):
        text = self.partial + text
        lines = text.split("\n")
        self.partial = "" if final else lines.pop()
        for line in lines:
            if line.strip():
                self.line(line)

    def line(self, line, source="error.log"):
        m = LEVEL.match(line)
        level = m.group(1) if m else ("stderr" if source == "stderr" else "other")
        self.levels[level] += 1
        if level not in ("debug", "info", "notice"):
            self.shapes[(level, shape(line.replace(self.strip, "@REPO@")
                                      if self.strip else line))] += 1
        for reason, pat in FATAL:
            if pat.search(line):
                self.n_fatal += 1
                if len(self.fatal) < 50:
                    self.fatal.append((reason, line[:500]))
                return
        if level in ("error", "crit", "stderr", "other") and not any(
                p.search(line) for p in EXPECTED_ERRORS):
            self.n_unexpected += 1
            if len(self.unexpected) < 50:
                self.unexpected.append(line[:500])


def resource_bounds(samples):
    """Checks the samples (dicts with role "worker" or "master", phase
    "early" or "late", t, gen, pid, rss_kib, fds, threads) against the
    bounds. Returns (failures, measured): failures as text; measured =
    what each bound compared."""
    failures = []
    measured = {}
    late = [s for s in samples if s["phase"] == "late"]
    if not late:
        return ["no resource samples were taken"], measured
    base_t = min(s["t"] for s in late)
    for role, bound in (("worker", WORKER_RSS_GROWTH_MIB), ("master", MASTER_RSS_GROWTH_MIB)):
        base = [s for s in late if s["role"] == role and s["t"] == base_t]
        if not base:
            failures.append(f"no {role} in the warm-up sample")
            continue
        later = [s for s in late if s["role"] == role and s["t"] > base_t]
        base_rss = max(s["rss_kib"] for s in base)
        peak = max((s["rss_kib"] for s in later), default=base_rss)
        growth = (peak - base_rss) / 1024
        m = measured[role] = dict(
            base_rss_mib=base_rss / 1024, peak_rss_mib=peak / 1024,
            growth_mib=growth, bound_mib=bound,
            samples=len({s["t"] for s in later}),
            fds=sorted({s["fds"] for s in base}), threads=sorted({s["threads"] for s in base}))
        if growth > bound:
            failures.append(f"{role} RSS grew by {growth:.1f} MiB over the run "
                            f"({base_rss / 1024:.1f} -> {peak / 1024:.1f} MiB; bound {bound} MiB)")
        every = [s for s in samples if s["role"] == role]
        for what in ("fds", "threads"):
            want = set(m[what])
            if len(want) != 1:
                failures.append(f"{role}s differ in {what} at warm-up: {sorted(want)}")
            odd = [s for s in every if s[what] not in want]
            m[f"{what}_changed"] = len(odd)
            if odd:
                s = odd[0]
                failures.append(
                    f"{role} {what}: {s[what]} at {s['t']:.0f} s (pid {s['pid']}, "
                    f"generation {s['gen']}, {s['phase']}), warm-up {sorted(want)}; "
                    f"{len(odd)} such samples")
    # within each generation, early -> late, worker by worker
    early = {s["pid"]: s for s in samples if s["role"] == "worker" and s["phase"] == "early"}
    growths = []
    for s in late:
        e = early.get(s["pid"])
        if s["role"] == "worker" and e is not None:
            growths.append(((s["rss_kib"] - e["rss_kib"]) / 1024, s))
    worst = max(growths, key=lambda g: g[0], default=None)
    measured["generation"] = dict(
        pairs=len(growths), bound_mib=GEN_RSS_GROWTH_MIB,
        max_growth_mib=worst[0] if worst else None,
        median_growth_mib=sorted(g for g, _ in growths)[len(growths) // 2] if growths else None)
    over = [(g, s) for g, s in growths if g > GEN_RSS_GROWTH_MIB]
    if over:
        g, s = over[0]
        failures.append(f"worker {s['pid']} (generation {s['gen']}) grew by {g:.1f} MiB "
                        f"between its early and late samples (bound {GEN_RSS_GROWTH_MIB} MiB; "
                        f"{len(over)} such workers)")
    return failures, measured


# Counters of thread_pool_status that some scrape must have seen above 0:
# the kinds that should move them did.
METRICS_MUST_MOVE = ("tasks_completed_total", "task_errors_total", "tasks_rejected_total",
                     "tasks_timed_out_total", "tasks_abandoned_total",
                     "accept_gate_pauses_total", "accepted_connections_total")


def metrics_failures(metrics_max):
    """Failures from the scrapes: counters that never moved."""
    if not metrics_max:
        return ["no scrape of thread_pool_status was read"]
    return [f"thread_pool_status never showed {k} above 0"
            for k in METRICS_MUST_MOVE if not metrics_max.get(k)]


def outcome_failures(counts, n_unexpected, kinds):
    """Failures from the tally: unexpected outcomes, and kinds that never
    ran or never gave each outcome they are there to show (a soak that
    did not exercise a feature does not pass)."""
    failures = []
    total = Counter()
    for (_, kind, outcome), n in counts.items():
        total[(kind, outcome)] += n
    if n_unexpected:
        bad = sorted(((k, o), n) for (k, o), n in total.items()
                     if o not in kinds[k].expected)
        failures.append(f"{n_unexpected} requests with unexpected outcomes: "
                        + ", ".join(f"{k} {o} ×{n}" for (k, o), n in bad))
    for name, kind in kinds.items():
        if not any(k == name for (k, _) in total):
            failures.append(f"no {name} request ran")
            continue
        for outcome in sorted(kind.must_see):
            if not total[(name, outcome)]:
                failures.append(f"no {name} request gave {outcome}")
    return failures
