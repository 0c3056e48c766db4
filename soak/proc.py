"""What the soak reads from /proc about nginx's processes."""

import os
from pathlib import Path


def _stat_fields(pid):
    """The fields of /proc/PID/stat after the command (state is [0], ppid
    [1]); None once the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command may hold spaces and parentheses: split after the last ')'
    return stat[stat.rindex(")") + 2:].split()


def alive(pid):
    """Whether pid runs (a zombie has ended)."""
    f = _stat_fields(pid)
    return f is not None and f[0] != "Z"


def children(pid):
    """Pids of the live processes whose parent is pid."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            f = _stat_fields(d.name)
            if f is not None and int(f[1]) == pid and f[0] != "Z":
                out.append(int(d.name))
    return sorted(out)


def title(pid):
    """The process title nginx sets ("nginx: worker process", "nginx:
    worker process is shutting down", ...); "" once gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()


def workers(master):
    """(current, exiting): the master's worker processes, those serving
    and those shutting down after a reload."""
    current, exiting = [], []
    for pid in children(master):
        t = title(pid)
        if t.startswith("nginx: worker process"):
            (exiting if "shutting down" in t else current).append(pid)
    return current, exiting


def usage(pid):
    """RSS (KiB), open fds and threads of pid; None once it is gone."""
    try:
        rss = None
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        threads = len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None
    if rss is None:
        return None
    return dict(rss_kib=rss, fds=fds, threads=threads)
