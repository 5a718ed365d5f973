"""The accounting child's energy, carbon and cost counters exported over OTLP: `wattgate
serve` with accounting (the apportioner as its child) and telemetry on, over a simulated
engine; the receiver gets `wattgate.tenant.energy` and the rest from the child, equal to the
Prometheus counters the gateway's /metrics shows once apportioning is done."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.faults.helpers import wait_for
from tests.support.gateway import KEY_A, raw_config
from tests.support.otlp_receiver import Received, attributes, otlp_receiver
from tests.support.procs import free_port, running, wattgate_cmd

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
pytestmark = [pytest.mark.timeout(150), pytest.mark.slow]

MODEL = "llama-3.1-8b"


def latest_sums(got: Received, name: str) -> dict[str, float]:
    """`wattgate.tenant` (or `wattgate.engine`) -> value, from the last export of `name`."""
    batches = [m for m in got.metrics if m.name == name]
    if not batches:
        return {}
    out = {}
    for p in batches[-1].sum.data_points:
        a = attributes(p.attributes)
        out[str(a.get("wattgate.tenant", a.get("wattgate.engine")))] = p.as_double
    return out


def prometheus_value(text: str, family_name: str, label: str, value: str) -> float | None:
    for family in text_string_to_metric_families(text):
        if family.name == family_name:
            for s in family.samples:
                if s.name.endswith("_total") and s.labels.get(label) == value:
                    return float(s.value)
    return None


def config(tmp_path: Path, engine: str, otlp: str) -> Path:
    raw: dict[str, Any] = raw_config([{"name": "e0", "url": engine, "precision": "bf16"}],
                                     model=MODEL)
    raw["accounting"] = {"interval_s": 1, "settle_s": 1, "poll_s": 0.1, "flush_s": 0.3,
                         "hold_s": 5, "apportioner": "process",
                         "ledger": {"kind": "sqlite", "path": str(tmp_path / "ledger.db")},
                         "meters": {"e0": {"kind": "sim", "url": engine}}}
    raw["telemetry"] = {"otlp_endpoint": otlp, "export_interval_s": 0.3}
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


async def test_the_childs_energy_counters_reach_the_receiver(tmp_path: Path) -> None:
    eport, gport = free_port(), free_port()
    engine, gw = f"http://127.0.0.1:{eport}", f"http://127.0.0.1:{gport}"
    sim = wattgate_cmd("sim", "--gpu", "h100", "--model", MODEL, "--precision", "bf16",
                       "--port", str(eport))
    async with otlp_receiver() as (otlp, got), aiohttp.ClientSession() as s:
        cfg = config(tmp_path, engine, otlp)
        with running(sim, engine + "/health", timeout_s=60), \
                running(wattgate_cmd("serve", "--config", str(cfg), "--port", str(gport)),
                        gw + "/readyz", log=tmp_path / "gw.log", timeout_s=60):
            for i in range(6):
                async with s.post(f"{gw}/v1/completions", json={
                        "model": MODEL, "prompt": [1] * 200, "max_tokens": 16,
                        "stream": i % 2 == 0}, headers={"Authorization": f"Bearer {KEY_A}"},
                        timeout=aiohttp.ClientTimeout(total=30)) as r:
                    assert r.status == 200
                    await r.read()

            async def agree() -> bool:
                """The receiver's last export equals the gateway's /metrics (the child's
                counters), both non-zero: apportioning is done and was exported."""
                async with s.get(gw + "/metrics") as r:
                    text = await r.text()
                prom = prometheus_value(text, "wattgate_tenant_energy_joules", "tenant",
                                        "tenant-a")
                otel = latest_sums(got, "wattgate.tenant.energy").get("tenant-a")
                if not prom or otel is None:
                    return False
                return abs(otel - prom) <= 1e-9 * prom

            await wait_for(agree, 60.0, "tenant-a's energy at the receiver as in /metrics")
    assert latest_sums(got, "wattgate.tenant.carbon")["tenant-a"] > 0
    assert latest_sums(got, "wattgate.tenant.cost")["tenant-a"] >= 0
    assert latest_sums(got, "wattgate.engine.energy")["e0"] > 0
    energy = [m for m in got.metrics if m.name == "wattgate.tenant.energy"][-1]
    assert energy.unit == "J" and energy.sum.is_monotonic
    # the gateway's own GenAI metrics came too (from the gateway process, not the child)
    assert any(m.name == "gen_ai.client.token.usage" for m in got.metrics)
