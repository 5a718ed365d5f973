"""The load generator grades each tenant by the SLO class the gateway grades it by (its
`slo_class` in `GET /v1/usage`), not by its own default: through a real gateway, a tenant of
class `batch` (TTFT <= 10 s) is met by a 0.8 s TTFT that the load generator's own 0.5 s
default would count as a miss."""

from __future__ import annotations

import pytest

from core.vocab import SloClass
from loadgen import lengths
from loadgen.arrivals import Constant
from loadgen.client import ClientOptions, Target
from loadgen.runner import RunOptions, run_workload
from loadgen.slo_source import fetch_tenant_slos, graded_by_gateway
from loadgen.workload import TenantSpec, Workload
from tests.support.fake_engine import FakeEngine, fake_engine
from tests.support.gateway import KEY_A, KEY_B, make_config, running_gateway

pytestmark = pytest.mark.timeout(60)


def workload(*tenants: TenantSpec) -> Workload:
    return Workload(model="m", tenants=tenants, arrival=None, duration_s=1.0,
                    slo_classes=(SloClass("default", ttft_s=0.5, tpot_s=0.05),))


async def test_tenants_are_graded_by_the_gateways_class() -> None:
    b = TenantSpec("tenant-b", api_key=KEY_B, arrival=Constant(4.0),
                   prompt_tokens=lengths.fixed(8), output_tokens=lengths.fixed(4))
    a = TenantSpec("tenant-a", api_key=KEY_A)
    keyless = TenantSpec("someone")
    async with fake_engine(FakeEngine(model="m", ttft_s=0.8)) as eng, running_gateway(
            make_config([{"name": "e", "url": eng.url, "precision": "int4"}])) as gw:
        found = await fetch_tenant_slos(gw, [a, b, keyless])
        assert found == {"tenant-a": SloClass("interactive", ttft_s=0.5, tpot_s=0.05),
                         "tenant-b": SloClass("batch", ttft_s=10.0)}
        assert await fetch_tenant_slos(eng.url, [b]) == {}  # an engine does not say
        own = workload(b)
        graded, notes = graded_by_gateway(own, found)
        assert notes == ["SLO: tenant tenant-b graded by the gateway's class batch"]
        opts = RunOptions(fetch_energy=False, progress=False, client=ClientOptions(),
                          lag_threshold_s=1.0)
        mine = await run_workload(own, Target(gw, "m"), opts)
        theirs = await run_workload(graded, Target(gw, "m"), opts)
    assert mine.summary.ok == theirs.summary.ok >= 3
    assert mine.summary.attainment == 0.0  # 0.8 s TTFT against the load generator's 0.5 s
    assert theirs.summary.attainment == 1.0  # against the gateway's batch class, 10 s


def test_gateway_limits_become_engine_time_under_a_time_scale() -> None:
    b = TenantSpec("tenant-b", api_key=KEY_B)
    graded, _ = graded_by_gateway(workload(b), {"tenant-b": SloClass("batch", ttft_s=5.0)}, 0.1)
    assert graded.slo("batch") == SloClass("batch", ttft_s=0.5)
    assert graded.tenants[0].slo_class == "batch"
    # the load generator's own class grades nobody now: not listed beside the gateway's
    assert [c.name for c in graded.slo_classes] == ["batch"]
    keyless = TenantSpec("someone")
    both, _ = graded_by_gateway(workload(b, keyless), {"tenant-b": SloClass("batch")})
    assert [c.name for c in both.slo_classes] == ["default", "batch"]
