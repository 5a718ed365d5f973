"""Several client processes for rates one event loop cannot keep.

The plan is dealt round-robin (request i to worker i mod W), so each worker's schedule is the
same process thinned by W, and all workers start on one shared monotonic t0 (CLOCK_MONOTONIC is
system-wide on Linux). Each worker runs the ordinary single-process client.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from loadgen.client import ClientOptions, Target, run_plan
from loadgen.results import RequestResult
from loadgen.workload import PlannedRequest

START_MARGIN_S = 0.3  # between the last worker reporting ready and t0


def deal(plan: Sequence[PlannedRequest], workers: int) -> list[list[PlannedRequest]]:
    parts: list[list[PlannedRequest]] = [[] for _ in range(workers)]
    for i, req in enumerate(plan):
        parts[i % workers].append(req)
    return parts


def _worker(conn: Connection, plan: list[PlannedRequest], target: Target, opts: ClientOptions,
            concurrency: int | None) -> None:
    import uvloop

    conn.send("ready")
    t0 = float(conn.recv())
    results = uvloop.run(run_plan(plan, target, t0=t0, concurrency=concurrency, opts=opts))
    conn.send(results)
    conn.close()


def run_workers(plan: Sequence[PlannedRequest], target: Target, workers: int, *,
                opts: ClientOptions | None = None, concurrency: int | None = None,
                ready_timeout_s: float = 60.0) -> tuple[list[RequestResult], float]:
    """Run `plan` across `workers` processes; returns (results in plan order, t0)."""
    opts = opts or ClientOptions()
    ctx = mp.get_context("spawn")
    parts = deal(plan, workers)
    conc = [None if concurrency is None else max(1, concurrency // workers + (i < concurrency
                                                                              % workers))
            for i in range(workers)]
    procs: list[tuple[Any, Connection]] = []
    try:
        for part, c in zip(parts, conc, strict=True):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(child, part, target, opts, c), daemon=True)
            p.start()
            child.close()
            procs.append((p, parent))
        for p, conn in procs:
            if not conn.poll(ready_timeout_s):
                raise RuntimeError(f"load worker {p.pid} not ready after {ready_timeout_s}s")
            conn.recv()
        t0 = time.monotonic() + START_MARGIN_S
        for _, conn in procs:
            conn.send(t0)
        last_due = max((r.intended_s for r in plan), default=0.0)
        budget = START_MARGIN_S + last_due + opts.grace_s + 60.0
        results: list[RequestResult] = []
        for p, conn in procs:
            if not conn.poll(max(1.0, t0 + budget - time.monotonic())):
                raise RuntimeError(f"load worker {p.pid} did not finish in time")
            results.extend(conn.recv())
        results.sort(key=lambda r: r.index)
        return results, t0
    finally:
        for p, conn in procs:
            conn.close()
            p.join(5)
            if p.is_alive():
                p.terminate()
                p.join(5)
