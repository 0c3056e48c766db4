"""make bench's harness: the nginx it starts (one per variant, under
bench/out/NAME), wrk, and what it reads of their processes in /proc.
Shared by run.py and compare.py."""

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import procs
import rust_pool
from procs import free_port

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
OUT = BENCH / "out"
WRK = "wrk"
WRK_SCRIPT = BENCH / "wrk_json.lua"
WAF_RULES = REPO / "nginx-conf/waf_rules.lua"
# The Rust WAF as a pool handler (examples/waf-rust, src/handler.rs).
WAF_RUST_LIB = procs.RELEASE_DIR / "libwaf_rust.so"


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def stat_fields(path):
    """The fields of a /proc stat file after the command (index 0: the
    state), or None if it is gone."""
    try:
        stat = Path(path).read_text()
    except OSError:
        return None
    # the command may hold spaces and parentheses: split after the last ')'
    return stat[stat.rindex(")") + 2:].split()


def children(pid):
    """Pids of the processes whose parent is pid."""
    out = []
    for d in Path("/proc").iterdir():
        fields = stat_fields(d / "stat") if d.name.isdigit() else None
        if fields and int(fields[1]) == pid:
            out.append(int(d.name))
    return out


def kib(path, key):
    """The `key: N kB` field of a /proc file."""
    for line in Path(path).read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def rss_kib(pid):
    return kib(f"/proc/{pid}/status", "VmRSS")


def thread_count(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def thread_cpu_us(pid, tid):
    """CPU time of thread tid of pid, in µs: the scheduler's run time
    (schedstat, in ns), or where that is missing user + system time (stat,
    10 ms ticks); 0 once the thread is gone."""
    task = f"/proc/{pid}/task/{tid}"
    try:
        return int(Path(f"{task}/schedstat").read_text().split()[0]) / 1000
    except (OSError, ValueError, IndexError):
        pass
    fields = stat_fields(f"{task}/stat")
    if not fields:
        return 0.0
    return (int(fields[11]) + int(fields[12])) * 1e6 / os.sysconf("SC_CLK_TCK")


def thread_writes(pid, comm):
    """Write system calls made so far by pid's threads named comm (their
    /proc io counters)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        task = Path(f"/proc/{pid}/task/{tid}")
        try:
            if (task / "comm").read_text().strip() != comm:
                continue
            io = (task / "io").read_text()
        except OSError:
            continue
        total += int(next(l.split()[1] for l in io.splitlines() if l.startswith("syscw:")))
    return total


def pool_threads_cpu_us(pid):
    """CPU time of pid's threads but the main one (the event loop), in µs."""
    return sum(thread_cpu_us(pid, tid) for tid in os.listdir(f"/proc/{pid}/task")
               if int(tid) != pid)


def others_cpu_s(pid):
    """CPU seconds the machine has spent on anything but process pid
    (stolen time included): what competed with it for the cores."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
    fields = stat_fields(f"/proc/{pid}/stat")
    return (busy - int(fields[11]) - int(fields[12])) / os.sysconf("SC_CLK_TCK")


# Pools beside rwt, tp and tpc, and their handlers ({repo}: the source
# tree): the WAF cell's, and the hand-off section's Rust pool.
POOL_HANDLERS = {
    "waf_lua": "thread_pool_process_by_lua_file waf_lua {repo}/nginx-conf/waf.lua;",
    "waf_rust": f"thread_pool_process_by_rust waf_rust {WAF_RUST_LIB} {WAF_RULES};",
    "mech": "thread_pool_process_by_lua mech \"return require('bench_mech').task\";",
    "stream_lua": "thread_pool_process_by_lua stream_lua "
                  "\"return require('bench_stream').task\";",
    # the updates section's: a task, and the update chunk that replaces its
    # state (bench/lua/bench_updates.lua)
    "upd": "thread_pool_process_by_lua upd \"return require('bench_updates').task\";\n"
           "thread_pool_update_by_lua upd \"require('bench_updates').apply(...)\";",
    rust_pool.POOL: rust_pool.DIRECTIVE,
}
# The pools of POOL_HANDLERS whose handler is a library: the library, and
# the command that builds it.
LIBRARIES = {
    "waf_rust": (WAF_RUST_LIB, "cargo build --release -p waf-rust"),
    rust_pool.POOL: (rust_pool.LIB, rust_pool.BUILD),
}


class Nginx:
    """One nginx under bench/out/NAME: started on a free loopback port,
    stopped (QUIT, then TERM, then KILL) on exit from the with block. Its
    configuration, bench/lua, lua/ and nginx-conf/ come from the source
    tree `tree`, the module from `module` (this checkout's by default);
    `pools` adds pools of POOL_HANDLERS. `workers` worker processes (the
    updates section's 2; `worker` is the one that answered first), and
    `listen`, options of the listen directive (" reuseport")."""

    last = None  # the last nginx started: its versions and logs for the report

    def __init__(self, name, tp_threads=2, rwt_threads=2, scheduling=None,
                 copying_pool=False, pools=(), tree=REPO, module=procs.MODULE,
                 workers=1, listen=""):
        self.name = name
        self.nworkers = workers
        self.prefix = OUT / name
        self.port = free_port()
        for sub in ("conf", "logs"):
            (self.prefix / sub).mkdir(parents=True, exist_ok=True)
        for f in (self.prefix / "logs").iterdir():
            f.unlink()
        extra, pools = pools, []
        if rwt_threads:
            pools.append(f"thread_pool rwt threads={rwt_threads};")
        handler = ""
        if tp_threads:
            # tpc: the same pool, copying every string
            names = ("tp", "tpc") if copying_pool else ("tp",)
            pools += [f"thread_pool {name} threads={tp_threads};" for name in names]
            handler = "\n".join(
                f"thread_pool_process_by_lua {name} "
                "\"return require('bench_tasks').call\";" for name in names)
            if copying_pool:
                handler += "\nthread_pool_zero_copy tpc off;"
            if scheduling:
                handler += f"\nthread_pool_scheduling tp {scheduling};"
        for pool in extra:
            pools.append(f"thread_pool {pool} threads={tp_threads or 2};")
            handler += "\n" + POOL_HANDLERS[pool].format(repo=tree)
        conf = (tree / "bench/nginx.conf.tmpl").read_text()
        fields = dict(procs.module_fields(module), REPO=str(tree), PORT=str(self.port),
                      POOLS="\n".join(pools), TP_HANDLER=handler,
                      WORKERS=str(workers), LISTEN=listen)
        for key, value in fields.items():
            conf = conf.replace(f"@{key}@", value)
        (self.prefix / "conf/nginx.conf").write_text(conf)
        self.proc = None
        self.worker = None
        self.info = {}
        Nginx.last = self

    def __enter__(self):
        self.proc = procs.start(self.prefix)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx {self.name} exited: "
                                   + self.problems_text())
            try:
                info = self.get_json("/info", timeout=2)
                if len(self.workers()) < self.nworkers:
                    raise ValueError("workers still starting")
                self.info = info
                self.worker = info["worker_pid"]
                return self
            except (OSError, ValueError):
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nginx {self.name} did not answer: "
                           + self.problems_text())

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        procs.stop(self.proc, 15,
                   lambda sig: log(f"nginx {self.name} still running after {sig.name}"))

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def get_json(self, path, timeout):
        with urllib.request.urlopen(self.url(path), timeout=timeout) as r:
            return json.loads(r.read())

    def errors(self):
        """Failures the heavy handlers counted since the last call."""
        return self.get_json("/errors", timeout=10)

    def problems(self):
        """error.log lines at warn or worse, and nginx's stderr."""
        lines = []
        for f in ("error.log", "stderr.log"):
            p = self.prefix / "logs" / f
            if p.exists():
                lines += [l for l in p.read_text(errors="replace").splitlines()
                          if l.strip()]
        return lines

    def problems_text(self):
        return "\n".join(self.problems()[-20:]) or "(no log lines)"

    def workers(self):
        """The pids of its worker processes."""
        return children(self.proc.pid)

    def alive(self):
        """Whether the worker that started is still the one running (a
        crash makes the master start another)."""
        return self.proc.poll() is None and self.worker in children(self.proc.pid)


def start_native(stack, name, pool, **kw):
    """An nginx NAME (Nginx arguments in kw) with POOL, a pool whose handler
    is a library (LIBRARIES), entered in stack, and None; or None and why
    not: the library is not built, or nginx did not start (a module
    without thread_pool_process_by_rust: make bench-compare's base)."""
    lib, build = LIBRARIES[pool]
    if not lib.exists():
        return None, f"{lib.relative_to(REPO)} is not built ({build})"
    try:
        return stack.enter_context(Nginx(name, pools=(pool,), **kw)), None
    except RuntimeError as e:
        return None, f"its nginx did not start: {e}"


def wrk_start(url, conns, secs, script=WRK_SCRIPT, env=None):
    threads = 1 if conns < 8 else 2
    cmd = [WRK, "-t", str(threads), "-c", str(conns), "-d", f"{secs}s",
           "--timeout", "10s", "-s", str(script), url]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env and {**os.environ, **env})


def wrk_wait(proc, secs):
    """The JSON line of wrk_json.lua, with req/s and ok req/s added."""
    try:
        out, err = proc.communicate(timeout=secs + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise RuntimeError("wrk did not finish in time")
    for line in out.splitlines():
        if line.startswith("BENCH_JSON "):
            r = json.loads(line[len("BENCH_JSON "):])
            dur = r["duration_us"] / 1e6
            r["rps"] = r["requests"] / dur if dur else 0.0
            r["ok_rps"] = (r["requests"] - r["status"]) / dur if dur else 0.0
            return r
    raise RuntimeError(f"wrk gave no result: {out}\n{err}")


def wrk_run(url, conns, secs):
    return wrk_wait(wrk_start(url, conns, secs), secs)
