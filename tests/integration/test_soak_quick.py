"""bench.soak --quick kept working: a real gateway under steady load with client drops and an
engine SIGKILLed and restarted, its RSS and fds and its accounting child's sampled from /proc,
the three result files written, and no error but the injected ones (with `make test-workers`,
a node of 2 workers, each sampled and fitted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.support.procs import TEST_WORKERS
from tests.support.replicas import TEST_REPLICAS

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.skipif(TEST_REPLICAS > 1, reason=(
    "bench.soak starts and samples one node (a gateway or a --workers node, SQLite ledger) "
    "itself; it has no replica set (PostgreSQL, a front) to run, and bench cannot use the "
    "tests' replica support"))
def test_quick_soak_samples_gateway_and_child_and_sees_only_injected_errors(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.soak", "--quick", "--duration-s", "30",
                           "--workers", str(TEST_WORKERS), "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "soak " in proc.stdout  # progress lines
    # a node of N workers writes soak_workersN.*, beside the single process's soak.*
    stem = "soak" if TEST_WORKERS == 1 else f"soak_workers{TEST_WORKERS}"
    res = orjson.loads((tmp_path / f"{stem}.json").read_bytes())
    assert res["gateway_alive"]
    assert res["engine_kills"] >= 1 and res["client_disconnects"] > 0
    assert res["other_errors"] == {}, res["other_errors"]
    assert res["ok"] >= 0.7 * res["sent"]
    samples = res["samples"]
    assert len(samples) >= 20 and all(s["rss_mb"] > 10 and s["fds"] > 3 for s in samples)
    assert "rss_slope_mb_per_h" in res["fit"]
    # the accounting child is a process of its own, sampled beside the gateway
    child = [s for s in samples if s["child_pid"] is not None]
    assert len(child) >= 0.9 * len(samples)
    assert all(s["child_pid"] != 0 and s["child_rss_mb"] > 10 for s in child)
    assert res["child_pids"] and all(p not in (0, None) for p in res["child_pids"])
    assert "rss_slope_mb_per_h" in res["child_fit"]
    assert "accounting child" in (tmp_path / f"{stem}.md").read_text()
    # fds are not leaking at the rate of requests (one per request would be hundreds)
    assert res["fit"]["fd_max"] < 200
    assert (tmp_path / f"{stem}.md").read_text().startswith("# Soak")
    assert (tmp_path / f"{stem}.png").stat().st_size > 5_000
    if TEST_WORKERS > 1:  # each worker sampled beside the parent and the child
        whole = [s for s in samples if len(s["workers"]) == TEST_WORKERS]
        assert len(whole) >= 0.9 * len(samples)
        for i in range(1, TEST_WORKERS + 1):
            assert "rss_slope_mb_per_h" in res["fits"][f"worker {i}"]
            assert res["fits"][f"worker {i}"]["rss_min_mb"] > 10
