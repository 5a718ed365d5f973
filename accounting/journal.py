"""A write-ahead journal of finished requests, so a killed gateway loses at most a few
milliseconds of them instead of its last ledger flush window.

The event loop only appends the record to a deque (`Journal.append`, tens of ns). A writer
thread wakes when records come (it sleeps while none do), waits `fsync_s` for more, encodes
what is queued as lines (core/codec.py: one JSON array per record, its version first),
writes them with one `write` and makes them durable with one `fsync` (group commit). A
SIGKILL loses only what was not yet written (records finished in the last window, at most
about `fsync_s` plus one write); a power loss, what was not yet fsynced.

Files, in the journal directory (one per ledger, shared by the processes on a host):
`<owner>.lock` held with an exclusive `flock` for as long as the owner lives, and
`<owner>.<segment>.jsonl`. The service cuts a new segment whenever it takes queued records
in (`cut`), and once those records are in the ledger it releases the segments before the
cut (`release`), which the writer deletes. At start-up `recover` reads the segments of
owners that are gone (their lock is free, or missing) so the service can write them to the
ledger again; the ledger keeps one row per request id, so replaying twice is harmless.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from core.codec import decode_lines, encode
from core.records import RequestRecord

log = logging.getLogger("wattgate.accounting.journal")

SUFFIX = ".jsonl"
LOCK_SUFFIX = ".lock"


def read_segment(path: Path) -> tuple[list[RequestRecord], int]:
    """The records of one segment file and the count of lines skipped (a line torn by a
    crash mid-write is the usual one: it is the last and has no newline)."""
    data = path.read_bytes()
    return decode_lines(data if data.endswith(b"\n") else data + b"\n")


def _segment_name(owner: str, segment: int) -> str:
    return f"{owner}.{segment:08d}{SUFFIX}"


def _owner_of(name: str) -> str:
    """`<owner>` of `<owner>.<segment>.jsonl` or `<owner>.lock`."""
    if name.endswith(LOCK_SUFFIX):
        return name[:-len(LOCK_SUFFIX)]
    return name[:-len(SUFFIX)].rsplit(".", 1)[0]


def _fsync_dir(directory: Path) -> None:
    # A new file's name is durable only once its directory is (power loss; a SIGKILL does
    # not need it, the kernel has the entry).
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class _Cut:
    segment: int  # records queued before this are in segments < segment


@dataclass(frozen=True, slots=True)
class _Encoded:
    lines: bytes
    count: int


class Journal:
    """One process's journal: `append` on the event loop, everything else on its thread."""

    def __init__(self, directory: Path, fsync_s: float = 0.02, *, owner: str | None = None,
                 fsync: bool = True, retry_s: float | None = None):
        """`retry_s`: a write that fails (a full disk) keeps its records and is tried again
        this much later, instead of stopping the journal (the gateway's spill, link.py)."""
        self.directory = directory
        self.retry_s = retry_s
        self.failing = False  # retrying: the last write failed (a full disk)
        self.failures = 0  # writes that failed, retried or not
        self._torn = False  # a failed write may have left half a line: end it before the next
        self.fsync_s = fsync_s
        self.owner = owner or f"{os.getpid()}-{secrets.token_hex(4)}"
        self._fsync = fsync
        self._queue: deque[RequestRecord | _Cut | _Encoded] = deque()
        self._next_cut = 0  # loop side: the segment the next cut opens
        self._released = 0  # segments below this may be deleted (set by the loop)
        self._stop = threading.Event()
        # Set when there is work for the thread (records, a cut, a release, stopping): an idle
        # journal's thread sleeps instead of waking every fsync_s
        self._work = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock_fd: int | None = None
        self._failed = False  # a write failed: the journal stops, the ledger path goes on
        self._fd: int | None = None
        self._segment = 0
        self._closed: list[int] = []  # written segments below the current one, not deleted
        self.records_written = 0
        self.cpu_s = 0.0  # the writer thread's CPU time (encoding, syscalls), for benchmarks
        self.turns = 0  # the writer thread's wake-ups

    # --- event loop side ----------------------------------------------------------------------

    def append(self, rec: RequestRecord) -> None:
        """Queue a finished request for the journal (O(1), no I/O)."""
        if not self._failed:
            self._push(rec)

    def append_encoded(self, lines: bytes, count: int) -> None:
        """Queue `count` records already encoded as journal lines (`encode`), as the accounting
        child receives them from its gateway."""
        if not self._failed:
            self._push(_Encoded(lines, count))

    def _push(self, item: RequestRecord | _Encoded) -> None:
        self._queue.append(item)
        if not self._work.is_set():  # set once per turn, not per record
            self._work.set()

    def cut(self) -> int:
        """Start a new segment for the records queued from now on; returns its number: every
        record queued before the call is in a lower one."""
        self._next_cut += 1
        self._queue.append(_Cut(self._next_cut))
        self._work.set()
        return self._next_cut

    def release(self, segment: int) -> None:
        """Records in segments below `segment` are in the ledger: their files may go."""
        if segment > self._released:
            self._released = segment
            self._work.set()

    @property
    def failed(self) -> bool:
        return self._failed

    # --- lifecycle (blocking: call from a thread at start and stop) ---------------------------

    def open(self) -> None:
        """Create the directory, take this owner's lock and start the writer thread."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / f"{self.owner}{LOCK_SUFFIX}", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._lock_fd = fd
        self._thread = threading.Thread(target=self._run, name="wattgate-journal", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Write what is queued, stop the thread, delete released segments and the lock. A
        segment not released stays, and the next start replays it (its owner is gone)."""
        self._stop.set()
        self._work.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._lock_fd is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.directory / f"{self.owner}{LOCK_SUFFIX}")
            os.close(self._lock_fd)
            self._lock_fd = None

    # --- writer thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._work.wait()
            # The group window: what is appended within fsync_s of the first record goes in
            # one write and one fsync
            self._stop.wait(self.fsync_s)
            self._work.clear()  # before draining: an append from here on wakes the next turn
            # Read after the clear: `close` sets stop before work, so a wake-up the clear
            # wiped is still seen here, not waited for forever
            stopping = self._stop.is_set()
            self.turns += 1
            t0 = time.thread_time()
            try:
                self._drain()
                if stopping:
                    self._close_segment()
            except OSError as exc:
                self.failures += 1
                self._torn = True
                if self._fd is not None:  # reopened by the retry: the path may be mended
                    with contextlib.suppress(OSError):
                        os.close(self._fd)
                    self._fd = None
                if self.retry_s is not None and not stopping:
                    if not self.failing:
                        log.error("request journal in %s cannot write (%s): its records are "
                                  "kept in memory and the write retried every %.1f s",
                                  self.directory, exc, self.retry_s)
                    self.failing = True
                    self._stop.wait(self.retry_s)
                    self._work.set()
                    continue
                # Serving goes on without the journal: the ledger's own batching still holds.
                log.error("request journal in %s failed, stopped (%d records not written): %s",
                          self.directory, self._queued_records(), exc)
                self._failed = True
                self._queue.clear()
                return
            if self.failing:
                log.warning("request journal in %s writes again", self.directory)
                self.failing = False
            self._delete_released()
            self.cpu_s += time.thread_time() - t0
            if stopping:
                return

    def _drain(self) -> None:
        queue = self._queue
        lines: list[bytes] = []
        count = 0
        item: RequestRecord | _Cut | _Encoded | None = None
        try:
            while queue:
                item = queue.popleft()
                if isinstance(item, _Cut):
                    self._write(lines, count)
                    lines, count = [], 0
                    self._close_segment()
                    self._segment = item.segment
                elif isinstance(item, _Encoded):
                    lines.append(item.lines)
                    count += item.count
                else:
                    lines.append(encode(item))
                    count += 1
                item = None
            self._write(lines, count)
        except OSError:
            # Nothing taken is lost: a retry writes it again (a line written twice is harmless,
            # the ledger keeps one row per request id)
            if isinstance(item, _Cut):
                queue.appendleft(item)
            if lines:
                queue.appendleft(_Encoded(b"".join(lines), count))
            raise

    def _queued_records(self) -> int:
        return sum(1 if isinstance(i, RequestRecord) else i.count
                   for i in self._queue if not isinstance(i, _Cut))

    def _write(self, lines: list[bytes], count: int) -> None:
        if not lines:
            return
        if self._fd is None:
            path = self.directory / _segment_name(self.owner, self._segment)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            if self._fsync:
                _fsync_dir(self.directory)
        data = b"".join(lines)
        if self._torn:
            data = b"\n" + data  # an empty line is skipped; a torn one ends here
        os.write(self._fd, data)
        self._torn = False
        if self._fsync:
            os.fsync(self._fd)
        self.records_written += count

    def _close_segment(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._closed.append(self._segment)

    def _delete_released(self) -> None:
        keep: list[int] = []
        for seg in self._closed:
            if seg < self._released:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.directory / _segment_name(self.owner, seg))
            else:
                keep.append(seg)
        self._closed = keep


@dataclass
class Recovered:
    """Records left by owners that are gone, and what to delete once they are in the ledger."""

    records: list[RequestRecord] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    skipped_lines: int = 0
    _locks: list[tuple[int, Path]] = field(default_factory=list)

    def done(self) -> None:
        """The records are in the ledger: delete their files and the owners' locks."""
        for path in self.files:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        for fd, path in self._locks:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            os.close(fd)
        self._locks = []

    def abandon(self) -> None:
        """Keep the files for the next start; let go of the owners' locks."""
        for fd, _ in self._locks:
            os.close(fd)
        self._locks = []


def _dead_owners(directory: Path, names: Iterable[str], me: str
                 ) -> tuple[set[str], list[tuple[int, Path]]]:
    """Owners (other than `me`) whose lock is free or missing, with the locks now held."""
    owners = {_owner_of(n) for n in names} - {me}
    dead: set[str] = set()
    held: list[tuple[int, Path]] = []
    for owner in sorted(owners):
        lock = directory / f"{owner}{LOCK_SUFFIX}"
        try:
            fd = os.open(lock, os.O_RDWR)
        except FileNotFoundError:
            dead.add(owner)  # a lock goes only after its segments: these are orphans
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)  # alive: another gateway process on this host
            continue
        dead.add(owner)
        held.append((fd, lock))
    return dead, held


def recover(directory: Path, me: str = "") -> Recovered:
    """Read the segments of every owner that is gone, oldest segment first per owner."""
    out = Recovered()
    if not directory.is_dir():
        return out
    names = [p.name for p in directory.iterdir()
             if p.name.endswith(SUFFIX) or p.name.endswith(LOCK_SUFFIX)]
    dead, out._locks = _dead_owners(directory, names, me)
    for name in sorted(n for n in names if n.endswith(SUFFIX) and _owner_of(n) in dead):
        path = directory / name
        records, skipped = read_segment(path)
        out.records.extend(records)
        out.skipped_lines += skipped
        out.files.append(path)
    return out
