#!/usr/bin/python3
"""make soak: one nginx, two workers, every feature of the module at once,
for MINUTES minutes.

Starts Debian's nginx under a temporary prefix with soak/nginx.conf.tmpl
(loopback only), drives it with the bounded clients of soak/load.py,
reloads it (HUP) every 30 s, and before each reload samples RSS, open fds
and threads of the serving workers and of the master from /proc, with no
request in flight. It fails on a request with an outcome its kind may not
give (a lost one included), a fatal line in the error log or nginx's
stderr, an unexpected error line, a worker that dies or does not exit
after a reload, or a resource sample past the bounds of soak/check.py.
Writes bench/SOAK.md and bench/soak.png (soak/report.py), the raw results
to bench/out/soak.json and the error log to bench/out/soak-error.log;
removes its prefix; exits 1 on failure.

  /usr/bin/python3 soak/soak.py --minutes 30
  /usr/bin/python3 soak/soak.py --seconds 45 --out /tmp/dir   # a short run
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ beside the sources
import check  # noqa: E402
import load  # noqa: E402
import proc  # noqa: E402
import report  # noqa: E402

# bench/procs.py: after soak's own modules, whose names bench's share
sys.path.append(str(Path(__file__).resolve().parent.parent / "bench"))
import procs  # noqa: E402

SOAK = Path(__file__).resolve().parent
REPO = SOAK.parent
MODULE = procs.MODULE
# The module's pools in soak/nginx.conf.tmpl: each must show in the metrics.
POOLS = ("work", "slow", "big", "tiny", "copy")
WORKERS = 2
# With no request in flight, how long to wait before reading /proc: pool
# threads that moved large strings collect and trim when they go idle.
SETTLE_S = 1.0
# Reads of each process per sample, this far apart (see sample()), and
# more while its RSS still falls by more than RSS_SETTLED_KIB across them
# (pool threads give memory back once idle: on a busy machine, later), up
# to SETTLE_MAX_S.
READS = 4
READ_GAP_S = 0.25
RSS_SETTLED_KIB = 1024
SETTLE_MAX_S = 20.0
# The early sample of a generation, this long after the reload.
EARLY_S = 10.0


def log(msg):
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def metrics_check(text):
    """(error, summary) for one scrape of thread_pool_status: every pool
    and both workers there, read by Prometheus's own parser."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        text_string_to_metric_families = None
    samples = []
    try:
        if text_string_to_metric_families:
            for fam in text_string_to_metric_families(text):
                samples += [(s.name, s.labels, s.value) for s in fam.samples]
        else:
            for line in text.splitlines():
                if line and not line.startswith("#"):
                    name, _, rest = line.partition("{")
                    labels, _, value = rest.rpartition("} ")
                    samples.append((name, dict(kv.split("=", 1) for kv in labels.split(",")),
                                    float(value)))
                    for k, v in samples[-1][1].items():
                        samples[-1][1][k] = v.strip('"')
    except (ValueError, TypeError) as e:
        return f"unparsable: {e}", None
    summary = {}
    seen = set()
    for name, labels, value in samples:
        if name.startswith("ngx_threadpool_") and name.endswith("_total") or name in (
                "ngx_threadpool_threads", "ngx_threadpool_accept_gate_paused_workers"):
            key = name[len("ngx_threadpool_"):]
            summary[key] = summary.get(key, 0) + value
        if name == "ngx_threadpool_tasks_pushed_total":
            seen.add((labels.get("pool"), labels.get("worker")))
    missing = [(p, w) for p in POOLS for w in map(str, range(WORKERS)) if (p, w) not in seen]
    absent = sorted({w for _, w in missing} - {w for _, w in seen})
    if missing and all(w in absent for _, w in missing):
        # a worker whose init_process has not run yet (after a start or a
        # reload, whose zone starts afresh) has no counters
        return f"{load.NOT_STARTED} {', '.join(absent)}", None
    if missing:
        return f"no tasks_pushed_total for {', '.join(f'{p}/{w}' for p, w in missing)}", None
    if "accept_gate_paused_workers" not in summary:
        return "no accept gate metrics", None
    return None, summary


class Soak:
    def __init__(self, args):
        self.args = args
        self.duration = args.seconds if args.seconds else args.minutes * 60
        self.kinds = load.KINDS + [load.INJECT[name] for name in args.inject]
        self.prefix = Path(tempfile.mkdtemp(prefix="ngx_threadpool-soak-"))
        self.port = procs.free_port()
        self.nginx = None
        self.failures = []
        self.repeats = {}
        self.samples = []
        self.reloads = []
        self.gen = 0
        self.gen_pids = []
        self.generations = []           # dict(gen, pids, started, reason)
        self.exiting = {}               # pid -> time of the reload that retired it
        self.reported_lingering = set()
        self.logscan = check.LogScan(strip=str(REPO))
        self.log_offset = 0
        self.t0 = None
        self.minutes = max(1, int(-(-self.duration // 60)))
        self.tally = load.Tally(time.monotonic(), last_minute=self.minutes - 1)
        self.load = None
        self.conf = ""
        self.counters = dict(posted=0, posted_done=0)
        self.started = time.strftime("%Y-%m-%d %H:%M:%S %z")

    def fail(self, why, key=None):
        """Records a failure; of those with the same `key` (a crash loop
        respawning workers) only the first few, then a count."""
        log(f"FAIL: {why}")
        if key is not None:
            self.repeats[key] = self.repeats.get(key, 0) + 1
            if self.repeats[key] > 3:
                return
        self.failures.append(why)

    # ---- nginx ------------------------------------------------------------

    def write_conf(self):
        for sub in ("conf", "logs"):
            (self.prefix / sub).mkdir()
        conf = (SOAK / "nginx.conf.tmpl").read_text()
        fields = dict(procs.module_fields(), REPO=str(REPO), SOAK=str(SOAK),
                      PORT=str(self.port))
        for key, value in fields.items():
            conf = conf.replace(f"@{key}@", value)
        (self.prefix / "conf/nginx.conf").write_text(conf)
        return conf

    def start(self):
        self.conf = self.write_conf()
        self.nginx = procs.start(self.prefix)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.nginx.poll() is not None:
                raise RuntimeError("nginx exited at start: " + self.log_tail())
            cur, _ = proc.workers(self.nginx.pid)
            if len(cur) == WORKERS and self.all_counting():
                self.new_generation(cur, "start")
                return
            time.sleep(0.05)
        raise RuntimeError("nginx did not answer within 20 s: " + self.log_tail())

    def all_counting(self):
        """Whether thread_pool_status shows every worker's pools: each
        worker has run its init_process and serves."""
        try:
            status, body = load.request(self.port, "/metrics", timeout=2)
        except load.Lost:
            return False
        return status == 200 and metrics_check(body.decode("utf-8", "replace"))[0] is None

    def log_tail(self):
        lines = []
        for f in ("error.log", "stderr.log"):
            p = self.prefix / "logs" / f
            if p.exists():
                lines += p.read_text(errors="replace").splitlines()[-15:]
        return "\n".join(lines) or "(no log lines)"

    def stop(self):
        """QUIT (graceful), then TERM, then KILL; returns the exit code or
        None if it had to be killed."""
        if self.nginx is None or self.nginx.poll() is not None:
            return self.nginx.returncode if self.nginx else None
        for sig, wait in ((signal.SIGQUIT, 30), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            self.nginx.send_signal(sig)
            try:
                code = self.nginx.wait(wait)
                return code if sig == signal.SIGQUIT else None
            except subprocess.TimeoutExpired:
                log(f"nginx still running after {sig.name}")
        return None

    def who_stopped(self):
        """The master's log line of a stop signal it got, if any: a run
        stopped from outside (another process) says so."""
        try:
            text = (self.prefix / "logs/error.log").read_text(errors="replace")
        except OSError:
            return ""
        pid = self.nginx.pid
        for line in text.splitlines():
            if f" {pid}#{pid}: signal " in line and "received from" in line and any(
                    f"signal {n} " in line for n in (2, 3, 9, 15)):
                return f": {line.split(': ', 1)[1]} (not from this soak)"
        return ""

    def read_log(self, final=False):
        path = self.prefix / "logs/error.log"
        try:
            with open(path, "rb") as f:
                f.seek(self.log_offset)
                data = f.read()
        except OSError:
            return
        self.log_offset += len(data)
        before = (len(self.logscan.fatal), self.logscan.n_unexpected)
        self.logscan.feed(data.decode("utf-8", "replace"), final=final)
        for reason, line in self.logscan.fatal[before[0]:]:
            log(f"{reason} in error.log: {line[:200]}")
        if self.logscan.n_unexpected > before[1]:
            log(f"unexpected line in error.log: {self.logscan.unexpected[-1][:200]}")

    # ---- workers and generations ------------------------------------------

    def new_generation(self, pids, reason):
        self.gen += 1
        self.gen_pids = sorted(pids)
        self.generations.append(dict(gen=self.gen, pids=self.gen_pids,
                                     started=self.now(), reason=reason))

    def now(self):
        return 0.0 if self.t0 is None else time.monotonic() - self.t0

    def watch(self):
        """Between reloads: the master alive, the generation's workers the
        same, the old ones gone in time."""
        if self.nginx.poll() is not None:
            self.read_log()
            raise RuntimeError(f"the nginx master exited ({self.nginx.returncode})"
                               + self.who_stopped())
        cur, exiting = proc.workers(self.nginx.pid)
        gone = [p for p in self.gen_pids if p not in cur]
        if gone:
            self.fail(f"worker {', '.join(map(str, gone))} of generation {self.gen} "
                      f"ended without a reload at {self.now():.0f} s", key="respawn")
            self.new_generation(cur, "respawn")
        for pid, since in list(self.exiting.items()):
            if not proc.alive(pid):
                del self.exiting[pid]
            elif self.now() - since > check.EXIT_AFTER_RELOAD_S and pid not in self.reported_lingering:
                self.reported_lingering.add(pid)
                self.fail(f"old worker {pid} still running {self.now() - since:.0f} s "
                          f"after its reload ({proc.title(pid)})")
        self.read_log()

    def sample(self, phase):
        """RSS, fds and threads of the serving workers and the master,
        with no request in flight; `phase` is "early" or "late" in the
        generation's life (check.py)."""
        quiet = self.load.pause() if self.load else True
        try:
            # the old generation's workers gone (else the master holds
            # their channels), at most until they count as lingering
            while self.exiting and min(self.exiting.values()) + check.EXIT_AFTER_RELOAD_S \
                    > self.now():
                self.exiting = {p: t for p, t in self.exiting.items() if proc.alive(p)}
                time.sleep(0.1)
            self.collect_garbage()
            time.sleep(SETTLE_S)
            t = self.now()
            cur, _ = proc.workers(self.nginx.pid)
            rows = [("worker", pid) for pid in cur] + [("master", self.nginx.pid)]
            for role, pid in rows:
                # the fewest fds of a few reads: a connection whose request
                # is still ending on the server side is not a leak
                reads = []
                end = time.monotonic() + SETTLE_MAX_S
                while True:
                    u = proc.usage(pid)
                    if u:
                        reads.append(u)
                    last = [r["rss_kib"] for r in reads[-READS:]]
                    if len(reads) >= READS and last[0] - last[-1] <= RSS_SETTLED_KIB \
                            or time.monotonic() >= end or not u:
                        break
                    time.sleep(READ_GAP_S)
                if reads:
                    u = dict(reads[-1], fds=min(r["fds"] for r in reads))
                    self.samples.append(dict(t=round(t, 1), gen=self.gen, role=role,
                                             phase=phase, pid=pid, quiet=quiet, **u))
            if not quiet:
                log("sample taken with requests still in flight")
        finally:
            if self.load:
                self.load.resume()
        ws = [s for s in self.samples if s["t"] == round(t, 1) and s["role"] == "worker"]
        log(f"{phase} sample at {t:.0f} s, generation {self.gen}: " + "; ".join(
            f"worker {s['pid']} {s['rss_kib'] / 1024:.1f} MiB {s['fds']} fds "
            f"{s['threads']} threads" for s in ws))

    def collect_garbage(self):
        """Has each worker's event loop run a full collection: the large
        strings it let go of are garbage, not growth."""
        try:
            load.request(self.port, "/k/gc", timeout=10)
            end = time.monotonic() + 3
            while time.monotonic() < end:
                _, body = load.request(self.port, "/k/gc_done", timeout=10)
                if body.strip() == str(WORKERS).encode():
                    return
                time.sleep(0.05)
        except load.Lost as e:
            self.fail(f"/k/gc: {e}")
            return
        log("the workers did not all collect their garbage within 3 s")

    def reload(self):
        """HUP, then waits for the new generation's workers; until each of
        them counts in thread_pool_status, a scrape may miss one that has
        not started yet (load.py, "ok-reloading")."""
        old = list(self.gen_pids)
        t = self.now()
        self.load.reload_phase += 1
        try:
            self.nginx.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                cur, _ = proc.workers(self.nginx.pid)
                if len(cur) == WORKERS and not set(cur) & set(old):
                    for pid in old:
                        self.exiting[pid] = t
                    self.new_generation(cur, "reload")
                    self.reloads.append(dict(t=round(t, 1), took=round(self.now() - t, 2),
                                             old=old, new=cur))
                    while not self.all_counting():
                        if time.monotonic() >= deadline:
                            self.fail(f"the workers of the reload at {t:.0f} s did not all "
                                      "show in thread_pool_status within 15 s")
                            return
                        time.sleep(0.05)
                    return
                time.sleep(0.05)
            self.reloads.append(dict(t=round(t, 1), took=None, old=old, new=None))
            self.fail(f"the reload at {t:.0f} s started no new workers within 15 s")
        finally:
            self.load.reload_phase += 1

    # ---- the run ----------------------------------------------------------

    def run(self):
        d = self.duration
        log(f"{d:.0f} s, a reload every {self.args.reload_every:.0f} s, prefix {self.prefix}")
        self.start()
        self.t0 = time.monotonic()
        self.generations[-1]["started"] = 0.0
        self.tally = load.Tally(self.t0, last_minute=self.minutes - 1)
        self.load = load.Load(self.port, self.tally, deadline=self.t0 + d, kinds=self.kinds,
                              clients=self.args.clients, pace=self.args.pace,
                              seed=self.args.seed,
                              metrics_check=metrics_check)
        self.load.start()
        next_reload = self.args.reload_every
        next_early = EARLY_S
        while self.now() < d:
            self.watch()
            if self.now() >= next_early and next_early < d:
                self.sample("early")
                next_early = float("inf")
            if self.now() >= next_reload and next_reload < d:
                self.sample("late")
                self.reload()
                next_early = self.now() + EARLY_S
                next_reload += self.args.reload_every
            time.sleep(min(0.5, max(0.0, min(next_reload, next_early, d) - self.now())))
        if not self.load.join(limit=load.ANSWER_TIMEOUT + 10):
            self.fail("the clients did not stop")
        self.watch()
        self.sample("late")
        try:
            _, body = load.request(self.port, "/k/counters", timeout=10)
            posted, done = (int(x) for x in body.split())
            self.counters = dict(posted=posted, posted_done=done)
        except (load.Lost, ValueError) as e:
            self.fail(f"/k/counters: {e}")
        code = self.stop()
        if code != 0:
            self.fail(f"nginx did not stop cleanly on QUIT (exit {code})")
        self.read_log(final=True)
        stderr = (self.prefix / "logs/stderr.log").read_text(errors="replace")
        for line in stderr.splitlines():
            if line.strip():
                self.logscan.line(line, source="stderr")

    def verdict(self):
        counts, unexpected, n_unexpected = self.tally.snapshot()
        failures = list(self.failures)
        for key, n in self.repeats.items():
            if n > 3:
                failures.append(f"... and {n - 3} more like that ({key})")
        failures += check.outcome_failures(
            counts, n_unexpected, {k.name: k for k in self.kinds + [load.STATIC, load.METRICS]})
        for reason, line in self.logscan.fatal[:5]:
            failures.append(f"{reason}: {line}")
        if self.logscan.n_fatal > 5:
            failures.append(f"... and {self.logscan.n_fatal - 5} more fatal log lines")
        if self.logscan.n_unexpected:
            failures.append(f"{self.logscan.n_unexpected} unexpected error lines, "
                            f"the first: {self.logscan.unexpected[0]}")
        failures += check.metrics_failures(self.load.metrics_max if self.load else {})
        res_fail, measured = check.resource_bounds(self.samples)
        failures += res_fail
        if self.counters["posted_done"] > self.counters["posted"]:
            failures.append(f"more posted tasks ran than were queued: {self.counters}")
        return failures, measured, counts, unexpected, n_unexpected

    def results(self):
        failures, measured, counts, unexpected, n_unexpected = self.verdict()
        return dict(
            started=self.started, seconds=round(self.duration),
            minutes=self.minutes, reload_every=self.args.reload_every,
            clients=self.args.clients, pace=self.args.pace, seed=self.args.seed,
            passed=not failures, failures=failures,
            injected=self.args.inject,
            kinds=[dict(name=k.name, what=k.what, expected=sorted(k.expected),
                        weight=k.weight) for k in self.kinds + [load.STATIC, load.METRICS]],
            counts=[[m, k, o, n] for (m, k, o), n in sorted(counts.items())],
            unexpected=unexpected, n_unexpected=n_unexpected,
            samples=self.samples, generations=self.generations, reloads=self.reloads,
            measured=measured,
            bounds=dict(worker_rss_growth_mib=check.WORKER_RSS_GROWTH_MIB,
                        gen_rss_growth_mib=check.GEN_RSS_GROWTH_MIB,
                        master_rss_growth_mib=check.MASTER_RSS_GROWTH_MIB,
                        exit_after_reload_s=check.EXIT_AFTER_RELOAD_S),
            log_levels=dict(self.logscan.levels),
            log_shapes=[[lvl, shp, n] for (lvl, shp), n in self.logscan.shapes.most_common(25)],
            log_fatal=self.logscan.fatal, log_unexpected=self.logscan.unexpected,
            metrics=self.load.metrics_by_minute if self.load else {},
            counters=self.counters,
            metrics_max=self.load.metrics_max if self.load else {},
            conf=self.conf.replace(str(REPO), "@REPO@").replace(str(MODULE), "@MODULE@"),
            machine=dict(procs.machine(procs.NGINX),
                         loadavg=Path("/proc/loadavg").read_text().split()[:3]),
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=float(os.environ.get("MINUTES") or 30))
    ap.add_argument("--seconds", type=float, default=0,
                    help="the duration in seconds (overrides --minutes)")
    ap.add_argument("--reload-every", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=6, help="mixed client threads")
    ap.add_argument("--pace", type=float, default=0.06,
                    help="mean pause of a mixed client between requests (s)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--inject", action="append", default=[], choices=sorted(load.INJECT),
                    help="add a fault the soak must fail on (repeatable): "
                    + "; ".join(f"{n}: {k.what}" for n, k in sorted(load.INJECT.items())))
    ap.add_argument("--out", type=Path, default=REPO / "bench",
                    help="where SOAK.md and soak.png go (default bench/)")
    args = ap.parse_args()
    if not MODULE.exists():
        sys.exit(f"{MODULE} missing: run `make build` first")
    if args.seconds <= 0 and args.minutes <= 0:
        ap.error("the duration must be positive")
    if args.inject and args.out == REPO / "bench":
        args.out = REPO / "bench/out"   # a faulty run does not replace bench/SOAK.md

    # TERM (as from a CI timeout) ends the run like Ctrl-C: nginx stopped,
    # the prefix removed.
    def on_term(signum, frame):
        raise KeyboardInterrupt()

    signal.signal(signal.SIGTERM, on_term)
    soak = Soak(args)
    try:
        try:
            soak.run()
        except (RuntimeError, load.Lost, OSError) as e:
            soak.fail(str(e))
            if soak.load:
                soak.load.stop_now.set()
                soak.load.running.set()
            soak.stop()
            soak.read_log(final=True)
        res = soak.results()
        # raw results beside bench/out's others, or beside the report
        out_raw = REPO / "bench/out" if args.out == REPO / "bench" else args.out
        out_raw.mkdir(parents=True, exist_ok=True)
        (out_raw / "soak.json").write_text(json.dumps(res, indent=1))
        if (soak.prefix / "logs/error.log").exists():
            shutil.copy(soak.prefix / "logs/error.log", out_raw / "soak-error.log")
        args.out.mkdir(parents=True, exist_ok=True)
        report.render(res, args.out)
    finally:
        if soak.load:
            soak.load.stop_now.set()
            soak.load.running.set()
        soak.stop()
        shutil.rmtree(soak.prefix, ignore_errors=True)
    log(f"{'PASS' if res['passed'] else 'FAIL'}: {args.out / 'SOAK.md'}")
    for f in res["failures"]:
        log(f"  {f}")
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted: nginx stopped, prefix removed, no report")
        sys.exit(130)
