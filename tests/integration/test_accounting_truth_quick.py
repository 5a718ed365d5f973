"""bench.accounting_truth --quick, the accounting-against-truth benchmark kept working: the
whole mixed workload through a real gateway on the 4-engine simulated fleet, every request
joined to its bill and its truth, conservation exact per engine, the report files written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

REPO = Path(__file__).resolve().parents[2]
CLASSES = {"chat", "long", "long-cancel-end", "long-cancel-mid", "prefill", "burst",
           "nonstream", "adv-drop-end", "adv-prefill", "adv-slow-reader", "adv-split"}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_quick_run_joins_every_request_to_a_final_bill_and_its_truth(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.accounting_truth", "--quick",
                           "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = orjson.loads((tmp_path / "accounting_truth.json").read_bytes())
    (run,) = res["runs"]
    assert run["joined"] == run["sent"] and run["final"] == run["sent"]
    assert set(run["errors_by_class"]) >= CLASSES  # every shape was served and measured
    assert len(run["engines"]) == 4
    for engine in run["engines"]:  # shares + idle == metered, per engine
        assert engine["intervals"] > 0
        assert abs(engine["residual_j"]) <= 1e-9 * engine["metered_j"]
    # Loose on purpose (the benchmark checks the targets): a bill far from the truth over
    # the whole run means the join or the meters broke, not that accuracy slipped.
    overall = run["overall"]
    assert abs(overall["bill_j"] - overall["truth_j"]) <= 0.15 * overall["truth_j"]
    assert (tmp_path / "accounting_truth.md").read_text().startswith("# Accounting against")
    assert (tmp_path / "accounting_truth.png").stat().st_size > 10_000
