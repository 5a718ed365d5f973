"""The capacity signal through a real gateway on the simulated fleet: the
`wattgate_pool_engines_needed` gauge read from /metrics rises with the load and falls back when
the load stops, and /admin/v1/endpoints counts the idle joules of the engines it did not need."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.routing.learner import STALE_S
from loadgen.procs import free_port, process, wait_http, wattgate
from loadgen.truth.fleet import ADMIN_KEY, MODEL, _digest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
API_KEY = "sk-capacity-test"
TIME_SCALE = 0.1  # engine time runs at a tenth of wall time: loads that fit two CPU cores
TPOT_SLO_S = 0.006  # engine time: tight, so that one engine's SLO capacity is small
ENGINES = ("trt-fp8-a", "trt-fp8-b")  # one pool (model, fp8) of two engines


def _get(url: str, admin: bool = False) -> bytes:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"} if admin else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
        body: bytes = r.read()
    return body


def needed(base: str) -> float:
    """The fp8 pool's gauge value from /metrics."""
    for line in _get(f"{base}/metrics").decode().splitlines():
        if line.startswith("wattgate_pool_engines_needed{") and 'precision="fp8"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("wattgate_pool_engines_needed{precision=fp8} not in /metrics")


def gateway_doc(urls: dict[str, str], port: int, ledger: Path) -> dict[str, Any]:
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "routing": {"policy": "slo_energy"},
        "slo_classes": {"interactive": {"ttft_s": 5.0, "tpot_s": TPOT_SLO_S / TIME_SCALE}},
        "tenants": [{"name": "t", "api_key_sha256": _digest(API_KEY)}],
        "admin": {"api_key_sha256": _digest(ADMIN_KEY)},
        "models": [{"name": MODEL, "endpoints": [
            {"name": n, "url": u, "kind": "trtllm", "precision": "fp8"} for n, u in urls.items()]}],
        "health": {"interval_s": 1, "timeout_s": 2},
        "accounting": {"interval_s": 1, "settle_s": 2, "poll_s": 0.25, "flush_s": 0.5,
                       "ledger": {"kind": "sqlite", "path": str(ledger)},
                       "meters": {n: {"kind": "sim", "url": u} for n, u in urls.items()}},
    }


def load(base: str, concurrency: int, requests: int, log: Path) -> subprocess.Popen[bytes]:
    """A closed loop of `concurrency` streams, `requests` in all (wattgate loadgen)."""
    cmd = wattgate("loadgen", "run", "--target", base, "--model", MODEL, "--api", "completions",
                   "--concurrency", str(concurrency), "--requests", str(requests),
                   "--prompt-tokens", "64", "--output-tokens", "48", "--tokenizer", "words",
                   "--api-key", API_KEY, "--no-energy", "--quiet", "--lag-threshold-ms", "1000")
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=out)


def watch(base: str, proc: subprocess.Popen[bytes], deadline_s: float) -> list[float]:
    """The gauge every 0.5 s while `proc` runs (bounded by `deadline_s`)."""
    seen = []
    end = time.monotonic() + deadline_s
    while proc.poll() is None and time.monotonic() < end:
        seen.append(needed(base))
        time.sleep(0.5)
    assert proc.wait(max(end - time.monotonic(), 1.0)) == 0
    return seen


def test_engines_needed_rises_with_load_and_falls_back(tmp_path: Path) -> None:
    ports = {n: free_port() for n in ENGINES}
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(
        {"defaults": {"gpu": "h100", "model": MODEL, "served_model_name": MODEL,
                      "host": "127.0.0.1", "time_scale": TIME_SCALE, "tokens_per_event": 8},
         "engines": [{"name": n, "precision": "fp8", "dialect": "trtllm", "port": p}
                     for n, p in ports.items()]}))
    urls = {n: f"http://127.0.0.1:{p}" for n, p in ports.items()}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(
        gateway_doc(urls, port, tmp_path / "ledger.db")))
    with open(tmp_path / "fleet.log", "wb") as flog, open(tmp_path / "gw.log", "wb") as glog, \
            process(wattgate("sim", "fleet", str(tmp_path / "fleet.yaml")), flog) as sims:
        for url in urls.values():
            wait_http(f"{url}/health", sims, 60)
        with process(wattgate("serve", "--config", str(tmp_path / "gateway.yaml"),
                              "--log-level", "warning"), glog) as gw:
            wait_http(f"{base}/health", gw, 60)
            assert needed(base) == 0.0  # nothing routed yet
            light = watch(base, load(base, 2, 8, tmp_path / "light.log"), 60.0)
            heavy = watch(base, load(base, 60, 240, tmp_path / "heavy.log"), 60.0)
            # the loads routing saw go stale STALE_S after the last request: back to 0
            after: list[float] = []
            end = time.monotonic() + STALE_S + 10.0
            while time.monotonic() < end and (not after or after[-1] > 0.0):
                time.sleep(1.0)
                after.append(needed(base))
            endpoints = json.loads(_get(f"{base}/admin/v1/endpoints", admin=True))["endpoints"]
    assert max(light) == 1.0, light  # two streams: one engine covers them
    assert max(heavy) == 2.0, heavy  # sixty: past one engine's SLO capacity
    assert after[-1] == 0.0, after
    curves = {e["name"]: e["model_curves"] for e in endpoints}
    # while one engine covered the light load the other was surplus, and when nothing ran
    # both were: idle power x those seconds (the learnt idle power of a simulator running at
    # a tenth of real time is a tenth of the 75 W prior: energy counts in engine time)
    assert any(c["surplus_idle_j"] > 0.0 for c in curves.values()), curves
    for c in curves.values():
        assert 0.0 <= c["surplus_idle_j"] <= c["surplus_s"] * 75.0 * 1.01
        assert c["surplus_s"] <= 120.0  # never more than the test's own span
