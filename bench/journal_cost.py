"""What the write-ahead request journal costs per request, on the event loop and on its
writer thread.

    python -m bench.journal_cost            # writes bench/results/journal_cost.{json,md}
    python -m bench.journal_cost --quick    # shorter, prints only

Loop side: `AccountingService.record()` with the journal on and off (the difference is the
journal's `append`). Writer side: records are appended at `--rate` per second, as a gateway's
requests finish, for `--duration-s`; the writer thread's CPU time (encoding, write, fsync)
per record, and the wall time of a group commit, are reported. The journal lives in a
temporary directory on the same disk as the repository.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

import orjson

from accounting.config import AccountingConfig, JournalConfig, LedgerConfig
from accounting.journal import Journal
from accounting.recorder import LedgerRecorder
from accounting.service import AccountingService, EngineInfo
from bench.apportion_workload import make_records
from bench.provenance import commit
from core.codec import encode

RESULTS = Path(__file__).resolve().parent / "results"


def loop_side_ns(tmp: Path, n: int) -> dict[str, float]:
    """ns per record() call, best of 5, journal off and on (writer thread not started: only
    the loop's own work is timed)."""
    recs = make_records(n, 4, 60.0, 7)
    out: dict[str, float] = {}
    for on in (False, True):
        cfg = AccountingConfig(ledger=LedgerConfig(path=str(tmp / "l.db")),
                               journal=JournalConfig(enabled=on))
        svc = AccountingService(cfg, [EngineInfo(f"e{i}", "m", "bf16", 1) for i in range(4)])
        assert svc.recorder is not None
        record = svc.record

        def run(recorder: LedgerRecorder = svc.recorder, record: Any = record) -> None:
            for r in recs:
                record(r)
            recorder._pending.clear()
            if recorder.journal is not None:
                recorder.journal._queue.clear()

        best = min(timeit.repeat(run, number=1, repeat=5))
        out["on" if on else "off"] = best / n * 1e9
    return out


def writer_side(tmp: Path, rate_per_s: float, duration_s: float, fsync_ms: float
                ) -> dict[str, float]:
    recs = make_records(max(1000, int(rate_per_s)), 4, 60.0, 8)
    j = Journal(tmp / "journal", fsync_ms / 1000.0)
    j.open()
    tick_s = 0.005
    per_tick = max(1, round(rate_per_s * tick_s))
    sent = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < duration_s:
        for _ in range(per_tick):
            j.append(recs[sent % len(recs)])
            sent += 1
        if sent % (per_tick * 50) == 0:
            j.cut()  # as the service does at every ingest; nothing released: files stay
        time.sleep(tick_s)
    j.close()
    wall_s = time.monotonic() - t0
    size = sum(p.stat().st_size for p in (tmp / "journal").glob("*.jsonl"))
    encode_s = min(timeit.repeat(lambda: [encode(r) for r in recs[:1000]], number=1, repeat=5))
    return {"records": float(j.records_written), "rate_per_s": sent / wall_s,
            "writer_cpu_us_per_record": j.cpu_s / max(1, j.records_written) * 1e6,
            "encode_us_per_record": encode_s / 1000 * 1e6,
            "bytes_per_record": size / max(1, j.records_written),
            "writer_cpu_share_of_core": j.cpu_s / wall_s}


def fsync_ms_of_disk(tmp: Path) -> float:
    """Median wall time of one small write + fsync on this disk."""
    fd = os.open(tmp / "probe", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    times = []
    for _ in range(50):
        t = time.perf_counter()
        os.write(fd, b"x" * 4096)
        os.fsync(fd)
        times.append(time.perf_counter() - t)
    os.close(fd)
    return sorted(times)[len(times) // 2] * 1000




def markdown(res: dict[str, Any]) -> str:
    loop = res["loop_ns_per_record"]
    rows = "\n".join(
        f"| {w['rate_per_s']:.0f} | {w['writer_cpu_us_per_record']:.2f} | "
        f"{w['encode_us_per_record']:.2f} | {w['bytes_per_record']:.0f} | "
        f"{100 * w['writer_cpu_share_of_core']:.1f} % |" for w in res["writer"])
    return f"""# Request journal cost

`python -m bench.journal_cost` on commit {res['commit']}, {res['machine']}; fsync_ms
{res['fsync_ms']}, one small write + fsync on this disk: {res['disk_fsync_ms']:.2f} ms (median).

Event loop, per `record()` call: {loop['off']:.0f} ns journal off, {loop['on']:.0f} ns on
(+{loop['on'] - loop['off']:.0f} ns).

Writer thread (records appended at a steady rate for {res['duration_s']:.0f} s):

| records/s | writer CPU µs/record | of which encoding µs | bytes/record | writer CPU, share of a core |
| ---: | ---: | ---: | ---: | ---: |
{rows}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--duration-s", type=float, default=10.0)
    ap.add_argument("--fsync-ms", type=float, default=20.0)
    args = ap.parse_args()
    duration_s = 2.0 if args.quick else args.duration_s
    rates = (1000.0,) if args.quick else (1000.0, 5000.0)
    with tempfile.TemporaryDirectory(dir=Path(__file__).resolve().parent) as d:
        tmp = Path(d)
        res: dict[str, Any] = {
            "commit": commit(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "fsync_ms": args.fsync_ms, "duration_s": duration_s,
            "disk_fsync_ms": fsync_ms_of_disk(tmp),
            "loop_ns_per_record": loop_side_ns(tmp, 20_000 if not args.quick else 2_000),
            "writer": [],
        }
        for rate in rates:
            sub = tmp / f"r{int(rate)}"
            sub.mkdir()
            res["writer"].append(writer_side(sub, rate, duration_s, args.fsync_ms))
    md = markdown(res)
    print(md)
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "journal_cost.json").write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2))
        (RESULTS / "journal_cost.md").write_text(md)


if __name__ == "__main__":
    main()
