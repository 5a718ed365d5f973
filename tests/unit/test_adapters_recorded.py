"""The vLLM adapter on /metrics bodies recorded from a real vLLM 0.32 (CPU build) server."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.adapters import MetricsParseError, adapter_for

DATA = Path(__file__).resolve().parents[1] / "realengine" / "data"


def _recorded(name: str) -> bytes:
    return (DATA / f"vllm-0.32-cpu-metrics-{name}.txt").read_bytes()


def test_recorded_busy_metrics_give_running_requests_and_kv_fraction() -> None:
    """Six requests in flight were recorded: running 6, none waiting, a small KV fraction."""
    load = adapter_for("vllm").parse_load(_recorded("busy"))
    assert load.running == 6.0
    assert load.waiting == 0.0  # `num_requests_waiting_by_reason` must not be summed in
    assert load.kv_usage is not None
    assert 0.0 < load.kv_usage < 0.01  # a fraction in 0..1 despite the `_perc` name


def test_recorded_idle_metrics_give_zero_load() -> None:
    load = adapter_for("vllm").parse_load(_recorded("idle"))
    assert (load.running, load.waiting, load.kv_usage) == (0.0, 0.0, 0.0)


def test_metrics_without_vllm_gauges_are_rejected() -> None:
    """A body from another server (the histograms only) is an error, not zero load."""
    body = b"\n".join(line for line in _recorded("busy").splitlines()
                      if b"num_requests" not in line)
    with pytest.raises(MetricsParseError):
        adapter_for("vllm").parse_load(body)
