"""What `slo_energy` routing saves over `least_load` on the same seeded load (pure), and the
idle energy the tenants' bills leave out (one HTTP read of the gateway's usage report).

The saving is 1 - (J per output token under slo_energy) / (J per output token under
least_load), from each request's apportioned joules. Its 95 % interval is a paired bootstrap:
both runs replay one plan, so request i of one is request i of the other; resampling the
indices (with replacement) keeps each pair together.

It splits exactly in two (a shift-share decomposition over precisions p, token-weighted
shares s_p and J per output token j_p of each policy):

    j_se - j_ll = sum_p s_se,p (j_se,p - j_ll,p)      packing: the same precision, cheaper per
                                                        token because the batch is fuller
                + sum_p (s_se,p - s_ll,p) j_ll,p        precision: tokens moved to precisions
                                                        that cost less (at least_load's prices)

The second changes what the tenant receives (another numeric format), so the report names the
quality floor that allowed it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp

from loadgen.energy import EnergyRow
from loadgen.runner import RunOutcome

BOOTSTRAP_RESAMPLES = 2000
IDLE_POLICY = ("idle energy kept apart: the time no request was resident on an engine is "
               "billed to that engine's idle account, not shared over the tenants (as "
               "OpenCost does with idle sharing off)")


@dataclass(frozen=True, slots=True)
class Saving:
    pct: float  # (1 - j_se / j_ll) x 100: positive when slo_energy spends fewer J per token
    low_pct: float  # 95 % paired-bootstrap interval
    high_pct: float
    pairs: int  # requests with energy in both runs
    attainment_ll: float | None
    attainment_se: float | None
    packing_pct: float  # of the saving: same precision, fuller batches
    precision_pct: float  # of the saving: cheaper precisions
    floor: float | None  # the quality floor both gateways routed under
    excluded: tuple[str, ...]  # precisions the floor kept out, with why


def _rows(o: RunOutcome) -> list[EnergyRow | None]:
    f = o.energy_fetch
    return [f.row(m.result) if f is not None else None for m in o.requests]


def _j(rows: Sequence[EnergyRow]) -> float:
    tokens = sum(r.completion_tokens for r in rows)
    return math.fsum(r.energy_j for r in rows) / tokens if tokens else math.nan


def _by_precision(rows: Sequence[EnergyRow]) -> dict[str, tuple[float, float]]:
    """precision -> (share of output tokens, J per output token)."""
    total = sum(r.completion_tokens for r in rows)
    out = {}
    for p in sorted({r.precision for r in rows}):
        mine = [r for r in rows if r.precision == p]
        out[p] = (sum(r.completion_tokens for r in mine) / total, _j(mine))
    return out


def split(ll: Sequence[EnergyRow], se: Sequence[EnergyRow]) -> tuple[float, float]:
    """(packing, precision) parts of j_se - j_ll, in J per output token (module docstring);
    a precision only slo_energy served is priced at its own slo_energy cost (no packing)."""
    a, b = _by_precision(ll), _by_precision(se)
    packing = precision = 0.0
    for p in a.keys() | b.keys():
        s_ll, j_ll = a.get(p, (0.0, math.nan))
        s_se, j_se = b.get(p, (0.0, math.nan))
        base = j_ll if p in a else j_se
        if p in b:
            packing += s_se * (j_se - base)
        precision += (s_se - s_ll) * base
    return packing, precision


def routing_saving(ll: RunOutcome, se: RunOutcome, floor: float | None = None,
                   excluded: Sequence[str] = (), resamples: int = BOOTSTRAP_RESAMPLES,
                   seed: int = 0) -> Saving | None:
    """The saving with its interval and parts; None without energy in both runs."""
    pairs = [(x, y) for x, y in zip(_rows(ll), _rows(se), strict=False)
             if x is not None and y is not None and x.completion_tokens and y.completion_tokens]
    if len(pairs) < 2:
        return None
    a, b = [x for x, _ in pairs], [y for _, y in pairs]
    j_ll, j_se = _j(a), _j(b)
    rng = random.Random(seed)
    draws = []
    for _ in range(resamples):
        idx = [rng.randrange(len(pairs)) for _ in pairs]
        draws.append(100.0 * (1.0 - _j([b[i] for i in idx]) / _j([a[i] for i in idx])))
    draws.sort()
    packing, precision = split(a, b)
    return Saving(100.0 * (1.0 - j_se / j_ll), draws[int(0.025 * resamples)],
                  draws[min(resamples - 1, int(0.975 * resamples))], len(pairs),
                  ll.summary.attainment, se.summary.attainment,
                  -100.0 * packing / j_ll, -100.0 * precision / j_ll, floor, tuple(excluded))


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def saving_line(s: Saving | None) -> str:
    """The answer-box sentence: the saving in %, its interval, both attainments, its parts."""
    if s is None:
        return "Routing saving: n/a (no request energy in both routing runs)."
    floor = ("no quality floor" if s.floor is None else
             f"quality floor {s.floor:g}" + (f" ({'; '.join(s.excluded)})" if s.excluded else ""))
    sure = ("" if s.low_pct > 0.0 or s.high_pct < 0.0 else
            " (not significant: the interval holds 0)")
    return (f"Routing: slo_energy saves {s.pct:.1f} % [95 % CI {s.low_pct:.1f}, "
            f"{s.high_pct:.1f}] of least_load's J per output token{sure} on the same "
            f"{s.pairs} requests, SLO attainment {_pct(s.attainment_se)} vs "
            f"{_pct(s.attainment_ll)}: packing on engines of one precision "
            f"{s.packing_pct:.1f} %, choosing cheaper precisions {s.precision_pct:.1f} % "
            f"(a different numeric format for the tenant, allowed by the {floor}).")


async def idle_j(session: aiohttp.ClientSession, base_url: str, admin_key: str,
                 since_s: float, until_s: float) -> float | None:
    """The engines' idle joules over [since, until] (wall clock) from `/admin/v1/usage`; None
    when the gateway does not say."""
    try:
        async with session.get(f"{base_url.rstrip('/')}/admin/v1/usage",
                               params={"since": f"{since_s:.3f}", "until": f"{until_s:.3f}",
                                       "group_by": "tenant"},
                               headers={"Authorization": f"Bearer {admin_key}"}) as resp:
            if resp.status != 200:
                return None
            doc = await resp.json()
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    return idle_of(doc)


def idle_of(doc: Mapping[str, object]) -> float | None:
    rows = doc.get("rows")
    if not isinstance(rows, list):
        return None
    return math.fsum(float(r.get("energy_j") or 0.0) for r in rows
                     if isinstance(r, Mapping) and r.get("account") == "idle")


def idle_row(idle: float | None, width: int) -> list[str]:
    """The tenants' table row of the idle energy, its J in the energy column (12th)."""
    row = ["(idle, kept apart)", "-"] + ["-"] * (width - 2)
    row[11] = "n/a" if idle is None else f"{idle:.1f}"
    return row
