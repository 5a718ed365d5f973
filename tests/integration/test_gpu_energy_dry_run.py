"""bench.gpu_energy, the NVML check run on a real GPU, kept working on machines without one:
its dry run reads a fake NVML counter (a function of the wall clock, so the gateway it starts
reads the same one) through the real NVML meter, `wattgate agent` and `wattgate serve`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from bench.gpu_energy import parse_smi_csv

REPO = Path(__file__).resolve().parents[2]


def test_nvidia_smi_energy_is_read_in_the_unit_its_header_names() -> None:
    assert parse_smi_csv("total_energy_consumption [mJ]\n123456789\n") == pytest.approx(123456.789)
    assert parse_smi_csv("total_energy_consumption [J]\n12.5 J\n") == 12.5
    with pytest.raises(ValueError, match="unit"):
        parse_smi_csv("total_energy_consumption [Wh]\n1\n")
    with pytest.raises(ValueError, match="unexpected"):
        parse_smi_csv('Field "total_energy_consumption" is not a valid field to query.\n')


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_dry_run_charges_every_request_the_metered_energy(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu_energy", "--dry-run", "--out", str(tmp_path),
         "--idle-s", "1", "--load-s", "1", "--traffic-s", "5", "--on-s", "1", "--off-s", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = orjson.loads((tmp_path / "gpu_energy.json").read_bytes())
    assert (tmp_path / "gpu_energy.md").read_text().startswith("# NVML meter")
    assert (tmp_path / "gpu_energy.png").stat().st_size > 10_000
    idle, busy = res["meter"]["windows"]
    for w in (idle, busy):  # the meter and the counter read directly agree
        assert abs(w["meter_vs_sampler_rel"]) < 0.05
        # nvidia-smi (bench/fake_nvml/nvidia-smi) costs a process start per read, so its span is
        # known only to within that start: check its unit and sense, not its precision
        assert 60.0 * 0.9 <= w["smi_avg_w"] <= 300.0 * 1.1
    assert res["meter"]["smi_error"] is None
    # The fake counter steps every 20 ms. A busy-polling reader that the machine's other load
    # deschedules sees a step late, or two as one (23.7-23.9 ms medians with both cores
    # busy): the check is for the unit and the order of magnitude, not the scheduler.
    assert 18.0 <= res["meter"]["cadence_busy"]["median_ms"] <= 30.0
    assert res["meter"]["agent"]["max_abs_diff_j"] < 50.0  # one 20 ms step at 300 W is 6 J
    gw = res["gateway"]
    assert gw["traffic"]["ok"] > 10 and gw["traffic"]["failed"] == 0
    assert gw["requests"] == gw["traffic"]["ok"]
    # Traffic starts as soon as the gateway is ready: the engine's first interval is metered
    # from the gateway's first reading on, so even the first requests get their share.
    assert gw["requests_without_shares"] == 0
    assert gw["conservation_max_rel"] <= 1e-9
    assert abs(gw["bills_plus_idle_vs_energy_rel"]) <= 1e-9
    # Over the whole span the ledger's energy is the sampler's to within 1 %, beside what the
    # gateway's interpolation at the two ends can miss where the fake's power steps there.
    span_error_j = abs(gw["span_energy_j"] - gw["span_sampled_j"])
    assert span_error_j <= 0.01 * gw["span_sampled_j"] + gw["span_interpolation_bound_j"], gw
    assert gw["apportioned_in_time"]
