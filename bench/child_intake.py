"""What the accounting child spends per record, from the link's frames to ledger rows.

    python -m bench.child_intake                 # prints median and spread of 5 runs
    python -m bench.child_intake --records 5000 --repeats 3

Gateway side first: a `RecordLink` attached to one end of a socket pair ships the records
(`--frame` per ship window, as a busy gateway's 20 ms windows carry them); the bytes that
reach the other end are kept. Child side, timed: a `RecordIntake` reads those bytes from a
socket pair (decoding every record), hands them to its `LedgerRecorder` (journal on, in a
temporary directory, as the child runs), which ingests them into ledger rows and writes them
to a SQLite ledger. CPU time of the whole process (the journal's writer thread and the
ledger's worker thread count) per record, for each run; the gateway side's CPU per record
(encoding and shipping) is reported too.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from accounting.config import AccountingConfig, JournalConfig, LedgerConfig
from accounting.intake import RecordIntake
from accounting.journal import Journal
from accounting.ledger.sqlite import SqliteLedger
from accounting.link import SHIP_S, RecordLink
from accounting.recorder import LedgerRecorder
from bench.apportion_workload import make_records
from bench.provenance import commit
from core.records import RequestRecord


async def _frames(records: list[RequestRecord], frame: int) -> tuple[bytes, float]:
    """The bytes a gateway's link sends for `records`, and its CPU seconds doing so (the
    socket reads of this benchmark count too: a few per frame)."""
    link = RecordLink()
    gateway, child = socket.socketpair()
    child.setblocking(False)
    link.attach(gateway)
    out = bytearray()
    c0 = time.process_time()
    for i in range(0, len(records), frame):
        for rec in records[i:i + frame]:
            link.record(rec)
        await asyncio.sleep(SHIP_S * 1.5)  # the link's timer ships the window
        while True:
            try:
                out += child.recv(1 << 22)
            except BlockingIOError:
                break
    cpu_s = time.process_time() - c0
    link.detach()
    child.close()
    return bytes(out), cpu_s


async def _child(data: bytes, n: int, tmp: Path) -> float:
    """CPU seconds of the child turning `data` (frames of `n` records) into ledger rows."""
    cfg = AccountingConfig(ledger=LedgerConfig(path=str(tmp / "ledger.db")),
                           journal=JournalConfig(enabled=True, path=str(tmp / "journal")))
    ledger = SqliteLedger(tmp / "ledger.db")
    await ledger.open()
    recorder = LedgerRecorder(cfg, ledger, "bench", clock=time.time)
    assert recorder.journal is not None
    journal: Journal = recorder.journal
    await asyncio.to_thread(journal.open)
    intake = RecordIntake(recorder)
    gateway, child = socket.socketpair()
    await intake.start(child.detach())
    gateway.setblocking(False)
    loop = asyncio.get_running_loop()
    gc.collect()
    c0 = time.process_time()
    await loop.sock_sendall(gateway, data)
    while recorder.queued < n:  # noqa: ASYNC110 (the recorder signals writes, not arrivals)
        await asyncio.sleep(0.001)
    await recorder.ingest_chunked()
    await recorder.flush()
    await asyncio.to_thread(journal.close)
    cpu_s = time.process_time() - c0
    assert recorder.records_written == n, (recorder.records_written, n)
    gateway.close()
    await ledger.close()
    return cpu_s


def run(n: int, frame: int, repeats: int) -> dict[str, Any]:
    records = make_records(n, engines=8, span_s=n / 2000.0, seed=11)
    data, gateway_cpu_s = asyncio.run(_frames(records, frame))
    child_us: list[float] = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            child_us.append(asyncio.run(_child(data, n, Path(tmp))) / n * 1e6)
    return {"commit": commit(), "records": n, "frame_records": frame, "repeats": repeats,
            "frame_bytes_per_record": len(data) / n,
            "gateway_cpu_us_per_record": gateway_cpu_s / n * 1e6,
            "child_cpu_us_per_record": child_us,
            "child_cpu_us_per_record_median": statistics.median(child_us),
            "child_cpu_us_per_record_spread": max(child_us) - min(child_us)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--frame", type=int, default=80, help="records per ship window")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    res = run(a.records, a.frame, a.repeats)
    runs = ", ".join(f"{u:.1f}" for u in res["child_cpu_us_per_record"])
    print(f"commit {res['commit']}: {res['records']} records, {res['frame_records']} per frame, "
          f"{res['frame_bytes_per_record']:.0f} bytes/record")
    print(f"child CPU us/record: median {res['child_cpu_us_per_record_median']:.1f}, spread "
          f"{res['child_cpu_us_per_record_spread']:.1f} (runs: {runs})")
    print(f"gateway CPU us/record (encode, ship): {res['gateway_cpu_us_per_record']:.2f}")


if __name__ == "__main__":
    main()
