"""The soak's own logic, without nginx (make soak-test, part of make test):
the HTTP reading and the keep-alive retry rule against a scripted server
on loopback, the outcome tally, the log scan, the resource bounds, and
the report.

  /usr/bin/python3 -m unittest discover -s soak -p 'test_*.py'
"""

import socket
import sys
import tempfile
import threading
import unittest
from collections import Counter
from pathlib import Path

sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
import check  # noqa: E402
import load  # noqa: E402
import report  # noqa: E402
import soak  # noqa: E402


class Server:
    """A loopback server that answers each connection with the scripted
    behaviours in turn: bytes to send per request, or "close" (close
    without answering), or "reset" (close with an RST)."""

    def __init__(self, script):
        self.script = list(script)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while self.script:
            conn, _ = self.sock.accept()
            self.connections += 1
            with conn:
                while self.script:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                    if not data:
                        break
                    step = self.script.pop(0)
                    if step == "close":
                        break
                    if step == "reset":
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                        b"\x01\x00\x00\x00\x00\x00\x00\x00")
                        break
                    conn.sendall(step)
                    if b"Connection: close" in step:
                        break

    def close(self):
        self.sock.close()


OK_KEEP = b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nstatic\n"


class HttpTests(unittest.TestCase):
    def test_dechunk(self):
        self.assertEqual(load.dechunk(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"), b"abcde")
        self.assertIsNone(load.dechunk(b"3\r\nabc\r\n2\r\nd"))

    def test_chunked_answer_on_a_new_connection(self):
        srv = Server([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                      b"Connection: close\r\n\r\n3\r\nok\n\r\n0\r\n\r\n"])
        status, body = load.request(srv.port, "/k/push", timeout=5)
        self.assertEqual((status, body), (200, b"ok\n"))
        self.assertEqual(load.outcome_of(status, body), ("ok", ""))
        srv.close()

    def test_no_answer_is_lost(self):
        srv = Server(["close"])
        with self.assertRaises(load.Lost) as e:
            load.request(srv.port, "/k/push", timeout=5)
        self.assertEqual(e.exception.outcome, "closed without answer")
        srv.close()

    def test_an_answer_cut_short_is_lost(self):
        srv = Server([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"])
        with self.assertRaises(load.Lost) as e:
            load.request(srv.port, "/k/push", timeout=5)
        self.assertEqual(e.exception.outcome, "closed early")
        srv.close()

    def test_outcome_of_a_bad_answer(self):
        self.assertEqual(load.outcome_of(500, b"BAD echo: x\n"), ("status 500", "BAD echo: x"))
        self.assertEqual(load.outcome_of(200, b"two words\n"),
                         ("unexpected body", "two words"))

    def test_keepalive_retries_once_on_a_reused_connection(self):
        # the second request meets a close (as at a reload): retried
        srv = Server([OK_KEEP, "close", OK_KEEP])
        conn = load.KeepAlive(srv.port)
        self.assertEqual(conn.get("/static", timeout=5), (200, b"static\n", False))
        self.assertEqual(conn.get("/static", timeout=5), (200, b"static\n", True))
        self.assertEqual(srv.connections, 2)
        conn.close()
        srv.close()

    def test_keepalive_does_not_retry_a_fresh_connection(self):
        srv = Server(["close"])
        conn = load.KeepAlive(srv.port)
        with self.assertRaises(load.Lost):
            conn.get("/static", timeout=5)
        srv.close()

    def test_keepalive_does_not_retry_after_part_of_an_answer(self):
        srv = Server([OK_KEEP, b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nst"])
        conn = load.KeepAlive(srv.port)
        conn.get("/static", timeout=5)
        with self.assertRaises(load.Lost) as e:
            conn.get("/static", timeout=5)
        self.assertEqual(e.exception.outcome, "closed early")
        srv.close()


class TallyTests(unittest.TestCase):
    def test_expected_and_unexpected(self):
        t = load.Tally(t0=0.0, last_minute=1)
        t.add("push", "ok", t=5)
        t.add("push", "reset", "send", t=70)
        t.add("timeout", "timeout", t=200)     # after the end: the last minute
        counts, unexpected, n = t.snapshot()
        self.assertEqual(counts[(0, "push", "ok")], 1)
        self.assertEqual(counts[(1, "timeout", "timeout")], 1)
        self.assertEqual(n, 1)
        self.assertEqual(unexpected[0]["outcome"], "reset")

    def test_outcome_failures(self):
        kinds = {k: load.BY_NAME[k] for k in ("push", "big", "static")}
        counts = Counter({(0, "push", "ok"): 3, (0, "big", "ok"): 1, (0, "static", "ok"): 2})
        self.assertEqual(check.outcome_failures(counts, 0, kinds), [])
        counts[(0, "push", "status 500")] += 1
        self.assertIn("push status 500 ×1", check.outcome_failures(counts, 1, kinds)[0])
        del counts[(0, "big", "ok")]
        counts[(0, "big", "limit")] = 1
        self.assertIn("no big request gave ok", check.outcome_failures(counts, 1, kinds))
        kinds["oom"] = load.BY_NAME["oom"]
        self.assertIn("no oom request ran", check.outcome_failures(counts, 1, kinds))


LOG = """\
2026/11/24 03:52:27 [notice] 100#100: start worker process 101
2026/11/24 03:52:28 [warn] 101#103: ngx_threadpool: thread pool "work" thread #0: not enough memory; rebuilding its Lua state
2026/11/24 03:52:29 [notice] 100#100: worker process 101 exited with code 0
2026/11/24 03:52:29 [info] 101#101: *12 client prematurely closed connection
"""


class LogTests(unittest.TestCase):
    def test_clean_log(self):
        scan = check.LogScan()
        scan.feed(LOG, final=True)
        self.assertEqual(scan.fatal, [])
        self.assertEqual(scan.n_unexpected, 0)
        self.assertEqual(scan.levels["warn"], 1)

    def test_fatal_lines(self):
        for line, reason in [
            ("2026/11/24 03:52:29 [alert] 100#100: worker process 101 exited on signal 6", "crash"),
            ("2026/11/24 03:52:29 [notice] 100#100: worker process 101 exited with code 2",
             "worker exit code"),
            ("2026/11/24 03:52:29 [emerg] 100#100: bind() failed", "emerg"),
            ("thread 'tp work' panicked at src/worker/mod.rs:1", "panic"),
            ("fatal runtime error: Rust cannot catch foreign exceptions", "rust abort"),
            ("munmap_chunk(): invalid pointer", "heap corruption"),
        ]:
            scan = check.LogScan()
            scan.feed(line + "\n")
            self.assertEqual([r for r, _ in scan.fatal], [reason], line)

    def test_an_error_line_is_unexpected(self):
        scan = check.LogScan()
        scan.feed("2026/11/24 03:52:29 [error] 101#101: *5 lua entry thread aborted\n")
        self.assertEqual(scan.n_unexpected, 1)

    def test_lines_split_across_reads(self):
        scan = check.LogScan()
        scan.feed("2026/11/24 03:52:29 [al")
        self.assertEqual(scan.fatal, [])
        scan.feed("ert] 100#100: x\n")
        self.assertEqual(len(scan.fatal), 1)


def samples(worker_rss, master_rss=10240, fds=10, threads=10, early=None):
    """Late samples 30 s apart (MiB per generation, two workers each), and
    early ones (`early`: MiB per generation) 20 s before each."""
    out = []
    for i, rss in enumerate(worker_rss):
        t = 30.0 * (i + 1)
        for j in range(2):
            pid = 1000 + 10 * i + j
            out.append(dict(t=t, gen=i + 1, role="worker", phase="late", pid=pid,
                            rss_kib=rss * 1024, fds=fds, threads=threads))
            if early is not None:
                out.append(dict(t=t - 20, gen=i + 1, role="worker", phase="early", pid=pid,
                                rss_kib=early[i] * 1024, fds=fds, threads=threads))
        out.append(dict(t=t, gen=i + 1, role="master", phase="late", pid=1,
                        rss_kib=master_rss, fds=10, threads=1))
    return out


class BoundsTests(unittest.TestCase):
    def test_within_bounds(self):
        failures, m = check.resource_bounds(samples([40, 45, 38], early=[35, 40, 36]))
        self.assertEqual(failures, [])
        self.assertAlmostEqual(m["worker"]["growth_mib"], 5)
        self.assertAlmostEqual(m["generation"]["max_growth_mib"], 5)

    def test_growth_over_the_run(self):
        rss = [40, 45, 40 + check.WORKER_RSS_GROWTH_MIB + 1]
        failures, _ = check.resource_bounds(samples(rss))
        self.assertTrue(any("grew by" in f and "over the run" in f for f in failures), failures)

    def test_growth_within_a_generation(self):
        late = [40, 40 + check.GEN_RSS_GROWTH_MIB + 2]
        failures, _ = check.resource_bounds(samples(late, early=[38, 40]))
        self.assertTrue(any("between its early and late" in f for f in failures), failures)

    def test_fds_and_threads_constant(self):
        s = samples([40, 40, 40])
        s[-2]["fds"] = 11
        failures, _ = check.resource_bounds(s)
        self.assertTrue(any("worker fds: 11" in f for f in failures), failures)
        s = samples([40, 40])
        s[0]["threads"] = 9
        failures, _ = check.resource_bounds(s)
        self.assertTrue(any("differ in threads" in f for f in failures), failures)

    def test_no_samples(self):
        self.assertEqual(check.resource_bounds([])[0], ["no resource samples were taken"])


METRICS = """\
# TYPE ngx_threadpool_tasks_pushed_total counter
{pushed}
# TYPE ngx_threadpool_accept_gate_paused_workers gauge
ngx_threadpool_accept_gate_paused_workers 0
"""


class MetricsTests(unittest.TestCase):
    def test_every_pool_and_worker(self):
        rows = "\n".join(f'ngx_threadpool_tasks_pushed_total{{pool="{p}",worker="{w}"}} 3'
                         for p in soak.POOLS for w in range(soak.WORKERS))
        err, summary = soak.metrics_check(METRICS.format(pushed=rows))
        self.assertIsNone(err)
        self.assertEqual(summary["tasks_pushed_total"], 3 * len(soak.POOLS) * soak.WORKERS)

    def test_a_pool_missing(self):
        rows = "\n".join(f'ngx_threadpool_tasks_pushed_total{{pool="{p}",worker="{w}"}} 3'
                         for p in soak.POOLS for w in range(soak.WORKERS) if (p, w) != ("work", 1))
        err, _ = soak.metrics_check(METRICS.format(pushed=rows))
        self.assertEqual(err, "no tasks_pushed_total for work/1")

    def test_a_worker_not_started(self):
        rows = "\n".join(f'ngx_threadpool_tasks_pushed_total{{pool="{p}",worker="0"}} 3'
                         for p in soak.POOLS)
        err, _ = soak.metrics_check(METRICS.format(pushed=rows))
        self.assertEqual(err, f"{load.NOT_STARTED} 1")


    def test_counters_that_never_moved(self):
        seen = {k: 1 for k in check.METRICS_MUST_MOVE}
        self.assertEqual(check.metrics_failures(seen), [])
        seen["tasks_abandoned_total"] = 0
        self.assertEqual(check.metrics_failures(seen),
                         ["thread_pool_status never showed tasks_abandoned_total above 0"])
        self.assertEqual(check.metrics_failures({}),
                         ["no scrape of thread_pool_status was read"])


class ReportTests(unittest.TestCase):
    def test_render(self):
        kinds = [load.BY_NAME[k] for k in ("push", "oom", "static")]
        res = dict(
            started="now", seconds=60, minutes=1, reload_every=30.0, clients=6, seed=1,
            passed=False, failures=["1 requests with unexpected outcomes: push reset ×1"],
            injected=["drop"],
            kinds=[dict(name=k.name, what=k.what, expected=sorted(k.expected),
                        weight=k.weight) for k in kinds],
            counts=[[0, "push", "ok", 10], [0, "push", "reset", 1], [0, "oom", "oom", 2],
                    [0, "static", "ok", 5]],
            unexpected=[dict(t=1.5, kind="push", outcome="reset", detail="send")],
            n_unexpected=1, samples=samples([40, 41], early=[39, 40]),
            generations=[], reloads=[dict(t=30, took=0.2, old=[1], new=[2])],
            measured=check.resource_bounds(samples([40, 41], early=[39, 40]))[1],
            bounds=dict(worker_rss_growth_mib=48, gen_rss_growth_mib=40,
                        master_rss_growth_mib=8, exit_after_reload_s=20),
            log_levels={"notice": 3}, log_shapes=[["warn", "x | y", 2]], log_fatal=[],
            log_unexpected=[], metrics={"0": {"tasks_pushed_total": 5}},
            counters=dict(posted=3, posted_done=3), conf="events {}\n",
            machine=dict(nproc=2, cpu="cpu", kernel="k", nginx="1.22.1", python="3",
                         commit="abc", loadavg=["0", "0", "0"]))
        with tempfile.TemporaryDirectory() as d:
            report.render(res, Path(d))
            md = (Path(d) / "SOAK.md").read_text()
        self.assertIn("**Verdict: FAIL.**", md)
        self.assertIn("10 **+1 bad**", md)
        self.assertIn("Faults injected on purpose", md)


if __name__ == "__main__":
    unittest.main()
