"""How long the tenancy store keeps an admission of a tenant far from its limits (a joule
budget and a concurrency cap it never reaches), one request at a time: the store with its
own settlement loop over a real SQLite ledger, no HTTP. A request admitted from an
allowance returns at once; one that waits for a ledger transaction shows in the tail.

    python -m bench.tenancy_admit                        # 5,000 requests, 0.5 ms each
    python -m bench.tenancy_admit --requests 20000 --service-ms 0.2

Prints the admission's wall time (p50, p99, p99.9, max), how many requests waited over
0.5 ms, and the process's CPU per request (admission, settlement and the ledger thread).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from accounting.ledger.sqlite import SqliteLedger
from accounting.pricing import Pricing
from gateway.config import parse_config
from gateway.tenancy.budget import estimate
from gateway.tenancy.store import TenancyStore

TENANT = "tenant-a"
CONFIG: dict[str, Any] = {
    "listen": {"host": "127.0.0.1", "port": 0},
    "slo_classes": {"interactive": {"ttft_s": 0.5}},
    "tenants": [{"name": TENANT, "api_key_sha256": "0" * 64, "slo_class": "interactive",
                 "budgets": [{"period": "day", "j": 1e15}],
                 "limits": {"max_concurrent": 100_000}}],
    "models": [{"name": "m", "endpoints": [
        {"name": "e", "url": "http://127.0.0.1:1", "precision": "bf16"}]}],
    "accounting": {"ledger": {"kind": "sqlite", "path": "/unused.db"}},
}


async def _nothing() -> None:
    return None


async def run(requests: int, service_s: float) -> list[float]:
    """Each admission's wall time; prints the CPU per request."""
    cfg = parse_config(CONFIG, env={})
    tenant = cfg.tenants[0]
    waits: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        ledger = SqliteLedger(Path(d) / "ledger.db")
        await ledger.open()
        store = TenancyStore(ledger, "r", cfg.tenant_controls, Pricing(), time.time)
        store.start(_nothing)
        used = estimate(100, 16, store.rates_of(TENANT, "bf16", 100, time.time()))
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for i in range(requests):
            t0 = time.perf_counter()
            verdict = await store.admit(tenant, f"q{i}", 100, 100, "bf16", ())
            waits.append(time.perf_counter() - t0)
            if not verdict.allowed:
                raise SystemExit(f"request {i} refused: {verdict.reason}")
            await asyncio.sleep(service_s)
            store.settle(TENANT, f"q{i}", used, "e", int(time.time()))
        cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
        await store.stop()
        await ledger.close()
    print(f"process CPU {cpu_s / requests * 1e6:.0f} us/request over {wall_s:.1f} s")
    return waits


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--service-ms", type=float, default=0.5, help="each request's run time")
    args = p.parse_args()
    waits = sorted(asyncio.run(run(args.requests, args.service_ms / 1e3)))

    def ms(q: float) -> float:
        return waits[min(len(waits) - 1, int(q * len(waits)))] * 1e3

    print(f"{len(waits)} admissions, ms: p50 {ms(0.5):.3f} p99 {ms(0.99):.3f} "
          f"p99.9 {ms(0.999):.3f} max {waits[-1] * 1e3:.2f}; "
          f"waited over 0.5 ms: {sum(w > 5e-4 for w in waits)}")


if __name__ == "__main__":
    main()
