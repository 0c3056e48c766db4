"""What bench/harness.py, bench/fairness.py and soak/soak.py share about
the nginx they start: pick a free loopback port, start it, stop it, and name
the machine and versions it ran on."""

import os
import platform
import random
import signal
import socket
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The nginx under test: NGX_TP_NGINX when set (make test-openresty: OpenResty's
# nginx, the lua module compiled in), else Debian's.
NGINX = os.environ.get("NGX_TP_NGINX", "/usr/sbin/nginx")
MODULES = "/usr/lib/nginx/modules"
# The module cargo built: under CARGO_TARGET_DIR when set (matrix/chroot.sh
# sets one per Debian release; a relative one is the repository's, where make
# runs cargo).
RELEASE_DIR = REPO / os.environ.get("CARGO_TARGET_DIR", "target") / "release"
MODULE = RELEASE_DIR / "libngx_threadpool.so"


def lua_module_lines():
    """The load_module lines of ngx_devel_kit and lua-nginx-module, to go
    before this module's: none when the lua module is compiled into nginx
    (its -V lists it among --add-module)."""
    flags = subprocess.run([NGINX, "-V"], capture_output=True, text=True).stderr.split()
    if any(f.startswith("--add-module=") and "lua-nginx-module" in f for f in flags):
        return ""
    return (f"load_module {MODULES}/ndk_http_module.so;\n"
            f"load_module {MODULES}/ngx_http_lua_module.so;\n")


def module_fields(module=MODULE):
    """The fields every nginx.conf template here has: @LUA_MODULES@, then
    @MODULE@ for this module's load_module, and @USER@ (as root, workers
    would run as nobody, who may not read a checkout in a private
    directory)."""
    return dict(LUA_MODULES=lua_module_lines(), MODULE=str(module),
                USER="user root;" if os.geteuid() == 0 else "")


def free_port():
    """A loopback port no socket holds, below the kernel's ephemeral ports:
    one the kernel handed out (bind to port 0) can be a client's local port
    (wrk's, by the thousand) by the time nginx binds it."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral = int(f.read().split()[0])
    for port in random.sample(range(20000, ephemeral), ephemeral - 20000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port below %d" % ephemeral)


def start(prefix, *args):
    """Starts nginx on `prefix` (its conf/nginx.conf, then `args`), with its
    stdout and stderr in logs/stderr.log: the Popen of the master."""
    with open(prefix / "logs/stderr.log", "w") as stderr:
        return subprocess.Popen([NGINX, "-p", str(prefix), "-c", "conf/nginx.conf", *args],
                                stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr)


def stop(proc, quit_wait, on_timeout=None):
    """Stops an nginx master: QUIT (a graceful stop, up to `quit_wait`
    seconds), then TERM, then KILL; `on_timeout(sig)` hears of each signal
    that did not end it in time."""
    if proc is None or proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGQUIT, quit_wait), (signal.SIGTERM, 5),
                      (signal.SIGKILL, 5)):
        proc.send_signal(sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            if on_timeout:
                on_timeout(sig)


def machine(nginx, **commands):
    """The machine and versions a report names: CPUs, kernel, the nginx
    binary `nginx`, Python, the checkout's commit, and the first line each
    of `commands` (name=argv) prints."""
    def run(cmd):
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            return (p.stdout + p.stderr).strip()
        except OSError as e:
            return f"({e})"

    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return dict(
        nproc=os.cpu_count(), cpu=cpu, kernel=platform.release(),
        nginx=run([nginx, "-v"]).replace("nginx version: ", ""),
        python=platform.python_version(),
        commit=run(["git", "-C", str(REPO), "describe", "--always", "--dirty"]),
        **{name: (run(argv).splitlines() or [""])[0] for name, argv in commands.items()},
    )
