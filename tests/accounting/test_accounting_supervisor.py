"""The gateway's supervision of its apportioner child: restarted with back-off when it dies or
hangs (its liveness probe unanswered), SIGTERM then SIGKILL past the deadline on stop, series
for Prometheus that never wait on a hung child. The child here is a stand-in process (the real
one runs in tests/integration/test_apportioner_process.py)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import resource
import signal
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry

from accounting import supervisor
from accounting.config import CHILD_NICE
from accounting.supervisor import ApportionerChild

pytestmark = pytest.mark.timeout(30)

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
STUBBORN = [sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "time.sleep(60)"]
# Serves /healthz, and /metrics to the bearer of the token its gateway handed it, on 127.0.0.1
# at the port it writes to --port-file, as the real child does.
SERVER = [sys.executable, "-c", r"""
import http.server, os, sys
token = os.environ.pop("WATTGATE_APPORTIONER_TOKEN")
port_file = sys.argv[sys.argv.index("--port-file") + 1]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == "/healthz" or (
            self.path == "/metrics" and self.headers["Authorization"] == "Bearer " + token)
        body = b"standin_series 1.0\n" if ok else b"no"
        self.send_response(200 if ok else 401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
srv = http.server.HTTPServer(("127.0.0.1", 0), H)
open(port_file + ".tmp", "w").write(str(srv.server_address[1]))
os.replace(port_file + ".tmp", port_file)
srv.serve_forever()
"""]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def wait_pid(child: ApportionerChild, not_pid: int | None = None) -> int:
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        if child.pid is not None and child.pid != not_pid:
            return child.pid
        await asyncio.sleep(0.02)
    raise TimeoutError("no child process")


async def test_a_dead_child_is_restarted_and_counted_then_stopped_with_sigterm() -> None:
    registry = CollectorRegistry()
    child = ApportionerChild("gw.yaml", command=SLEEPER)
    child.register(registry)
    await child.start()
    first = await wait_pid(child)
    assert registry.get_sample_value("wattgate_apportioner_up") == 1.0
    assert child.argv()[-8:] == ["--port", "0", "--port-file", str(child.port_file),
                                 "--parent-pid", str(os.getpid()), "--nice", str(CHILD_NICE)]
    os.kill(first, signal.SIGKILL)
    second = await wait_pid(child, not_pid=first)
    assert second != first and child.restarts == 1
    assert registry.get_sample_value("wattgate_apportioner_restarts_total") == 1.0
    assert await child.metrics_text() == b""  # not listening (a stand-in): nothing appended
    await child.stop()
    assert not alive(second) and child.proc is not None and child.proc.returncode == -15
    assert registry.get_sample_value("wattgate_apportioner_up") == 0.0


async def test_a_child_that_ignores_sigterm_is_killed_at_the_deadline() -> None:
    child = ApportionerChild("gw.yaml", command=STUBBORN)
    await child.start()
    pid = await wait_pid(child)
    await asyncio.sleep(0.5)  # its SIGTERM handler is installed
    t0 = time.monotonic()
    await child.stop(deadline_s=0.5)
    assert 0.4 <= time.monotonic() - t0 < 5.0
    assert not alive(pid) and child.proc is not None and child.proc.returncode == -9
    assert child.restarts == 0  # a stop is not a death


async def test_a_hung_child_is_seen_killed_and_restarted_and_scrapes_do_not_wait(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(supervisor, "PROBE_EVERY_S", 0.2)
    monkeypatch.setattr(supervisor, "PROBE_TIMEOUT_S", 0.3)
    registry = CollectorRegistry()
    child = ApportionerChild("gw.yaml", command=SERVER)
    child.register(registry)
    await child.start()
    try:
        first = await wait_pid(child)
        assert await child.wait_ready(10.0)
        assert await child.metrics_text() == b"standin_series 1.0\n"  # with its token
        os.kill(first, signal.SIGSTOP)  # hung: alive, not answering
        with caplog.at_level(logging.WARNING, logger="wattgate.apportioner"):
            t0 = time.monotonic()
            assert await child.metrics_text() == b""  # waits at most FETCH_TIMEOUT_S ...
            assert time.monotonic() - t0 < supervisor.FETCH_TIMEOUT_S + 0.5
            t0 = time.monotonic()
            assert await child.metrics_text() == b""  # ... once: then not at all
            assert await child.energy_check() is None
            assert time.monotonic() - t0 < 0.1
            second = await wait_pid(child, not_pid=first)
        assert not alive(first) and child.restarts == 1
        killed = [r.getMessage() for r in caplog.records if "liveness" in r.getMessage()]
        assert len(killed) == 1 and f"pid {first}" in killed[0]
        assert "TimeoutError" in killed[0]  # named, though its text is empty
        assert "did not answer /metrics: TimeoutError" in caplog.text
        assert registry.get_sample_value("wattgate_apportioner_restarts_total") == 1.0
        assert await child.wait_ready(10.0) and second == child.pid
        for _ in range(100):  # read again once a probe is answered
            if await child.metrics_text():
                break
            await asyncio.sleep(0.1)
        assert await child.metrics_text() == b"standin_series 1.0\n"
        assert registry.get_sample_value("wattgate_apportioner_up") == 1.0
    finally:
        await child.stop()


async def test_the_up_gauge_drops_when_the_child_stops_answering(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor, "PROBE_EVERY_S", 0.2)
    monkeypatch.setattr(supervisor, "PROBE_TIMEOUT_S", 0.2)
    monkeypatch.setattr(supervisor, "BACKOFF_FIRST_S", 5.0)  # down long enough to be seen
    registry = CollectorRegistry()
    child = ApportionerChild("gw.yaml", command=SERVER)
    child.register(registry)
    await child.start()
    try:
        first = await wait_pid(child)
        assert await child.wait_ready(10.0)
        os.kill(first, signal.SIGSTOP)
        deadline = time.monotonic() + 10.0
        while registry.get_sample_value("wattgate_apportioner_up") != 0.0:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert child.restarts == 0  # killed, waiting out its back-off
    finally:
        await child.stop()


@contextlib.contextmanager
def out_of_descriptors() -> Iterator[Callable[[], None]]:
    """This process at its file-descriptor limit (every new descriptor: EMFILE) inside; the
    function yielded takes again any descriptor freed meanwhile."""
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16, old[1]))
    held: list[int] = []

    def fill() -> None:
        for _ in range(10_000):  # bounded: the limit is a few descriptors away
            try:
                held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as exc:
                if exc.errno != errno.EMFILE:
                    raise
                break
    try:
        fill()
        yield fill
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, old)


async def test_a_healthy_child_is_not_killed_for_the_gateways_own_emfile(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(supervisor, "PROBE_EVERY_S", 0.1)
    monkeypatch.setattr(supervisor, "PROBE_TIMEOUT_S", 0.3)
    monkeypatch.setattr(supervisor, "READY_WAIT_S", 0.3)
    child = ApportionerChild("gw.yaml", command=SERVER)
    await child.start()
    try:
        first = await wait_pid(child)
        assert await child.wait_ready(10.0)
        with caplog.at_level(logging.WARNING, logger="wattgate.apportioner"), \
                out_of_descriptors() as fill:
            for _ in range(300):  # 15 probes, 5 times the misses that kill a hung child
                fill()  # what a probe's closed connection frees is taken again
                await asyncio.sleep(0.005)
        assert child.pid == first and alive(first) and child.restarts == 0
        assert "not counted as a miss" in caplog.text
        assert "killing it" not in caplog.text
    finally:
        await child.stop()


async def test_a_respawn_that_fails_for_want_of_descriptors_is_retried_and_logged(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(supervisor, "BACKOFF_FIRST_S", 0.1)
    monkeypatch.setattr(supervisor, "BACKOFF_MAX_S", 0.2)
    registry = CollectorRegistry()
    child = ApportionerChild("gw.yaml", command=SLEEPER)
    child.register(registry)
    await child.start()
    try:
        first = await wait_pid(child)
        with caplog.at_level(logging.ERROR, logger="wattgate.apportioner"), \
                out_of_descriptors():
            os.kill(first, signal.SIGKILL)
            await asyncio.sleep(1.0)
            assert child.pid is None
            down_s = registry.get_sample_value("wattgate_accounting_unavailable_seconds")
        assert caplog.text.count("could not start the apportioner child") >= 2
        assert "Too many open files" in caplog.text
        assert down_s is not None and down_s >= 0.5
        assert registry.get_sample_value("wattgate_apportioner_up") == 0.0
        second = await wait_pid(child, not_pid=first)  # descriptors again: started
        assert second != first and child.restarts == 1
    finally:
        await child.stop()
