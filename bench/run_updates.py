"""make bench's updates section (run.py runs it, report_updates.py renders
it): live updates (docs/updates.md) of a Lua pool in 2 workers while wrk
keeps every thread of both busy with tasks of TASK_MS.

For each load (the task sleeping or spinning for TASK_MS), in an nginx of
its own: `n` updates one after another, each waiting in update_opts for
every thread of every worker: the caller's time in the call, and each
worker's update_seconds (from the update's call to the last of its threads
moving to it) read from the status page; the event loop's CPU time in
`update` calls alone (bench/lua/bench_updates.lua's /upd/cost); and the
caller's event-loop CPU in pairs of an update and the same request
without it.
Then, in a fresh nginx under the sleeping load, `rss_updates` updates that
each carry a rule set of STRINGS strings (and every CODE_EVERY-th new
handler code): the workers' RSS after each. Failures throughout: wrk's
non-2xx and socket errors, the pool's failure counters, the tasks the
handler saw split by an update."""

import http.client
import json
import os
import random
import re
import signal
import statistics
import time
import urllib.request

from pathlib import Path

from harness import Nginx, log, rss_kib, stat_fields, thread_cpu_us, wrk_start, wrk_wait

POOL = "upd"
WORKERS = 2
THREADS = 2
TASK_MS = 5
LOADS = ("sleep", "spin")
# wrk's connections: 4 per thread, so that no thread waits for a task.
CONNS = 16
# The rule set of the RSS cell: strings of ~60 bytes.
STRINGS = 3000
CODE_EVERY = 10
# update_opts's wait, in seconds: the most an update may take.
WAIT_S = 5
# How long wrk runs at most: the cell stops it (SIGINT) when done.
LOAD_LIMIT_S = 1800
WARMUP_S = 2
# The pool's failure counters on the status page.
FAILURES = ("task_errors_total", "tasks_rejected_total", "tasks_timed_out_total",
            "tasks_abandoned_total", "tasks_overloaded_total", "tasks_expired_total",
            "updates_failed_total")
SERIES = re.compile(r'^ngx_threadpool_(\w+)\{([^}]*)\} (\S+)$')
LABEL = re.compile(r'(\w+)="([^"]*)"')


def metrics(ng):
    """The pool's series on the status page: {(name without the prefix,
    worker, thread): value}; histogram buckets left out."""
    with urllib.request.urlopen(ng.url("/upd/metrics"), timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = SERIES.match(line)
        if not m or m[1].endswith("_bucket"):
            continue
        labels = dict(LABEL.findall(m[2]))
        if labels.get("pool") == POOL:
            out[(m[1], labels.get("worker"), labels.get("thread"))] = float(m[3])
    return out


def by_worker(m, name):
    return {w: v for (n, w, t), v in m.items() if n == name and t is None}


def delta(m0, m1, name):
    """A counter's growth between two readings, by worker."""
    before = by_worker(m0, name)
    return {w: v - before.get(w, 0) for w, v in by_worker(m1, name).items()}


def thread_cpu_named(pids, comm):
    """CPU µs of the threads named comm of processes pids."""
    total = 0.0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    if f.read().strip() != comm:
                        continue
            except OSError:
                continue
            total += thread_cpu_us(pid, int(tid))
    return total


class Caller:
    """One keep-alive connection, so that every update comes from the same
    worker (the listen socket has reuseport: a connection stays where the
    kernel put it)."""

    def __init__(self, port):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S + 30)
        self.worker = None

    def get(self, path):
        self.conn.request("GET", path)
        r = self.conn.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"{path}: {r.status} {body[:200]!r}")
        answer = json.loads(body)
        if self.worker is None:
            self.worker = answer["worker"]
        elif answer["worker"] != self.worker:
            raise RuntimeError(f"the caller's connection moved from worker {self.worker} "
                               f"to {answer['worker']}")
        return answer

    def close(self):
        self.conn.close()


class Load:
    """wrk on /upd/work with tasks of `kind` until stopped (SIGINT), its
    result in `result`."""

    def __init__(self, ng, kind):
        self.proc = wrk_start(ng.url(f"/upd/work?ms={TASK_MS}&kind={kind}"), CONNS,
                              LOAD_LIMIT_S)
        self.result = None

    def __enter__(self):
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGINT)
        self.result = wrk_wait(self.proc, 0)


def settled_seconds(ng, version, before):
    """Each worker's update_seconds and update_version for `version`, and
    whether every thread of every worker runs it; read again (up to 3
    times) while a worker shows the update_seconds of the update before:
    the last thread counts itself at the version just before it stores the
    time."""
    for _ in range(4):
        m = metrics(ng)
        secs = by_worker(m, "update_seconds")
        if all(secs.get(w) != before.get(w) for w in secs):
            break
        time.sleep(0.01)
    threads = [v for (n, w, t), v in m.items() if n == "thread_update_version"]
    return secs, dict(versions=by_worker(m, "update_version"),
                      threads_at=sum(v >= version for v in threads),
                      threads=len(threads))


def update_series(ng, load, caller, count, strings=0, code_every=0, rss_pids=()):
    """`count` updates one after another, each waiting for every thread:
    per update the caller's figures (bench_updates.lua's answer), the
    workers' update_seconds, whether every thread moved, when it was made
    (seconds into the series), the CPU seconds so far of processes other
    than the bench's (nginx, wrk under `load`, this one), and (rss_pids)
    the workers' RSS after it."""
    rows = []
    before = by_worker(metrics(ng), "update_seconds")
    ours = [ng.proc.pid, *ng.workers(), os.getpid(), load.proc.pid]
    start = time.monotonic()
    for i in range(1, count + 1):
        code = code_every and i % code_every == 0
        t0 = time.monotonic()
        r = caller.get(f"/upd/update?n={i}&wait={WAIT_S}&strings={strings}"
                       + ("&code=1" if code else ""))
        r["request_s"] = time.monotonic() - t0
        r["code"] = bool(code)
        r["t"] = t0 - start
        r["outside_cpu_s"] = outside_cpu_s(ours)
        if r.get("version"):
            secs, state = settled_seconds(ng, r["version"], before)
            r.update(state, seconds=secs)
            before = secs
        if rss_pids:
            r["rss_kib"] = {str(pid): rss_kib(pid) for pid in rss_pids}
        rows.append(r)
        # a random phase against the tasks
        time.sleep(random.uniform(0, TASK_MS / 1000))
    return rows


def cpu_pairs(ng, caller, pid, secs, span):
    """For `secs`: pairs of an update (waiting for every thread) and the
    same request without the update (dry), paced to last as long as the
    update before it did (`span` seconds at first), the two in turns
    first: per pair, the event-loop CPU time of the caller's worker
    (`pid`'s main thread) and the update threads' in both workers, during
    each. Their sums, and the pairs."""
    pids = ng.workers()
    name = "tp updates"
    sums = dict(update_loop_us=0.0, dry_loop_us=0.0, update_threads_us=0.0,
                dry_threads_us=0.0)
    pairs = 0
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        pairs += 1
        for dry in ((False, True) if pairs % 2 else (True, False)):
            loop0, threads0, t0 = thread_cpu_us(pid, pid), thread_cpu_named(pids, name), \
                time.monotonic()
            caller.get(f"/upd/update?n={pairs}&wait={WAIT_S}" + ("&dry=1" if dry else ""))
            if dry:
                time.sleep(max(0.0, span - (time.monotonic() - t0)))
            else:
                span = time.monotonic() - t0
            what = "dry" if dry else "update"
            sums[f"{what}_loop_us"] += thread_cpu_us(pid, pid) - loop0
            sums[f"{what}_threads_us"] += thread_cpu_named(pids, name) - threads0
    return dict(sums, pairs=pairs, secs=secs)


def outside_cpu_s(pids):
    """CPU seconds the machine has spent so far (stolen time included) on
    anything but processes `pids`: what competed with the bench."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
    for pid in pids:
        fields = stat_fields(f"/proc/{pid}/stat")
        if fields:
            busy -= int(fields[11]) + int(fields[12])
    return busy / os.sysconf("SC_CLK_TCK")


def failures(m0, m1):
    """The pool's failure counters' growth, summed over workers."""
    return {name: int(sum(delta(m0, m1, name).values())) for name in FAILURES}


def run_stats(m0, m1, secs):
    """Per worker: tasks completed, their mean run time (ms), and how busy
    the pool's threads were (run seconds ÷ threads × secs)."""
    done = delta(m0, m1, "run_seconds_count")
    run = delta(m0, m1, "run_seconds_sum")
    return {w: dict(tasks=done[w], run_ms=run[w] / done[w] * 1000 if done[w] else None,
                    busy=run[w] / THREADS / secs) for w in done}


def cell_nginx(name):
    return Nginx(name, tp_threads=0, rwt_threads=0, pools=(POOL,), workers=WORKERS,
                 listen=" reuseport")


def warm(ng, kind):
    """The JIT, the Lua states and wrk's connections, before measuring."""
    with Load(ng, kind):
        time.sleep(WARMUP_S)
    ng.errors()


def load_cell(plan, kind):
    """The latency, cost and CPU figures under tasks of `kind`."""
    with cell_nginx(f"updates-{kind}") as ng:
        start_workers = sorted(ng.workers())
        warm(ng, kind)
        caller = Caller(ng.port)
        m0, t0 = metrics(ng), time.monotonic()
        with Load(ng, kind) as load:
            log(f"updates: {plan['upd_n']} updates under the {kind} load")
            rows = update_series(ng, load, caller, plan["upd_n"])
            pid = rows[0]["pid"]
            cost = {}
            for strings in (0, STRINGS):
                cost[str(strings)] = caller.get(f"/upd/cost?n={plan['upd_cost']}"
                                                f"&from=100000&strings={strings}")
            span = statistics.median(r["request_s"] for r in rows)
            cpu = [cpu_pairs(ng, caller, pid, plan["upd_cpu_secs"], span)
                   for _ in range(plan["upd_cpu_rounds"])]
        m1, secs = metrics(ng), time.monotonic() - t0
        caller.close()
        return dict(kind=kind, updates=rows, cost=cost, cpu=cpu,
                    caller_pid=pid, wrk=load.result, failures=failures(m0, m1),
                    runs=run_stats(m0, m1, secs), errors=ng.errors(),
                    alive=ng.proc.poll() is None and sorted(ng.workers()) == start_workers,
                    log=ng.problems())


def rss_cell(plan):
    """The workers' RSS over updates carrying a rule set, under the
    sleeping load."""
    kind = "sleep"
    with cell_nginx("updates-rss") as ng:
        pids = sorted(ng.workers())
        warm(ng, kind)
        caller = Caller(ng.port)
        m0, t0 = metrics(ng), time.monotonic()
        start = {str(pid): rss_kib(pid) for pid in pids}
        with Load(ng, kind) as load:
            log(f"updates: {plan['upd_rss']} updates of {STRINGS} strings, "
                f"new code every {CODE_EVERY}")
            rows = update_series(ng, load, caller, plan["upd_rss"], STRINGS, CODE_EVERY, pids)
        m1, secs = metrics(ng), time.monotonic() - t0
        caller.close()
        return dict(kind=kind, updates=rows, rss_start_kib=start, caller_pid=rows[0]["pid"],
                    wrk=load.result, failures=failures(m0, m1),
                    runs=run_stats(m0, m1, secs), errors=ng.errors(),
                    alive=ng.proc.poll() is None and sorted(ng.workers()) == pids,
                    log=ng.problems())


def section_updates(plan, res):
    cells = {}
    for kind in LOADS:
        cells[kind] = load_cell(plan, kind)
    cells["rss"] = rss_cell(plan)
    res["updates"] = dict(
        workers=WORKERS, threads=THREADS, task_ms=TASK_MS, conns=CONNS, strings=STRINGS,
        code_every=CODE_EVERY, wait_s=WAIT_S, cells=cells,
        alive=all(c["alive"] for c in cells.values()),
        log=[line for c in cells.values() for line in c["log"]])
