"""A tenant who plans cannot overspend its joule budget: reservations follow its own shape.

Through a real `wattgate serve` (accounting on, `sim` meters) in front of one simulated
engine: a neighbour's cheap traffic first (short prompts, long outputs: cheap per token),
then the attacker's waves of long-prompt, few-token requests sent all at once, again and
again after each 429, against a joule budget. Reservations learnt from every tenant's bills
took the neighbour's cheap rate and let a whole wave in, so the attacker was billed far past
its budget; reservations learnt from the attacker's own bills (the prior until it has some)
hold the bill within 5 % of the budget.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import aiohttp
import pytest
import uvloop

from loadgen.truth.client import Shape, send, session
from loadgen.truth.fleet import EngineSpec, api_key, running_fleet
from loadgen.truth.workload import Planned, drive

pytestmark = pytest.mark.timeout(420)
BUDGET_J = 1200.0
OVERSHOOT = 0.05
WAVES = 7
WAVE = 10  # requests sent at once


async def spent_j(url: str, tenant: str, deadline_s: float = 60.0
                  ) -> tuple[float, float, list[dict[str, object]]]:
    """(charged, reserved) J of `tenant`'s budget once nothing is reserved any more, and the
    rates its reservations learnt."""
    auth = {"Authorization": f"Bearer {api_key(tenant)}"}
    end = time.monotonic() + deadline_s
    async with aiohttp.ClientSession() as s:
        while True:
            async with s.get(url + "/v1/usage", headers=auth) as r:
                usage = await r.json()
            b = usage["budgets"][0]
            if b["held"] == 0 or time.monotonic() > end:
                return float(b["spent"]), float(b["held"]), usage.get("budget_rates", [])
            await asyncio.sleep(0.5)


async def attack(url: str) -> list[int]:
    rnd = random.Random(7)
    # the neighbour: 20 streams of 50 prompt and 200 output tokens, then its bills go final
    neighbour = [Planned(0.1 * i, Shape("cheap", "neighbour", 50, 200)) for i in range(20)]
    sent = await drive(url, neighbour, print, deadline_s=120)
    assert all(s.http_status == 200 for s in sent), [s.http_status for s in sent]
    await asyncio.sleep(5.0)
    statuses: list[int] = []
    async with session() as http:
        for _ in range(WAVES):
            wave = [Shape("long", "attacker", rnd.randint(9000, 12000), rnd.randint(1, 30))
                    for _ in range(WAVE)]
            got = await asyncio.gather(*(send(http, url, shape) for shape in wave))
            statuses += [g.http_status for g in got]
            await asyncio.sleep(4.0)  # its bills go final; the gateway learns from them
    return statuses


def test_neighbour_then_long_prompts_stays_within_the_budget(tmp_path: Path) -> None:
    extra = {"attacker": {"budgets": [{"period": "month", "j": BUDGET_J}]}}
    with running_fleet(tmp_path, ("neighbour", "attacker"),
                       (EngineSpec("vllm-bf16", "bf16", "vllm"),), tenant_extra=extra) as f:
        statuses = uvloop.run(attack(f.gateway_url))
        spent, held, rates = uvloop.run(spent_j(f.gateway_url, "attacker"))
    admitted = statuses.count(200)
    overshoot = spent / BUDGET_J - 1.0
    print(f"attacker: {admitted} of {len(statuses)} admitted, billed {spent:.1f} J against "
          f"{BUDGET_J:g} J ({overshoot:+.1%}), {held:.1f} J still reserved; learnt {rates}")
    assert set(statuses) <= {200, 429}
    assert admitted >= 3, "the budget let some of the attack in"
    assert held == 0
    assert overshoot <= OVERSHOOT
    # learnt from its own long-prompt bills only: nothing of the neighbour's short prompts
    assert rates and all(r["prompt_tokens"] == [8192, None] for r in rates), rates
