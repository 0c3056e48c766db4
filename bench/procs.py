"""What bench/harness.py, bench/fairness.py and soak/soak.py share about
the nginx they start: pick a free loopback port, start it, stop it, and name
the machine and versions it ran on."""

import os
import platform
import signal
import socket
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NGINX = "/usr/sbin/nginx"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
