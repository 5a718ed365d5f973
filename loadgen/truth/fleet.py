"""Start a simulated fleet and `wattgate serve` (accounting on, `sim` meters) as processes on
free 127.0.0.1 ports, and a busy-loop process that loads the gateway's cores."""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from loadgen.procs import free_port, process, wait_http, wattgate

REPO = Path(__file__).resolve().parents[2]
MODEL = "llama-3.1-8b"
ADMIN_KEY = "sk-truth-admin"


@dataclass(frozen=True, slots=True)
class EngineSpec:
    name: str
    precision: str
    dialect: str  # vllm | trtllm
    gpu: str = "h100"


# Two precisions (16-bit and FP8) on both dialects: the coefficients and the wire differ.
FLEET = (EngineSpec("vllm-bf16", "bf16", "vllm"), EngineSpec("vllm-fp8", "fp8", "vllm"),
         EngineSpec("trt-bf16", "bf16", "trtllm"), EngineSpec("trt-fp8", "fp8", "trtllm"))


@dataclass(frozen=True, slots=True)
class Fleet:
    gateway_url: str
    engine_urls: dict[str, str]  # engine name -> base URL
    ledger_path: Path
    gateway_pid: int


def api_key(tenant: str) -> str:
    return f"sk-truth-{tenant}"


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def gateway_config(engine_urls: dict[str, str], specs: Sequence[EngineSpec],
                   tenants: Sequence[str], ledger: Path, port: int,
                   tenant_extra: Mapping[str, Mapping[str, Any]] | None = None
                   ) -> dict[str, Any]:
    """`tenant_extra`: more of a tenant's section (its budgets, ...), by tenant."""
    kinds = {s.name: s for s in specs}
    extra = tenant_extra or {}
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "routing": {"policy": "least_load"},
        "slo_classes": {"default": {"ttft_s": 10.0}},
        "default_slo_class": "default",
        "tenants": [{"name": t, "api_key_sha256": _digest(api_key(t)), **extra.get(t, {})}
                    for t in tenants],
        "admin": {"api_key_sha256": _digest(ADMIN_KEY)},
        "models": [{"name": MODEL, "endpoints": [
            {"name": n, "url": u, "kind": kinds[n].dialect, "precision": kinds[n].precision}
            for n, u in engine_urls.items()]}],
        # Generous: a slow reader or a 30k-token prefill on a busy machine is not a failure.
        "timeouts": {"connect_s": 2, "first_byte_s": 60, "read_s": 60, "total_s": 600},
        "retries": {"max_attempts": 2, "deadline_s": 10},
        "health": {"interval_s": 1, "timeout_s": 2, "unhealthy_after": 3, "healthy_after": 1},
        "accounting": {"interval_s": 1, "settle_s": 2, "poll_s": 0.25, "flush_s": 0.5,
                       "ledger": {"kind": "sqlite", "path": str(ledger)},
                       "meters": {n: {"kind": "sim", "url": u} for n, u in engine_urls.items()}},
    }


@contextlib.contextmanager
def running_fleet(work_dir: Path, tenants: Sequence[str],
                  specs: Sequence[EngineSpec] = FLEET, max_batch: int = 256,
                  tenant_extra: Mapping[str, Mapping[str, Any]] | None = None
                  ) -> Iterator[Fleet]:
    """The engines (one `wattgate sim fleet` process) and one `wattgate serve` in front."""
    work_dir.mkdir(parents=True, exist_ok=True)
    ports = {s.name: free_port() for s in specs}
    fleet_doc = {"defaults": {"gpu": "h100", "model": MODEL, "served_model_name": MODEL,
                              "host": "127.0.0.1", "max_batch": max_batch},
                 "engines": [{"name": s.name, "precision": s.precision, "dialect": s.dialect,
                              "gpu": s.gpu, "port": ports[s.name]} for s in specs]}
    (work_dir / "fleet.yaml").write_text(yaml.safe_dump(fleet_doc))
    urls = {n: f"http://127.0.0.1:{p}" for n, p in ports.items()}
    gw_port = free_port()
    ledger = work_dir / "ledger.db"
    (work_dir / "gateway.yaml").write_text(yaml.safe_dump(
        gateway_config(urls, specs, tenants, ledger, gw_port, tenant_extra)))
    with open(work_dir / "fleet.log", "wb") as flog, open(work_dir / "gateway.log", "wb") as glog, \
            process(wattgate("sim", "fleet", str(work_dir / "fleet.yaml")), flog) as sims:
        for url in urls.values():
            wait_http(f"{url}/health", sims, 60)
        with process(wattgate("serve", "--config", str(work_dir / "gateway.yaml"),
                              "--log-level", "warning"), glog) as gw:
            gw_url = f"http://127.0.0.1:{gw_port}"
            wait_http(f"{gw_url}/health", gw, 60)
            yield Fleet(gw_url, urls, ledger, gw.pid)


@contextlib.contextmanager
def cpu_hog(pid: int, log: IO[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    """A busy loop on the CPUs process `pid` may run on (its affinity): the gateway competes
    for its core with a process that never yields."""
    cpus = sorted(os.sched_getaffinity(pid))
    code = ("import os, time\n"
            f"os.sched_setaffinity(0, {cpus!r})\n"
            "end = time.monotonic() + 3600\n"
            "while time.monotonic() < end:\n    pass\n")
    with process([sys.executable, "-c", code], log) as proc:
        yield proc
