"""The gateway's side of the apportioner process: `wattgate serve` starts it as a child (same
config file), restarts it with a bounded back-off if it dies, stops it on shutdown (SIGTERM,
then SIGKILL past a deadline), and reads its `/metrics` and `/energy-check` over 127.0.0.1.

A child can also hang without exiting (stopped, deadlocked, its loop blocked): its `/healthz`
is probed every PROBE_EVERY_S with a deadline, and after PROBE_MISSES misses in a row it is
taken for dead, its process group SIGKILLed and restarted with the same back-off. While a
probe or a read has just gone unanswered, the gateway's /metrics and /energy-check do not wait
for the child: its series are left out and `wattgate_apportioner_up` says why.

The gateway's own shortage of file descriptors (or memory) is not the child's fault: a probe
that fails with EMFILE/ENFILE/ENOMEM/ENOBUFS tells nothing about the child and is not counted
as a miss; a spawn that fails so is logged at once and tried again with the same back-off.
While no child runs, the records go to the link's spill journal (link.py), and
`wattgate_accounting_unavailable_seconds` says for how long.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import secrets
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge

from accounting.config import CHILD_NICE
from accounting.journal import Journal
from accounting.link import RecordLink
from accounting.mode import INLINE, AccountingMode
from core.tasks import cancel_and_wait

log = logging.getLogger("wattgate.apportioner")

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
HEALTHY_RUN_S = 60.0  # a child that lived this long restarts after the first back-off again
READY_WAIT_S = 30.0  # `wattgate serve` waits this long for the child's first meter reading
STOP_DEADLINE_S = 10.0  # after SIGTERM: its last commit and counter store, then SIGKILL
FETCH_TIMEOUT_S = 1.0  # a /metrics scrape waits at most this for the child's series
PROBE_EVERY_S = 2.0  # the child's /healthz is asked this often
PROBE_TIMEOUT_S = 1.0  # and must answer within this
PROBE_MISSES = 3  # misses in a row after which the child is killed and restarted
TOKEN_ENV = "WATTGATE_APPORTIONER_TOKEN"  # the child's bearer token for this gateway's reads
SPILL_RETRY_S = 1.0  # a spill write that failed (a full disk) is tried again this often
# This process out of descriptors or memory: says nothing about the child
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
UNKNOWN = "unknown"  # a probe that could not be made


def out_of_resources(exc: BaseException) -> bool:
    """`exc` is this process's own shortage of descriptors or memory."""
    return isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS


class ApportionerChild:
    def __init__(self, config_path: str, *, log_level: str | None = None,
                 command: Sequence[str] | None = None, mode: AccountingMode = INLINE,
                 spill_dir: Path | None = None):
        """`mode`: the child's (`AccountingMode.child`); `spill_dir`: the accounting journal's
        directory, where records wait while no child runs (None: in memory only)."""
        self.config_path = config_path
        self._spill_dir = spill_dir
        self._spill: Journal | None = None
        self._port: int | None = None  # the child's, once read from its port file
        self._down_since: float | None = None  # monotonic; None while a child answers
        self.mode = mode
        # `python -m wattgate_cli`: the same interpreter and install as this gateway
        self._command = list(command or (sys.executable, "-m", "wattgate_cli"))
        self._log_level = log_level
        self._dir: Path | None = None  # holds the port file, from start() to stop()
        self.port_file = Path(os.devnull)
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self._watch: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._stopping = False
        self._restarts_metric: Counter | None = None
        self._up: Gauge | None = None
        self._probe: asyncio.Task[None] | None = None
        self._spawned_at = 0.0
        # False from a probe or read that went unanswered until a probe is answered again:
        # meanwhile reads do not wait for the child
        self._answering = True
        # Lets this gateway read the child's /metrics and /energy-check where a metrics key is
        # configured (the config holds only its digest)
        self._token = secrets.token_urlsafe(32)
        # This gateway's finished requests go to the child over a socket pair made per spawn;
        # the child records them under this gateway's replica name
        self.link = RecordLink()
        self.replica = f"{socket.gethostname()}:{os.getpid()}"

    def register(self, registry: CollectorRegistry) -> None:
        """Count restarts and show whether the child runs on the gateway's registry."""
        self._restarts_metric = Counter(
            "wattgate_apportioner_restarts", "Times the apportioner child was restarted "
            "after it died or was killed for missing its liveness probes", registry=registry)
        self._up = Gauge("wattgate_apportioner_up", "1 while the apportioner child process "
                         "runs and answers its liveness probe", registry=registry)
        self._up.set(1.0 if self.pid is not None else 0.0)
        Gauge("wattgate_accounting_unavailable_seconds", "How long this gateway's accounting "
              "child has been down or unanswering (0 while it answers); meanwhile records wait "
              "in the spill journal", registry=registry).set_function(self.unavailable_s)
        Gauge("wattgate_accounting_unwritten_records", "Finished requests this gateway holds "
              "that its accounting child has not acknowledged as written to the ledger",
              registry=registry).set_function(lambda: float(self.link.unwritten))
        Gauge("wattgate_accounting_forgotten_records", "Records no longer held in this "
              "gateway's memory for its accounting child (past 300,000 unacknowledged): in the "
              "spill journal where it is on, else lost", registry=registry).set_function(
            lambda: float(self.link.forgotten))
        Gauge("wattgate_accounting_spill_failing", "1 while writes to the spill journal fail "
              "(a full disk): records not yet in the ledger are then in memory only",
              registry=registry).set_function(
            lambda: float(self._spill is not None and self._spill.failing))

    def unavailable_s(self) -> float:
        return 0.0 if self._down_since is None else time.monotonic() - self._down_since

    def _went_down(self) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
        if self._up is not None:
            self._up.set(0.0)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.returncode is None else None

    def argv(self, records_fd: int | None = None) -> list[str]:
        argv = [*self._command, "apportioner", "--config", self.config_path,
                "--host", "127.0.0.1", "--port", "0", "--port-file", str(self.port_file),
                "--parent-pid", str(os.getpid()), "--nice", str(CHILD_NICE)]
        if records_fd is not None:
            argv += ["--records-fd", str(records_fd), "--replica", self.replica,
                     "--idle-class", "--open-floor", repr(self.link.floor()),
                     *self.mode.child_flags()]
        if self._log_level:
            argv += ["--log-level", self._log_level]
        return argv

    async def start(self) -> None:
        self._stopping = False
        if self._spill_dir is not None and self._spill is None:
            self._spill = await self.link.open_spill(self._spill_dir, SPILL_RETRY_S)
        self._dir = Path(tempfile.mkdtemp(prefix="wattgate-apportioner-"))
        self.port_file = self._dir / "port"
        await self._launch("apportioner")

    async def _let_go(self) -> None:
        """Detach the link (the unacknowledged go to the spill); close the spill, the session."""
        self.link.detach()
        if self._spill is not None:
            await asyncio.to_thread(self._spill.close)
            self._spill = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _launch(self, what: str) -> None:
        """Spawn the child (the watcher retries a failure), then its watcher and probe."""
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S),
            headers={"Authorization": f"Bearer {self._token}"})
        try:
            await self._spawn()
        except OSError as exc:
            self._went_down()
            log.error("could not start the %s child (%s): retrying", what, describe(exc))
        self._watch = asyncio.create_task(self._supervise(), name=f"wattgate-{what}-child")
        self._probe = asyncio.create_task(self._liveness(), name=f"wattgate-{what}-probe")
        for task in (self._watch, self._probe):
            task.add_done_callback(_log_death)

    async def _spawn(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.port_file.unlink()
        # A process group of its own: a terminal's Ctrl-C (or a signal to the gateway's process
        # group) reaches the gateway, which stops the child after draining; the child exits by
        # itself if the gateway dies (--parent-pid). The same session, so the same scheduling
        # group where the kernel groups sessions (priority.py).
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv(theirs.fileno()), stdin=asyncio.subprocess.DEVNULL,
                preexec_fn=os.setpgrp, pass_fds=(theirs.fileno(),),
                env={**os.environ, TOKEN_ENV: self._token})
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.link.attach(ours)
        self._port = None
        self._spawned_at = time.monotonic()
        self._answering = True
        log.info("apportioner child started, pid %d", self.proc.pid)
        if self._up is not None:
            self._up.set(1.0)

    async def wait_ready(self, timeout_s: float = READY_WAIT_S) -> bool:
        """Wait until the child serves (it has read the meters); False at the deadline."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if self._url("/") is not None:
                    return True
            await asyncio.sleep(0.05)
        return False

    async def _supervise(self) -> None:
        backoff = BACKOFF_FIRST_S
        while not self._stopping:
            proc = self.proc
            if proc is not None and proc.returncode is None:
                started = time.monotonic()
                rc = await proc.wait()
                if self._stopping:
                    return
                self._went_down()
                if time.monotonic() - started >= HEALTHY_RUN_S:
                    backoff = BACKOFF_FIRST_S
                log.error("apportioner child (pid %d) exited with %s; restarting in %.1f s",
                          proc.pid, rc, backoff)
            backoff = await self._respawn(backoff)

    async def _respawn(self, backoff_s: float) -> float:
        """Start a successor, after `backoff_s` and then with a doubling back-off while a
        spawn fails; returns the back-off for the next death."""
        while not self._stopping:
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2.0, BACKOFF_MAX_S)
            if self._stopping:
                break
            try:
                await self._spawn()
            except OSError as exc:
                # out of descriptors (socketpair, the pipes, fork): the records wait in the
                # spill journal meanwhile
                log.error("could not start the apportioner child (%s): retrying in %.1f s",
                          describe(exc), backoff_s)
                continue
            self.restarts += 1
            if self._restarts_metric is not None:
                self._restarts_metric.inc()
            break
        return backoff_s

    async def _liveness(self) -> None:
        misses, pid = 0, -1
        while not self._stopping:
            await asyncio.sleep(PROBE_EVERY_S)
            proc = self.proc
            if proc is None or proc.returncode is not None:
                continue  # exited: _supervise restarts it
            if proc.pid != pid:
                misses, pid = 0, proc.pid
            reason = await self._probe_once()
            if reason is None:
                misses = 0
                continue
            if reason == UNKNOWN:
                continue  # this gateway is out of descriptors: neither a miss nor an answer
            misses += 1
            self._answering = False
            if misses >= PROBE_MISSES:
                self._kill_hung(proc, misses, reason)
                misses = 0

    async def _probe_once(self) -> str | None:
        """None when the child answered /healthz (or is still starting); else why not."""
        try:
            url = self._url("/healthz")
        except OSError:
            return UNKNOWN
        if url is None:
            if time.monotonic() - self._spawned_at < READY_WAIT_S:
                return None  # starting: it listens once it has read the meters
            return f"not listening {READY_WAIT_S:.0f} s after its start"
        if self._session is None:
            return None
        try:
            async with self._session.get(
                    url, timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)) as resp:
                body = await resp.read()
                if resp.status != 200:
                    return f"/healthz answered {resp.status}"
                self._heard(body)
        except (aiohttp.ClientError, TimeoutError) as exc:
            if out_of_resources(exc):
                log.warning("could not probe the apportioner child: %s (this gateway's own "
                            "shortage; not counted as a miss)", describe(exc))
                return UNKNOWN
            return describe(exc)
        self._answering = True
        self._down_since = None
        if self._up is not None:
            self._up.set(1.0)
        return None

    def _heard(self, body: bytes) -> None:
        """The child's /healthz answer (a node's supervisor keeps its watermark)."""

    def _kill_hung(self, proc: asyncio.subprocess.Process, misses: int, reason: str) -> None:
        log.warning("apportioner child (pid %d) missed %d liveness probes in a row (last: "
                    "%s): killing it to restart it", proc.pid, misses, reason)
        self._went_down()
        # Its whole process group: nothing it started outlives it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    async def stop(self, deadline_s: float = STOP_DEADLINE_S) -> None:
        """SIGTERM, wait up to `deadline_s` for its clean stop, then SIGKILL."""
        self._stopping = True
        for task in (self._watch, self._probe):
            await cancel_and_wait(task)
        self._watch = self._probe = None
        proc = self.proc
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), deadline_s)
            except TimeoutError:
                log.error("apportioner child (pid %d) did not stop in %.0f s: killed",
                          proc.pid, deadline_s)
                proc.kill()
                await proc.wait()
        if self._up is not None:
            self._up.set(0.0)
        await self._let_go()
        if self._dir is not None:
            with contextlib.suppress(OSError):
                self.port_file.unlink(missing_ok=True)
                self._dir.rmdir()
            self._dir = None

    def _url(self, path: str) -> str | None:
        """None while the child is starting; raises OSError where the port file cannot be
        read for want of descriptors (read once per child: the port does not change)."""
        if self._port is None:
            try:
                self._port = int(self.port_file.read_text())
            except OSError as exc:
                if out_of_resources(exc):
                    raise
                return None  # starting: not listening yet
            except ValueError:
                return None
        return f"http://127.0.0.1:{self._port}{path}"

    async def _get(self, path: str) -> bytes | None:
        try:
            url = self._url(path)
        except OSError:
            return None
        if url is None or self._session is None or not self._answering:
            return None
        try:
            async with self._session.get(url) as resp:
                if resp.status != 200:
                    log.warning("apportioner child answered %s with %d", path, resp.status)
                    return None
                return await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._answering = False  # until the next answered probe: no scrape waits on it
            log.warning("apportioner child did not answer %s: %s", path, describe(exc))
            return None

    async def metrics_text(self) -> bytes:
        """The child's Prometheus series (empty while it is down or starting)."""
        return await self._get("/metrics") or b""

    async def energy_check(self) -> dict[str, Any] | None:
        body = await self._get("/energy-check")
        got = None if body is None else orjson.loads(body)
        return got if isinstance(got, dict) else None


def _log_death(task: asyncio.Task[None]) -> None:
    """A supervising task never ends by itself: say so at once if it did."""
    exc = None if task.cancelled() else task.exception()
    if exc is not None:
        log.critical("%s stopped: %s; accounting is unavailable until the gateway restarts",
                     task.get_name(), describe(exc), exc_info=exc)


def describe(exc: BaseException) -> str:
    """The exception's text, or its type where it has none (a timeout)."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
