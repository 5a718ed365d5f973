"""What the accounting child spends per record, from the link's frames to ledger rows.

    python -m bench.child_intake                 # prints median and spread of 5 runs
    python -m bench.child_intake --records 5000 --repeats 3
    python -m bench.child_intake --repeats 9 --baseline ../old --write   # against another checkout

Gateway side first: a `RecordLink` attached to one end of a socket pair ships the records
(`--frame` per ship window, as a busy gateway's 20 ms windows carry them); the bytes that
reach the other end are kept. Child side, timed: a `RecordIntake` reads those bytes from a
socket pair (decoding every record), hands them to its `LedgerRecorder` (journal on, in a
temporary directory, as the child runs), which ingests them into ledger rows and writes them
to a SQLite ledger, the garbage collector set up as the child's (`child_gc`). CPU time of the
whole process (the journal's writer thread and the ledger's worker thread count) per record,
for each run; the gateway side's CPU per record (encoding and shipping) is reported too.

With `--baseline DIR` (a checkout of another commit, e.g. `git worktree add ../old <commit>`)
every run is a fresh interpreter, and the two checkouts' runs alternate (which goes first
alternates too), so both see the same machine; each encodes its own frames. `--write` keeps
the result in bench/results/child_intake.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from accounting import work
from accounting.config import AccountingConfig, JournalConfig, LedgerConfig
from accounting.intake import RecordIntake
from accounting.journal import Journal
from accounting.ledger.sqlite import SqliteLedger
from accounting.link import SHIP_S, RecordLink
from accounting.recorder import LedgerRecorder, child_gc
from bench.apportion_workload import cpu_reference_us, make_records
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
    child_gc()  # as the child sets its collector up once started (accounting/process.py)
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
            "frame_bytes_per_record": len(data) / n, "compiled_loop": work.compiled is not None,
            "gateway_cpu_us_per_record": gateway_cpu_s / n * 1e6,
            "child_cpu_us_per_record": child_us,
            "child_cpu_us_per_record_median": statistics.median(child_us),
            "child_cpu_us_per_record_spread": max(child_us) - min(child_us)}


RESULTS = Path(__file__).resolve().parent / "results"
# One run of a checkout's own `run`, in a fresh interpreter started in that checkout
_ONE_RUN = ("import json, sys; from bench.child_intake import run; "
            "print(json.dumps(run(int(sys.argv[1]), int(sys.argv[2]), 1)))")


def _one(checkout: Path, n: int, frame: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", _ONE_RUN, str(n), str(frame)], cwd=checkout,
                         capture_output=True, text=True, timeout=600, check=True).stdout
    res: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return res


def compare(n: int, frame: int, repeats: int, baseline: Path) -> dict[str, Any]:
    """`repeats` runs of this checkout and of `baseline`, alternated."""
    sides: dict[str, list[dict[str, Any]]] = {"baseline": [], "this": []}
    here = Path(__file__).resolve().parents[1]
    for i in range(repeats):
        order = [("baseline", baseline), ("this", here)]
        for side, checkout in order if i % 2 == 0 else order[::-1]:
            sides[side].append(_one(checkout, n, frame))
    out: dict[str, Any] = {"records": n, "frame_records": frame, "repeats": repeats,
                           "cpu_reference_us": cpu_reference_us()}
    for side, runs in sides.items():
        child = [r["child_cpu_us_per_record"][0] for r in runs]
        gateway = [r["gateway_cpu_us_per_record"] for r in runs]
        out[side] = {"commit": runs[0]["commit"],
                     "frame_bytes_per_record": runs[0]["frame_bytes_per_record"],
                     "child_cpu_us_per_record": child,
                     "child_cpu_us_per_record_median": statistics.median(child),
                     "child_cpu_us_per_record_spread": max(child) - min(child),
                     "gateway_cpu_us_per_record": gateway,
                     "gateway_cpu_us_per_record_median": statistics.median(gateway)}
    return out


def markdown(res: dict[str, Any]) -> str:
    rows = [f"| {side} ({r['commit']}) | {r['child_cpu_us_per_record_median']:.1f} | "
            f"{min(r['child_cpu_us_per_record']):.1f}-{max(r['child_cpu_us_per_record']):.1f} | "
            f"{r['gateway_cpu_us_per_record_median']:.1f} | {r['frame_bytes_per_record']:.0f} |"
            for side, r in (("this", res["this"]), ("baseline", res["baseline"]))]
    return "\n".join([
        "# The accounting child's CPU per record",
        "",
        f"`python -m bench.child_intake --records {res['records']} --frame "
        f"{res['frame_records']} --repeats {res['repeats']} --baseline DIR --write`: "
        f"{res['records']} streamed records (bench/apportion_workload.py, 8 engines, about 7 "
        f"intervals each) in frames of {res['frame_records']}, through the child's intake, "
        "journal (on) and recorder into a SQLite ledger; CPU time of the whole process per "
        f"record, {res['repeats']} runs of each checkout, alternated, each in a fresh "
        f"interpreter. CPU yardstick (sum(range(1000))): {res['cpu_reference_us']:.1f} us.",
        "",
        "| code | child CPU us/record, median | range over the runs | gateway CPU us/record "
        "(encode, ship), median | frame bytes/record |",
        "| --- | ---: | ---: | ---: | ---: |",
        *rows,
        "",
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--frame", type=int, default=80, help="records per ship window")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline", type=Path, help="a checkout of another commit to alternate with")
    ap.add_argument("--write", action="store_true",
                    help="write bench/results/child_intake.{json,md} (with --baseline)")
    a = ap.parse_args()
    if a.baseline is not None:
        res = compare(a.records, a.frame, a.repeats, a.baseline)
        md = markdown(res)
        print(md)
        if a.write:
            RESULTS.mkdir(exist_ok=True)
            (RESULTS / "child_intake.json").write_text(json.dumps(res, indent=2) + "\n")
            (RESULTS / "child_intake.md").write_text(md)
        return
    res = run(a.records, a.frame, a.repeats)
    runs = ", ".join(f"{u:.1f}" for u in res["child_cpu_us_per_record"])
    print(f"commit {res['commit']}: {res['records']} records, {res['frame_records']} per frame, "
          f"{res['frame_bytes_per_record']:.0f} bytes/record")
    print(f"child CPU us/record: median {res['child_cpu_us_per_record_median']:.1f}, spread "
          f"{res['child_cpu_us_per_record_spread']:.1f} (runs: {runs})")
    print(f"gateway CPU us/record (encode, ship): {res['gateway_cpu_us_per_record']:.2f}")


if __name__ == "__main__":
    main()
