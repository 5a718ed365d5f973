"""The mixed workload (seeded, so two runs send the same requests at the same offsets) and
the open-loop driver that sends it through the gateway."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from loadgen.truth.client import Sent, Shape, send, session

TENANTS = ("acme", "globex", "initech", "mallory")
ADVERSARY = "mallory"


@dataclass(frozen=True, slots=True)
class Planned:
    at_s: float  # offset from the start of the run
    shape: Shape


def poisson(rnd: random.Random, rate_rps: float, t0_s: float, t1_s: float) -> Iterator[float]:
    t = t0_s + rnd.expovariate(rate_rps)
    while t < t1_s:
        yield t
        t += rnd.expovariate(rate_rps)


def _chat(rnd: random.Random, duration_s: float) -> list[Planned]:
    """Short interactive chat at ~10 req/s (acme)."""
    return [Planned(t, Shape("chat", "acme", int(min(600, max(30, rnd.lognormvariate(5.0, 0.6)))),
                             rnd.randint(20, 120), chat=True))
            for t in poisson(rnd, 10.0, 0.0, duration_s)]


def _long(rnd: random.Random, duration_s: float) -> list[Planned]:
    """3,000-token documents with 800-token answers (globex); 5 % dropped by the client,
    half of those just before the end."""
    out = []
    for t in poisson(rnd, 0.5, 0.0, duration_s):
        u = rnd.random()
        if u < 0.025:
            shape = Shape("long-cancel-end", "globex", 3000, 800, cancel_after=rnd.randint(780, 798))
        elif u < 0.05:
            shape = Shape("long-cancel-mid", "globex", 3000, 800, cancel_after=rnd.randint(50, 700))
        else:
            shape = Shape("long", "globex", 3000, 800)
        out.append(Planned(t, shape))
    # At least one of each cancellation in every run, however short.
    out.append(Planned(0.2 * duration_s, Shape("long-cancel-end", "globex", 3000, 800,
                                               cancel_after=795)))
    out.append(Planned(0.3 * duration_s, Shape("long-cancel-mid", "globex", 3000, 800,
                                               cancel_after=300)))
    return out


def _prefill(rnd: random.Random, duration_s: float) -> list[Planned]:
    """Long prompts with max_tokens 1 (globex): 8k-30k tokens of prefill, one token out."""
    times = [*poisson(rnd, 0.2, 0.0, duration_s), 0.1 * duration_s]
    return [Planned(t, Shape("prefill", "globex", rnd.randint(8000, 30000), 1)) for t in times]


def _bursts(rnd: random.Random, duration_s: float) -> list[Planned]:
    """On/off bursts of medium requests (initech): 8 req/s for 3 s, then 6 s off."""
    out = []
    t_on = 1.0
    while t_on < duration_s:
        out += [Planned(t, Shape("burst", "initech", rnd.randint(600, 1200), rnd.randint(100, 250)))
                for t in poisson(rnd, 8.0, t_on, min(t_on + 3.0, duration_s))]
        t_on += 9.0
    return out


def _nonstream(rnd: random.Random, duration_s: float) -> list[Planned]:
    """Non-streamed medium requests (initech), 1 req/s."""
    return [Planned(t, Shape("nonstream", "initech", rnd.randint(300, 1500), rnd.randint(50, 200),
                             stream=False))
            for t in poisson(rnd, 1.0, 0.0, duration_s)]


def _adversary(rnd: random.Random, duration_s: float) -> list[Planned]:
    """mallory, every way a tenant could move its energy onto others: streams dropped just
    before the end, long prompts with max_tokens 1, slow readers of long outputs, one big
    request split into many small ones, n > 1."""
    out = []
    for t in poisson(rnd, 0.4, 0.0, duration_s):
        out.append(Planned(t, Shape("adv-drop-end", ADVERSARY, 3000, 500,
                                    cancel_after=rnd.randint(490, 498))))
    for t in poisson(rnd, 0.15, 0.0, duration_s):
        out.append(Planned(t, Shape("adv-prefill", ADVERSARY, rnd.randint(15000, 30000), 1)))
    for t in poisson(rnd, 0.3, 0.0, duration_s):
        out.append(Planned(t, Shape("adv-slow-reader", ADVERSARY, 200, 1200, read_pause_s=0.02)))
    t_burst = 2.0
    while t_burst < duration_s:  # a 3,000-token job sent as 20 pieces of 150 at once
        out += [Planned(t_burst + 0.01 * i, Shape("adv-split", ADVERSARY, 150, 40))
                for i in range(20)]
        t_burst += 10.0
    for t in poisson(rnd, 0.1, 0.0, duration_s):
        out.append(Planned(t, Shape("adv-n2", ADVERSARY, 500, 100, n=2)))
    return out


def mixed_plan(duration_s: float, seed: int = 7) -> list[Planned]:
    rnd = random.Random(seed)
    plan = [p for make in (_chat, _long, _prefill, _bursts, _nonstream, _adversary)
            for p in make(rnd, duration_s)]
    return sorted(plan, key=lambda p: p.at_s)


def scaled(plan: list[Planned], max_tokens_factor: float) -> list[Planned]:
    """The same plan with outputs (and cancellation points) shortened, for smoke runs."""
    def shrink(s: Shape) -> Shape:
        mt = max(1, round(s.max_tokens * max_tokens_factor)) if s.max_tokens > 1 else 1
        cut = None if s.cancel_after is None else max(1, min(mt - 1, round(
            s.cancel_after * max_tokens_factor)))
        return replace(s, max_tokens=mt, cancel_after=cut)
    return [Planned(p.at_s, shrink(p.shape)) for p in plan]


async def drive(base_url: str, plan: list[Planned], progress: Callable[[str], None],
                deadline_s: float, request_timeout_s: float = 120.0) -> list[Sent]:
    """Send the plan open-loop (each request at its offset, whatever the others do); stop
    waiting for stragglers `deadline_s` after the start."""
    t0 = time.monotonic()
    done: list[Sent] = []
    async with session() as http:
        async def one(p: Planned) -> None:
            await asyncio.sleep(max(0.0, t0 + p.at_s - time.monotonic()))
            done.append(await send(http, base_url, p.shape, request_timeout_s))

        tasks = [asyncio.create_task(one(p)) for p in plan]
        last = 0.0
        while not all(t.done() for t in tasks) and time.monotonic() - t0 < deadline_s:
            await asyncio.sleep(0.5)
            if time.monotonic() - last >= 5.0:
                last = time.monotonic()
                bad = sum(1 for s in done if s.error or s.http_status not in (200, 400))
                progress(f"  t={last - t0:5.1f} s  sent {sum(1 for p in plan if p.at_s <= last - t0)}"
                         f"/{len(plan)}  done {len(done)}  failed {bad}")
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return done
