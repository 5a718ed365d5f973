"""The synthetic workload of `bench.apportion`: streamed request records spread over engines,
and a CPU yardstick for comparing machines."""

from __future__ import annotations

import math
import random
import time

from core.records import RequestRecord
from core.timing import Latency

T0 = 1_700_000_000.0
NO_LATENCY = Latency(None, None, None, (), ())


def make_records(n: int, engines: int, span_s: float, seed: int) -> list[RequestRecord]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        start = rnd.uniform(0, span_s)
        ttft = rnd.uniform(0.02, 0.5)
        out_tokens = rnd.choice([rnd.randint(4, 64), rnd.randint(100, 600)])
        tpot = rnd.uniform(0.01, 0.05)
        first = start + ttft
        events = max(1, out_tokens // 2)  # engines coalesce ~2 tokens per event
        gap = tpot * out_tokens / events
        times = tuple(first + j * gap for j in range(events))
        out.append(RequestRecord(
            request_id=f"r{i}", tenant=f"t{i % 8}", model="m", engine=f"e{i % engines}",
            precision="bf16", slo_class="d", status="ok", http_status=200, stream=True,
            arrived_wall_s=T0 + start, arrived_s=start, dispatched_s=start,
            first_byte_s=first, first_token_s=first, finished_s=times[-1],
            read_times=times, read_events=(1,) * events,
            prompt_tokens=rnd.choice([rnd.randint(16, 256), rnd.randint(1000, 4000)]),
            completion_tokens=out_tokens, attempts=1, latency=NO_LATENCY, slo_met=True))
    return out



def cpu_reference_us() -> float:
    """Best time of sum(range(1000)) in us: a yardstick for comparing machines (a current
    desktop core does it in ~8-10 us)."""
    best = math.inf
    for _ in range(200):
        t0 = time.perf_counter_ns()
        sum(range(1000))
        best = min(best, (time.perf_counter_ns() - t0) / 1000.0)
    return best
