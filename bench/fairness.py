#!/usr/bin/python3
"""make fairness: the talk's timeout table, scaled to one 2-core machine.

For each mode of MODES and each load of a plan, starts Debian's nginx (under
bench/out/fairness/), runs a closed-loop client for a fixed time and records
per class (static, thumb) the timeout rate and p50/p99 latency, and per worker
the connections accepted and the tasks in flight (sampled every 100 ms).
Writes bench/FAIRNESS.md and bench/fairness_*.png; raw results go to
bench/out/fairness.json.

Simulated cells: the task sleeps SERVICE_MS in usleep, so 24 busy threads fit
on 2 cores (service time, not CPU). Real cells: the thumbnail handler of
nginx-conf/thumb.lua at a small scale. QUICK=1 (or --quick): a ~2 minute smoke.

Overload cells (also alone: --overload; writes bench/OVERLOAD.md and
bench/out/overload.json): the simulated task behind the gate or reuseport,
under N closed-loop slots, each request a thumbnail with probability 0.5 and
a static page otherwise, at loads of 5 to 20 requests waiting on the pool
per thread; defaults against a deadline from the push (push_task_timeout),
one from the request's start (push_task_until(ngx.req.start_time() + s)) and
a deadline with a tuned max_queue. Their client is bench/overload-client (a
thread per slot, blocking sockets), so that its own lateness stays out of
the times it measures. Keep-alive cells open every connection before the
storm, spread unevenly over the workers (OVERLOAD_KA_SHARES). --part new or
--part keepalive runs one half again and keeps the other's results.
"""

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ beside the sources
import procs  # noqa: E402
from procs import free_port  # noqa: E402

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
OUT = BENCH / "out"
PREFIX = OUT / "fairness"

SERVICE_MS = 50
STATIC_PAUSE_MS = SERVICE_MS  # a static client's pause between requests
SAMPLE_MS = 100

# A mode: how many workers, threads per worker's pool (0: the task runs on
# the event loop), and text added to the listen directive, the events block,
# the top level and the http block. Adding a mode is one entry here.
MODES = {
    # The talk's "120 workers direct" against 20 x 6 threads: as many event
    # loops as the thread modes have threads, so the capacity is the same.
    "Direct": dict(workers=24, threads=0),
    "Thread": dict(workers=4, threads=6),
    "Thread + reuseport": dict(workers=4, threads=6, listen="reuseport"),
    "Thread + gate": dict(workers=4, threads=6, http="thread_pool_accept_gate on;"),
}
# The real thumbnail handler, small: 2 workers x 2 threads (4 cores' worth
# would not fit on 2), against 4 inline workers.
REAL_MODES = {
    "Direct": dict(workers=4, threads=0),
    "Thread": dict(workers=2, threads=2),
    "Thread + reuseport": dict(workers=2, threads=2, listen="reuseport"),
    "Thread + gate": dict(workers=2, threads=2, http="thread_pool_accept_gate on;"),
}

PLANS = {
    # loads: connections as multiples of the thread count (half of them
    # thumbnail clients, half static clients). Each load runs `rounds`
    # times, the modes alternating within a round. Main cells open a new
    # connection per request (every request is an accept the workers
    # compete for); keep-alive cells keep it (as the talk's client did: a
    # connection stays where it was accepted, a new one only after a
    # timeout).
    "full": dict(loads=(0.5, 1, 2, 3.3, 5, 6.7, 10), ka_loads=(3.3, 6.7, 10), rounds=3,
                 secs=10, timeout_ms=500,
                 real_loads=(1, 3.3, 6.7), real_secs=10, real_timeout_ms=2000),
    "quick": dict(loads=(3.3, 10), ka_loads=(10,), rounds=1, secs=3, timeout_ms=500,
                  real_loads=(3.3,), real_secs=3, real_timeout_ms=2000),
}

# Overload: how the pool is told to behave (the push's timeout, which is
# also its deadline, and the queue bound), each behind the gate and behind
# reuseport, 4 workers x 6 threads. A refusal ("overloaded", "queue full")
# is answered 503, a timeout 504.
OVERLOAD_POLICIES = {
    "defaults": dict(),
    "deadline": dict(timeout=0.45),
    # the same 0.45 s, counted from the request's start
    "request deadline": dict(until=0.45),
    "deadline + max_queue=48": dict(timeout=0.45, max_queue=48),
}
# Keep-alive cells: the share of the connections each worker holds when
# the storm starts (the client opens them first, keeping a connection only
# on a worker whose share is not full): 4 workers, 40 % on the first.
OVERLOAD_KA_SHARES = (40, 30, 20, 10)
OVERLOAD_SPREADS = {
    "gate": dict(http="thread_pool_accept_gate on;"),
    "reuseport": dict(listen="reuseport"),
}
OVERLOAD_PLANS = {
    # loads: requests waiting on the pool per thread (slots / 24: a static
    # request returns at once, so nearly every slot waits on a thumbnail)
    "full": dict(loads=(5, 10, 13.3, 20), ka_loads=(5, 10, 13.3, 20), secs=10,
                 timeout_ms=500),
    "quick": dict(loads=(10, 20), ka_loads=(20,), secs=3, timeout_ms=500),
}
OVERLOAD_THREADS = 6
OVERLOAD_WORKERS = 4

CONF = r"""
@LUA_MODULES@load_module @MODULE@;
@USER@
worker_processes @WORKERS@;
worker_rlimit_nofile 8192;
error_log logs/error.log warn;
pid logs/nginx.pid;
env THUMB_IMAGES=@IMAGES@;
events { worker_connections 4096; @EVENTS@ }
@POOL@
@MAIN@
http {
    access_log off;
    lua_package_path "@REPO@/lua/?.lua;@REPO@/nginx-conf/?.lua;;";
    lua_shared_dict fairness 1m;
    @HTTP@
    init_by_lua_block {
        local ffi = require "ffi"
        ffi.cdef [[
            int usleep(unsigned int);
            typedef struct { long sec; long nsec; } fairness_timespec_t;
            int fairness_clock_gettime(int, fairness_timespec_t *) asm("clock_gettime");
        ]]
        REFUSED = { overloaded = 503, ["queue full"] = 503, timeout = 504 }
        local ts = ffi.new("fairness_timespec_t")
        -- this thread's CPU time (CLOCK_THREAD_CPUTIME_ID), in µs
        function CPU_US()
            ffi.C.fairness_clock_gettime(3, ts)
            return tonumber(ts.sec) * 1e6 + tonumber(ts.nsec) / 1e3
        end
    }
    @HANDLER@
    # Connections accepted per worker: the first request of each.
    # keep-alive storms: more requests on a connection than a run makes
    keepalive_requests 10000000;
    log_by_lua_block {
        if ngx.var.connection_requests == "1" and ngx.var.uri ~= "/stats" then
            ngx.shared.fairness:incr("acc:" .. ngx.worker.id(), 1, 0)
        end
    }
    server {
        listen 127.0.0.1:@PORT@ backlog=4096 @LISTEN@;
        location = /static { return 200 "static\n"; }
        location = /whoami { return 200 $pid; }
        location = /task {
            content_by_lua_block {
                local dict = ngx.shared.fairness
                local key = "fly:" .. ngx.worker.id()
                dict:incr(key, 1, 0)
                local cpu0 = CPU_US()
                local ok, err = @CALL@
                local cpu = CPU_US() - cpu0
                dict:incr(key, -1, 0)
                if not ok then
                    -- a refusal is shed at once, a timeout said so
                    local status = REFUSED[err] or 500
                    if status == 500 then
                        ngx.log(ngx.WARN, "fairness task: ", err)
                    elseif status == 503 then
                        -- the event loop's CPU time in the refused call
                        -- (which does not yield); the shared dict's lock,
                        -- which 4 workers on 2 cores spin on, stays out
                        dict:incr("refused", 1, 0)
                        dict:incr(cpu < 100 and "refused<100us" or cpu < 1000
                                  and "refused<1ms" or "refused>=1ms", 1, 0)
                    end
                    return ngx.exit(status)
                end
                ok = tostring(ok)
                ngx.header.content_type = "image/jpeg"
                ngx.header.content_length = #ok
                ngx.print(ok)
            }
        }
        location = /metrics { thread_pool_status; }
        location = /stats {
            content_by_lua_block {
                local dict, acc, fly = ngx.shared.fairness, {}, {}
                for i = 0, ngx.worker.count() - 1 do
                    acc[i + 1] = dict:get("acc:" .. i) or 0
                    fly[i + 1] = dict:get("fly:" .. i) or 0
                end
                local refused = {}
                for _, k in ipairs({ "refused", "refused<100us", "refused<1ms", "refused>=1ms" }) do
                    refused[k] = dict:get(k) or 0
                end
                ngx.say(require("cjson").encode({ acc = acc, fly = fly, refused = refused }))
            }
        }
    }
}
"""

# The task, by kind: simulated (usleep) or the real thumbnail.
TASKS = {
    "sim": dict(
        chunk=("local C = require('ffi').C "
               "pcall(require('ffi').cdef, 'int usleep(unsigned int);') "
               "return function(us) C.usleep(us) return 'done' end"),
        arg=str(SERVICE_MS * 1000),
        inline="require('ffi').C.usleep({arg}) or 'done'"),
    "real": dict(
        chunk="return require('thumb')",
        arg="'photo1.jpg'",
        inline="require('thumb')({arg})"),
}


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_images():
    images = OUT / "fairness-images"
    if not (images / "watermark.png").exists():
        images.mkdir(parents=True, exist_ok=True)
        subprocess.run(["convert", "-size", "1200x800", "-seed", "1",
                        "plasma:", str(images / "photo1.jpg")], check=True)
        subprocess.run(["convert", "-size", "25x25", "xc:white",
                        str(images / "watermark.png")], check=True)
    return images


class Nginx:
    def __init__(self, mode, kind, images):
        self.port = free_port()
        task = TASKS[kind]
        threads = mode["threads"]
        if threads:
            pool = (f"thread_pool work threads={threads} "
                    f"max_queue={mode.get('max_queue', 65536)};")
            handler = ('thread_pool_process_by_lua work "'
                       + task["chunk"].replace('"', '\\"') + '";')
            push = "require('resty.threadpool').work:"
            if mode.get("until"):
                call = push + (f"push_task_until(ngx.req.start_time() + {mode['until']}, "
                               f"{task['arg']})")
            elif mode.get("timeout"):
                call = push + f"push_task_timeout({mode['timeout']}, {task['arg']})"
            else:
                call = push + f"push_task({task['arg']})"
        else:
            pool, handler = "", ""
            call = task["inline"].format(arg=task["arg"])
        subs = dict(procs.module_fields(), REPO=str(REPO), PORT=str(self.port),
                    WORKERS=str(mode["workers"]), IMAGES=str(images),
                    EVENTS=mode.get("events", ""), MAIN=mode.get("main", ""),
                    HTTP=mode.get("http", ""),
                    LISTEN=mode.get("listen", ""), POOL=pool,
                    HANDLER=handler, CALL=call)
        conf = CONF
        for k, v in subs.items():
            conf = conf.replace(f"@{k}@", v)
        for sub in ("conf", "logs"):
            (PREFIX / sub).mkdir(parents=True, exist_ok=True)
        for f in (PREFIX / "logs").iterdir():
            f.unlink()
        (PREFIX / "conf/nginx.conf").write_text(conf)
        self.proc = None

    def __enter__(self):
        self.proc = procs.start(PREFIX, "-g", "daemon off;")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("nginx exited: " + self.error_log())
            try:
                asyncio.run(get(self.port, "/stats", 1.0))
                return self
            except (OSError, asyncio.TimeoutError):
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("nginx did not answer: " + self.error_log())

    def __exit__(self, *exc):
        self.stop()

    def error_log(self):
        try:
            return (PREFIX / "logs/error.log").read_text()[-2000:]
        except OSError:
            return ""

    def stop(self):
        procs.stop(self.proc, 10)


async def get(port, path, timeout):
    """One request on a new connection (HTTP/1.0); the body."""
    async def go():
        r, w = await asyncio.open_connection("127.0.0.1", port)
        try:
            w.write(f"GET {path} HTTP/1.0\r\nHost: x\r\n"
                    "\r\n".encode())
            data = await r.read()
        finally:
            w.close()
        if not data.startswith(b"HTTP/1.1 200"):
            raise OSError(f"bad response: {data[:60]!r}")
        return data.split(b"\r\n\r\n", 1)[1]
    return await asyncio.wait_for(go(), timeout)


async def keepalive_get(conn, port, path):
    """One request on conn[0] (a reader, writer pair), opened if None."""
    if conn[0] is None:
        conn[0] = await asyncio.open_connection("127.0.0.1", port)
    r, w = conn[0]
    w.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    head = await r.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise OSError(f"bad response: {head[:60]!r}")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await r.readexactly(length)


async def client(port, path, pause, timeout, until, stats, keepalive):
    """A closed-loop client: one request at a time, on a kept connection
    (keepalive) or a new one each time; a new connection after a timeout."""
    conn = [None]
    while time.monotonic() < until:
        t0 = time.monotonic()
        try:
            if keepalive:
                await asyncio.wait_for(keepalive_get(conn, port, path), timeout)
            else:
                await get(port, path, timeout)
            stats["lat"].append((time.monotonic() - t0) * 1000)
        except (asyncio.TimeoutError, OSError, asyncio.IncompleteReadError) as e:
            stats["timeouts" if isinstance(e, asyncio.TimeoutError) else "errors"] += 1
            if conn[0] is not None:
                conn[0][1].close()
                conn[0] = None
        if pause:
            await asyncio.sleep(pause)
    if conn[0] is not None:
        conn[0][1].close()


async def sampler(port, until, samples):
    while time.monotonic() < until:
        try:
            body = await get(port, "/stats", 1.0)
            samples.append(json.loads(body)["fly"])
        except (OSError, asyncio.TimeoutError, ValueError):
            pass
        await asyncio.sleep(SAMPLE_MS / 1000)


async def run_cell(port, conns, secs, timeout_ms, keepalive):
    until = time.monotonic() + secs
    classes = {c: dict(lat=[], timeouts=0, errors=0) for c in ("static", "thumb")}
    samples = []
    tasks = [sampler(port, until, samples)]
    for i in range(conns):
        if i % 2 == 0:
            tasks.append(client(port, "/task", 0, timeout_ms / 1000, until,
                                classes["thumb"], keepalive))
        else:
            tasks.append(client(port, "/static", STATIC_PAUSE_MS / 1000,
                                timeout_ms / 1000, until, classes["static"],
                                keepalive))
    await asyncio.gather(*tasks)
    acc = json.loads(await get(port, "/stats", 5.0))["acc"]
    gate = gate_metrics((await get(port, "/metrics", 5.0)).decode())
    return classes, samples, acc, gate


def gate_metrics(text):
    """Per worker, the accept gate's pauses and seconds paused (empty
    without the gate)."""
    out = dict(pauses={}, paused_s={})
    names = dict(pauses="ngx_threadpool_accept_gate_pauses_total",
                 paused_s="ngx_threadpool_accept_gate_paused_seconds_total")
    for line in text.splitlines():
        for key, name in names.items():
            if line.startswith(name + "{worker="):
                worker = int(line.split('"')[1])
                out[key][worker] = float(line.rsplit(" ", 1)[1])
    return {k: [v[w] for w in sorted(v)] for k, v in out.items()}


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def summarize(classes, samples, acc, gate, secs):
    out = {}
    for c, s in classes.items():
        done = len(s["lat"])
        total = done + s["timeouts"] + s["errors"]
        out[c] = dict(total=total, done=done, timeouts=s["timeouts"],
                      errors=s["errors"],
                      timeout_pct=100.0 * s["timeouts"] / total if total else 0.0,
                      p50=pct(s["lat"], 50), p99=pct(s["lat"], 99),
                      per_sec=done / secs)
    n = len(acc)
    out["acc"] = acc
    out["fly_mean"] = [sum(s[i] for s in samples) / len(samples) if samples else 0
                       for i in range(n)]
    out["fly_max"] = [max((s[i] for s in samples), default=0) for i in range(n)]
    out["gate"] = gate
    return out


def measure(modes, kind, loads, secs, timeout_ms, images, rounds, keepalive):
    """Every mode at every load, `rounds` times; within a round the modes
    alternate, so that a change of the machine's load hits them alike."""
    results = []
    for load in loads:
        for rnd in range(rounds):
            for name, mode in modes.items():
                capacity = mode["workers"] * max(mode["threads"], 1)
                conns = max(2, round(load * capacity))
                log(f"{kind} {name}: {conns} connections ({load}x), {secs}s, "
                    f"round {rnd + 1}/{rounds}, keepalive {keepalive}")
                with Nginx(mode, kind, images) as ngx:
                    res = asyncio.run(run_cell(ngx.port, conns, secs, timeout_ms,
                                               keepalive))
                r = summarize(*res, secs)
                r.update(mode=name, kind=kind, load=load, conns=conns,
                         workers=mode["workers"], threads=mode["threads"],
                         timeout_ms=timeout_ms, round=rnd, keepalive=keepalive)
                log(f"  thumb timeouts {r['thumb']['timeout_pct']:.2f}% "
                    f"static {r['static']['timeout_pct']:.2f}% acc {r['acc']}")
                results.append(r)
    return results


# The overload workload's client (bench/overload-client): a thread per slot
# and blocking sockets, so that its own lateness stays out of what it times.
OVERLOAD_CLIENT = procs.RELEASE_DIR / "overload-client"


def overload_cell(port, slots, secs, timeout_ms, keepalive):
    args = [str(OVERLOAD_CLIENT), str(port), str(slots), str(secs),
            str(timeout_ms), str(int(keepalive))]
    if keepalive:
        args.append(",".join(map(str, OVERLOAD_KA_SHARES)))
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    seen = json.loads(out)
    classes = {c: dict(seen[c], lat={int(k): v for k, v in seen[c]["lat"].items()})
               for c in ("static", "thumb")}
    metrics = asyncio.run(get(port, "/metrics", 5.0)).decode()
    refused = json.loads(asyncio.run(get(port, "/stats", 5.0)))["refused"]
    return classes, metrics, dict(lags=seen["lags"], refused=refused,
                                  spread=seen.get("spread", []))


def counter_sum(text, name):
    """The sum of a Prometheus counter over its labels."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{"))


def timeout_windows(starts, width_ms=100):
    """How the timed-out requests' starts fall in windows of width_ms: the
    windows that hold any, and the most in one (a host that stalled puts
    many in few)."""
    counts = {}
    for t in starts:
        counts[int(t // width_ms)] = counts.get(int(t // width_ms), 0) + 1
    return dict(windows=len(counts), most=max(counts.values(), default=0),
                at_ms=[w * width_ms for w in sorted(counts)][:20])


def overload_summary(classes, metrics, seen, secs):
    out = dict(client_lag_p99=pct(seen["lags"], 99), refused_cpu=seen["refused"],
               conns_at_start=seen["spread"])
    for c, s in classes.items():
        answered = {str(k): len(v) for k, v in s["lat"].items()}
        total = sum(answered.values()) + s["timeouts"] + s["errors"]
        share = lambda n: 100.0 * n / total if total else 0.0
        ok = s["lat"].get(200, [])
        refused = s["lat"].get(503, [])
        out[c] = dict(total=total, answered=answered, timeouts=s["timeouts"],
                      errors=s["errors"], timeout_pct=share(s["timeouts"]),
                      refused_pct=share(len(refused)),
                      late_pct=share(answered.get("504", 0)),
                      per_sec=s["served"] / secs, p50=pct(ok, 50), p99=pct(ok, 99),
                      refused_p50=pct(refused, 50), refused_p99=pct(refused, 99),
                      connect_p50=pct(s["connect"], 50), connect_p99=pct(s["connect"], 99),
                      timeout_windows=timeout_windows(s.get("timed_out_at", [])))
    for key in ("overloaded", "expired", "rejected", "timed_out", "cancelled",
                "completed"):
        out[key] = counter_sum(metrics, f"ngx_threadpool_tasks_{key}_total")
    return out


def measure_overload(plan, keepalive, wanted=None):
    """Every spread and policy at every load (one round: the cells of a
    load run back to back); with `wanted(keepalive, spread, policy, load)`,
    only the cells it accepts."""
    results = []
    loads = plan["ka_loads"] if keepalive else plan["loads"]
    threads = OVERLOAD_WORKERS * OVERLOAD_THREADS
    for load in loads:
        slots = round(load * threads)
        for spread_name, spread in OVERLOAD_SPREADS.items():
            for policy, options in OVERLOAD_POLICIES.items():
                if wanted and not wanted(keepalive, spread_name, policy, load):
                    continue
                mode = dict(workers=OVERLOAD_WORKERS, threads=OVERLOAD_THREADS,
                            **spread, **options)
                log(f"overload {spread_name}, {policy}: {slots} slots ({load}x), "
                    f"{plan['secs']}s, keepalive {keepalive}")
                load_avg = os.getloadavg()[0]
                with Nginx(mode, "sim", make_images()) as ngx:
                    res = overload_cell(ngx.port, slots, plan["secs"],
                                        plan["timeout_ms"], keepalive)
                r = overload_summary(*res, plan["secs"])
                r.update(spread=spread_name, policy=policy, load=load, slots=slots,
                         keepalive=keepalive, timeout_ms=plan["timeout_ms"],
                         load_avg=load_avg)
                log(f"  thumbs/s {r['thumb']['per_sec']:.0f}, thumb timeouts "
                    f"{r['thumb']['timeout_pct']:.2f}%, refused "
                    f"{r['thumb']['refused_pct']:.1f}%, static timeouts "
                    f"{r['static']['timeout_pct']:.2f}%")
                results.append(r)
    return results


def overload(quick, secs, part=None):
    plan = dict(OVERLOAD_PLANS["quick" if quick else "full"])
    if secs:
        plan["secs"] = secs
    load_before = os.getloadavg()
    results = []
    if part == "targets":
        # the target cells again, as a further round beside the last run's
        data = json.loads((OUT / "overload.json").read_text())
        sys.path.insert(0, str(BENCH))
        import fairness_report
        rnd = 1 + max(r.get("round", 0) for r in data["results"])
        for keepalive in (False, True):
            for r in measure_overload(plan, keepalive, fairness_report.is_target):
                r["round"] = rnd
                data["results"].append(r)
        data["meta"].setdefault("rounds_at", {})[str(rnd)] = dict(
            date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            load_before=load_before, load_avg=os.getloadavg())
        (OUT / "overload.json").write_text(json.dumps(data, indent=1))
        fairness_report.write_overload(data["meta"], data["results"])
        return
    if part in (None, "new"):
        results += measure_overload(plan, keepalive=False)
    if part in (None, "keepalive"):
        results += measure_overload(plan, keepalive=True)
    if part:
        # the other half from the last run
        kept = json.loads((OUT / "overload.json").read_text())["results"]
        results += [r for r in kept if r["keepalive"] != (part == "keepalive")]
        results.sort(key=lambda r: r["keepalive"])
    meta = dict(quick=quick, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                cpus=os.cpu_count(), kernel=platform.release(),
                load_before=load_before, load_avg=os.getloadavg(),
                service_ms=SERVICE_MS, secs=plan["secs"],
                workers=OVERLOAD_WORKERS, threads=OVERLOAD_THREADS)
    (OUT / "overload.json").write_text(json.dumps(dict(meta=meta, results=results),
                                                  indent=1))
    sys.path.insert(0, str(BENCH))
    import fairness_report
    fairness_report.write_overload(meta, results)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--overload", action="store_true",
                    help="only the overload cells")
    ap.add_argument("--secs", type=int, default=0,
                    help="seconds per overload cell (default: the plan's)")
    ap.add_argument("--part", choices=("new", "keepalive", "targets"),
                    help="with --overload: only these cells, the others kept "
                         "from bench/out/overload.json (targets: the target "
                         "cells once more, as a further round)")
    args = ap.parse_args()
    quick = args.quick or os.environ.get("QUICK") not in (None, "", "0")
    plan = PLANS["quick" if quick else "full"]
    OUT.mkdir(exist_ok=True)
    if args.overload:
        overload(quick, args.secs, args.part)
        return
    images = make_images()
    load_before = os.getloadavg()
    rounds = plan["rounds"]
    results = measure(MODES, "sim", plan["loads"], plan["secs"],
                      plan["timeout_ms"], images, rounds, keepalive=False)
    results += measure(MODES, "sim", plan["ka_loads"], plan["secs"],
                       plan["timeout_ms"], images, rounds, keepalive=True)
    results += measure(REAL_MODES, "real", plan["real_loads"],
                       plan["real_secs"], plan["real_timeout_ms"], images, 1,
                       keepalive=False)
    meta = dict(quick=quick, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                cpus=os.cpu_count(), kernel=platform.release(),
                load_before=load_before, load_avg=os.getloadavg(),
                service_ms=SERVICE_MS, rounds=rounds, secs=plan["secs"])
    (OUT / "fairness.json").write_text(json.dumps(dict(meta=meta, results=results),
                                                  indent=1))
    sys.path.insert(0, str(BENCH))
    import fairness_report
    fairness_report.write(meta, results)
    overload(quick, args.secs)


if __name__ == "__main__":
    main()
