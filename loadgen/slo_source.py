"""Grade each tenant by the SLO class the gateway grades it by.

The gateway answers `GET /v1/usage` with the calling tenant's `slo_class` (its name and
limits). A tenant with an API key is graded by that class; a tenant without one, or a target
that does not answer (an engine, an older gateway), keeps the load generator's own class.
With a simulator `time_scale` K the gateway's limits are wall time (what it grades), so they
are multiplied by K into engine time, the base the load generator's SLOs are given in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import aiohttp

from core.vocab import SloClass
from loadgen.workload import TenantSpec, Workload


def slo_of(doc: Mapping[str, Any]) -> SloClass | None:
    """The SLO class in a `/v1/usage` answer, or None when it has none."""
    raw = doc.get("slo_class")
    if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
        return None

    def limit(key: str) -> float | None:
        v = raw.get(key)
        return float(v) if isinstance(v, int | float) else None

    return SloClass(raw["name"], ttft_s=limit("ttft_s"), tpot_s=limit("tpot_s"),
                    e2e_s=limit("e2e_s"))


async def fetch_tenant_slos(base_url: str, tenants: Sequence[TenantSpec], timeout_s: float = 5.0
                            ) -> dict[str, SloClass]:
    """tenant name -> the gateway's class for it, for the tenants it answers for."""
    keyed = [t for t in tenants if t.api_key]
    if not keyed:
        return {}
    url = f"{base_url.rstrip('/')}/v1/usage"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:

        async def one(t: TenantSpec) -> tuple[str, SloClass | None]:
            try:
                async with s.get(url, params={"group_by": "tenant"},
                                 headers={"Authorization": f"Bearer {t.api_key}"}) as resp:
                    if resp.status != 200:
                        return t.name, None
                    return t.name, slo_of(await resp.json(content_type=None))
            except (aiohttp.ClientError, TimeoutError, ValueError):
                return t.name, None  # not a gateway that says: the tenant keeps its own

        found = await asyncio.gather(*(one(t) for t in keyed))
    return {name: slo for name, slo in found if slo is not None}


def _scaled(s: SloClass, k: float) -> SloClass:
    return SloClass(s.name, *(None if v is None else v * k for v in (s.ttft_s, s.tpot_s, s.e2e_s)))


def graded_by_gateway(w: Workload, found: Mapping[str, SloClass], time_scale: float = 1.0
                      ) -> tuple[Workload, list[str]]:
    """`w` with each tenant in `found` graded by the gateway's class (its limits x
    `time_scale`), and one line per tenant saying which SLO grades it."""
    if not found:
        return w, []
    gateway = {s.name: _scaled(s, time_scale) for s in found.values()}
    tenants = tuple(replace(t, slo_class=found[t.name].name) if t.name in found else t
                    for t in w.tenants)
    used = {t.slo_class for t in tenants}
    own = [s for s in w.slo_classes if s.name not in gateway and s.name in used]
    notes = [f"SLO: tenant {t.name} graded by the gateway's class {found[t.name].name}"
             if t.name in found else f"SLO: tenant {t.name} graded by the load generator's "
             f"class {t.slo_class} (the gateway did not say)" for t in w.tenants]
    return replace(w, tenants=tenants, slo_classes=(*own, *gateway.values())), notes
