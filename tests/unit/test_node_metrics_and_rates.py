"""A node's pieces that are not processes: its workers' expositions merged into one
(gateway/workers/merge.py: counters and histograms summed, gauges by their rule, one series
per worker), its rate store (gateway/workers/rates.py: the parent's buckets over a real
Unix socket, shared by its workers, down when the parent does not answer) and its default
number of workers (the CPU affinity, bounded by the cgroup's CPU quota)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.tenancy.rate_store import Ask, RateStoreError
from gateway.workers.merge import merge
from gateway.workers.parent import default_workers
from gateway.workers.rates import NodeBuckets, NodeRateStore, serve_buckets

pytestmark = pytest.mark.timeout(30)


def exposition(requests: float, inflight: float, healthy: float, up: float, le: float) -> bytes:
    return f"""# HELP wattgate_requests_total Requests
# TYPE wattgate_requests_total counter
wattgate_requests_total{{model="m",status="ok"}} {requests}
# HELP wattgate_requests_in_flight In flight
# TYPE wattgate_requests_in_flight gauge
wattgate_requests_in_flight{{model="m"}} {inflight}
# HELP wattgate_endpoint_healthy Healthy
# TYPE wattgate_endpoint_healthy gauge
wattgate_endpoint_healthy{{endpoint="e0"}} {healthy}
# HELP wattgate_apportioner_up Up
# TYPE wattgate_apportioner_up gauge
wattgate_apportioner_up {up}
# HELP wattgate_ttft_seconds TTFT
# TYPE wattgate_ttft_seconds histogram
wattgate_ttft_seconds_bucket{{le="0.1"}} {le}
wattgate_ttft_seconds_bucket{{le="+Inf"}} {requests}
wattgate_ttft_seconds_count {requests}
wattgate_ttft_seconds_sum 1.5
""".encode()


def values(text: bytes) -> dict[tuple[str, str], float]:
    return {(s.name, ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text.decode()) for s in f.samples}


def test_counters_and_histograms_sum_gauges_follow_their_rule_and_each_worker_shows() -> None:
    got = values(merge([exposition(3, 2, 1, 1, 1), exposition(5, 1, 0, 0, 4), None]))
    assert got[("wattgate_requests_total", "model=m,status=ok")] == 8
    assert got[("wattgate_ttft_seconds_bucket", "le=0.1")] == 5
    assert got[("wattgate_ttft_seconds_count", "")] == 8
    assert got[("wattgate_ttft_seconds_sum", "")] == 3.0
    assert got[("wattgate_requests_in_flight", "model=m")] == 3  # summed
    assert got[("wattgate_endpoint_healthy", "endpoint=e0")] == 1  # a node-wide reading: max
    assert got[("wattgate_apportioner_up", "")] == 0  # down if any worker cannot reach it
    assert got[("wattgate_worker_up", "worker=0")] == 1
    assert got[("wattgate_worker_up", "worker=2")] == 0  # did not answer
    assert got[("wattgate_worker_requests_total", "worker=0")] == 3
    assert got[("wattgate_worker_requests_total", "worker=1")] == 5


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="wg-"))  # a Unix socket path holds 107 bytes at most
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_two_workers_share_one_bucket_of_the_parent(short_dir: Path) -> None:
    now = [100.0]
    buckets = NodeBuckets(clock=lambda: now[0])
    server = await serve_buckets(buckets, short_dir / "rates.sock")
    a, b = NodeRateStore(short_dir / "rates.sock"), NodeRateStore(short_dir / "rates.sock")
    try:
        ask = Ask("t", "rps", 10.0, 1.0, 6.0)
        got_a = await a.exchange([ask])
        got_b = await b.exchange([ask])
        # one bucket of 10 for the node: 6 to the first, what is left to the second
        assert got_a[("t", "rps")].granted == 6.0 and got_b[("t", "rps")].granted == 4.0
        now[0] += 0.5  # refilled at 10/s
        assert (await a.exchange([ask]))[("t", "rps")].granted == pytest.approx(5.0)
        assert await a.heartbeat("w0") == 1 and await b.heartbeat("w1") == 2
        await b.forget("w1")
        assert await a.heartbeat("w0") == 1
    finally:
        await a.close()
        await b.close()
        server.close()
        await server.wait_closed()
    with pytest.raises(RateStoreError):  # the parent gone: the store is down
        await a.exchange([ask])


def test_the_default_workers_follow_the_affinity_and_the_cgroup_quota(tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    cpu_max = tmp_path / "cpu.max"
    assert default_workers(tmp_path / "absent") == cores  # no cgroup v2 file
    cpu_max.write_text("max 100000\n")
    assert default_workers(cpu_max) == cores  # no quota
    cpu_max.write_text("150000 100000\n")  # 1.5 CPUs: 2 workers, if the affinity has them
    assert default_workers(cpu_max) == min(cores, 2)
    cpu_max.write_text("20000 100000\n")  # a fifth of a CPU: still one worker
    assert default_workers(cpu_max) == 1
    cpu_max.write_text(f"{100000 * (cores + 8)} 100000\n")  # more quota than cores
    assert default_workers(cpu_max) == cores
