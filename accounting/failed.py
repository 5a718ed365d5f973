"""Failed work is not the tenant's (pure): a failed request's share of an interval, split
between its tenant's bill and its engine's `failed` account.

A request that an engine or the gateway failed (`outcome_class` "failed", core/outcomes.py:
5xx, an engine's 429, timeouts, an error after the stream began) gets its share of every
interval as any other request does (apportion.py: the engine's energy is conserved whoever
pays). With `accounting.failed_energy: failed_account` (the default) the share is then split:

- nothing delivered (no token event reached the client): the whole share goes to the
  engine's failed account;
- tokens delivered, then the failure (`delivered_s`: the wall-clock time of the last read
  that carried a token event to the client): the tenant keeps the share's dynamic part (its
  token work: the prefill and the decoded tokens the gateway relayed, all of which lie before
  `delivered_s`) and its static part pro rata of the request's residency in the interval up
  to `delivered_s`; the static part of the residency after it (the engine holding a request
  that was hung, stalled or trickling until it failed) goes to the failed account.

With `failed_energy: tenant` the whole share is the tenant's, as for a served request.
Served, refused and cancelled requests are always billed in full (a client that leaves
chose to). GPU-seconds split as the static part does (both are residency), and each part
is priced on its own, so carbon and cost follow the joules. For every share,
billed + failed == the share up to one rounding, so an interval's energy is its tenants'
shares + idle + failed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

from accounting.apportion import ShareColumns
from core.vocab import FailedEnergy

BILL_ALL = math.inf  # a request billed in full (not failed, or failures billed to tenants)
BILL_NONE = -math.inf  # a failed request that delivered nothing


def bill_until(outcome: str, delivered_s: float | None, failed_energy: FailedEnergy
               ) -> float:
    """Up to when (wall clock) a request's residency is its tenant's: BILL_ALL unless it
    failed and failures go to the failed account; BILL_NONE if it delivered no token."""
    if outcome != "failed" or failed_energy == "tenant":
        return BILL_ALL
    return BILL_NONE if delivered_s is None else delivered_s


class Cut(NamedTuple):
    """A failed request's billing cut in one interval: bill until `until_s`, its residency
    span there starting at `start_s` (wall clock) and lasting `residency_s`."""

    until_s: float
    start_s: float
    residency_s: float


def static_fraction(cut: Cut) -> float:
    """The part of the residency span before the cut (0..1)."""
    end = cut.start_s + cut.residency_s
    if cut.until_s >= end:
        return 1.0
    if cut.until_s <= cut.start_s or cut.residency_s <= 0.0:
        return 0.0
    return (cut.until_s - cut.start_s) / cut.residency_s


class Split(NamedTuple):
    billed: ShareColumns  # what the tenants pay
    failed: ShareColumns  # what goes to the engine's failed account (same request order)


def split_failed(shares: ShareColumns, cuts: Mapping[str, Cut]) -> Split:
    """Split each share whose request has a cut (above); the others are billed in full."""
    billed_s: list[float] = []
    billed_d: list[float] = []
    billed_e: list[float] = []
    billed_b: list[float] = []
    failed_s: list[float] = []
    failed_d: list[float] = []
    failed_e: list[float] = []
    failed_b: list[float] = []
    for rid, e, s, d, b in zip(*shares, strict=True):
        cut = cuts.get(rid)
        if cut is None or cut.until_s == BILL_ALL:
            bs, bd, be, bb = s, d, e, b
        elif cut.until_s == BILL_NONE:
            bs = bd = be = bb = 0.0
        else:
            f = static_fraction(cut)
            bs, bd, bb = s * f, d, b * f
            be = bs + bd if f < 1.0 else e
        billed_s.append(bs)
        billed_d.append(bd)
        billed_e.append(be)
        billed_b.append(bb)
        # the remainder by difference: billed + failed is the share, whatever the rounding
        failed_s.append(s - bs)
        failed_d.append(d - bd)
        failed_e.append(e - be)
        failed_b.append(b - bb)
    rids = shares.request_ids
    return Split(ShareColumns(rids, billed_e, billed_s, billed_d, billed_b),
                 ShareColumns(rids, failed_e, failed_s, failed_d, failed_b))
