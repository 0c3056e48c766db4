"""What bench/run.py and bench/fairness.py both do with the nginx they
start: pick a free loopback port, and stop it."""

import signal
import socket
import subprocess


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
