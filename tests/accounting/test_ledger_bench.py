"""bench.ledger_retention measures what it says: every request it writes finishes inside the
reports' window, so both reads (per-request rows, rollups) count all of them; with arrivals
denser than the longest request (as at 10M requests a month) the last ones used to finish
past the window and the run stopped on its count check after the half-hour write."""

from __future__ import annotations

from pathlib import Path

from bench.ledger_retention import measure, parts_text


async def test_dense_arrivals_are_all_counted_by_both_reads(tmp_path: Path) -> None:
    # 12,000 requests in one hour: one every 0.3 s, each up to 3 s long
    m = await measure(tmp_path, rows=12_000, days=1 / 24, tenants=3, engines=2,
                      retention_days=0.5 / 24)
    assert m["rows"] == 12_000 and m["hours"] == 1
    for report in m["reports"].values():  # measure() checked the counts; energy agrees
        assert report["energy_rel_diff"] < 1e-9
    assert 0 < m["pruned_requests"] < 12_000
    assert m["per_request_bytes"] > m["after_prune_per_request_bytes"]
    assert parts_text(m).startswith("Reports by tenant over the first part")
