"""Processes of the soak benchmark: the gateway's config; ports, start and stop come from the
accounting-truth harness (loadgen/truth/fleet.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

# processes are started and stopped as the accounting-truth harness does
from loadgen.procs import free_port, process, spawn, stop, wait_http, wattgate
from loadgen.truth.fleet import MODEL

TENANTS = ("t0", "t1", "t2")


def api_key(tenant: str) -> str:
    return f"sk-soak-{tenant}"


def gateway_config(engines: dict[str, tuple[str, str]], ledger: Path, port: int
                   ) -> dict[str, Any]:
    """`engines`: name -> (url, precision). Accounting on, with its defaults (SQLite ledger
    and the request journal next to it), `sim` meters."""
    def digest(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "routing": {"policy": "least_load"},
        "slo_classes": {"default": {"ttft_s": 10.0}},
        "default_slo_class": "default",
        "tenants": [{"name": t, "api_key_sha256": digest(api_key(t))} for t in TENANTS],
        "models": [{"name": MODEL, "endpoints": [
            {"name": n, "url": u, "kind": "vllm", "precision": p}
            for n, (u, p) in engines.items()]}],
        "timeouts": {"connect_s": 2, "first_byte_s": 30, "read_s": 30, "total_s": 120},
        "retries": {"max_attempts": 3, "deadline_s": 10},
        "health": {"interval_s": 0.5, "timeout_s": 1, "unhealthy_after": 1,
                   "healthy_after": 1},
        "accounting": {"ledger": {"kind": "sqlite", "path": str(ledger)},
                       "meters": {n: {"kind": "sim", "url": u}
                                  for n, (u, _) in engines.items()}},
    }


__all__ = ["MODEL", "api_key", "free_port", "gateway_config", "process", "spawn", "stop",
           "wait_http", "wattgate"]
