"""Apportioning throughput (requests/s per core) and the hot-path cost of `record()`.

    python -m bench.apportion            # ~20k requests, writes bench/results/apportion.{json,md}
    python -m bench.apportion --quick    # smaller, prints only

Throughput covers the pure pipeline the apportioner runs for each request: spreading the
record over the interval grid (work rows), grouping rows per (engine, interval), and
apportioning every interval as the service does (`apportion_by`, default BF16 coefficients:
instant sharing of static power and decode steps). The ledger round trip is not included
there. Both CPU time of this process (per core; the machine may be shared) and wall time are
reported. `record()` is timed on a service whose ledger does nothing.

The ledger is measured apart, on SQLite, as the gateway process pays for it: ingest plus the
batched write of requests and work rows (every replica), and the apportioner's step per
request (the one replica that apportions: read, apportion, price, write shares, mark done).
Then the whole service at steady state, records arriving as requests finish, with the
apportioner waiting for requests in flight (the default) and without (`hold_s: 0`).
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import orjson

from bench.apportion_pipeline import record_cost, throughput
from bench.apportion_report import markdown
from bench.apportion_service import apportioner_cost, ingest_write_cost, steady_cost
from bench.apportion_workload import cpu_reference_us

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 2000 if args.quick else 20_000
    result = {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpu_reference_us": cpu_reference_us(),
        "python": platform.python_version(),
        "throughput": throughput(n, 2 if args.quick else 5),
        "record": record_cost(20_000 if args.quick else 200_000),
        "ingest_write": ingest_write_cost(2000 if args.quick else 8000, 500),
        "apportioner": apportioner_cost(1000 if args.quick else 4000),
        "steady": steady_cost(1000 if args.quick else 4000, 500.0, 60.0),
        "steady_no_hold": steady_cost(1000 if args.quick else 4000, 500.0, 0.0),
    }
    md = markdown(result)
    print(md)
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "apportion.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
        (RESULTS / "apportion.md").write_text(md)


if __name__ == "__main__":
    main()
