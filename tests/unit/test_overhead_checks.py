"""The speed benchmark's checks: both accounting configurations are judged against the
same-run baselines, each target from the right side, every cell that ran."""

from __future__ import annotations

from typing import Any

from bench.overhead import report


def _cells(scale: dict[str, float]) -> list[dict[str, Any]]:
    return [{"target": target, "mode": mode, "connections": c, "run": run,
             "p99_ms": k, "rps": 100.0 * k, "proxy_cpu_us_per_req": 100.0 / k}
            for target, k in scale.items() for mode in report.MODES for c in (1, 16, 64)
            for run in (0, 1)]


def test_each_accounting_configuration_gets_every_target_from_the_right_side() -> None:
    raw = _cells({"wattgate": 1.2, "wattgate-tenants": 1.5, "wattgate-noacct": 1.0,
                  "vllm-router": 1.0})
    result = {c["check"]: c for c in report.checks(raw, raw)}
    # per configuration: p99 in 3 modes x 3 c, CPU and burst at 3 c, non-streaming at c=16, 64
    assert len(result) == 2 * (9 + 3 + 3 + 2)
    assert result["wattgate: nonstream c=64: p99 <= 1.3x without accounting"]["met"]
    assert not result["wattgate-tenants: nonstream c=64: p99 <= 1.3x without accounting"]["met"]
    assert not result["wattgate: stream16_burst c=16: streams/s >= 1.5x vllm-router"]["met"]
    assert result["wattgate-tenants: stream16_burst c=16: streams/s >= 1.5x vllm-router"]["met"]
    cpu = result["wattgate: stream16 c=1: CPU-µs per stream <= 1x vllm-router"]
    assert cpu["met"] and abs(cpu["value"] - 1 / 1.2) < 1e-9
    assert "wattgate: nonstream c=1: req/s >= 0.8x vllm-router" not in result


def test_a_configuration_that_did_not_run_has_no_checks() -> None:
    raw = _cells({"wattgate": 1.0, "wattgate-noacct": 1.0, "vllm-router": 1.0})
    assert all(c["target"] == "wattgate" for c in report.checks(raw, raw))
