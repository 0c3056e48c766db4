"""The soak's load: request kinds, what each may answer, and the bounded
client loops that send them (loopback only).

Every request ends in one outcome. A kind's `expected` outcomes are the
only ones it may give; anything else (another status or body, a reset, a
connection closed early, no answer in time) is unexpected and fails the
soak. The kinds' server side is soak/soak_http.lua.
"""

import random
import socket
import threading
import time
from collections import Counter

MIB = 1024 * 1024
# What push_task lets cross in one call (docs/lua-api.md: 16 MiB per call).
LIMIT = 16 * MIB
# How long a client waits for an answer before the request counts as lost.
ANSWER_TIMEOUT = 60.0


class Kind:
    """One kind of request: its path (a function of the random source, so
    that a kind can vary its query), its weight among the mixed clients,
    and the outcomes it may give."""

    def __init__(self, name, what, expected, weight, path=None, optional=()):
        self.name = name
        self.what = what
        self.expected = frozenset(expected)
        # what a run must have seen at least once
        self.must_see = self.expected - frozenset(optional)
        self.weight = weight
        self._path = path or (lambda rnd: f"/k/{name}")

    def path(self, rnd):
        return self._path(rnd)


def big_path(name):
    """1-16 MiB each way; one request in eight over the limit one way."""

    def path(rnd):
        size = lambda: rnd.randint(MIB, LIMIT - 1024)
        n_in, n_out = size(), size()
        if rnd.random() < 1 / 8:
            if rnd.random() < 0.5:
                n_in = LIMIT + rnd.randint(1, 1024)
            else:
                n_out = LIMIT + rnd.randint(1, 1024)
        return f"/k/{name}?in={n_in}&out={n_out}"

    return path


def abort_path(rnd):
    return "/k/abort_on" if rnd.random() < 0.5 else "/k/abort_off"


# The mixed clients' kinds. Weights are relative; a timeout or abort holds
# a `slow` thread for 100-400 ms after its caller left (the pool is kept
# under half busy), a big one moves up to 32 MiB, an oom allocates up to
# 64 MiB: those are kept rarer.
KINDS = [
    Kind("push", "push_task: a 16 B-40 KiB string and a table, echoed and checked",
         {"ok"}, 20),
    Kind("fanout", "four light threads push_task at once", {"ok"}, 5),
    Kind("batch", "push_tasks: 12 tasks, every fourth raising error()", {"ok"}, 6),
    Kind("post", "post_task: a counted task and a failing one; another in log_by_lua",
         {"posted"}, 6),
    Kind("timeout", "push_task_timeout(0.02) of a 150 ms task given a 16-256 KiB string "
         "(read in place after the caller left), or refused at once while the pool is busy",
         {"timeout", "overloaded"}, 4, optional=("overloaded",)),
    Kind("batch_timeout", "push_tasks_timeout(0.02) of a 400 ms task (logged as slow) "
         "and an echo, each given a 16-256 KiB string", {"timeout", "overloaded"}, 1,
         optional=("overloaded",)),
    Kind("abort", "the client closes (FIN or RST) while its 100 ms task runs on a "
         "16-256 KiB string; lua_check_client_abort on and off", {"aborted"}, 4, abort_path),
    Kind("error_string", "the handler raises error(\"boom N\")", {"error"}, 5),
    Kind("error_table", "the handler raises error({ code = N, ... })", {"error"}, 5),
    Kind("oom", "the handler holds 16-64 MiB and asks LuaJIT for a string past "
         "its limit; then an echo on the same pool", {"oom"}, 1),
    Kind("big", "1-16 MiB each way, read in place (zero-copy); 1 in 8 over 16 MiB",
         {"ok", "limit"}, 2, big_path("big"), optional={"limit"}),
    Kind("big_copy", "1-16 MiB each way, copied (thread_pool_zero_copy off); "
         "1 in 8 over 16 MiB", {"ok", "limit"}, 1, big_path("big_copy"),
         optional={"limit"}),
    Kind("full", "a pool of one thread and one slot, its thread held: three posts "
         "(two refused) and a push (refused)", {"full"}, 2),
    Kind("rwt", "ngx.run_worker_thread on nginx's own pool, beside the module's",
         {"ok"}, 4),
]
# Sent by their own loops, not the mixed clients.
STATIC = Kind("static", "GET /static on a kept-alive connection", {"ok", "ok-retried"}, 0,
              optional={"ok-retried"})
METRICS = Kind("metrics", "thread_pool_status, parsed by prometheus_client (during a reload, "
               "without a new worker that has not started yet)", {"ok", "ok-reloading"}, 0,
               optional={"ok-reloading"})
# The start of soak.metrics_check's error for workers with no counters yet.
NOT_STARTED = "no counters yet for worker"
ALL_KINDS = KINDS + [STATIC, METRICS]
# Faults to show that the soak fails when it should (soak.py --inject
# NAME): each breaks one thing the soak checks.
INJECT = {k.name[len("inject_"):]: k for k in [
    Kind("inject_crash", "the handler calls abort() through the FFI: the worker dies",
         {"ok"}, 1),
    Kind("inject_drop", "nginx closes the connection without an answer (return 444)",
         {"ok"}, 2),
    Kind("inject_leak_fd", "the handler opens /dev/null and never closes it", {"ok"}, 2),
    Kind("inject_leak_mem", "the handler mallocs 4 MiB, touches it and never frees it",
         {"ok"}, 2),
]}
BY_NAME = {k.name: k for k in ALL_KINDS + list(INJECT.values())}


class Tally:
    """Outcomes by minute and kind, and the unexpected ones in detail.
    Shared by the client threads."""

    def __init__(self, t0, last_minute=None, keep=50):
        self.t0 = t0
        self.last_minute = last_minute   # answers after the end count there
        self.lock = threading.Lock()
        self.counts = Counter()        # (minute, kind, outcome) -> n
        self.unexpected = []            # the first `keep`, in detail
        self.n_unexpected = 0
        self.keep = keep

    def minute(self, t):
        minute = int((t - self.t0) // 60)
        if self.last_minute is not None:
            minute = min(minute, self.last_minute)
        return minute

    def add(self, kind, outcome, detail="", t=None):
        t = time.monotonic() if t is None else t
        minute = self.minute(t)
        bad = outcome not in BY_NAME[kind].expected
        with self.lock:
            self.counts[(minute, kind, outcome)] += 1
            if bad:
                self.n_unexpected += 1
                if len(self.unexpected) < self.keep:
                    self.unexpected.append(dict(
                        t=round(t - self.t0, 3), kind=kind, outcome=outcome,
                        detail=detail[:300]))

    def snapshot(self):
        with self.lock:
            return Counter(self.counts), list(self.unexpected), self.n_unexpected


# ---- HTTP on a socket ------------------------------------------------------

class Lost(Exception):
    """No complete answer: `outcome` says how it went."""

    def __init__(self, outcome, detail=""):
        super().__init__(f"{outcome}: {detail}")
        self.outcome = outcome
        self.detail = detail


def _recv_some(sock):
    try:
        data = sock.recv(65536)
    except socket.timeout:
        raise Lost("no answer", "timed out waiting")
    except ConnectionResetError:
        raise Lost("reset")
    except OSError as e:
        raise Lost("socket error", str(e))
    return data


def read_head(sock, buf):
    """Reads up to the end of the headers: (status, headers, rest)."""
    while b"\r\n\r\n" not in buf:
        try:
            data = _recv_some(sock)
        except Lost as e:
            if buf and e.outcome == "reset":
                raise Lost("reset mid-answer", f"{len(buf)} bytes of headers")
            raise
        if not data:
            raise Lost("closed early" if buf else "closed without answer",
                       f"{len(buf)} bytes of headers")
        buf += data
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise Lost("bad answer", lines[0][:100])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(parts[1]), headers, rest


def dechunk(body):
    """The payload of a complete chunked body, or None if it is cut short."""
    out = bytearray()
    pos = 0
    while True:
        end = body.find(b"\r\n", pos)
        if end < 0:
            return None
        try:
            size = int(body[pos:end].split(b";")[0], 16)
        except ValueError:
            return None
        start = end + 2
        if size == 0:
            return bytes(out)
        if len(body) < start + size + 2:
            return None
        out += body[start:start + size]
        pos = start + size + 2


def read_body(sock, headers, rest, until_close):
    """The body after the headers: by Content-Length, chunked, or (for a
    `Connection: close` answer without either) to the end."""
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(rest) < n:
            data = _recv_some(sock)
            if not data:
                raise Lost("closed early", f"{len(rest)} of {n} body bytes")
            rest += data
        return rest[:n]
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            body = dechunk(rest)
            if body is not None:
                return body
            data = _recv_some(sock)
            if not data:
                raise Lost("closed early", "chunked body cut short")
            rest += data
    if until_close:
        while True:
            data = _recv_some(sock)
            if not data:
                return rest
            rest += data
    raise Lost("bad answer", "no length on a kept-alive connection")


def connect(port, timeout):
    try:
        return socket.create_connection(("127.0.0.1", port), timeout=timeout)
    except socket.timeout:
        raise Lost("no answer", "connect timed out")
    except ConnectionRefusedError:
        raise Lost("refused")
    except OSError as e:
        raise Lost("socket error", f"connect: {e}")


def request(port, path, timeout=ANSWER_TIMEOUT):
    """One GET on a new connection (`Connection: close`): (status, body)."""
    with connect(port, timeout) as sock:
        try:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: soak\r\n"
                         "Connection: close\r\n\r\n".encode())
        except OSError as e:
            raise Lost("reset" if isinstance(e, ConnectionResetError) else "socket error",
                       f"send: {e}")
        status, headers, rest = read_head(sock, b"")
        return status, read_body(sock, headers, rest, until_close=True)


def outcome_of(status, body):
    """The outcome a kind's answer stands for: its body's first word on a
    200, else the status (a 500 from soak_http.lua carries BAD and why)."""
    text = body.decode("utf-8", "replace").strip()
    if status == 200 and text and " " not in text:
        return text, ""
    return f"status {status}" if status != 200 else "unexpected body", text[:300]


def abort_request(port, path, rnd, timeout=ANSWER_TIMEOUT):
    """Reads the "pushed" line, then goes away: a FIN, or an RST (linger
    0). "aborted" if the line came."""
    with connect(port, timeout) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: soak\r\n"
                     "Connection: close\r\n\r\n".encode())
        status, headers, rest = read_head(sock, b"")
        while b"pushed\n" not in rest:
            data = _recv_some(sock)
            if not data:
                raise Lost("closed early", f"status {status}, {rest[:100]!r}")
            rest += data
        if status != 200:
            return f"status {status}", rest[:300].decode("latin-1")
        if rnd.random() < 0.5:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                            b"\x01\x00\x00\x00\x00\x00\x00\x00")
        return "aborted", ""


class KeepAlive:
    """GETs on one kept-alive connection, reopened when nginx closes it.
    A request that fails on a reused connection before any byte of its
    answer came back is retried once on a new one ("ok-retried"): nginx
    closes idle kept-alive connections when it reloads, and a request sent
    just then meets the close (RFC 9110, 9.2.2: clients retry idempotent
    requests so)."""

    def __init__(self, port):
        self.port = port
        self.sock = None

    def close(self):
        if self.sock:
            self.sock.close()
            self.sock = None

    def get(self, path, timeout=ANSWER_TIMEOUT):
        reused = self.sock is not None
        try:
            return self._get(path, timeout) + (False,)
        except Lost as e:
            self.close()
            if not (reused and e.outcome in ("reset", "closed without answer")):
                raise
        return self._get(path, timeout) + (True,)

    def _get(self, path, timeout):
        if self.sock is None:
            self.sock = connect(self.port, timeout)
        try:
            self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: soak\r\n\r\n".encode())
        except OSError as e:
            raise Lost("reset", f"send: {e}")
        status, headers, rest = read_head(self.sock, b"")
        body = read_body(self.sock, headers, rest, until_close=False)
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, body


# ---- the client loops ------------------------------------------------------

class Load:
    """The client threads. Every loop stops by itself at `deadline` or
    after `max_requests`, whichever comes first; `pause()` holds them
    between requests (and closes kept-alive connections) until `resume()`."""

    def __init__(self, port, tally, deadline, kinds=KINDS, clients=6, pace=0.06,
                 max_requests=2_000_000, seed=1, metrics_check=None,
                 metrics_every=2.0, static_every=0.05):
        self.port = port
        self.tally = tally
        self.deadline = deadline
        self.kinds = kinds
        self.clients = clients
        self.pace = pace
        self.max_requests = max_requests
        self.seed = seed
        self.metrics_check = metrics_check
        self.metrics_every = metrics_every
        self.static_every = static_every
        self.running = threading.Event()
        self.running.set()
        # moved on by the soak as a reload begins (odd: before its HUP) and
        # as it ends (even: once every new worker counts in
        # thread_pool_status)
        self.reload_phase = 0
        self.stop_now = threading.Event()
        self.lock = threading.Lock()
        self.in_flight = 0
        # Every kind once, in an order of the seed's, before the weighted
        # draws: each runs however few requests a slow machine gets through.
        self.first = [k for k in kinds if k.weight > 0]
        random.Random(seed).shuffle(self.first)
        self.threads = []
        self.metrics_max = {}      # the largest value of each, over the run
        self.metrics_by_minute = {}  # the last scrape of each minute

    # in-flight accounting, so that pause() can wait for quiet
    def _begin(self):
        with self.lock:
            self.in_flight += 1

    def _end(self):
        with self.lock:
            self.in_flight -= 1

    def _go(self):
        """Waits while paused; false once the loop must stop."""
        while not self.running.is_set():
            if self.stop_now.is_set() or time.monotonic() >= self.deadline:
                return False
            self.running.wait(0.05)
        return not self.stop_now.is_set() and time.monotonic() < self.deadline

    def pause(self, limit=ANSWER_TIMEOUT):
        """Holds every loop between requests; returns whether the requests
        in flight all ended within `limit` seconds."""
        self.running.clear()
        end = time.monotonic() + limit
        while time.monotonic() < end:
            with self.lock:
                if self.in_flight == 0:
                    return True
            time.sleep(0.02)
        return False

    def resume(self):
        self.running.set()

    def start(self):
        for i in range(self.clients):
            self.threads.append(threading.Thread(
                target=self._mixed, args=(random.Random(self.seed * 1000 + i),),
                name=f"soak-client-{i}", daemon=True))
        self.threads.append(threading.Thread(target=self._static, name="soak-static",
                                             daemon=True))
        self.threads.append(threading.Thread(target=self._metrics, name="soak-metrics",
                                             daemon=True))
        for t in self.threads:
            t.start()

    def join(self, limit):
        """Waits for every loop to end (they stop by themselves at the
        deadline); after `limit` seconds tells them to stop now."""
        end = time.monotonic() + limit
        for t in self.threads:
            t.join(max(0.0, end - time.monotonic()))
        if any(t.is_alive() for t in self.threads):
            self.stop_now.set()
            self.running.set()
            for t in self.threads:
                t.join(ANSWER_TIMEOUT + 5)
        return not any(t.is_alive() for t in self.threads)

    def _one(self, kind, fn):
        self._begin()
        try:
            outcome, detail = fn()
        except Lost as e:
            outcome, detail = e.outcome, e.detail
        except OSError as e:
            outcome, detail = "socket error", str(e)
        finally:
            self._end()
        self.tally.add(kind, outcome, detail)

    def _mixed(self, rnd):
        kinds = [k for k in self.kinds if k.weight > 0]
        weights = [k.weight for k in kinds]
        for _ in range(self.max_requests):
            if not self._go():
                return
            with self.lock:
                kind = self.first.pop() if self.first else None
            kind = kind or rnd.choices(kinds, weights)[0]
            path = kind.path(rnd)
            if kind.name == "abort":
                self._one("abort", lambda: abort_request(self.port, path, rnd))
            else:
                self._one(kind.name, lambda: outcome_of(*request(self.port, path)))
            time.sleep(rnd.uniform(0, 2 * self.pace))

    def _static(self):
        conn = KeepAlive(self.port)

        def get():
            status, body, retried = conn.get("/static")
            if status == 200 and body == b"static\n":
                return ("ok-retried" if retried else "ok"), ""
            return outcome_of(status, body)

        try:
            for _ in range(self.max_requests):
                if not self.running.is_set():
                    conn.close()   # quiet samples see no client connection
                if not self._go():
                    return
                self._one("static", get)
                time.sleep(self.static_every)
        finally:
            conn.close()

    def _metrics(self):
        def scrape():
            phase = self.reload_phase
            status, body = request(self.port, "/metrics")
            if status != 200:
                return outcome_of(status, body)
            if self.metrics_check:
                err, parsed = self.metrics_check(body.decode("utf-8", "replace"))
                # a reload was under way at some time of the scrape
                reloading = phase % 2 or phase != self.reload_phase
                if err and err.startswith(NOT_STARTED) and reloading:
                    return "ok-reloading", err
                if err:
                    return "unparsable", err
                self.metrics_by_minute[self.tally.minute(time.monotonic())] = parsed
                for k, v in parsed.items():
                    self.metrics_max[k] = max(v, self.metrics_max.get(k, v))
            return "ok", ""

        for _ in range(self.max_requests):
            if not self._go():
                return
            self._one("metrics", scrape)
            time.sleep(self.metrics_every)
