"""The planning tenant's strategies (seeded), run on one engine so that a request sent just
after a neighbour's is in that neighbour's steps, and the targets they are judged by.

Every `period_s` the same sequence, beside a light chat background (acme):
- cheap neighbour then long prompts: acme's cheap streams (50 prompt / 200 out), then a wave
  of mallory's 10k-16k-token prompts with max_tokens 1-30;
- riders: globex's 12,000-token prompt, then 30 of mallory's tiny requests (8 tokens in, 2
  out) 0.1 s later, streamed; again with the riders not streamed;
- a burst of 30 medium requests at once (initech);
- three non-streamed requests in one accounting interval (initech);
- cut-off streams: medium prompts dropped after 1-20 tokens (globex).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from loadgen.truth.client import Shape
from loadgen.truth.join import Joined
from loadgen.truth.summary import Target, quantile
from loadgen.truth.workload import ADVERSARY, Planned, poisson

RIDER_MAX = 0.05  # a rider's bill against its Shapley share
NEIGHBOUR_MAX = 0.01  # the rider's neighbour's bill against its Shapley share
RIDER_CLASSES = ("rider", "rider-nonstream")


def _round(rnd: random.Random, t0: float) -> list[Planned]:
    out = [Planned(t0 + 0.1 * i, Shape("cheap", "acme", 50, 200)) for i in range(24)]
    out += [Planned(t0 + 3.0 + 0.05 * i, Shape("wave-long", ADVERSARY, rnd.randint(10000, 16000),
                                               rnd.randint(1, 30))) for i in range(6)]
    for t, stream in ((t0 + 8.0, True), (t0 + 12.0, False)):
        cls = "rider" if stream else "rider-nonstream"
        out.append(Planned(t, Shape("rider-neighbour", "globex", 12000, 50)))
        out += [Planned(t + 0.1 + 0.001 * i, Shape(cls, ADVERSARY, 8, 2, stream=stream))
                for i in range(30)]
    out += [Planned(t0 + 16.0, Shape("burst30", "initech", rnd.randint(200, 800),
                                     rnd.randint(50, 150))) for _ in range(30)]
    out += [Planned(t0 + 20.3 + 0.05 * i, Shape("nonstream3", "initech", p, m, stream=False))
            for i, (p, m) in enumerate(((100, 20), (1000, 100), (3000, 10)))]
    out += [Planned(t0 + 21.0 + 0.3 * i, Shape("cutoff", "globex", rnd.randint(500, 3000), 200,
                                               cancel_after=rnd.randint(1, 20)))
            for i in range(10)]
    return out


def plan(rounds: int, period_s: float = 24.0, seed: int = 7) -> list[Planned]:
    rnd = random.Random(seed)
    duration_s = rounds * period_s
    out = [Planned(t, Shape("chat", "acme", rnd.randint(30, 300), rnd.randint(20, 80)))
           for t in poisson(rnd, 2.0, 0.0, duration_s)]
    for r in range(rounds):
        out += _round(rnd, 1.0 + r * period_s)
    return sorted(out, key=lambda p: p.at_s)


def targets(rows: Sequence[Joined]) -> list[Target]:
    """The riders' and their neighbours' targets (worst request, and p95 for riders)."""
    out = []
    for cls in RIDER_CLASSES:
        errs = [abs(r.error) for r in rows if r.sent.shape.cls == cls and r.truth_j > 0]
        if errs:
            p95 = quantile(errs, 0.95)
            out.append(Target(f"{cls}: |error| p95 against the Shapley share", p95, RIDER_MAX,
                              p95 <= RIDER_MAX))
    errs = [abs(r.error) for r in rows if r.sent.shape.cls == "rider-neighbour" and r.truth_j > 0]
    if errs:
        worst = max(errs)
        out.append(Target("rider-neighbour: worst |error|", worst, NEIGHBOUR_MAX,
                          worst <= NEIGHBOUR_MAX))
    return [t for t in out if not math.isnan(t.value)]
