"""The adversarial wave against a joule budget (seeded): a neighbour's cheap streams first
(short prompts, long outputs: cheap per token), then waves of long-prompt, few-token streams
from the budgeted tenant, all of a wave sent at once, a wave after each other wave's bills
are final, until the budget refuses a whole wave. What the tenant is billed against its
budget is the overshoot; the budget's own standing is read from `/v1/usage`. A wave waits for
the previous one's bills to be final and learnt from (or a minute), not for a fixed time.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

from loadgen.truth.client import Sent, Shape, send, session
from loadgen.truth.fleet import api_key
from loadgen.truth.workload import Planned, drive


@dataclass(frozen=True, slots=True)
class WavePlan:
    neighbour: str
    tenant: str
    neighbour_streams: int = 96
    neighbour_s: float = 45.0  # the neighbour's streams are spread over this long
    waves: int = 6  # at most; fewer when a whole wave is refused
    wave: int = 40  # streams sent at once
    prompt_tokens: tuple[int, int] = (10_000, 16_000)
    max_tokens: tuple[int, int] = (1, 30)
    final_wait_s: float = 4.0  # after a wave: its bills go final, the gateway learns them
    seed: int = 7


@dataclass(frozen=True, slots=True)
class Standing:
    """The budget once nothing is reserved any more (or the wait ran out)."""

    spent_j: float
    held_j: float
    rates: list[dict[str, object]]  # the rates its reservations learnt


async def standing(url: str, tenant: str, deadline_s: float = 60.0) -> Standing:
    """`tenant`'s first budget from `/v1/usage`, once its reservations are all settled."""
    auth = {"Authorization": f"Bearer {api_key(tenant)}"}
    end = time.monotonic() + deadline_s
    async with aiohttp.ClientSession() as s:
        while True:
            async with s.get(url + "/v1/usage", headers=auth) as r:
                usage = await r.json()
            b = usage["budgets"][0]
            if b["held"] == 0 or time.monotonic() > end:
                return Standing(float(b["spent"]), float(b["held"]),
                                list(usage.get("budget_rates", [])))
            await asyncio.sleep(0.5)


async def settled(url: str, tenant: str, deadline_s: float = 60.0) -> None:
    """Wait until nothing of `tenant` is reserved any more (its bills final) and the gateway
    shows budget rates learnt from them (or the wait ran out): on a busy machine the bills of
    a wave go final, and are learnt from, later than on an idle one."""
    auth = {"Authorization": f"Bearer {api_key(tenant)}"}
    end = time.monotonic() + deadline_s
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < end:
            async with s.get(url + "/v1/usage", headers=auth) as r:
                usage = await r.json()
            if usage["budgets"][0]["held"] == 0 and usage.get("budget_rates"):
                return
            await asyncio.sleep(0.5)


async def run(url: str, plan: WavePlan, say: Callable[[str], None],
              spread: Sequence[str] = ()) -> tuple[list[Sent], list[list[Sent]]]:
    """(the neighbour's requests, the tenant's waves). With `spread` (replicas' URLs) each
    wave's requests go to them in turn; else all to `url`, as do the neighbour's."""
    targets = list(spread) or [url]
    rnd = random.Random(plan.seed)
    gap_s = plan.neighbour_s / max(1, plan.neighbour_streams)
    cheap = [Planned(gap_s * i, Shape("cheap", plan.neighbour, 50, 200))
             for i in range(plan.neighbour_streams)]
    neighbour = await drive(url, cheap, say, deadline_s=plan.neighbour_s + 120.0)
    await asyncio.sleep(plan.final_wait_s)  # its bills go final before the first wave
    waves: list[list[Sent]] = []
    async with session() as http:
        for k in range(plan.waves):
            shapes = [Shape("wave-long", plan.tenant, rnd.randint(*plan.prompt_tokens),
                            rnd.randint(*plan.max_tokens)) for _ in range(plan.wave)]
            got = await asyncio.gather(*(send(http, targets[i % len(targets)], s)
                                         for i, s in enumerate(shapes)))
            waves.append(list(got))
            admitted = sum(1 for g in got if g.http_status == 200)
            say(f"  wave {k + 1}: {admitted} of {len(got)} admitted")
            if admitted == 0:
                break
            await asyncio.sleep(plan.final_wait_s)
            # each replica admits from the rates it learnt
            await asyncio.gather(*(settled(target, plan.tenant) for target in targets))
    return neighbour, waves
