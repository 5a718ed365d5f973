"""Leases of a rate limit kept in a shared store (pure; the clock is passed in).

The store (shared.py) keeps one token bucket per tenant and limit for all replicas: it holds
at most the limit and refills at limit / period, on the store's clock. A replica never asks
it per request: it leases a block of tokens and admits from that block locally. `exchange`
is the store's arithmetic (shared.py runs the same in one SQL statement); `Lease` is one
replica's side of one bucket.

How big a lease is: what the replica's recent demand uses in HORIZON_S, but at most
MAX_LEASE_SHARE of the limit and LEVEL_SHARE of what the store had left when it last
answered (or what it refills in NEAR_LIMIT_S, if more). Far from the limit a replica holds a
block and tops it up in the background before it runs out (no request waits); near the limit
the blocks shrink to what the bucket refills in NEAR_LIMIT_S, or one request where that is
less, and a request that finds its replica's lease empty waits for one lease round trip
(requests waiting together share it). When the store ran dry, the replica refuses locally until the
bucket has refilled by what the request needs or by a near-limit block (`empty_until_s`), so
a tenant at its limit costs the store one statement per block, not one per request.

Accuracy: the store never grants more than its bucket holds, so the replicas together admit
at most what one bucket would. They admit less only by what sits unused in leases: at most
one block per replica, a block near the limit being one request; a lease its replica has not
used for IDLE_RETURN_S goes back to the store, as does a surplus of refunded tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HORIZON_S = 0.1  # a lease covers this long of the replica's recent demand
MAX_LEASE_SHARE = 0.05  # and at most this share of the limit
LEVEL_SHARE = 0.25  # and at most this share of what the store had left,
NEAR_LIMIT_S = 0.02  # or, near the limit, of what it refills in this long
LOW_WATER = 0.5  # top up when the balance falls under this share of a lease
DEMAND_TAU_S = 1.0  # time constant of the demand rate's moving average
IDLE_RETURN_S = 1.0  # a lease untouched this long goes back to the store
MIN_WAIT_S = 0.001  # the shortest local refusal window


@dataclass(frozen=True, slots=True)
class Exchange:
    """What the store answered: tokens granted, and its bucket's level after."""

    granted: float
    level: float


def refilled(level: float, at_s: float, now_s: float, capacity: float, period_s: float
             ) -> float:
    return min(capacity, level + max(0.0, now_s - at_s) * capacity / period_s)


def exchange(level: float, at_s: float, now_s: float, capacity: float, period_s: float,
             amount: float) -> Exchange:
    """The store's side of one lease: `amount` > 0 asks for tokens, granted as far as the
    refilled bucket holds them; `amount` < 0 gives tokens back (the bucket stays at most
    full). A bucket not yet stored is full (`level` = capacity)."""
    full = refilled(level, at_s, now_s, capacity, period_s)
    granted = max(0.0, min(amount, full))
    return Exchange(granted, min(capacity, full - granted - min(amount, 0.0)))


@dataclass(slots=True)
class Lease:
    """One replica's lease of one shared bucket (a tenant's limit)."""

    capacity: float  # the limit per period
    period_s: float
    balance: float = 0.0  # leased and not yet admitted (below 0: tokens used past a lease)
    store_level: float = math.nan  # the store's level at its last answer (nan: not yet asked)
    asked: float = 0.0  # what requests asked for, each decayed by its age (DEMAND_TAU_S)
    size: float = 1.0  # moving average of one request's amount
    first_s: float = math.nan  # the first request
    seen_s: float = -math.inf  # the last request
    empty_until_s: float = -math.inf  # the store had nothing: refuse locally until then

    @property
    def rate_per_s(self) -> float:
        return self.capacity / self.period_s

    def note(self, now_s: float, amount: float) -> None:
        """A request asked for `amount` (admitted or not): the demand it shows."""
        if math.isnan(self.first_s):
            self.first_s = now_s
        else:
            self.asked *= math.exp(-max(0.0, now_s - self.seen_s) / DEMAND_TAU_S)
        self.asked += amount
        self.size += (amount - self.size) * 0.1
        self.seen_s = max(self.seen_s, now_s)

    @property
    def demand_per_s(self) -> float:
        """The recent demand rate: the decayed sum over the time it decays over, which for a
        young lease is its age (at least HORIZON_S), so a new client's rate is known within
        about HORIZON_S rather than ramping up over DEMAND_TAU_S."""
        if math.isnan(self.first_s):
            return 0.0
        age_s = max(HORIZON_S, self.seen_s - self.first_s)
        return self.asked / (DEMAND_TAU_S * -math.expm1(-age_s / DEMAND_TAU_S))

    def block(self) -> float:
        """The lease to hold: recent demand over HORIZON_S, capped by the limit's share and
        by the share of what the store last had."""
        known = self.capacity if math.isnan(self.store_level) else self.store_level
        return min(self.demand_per_s * HORIZON_S, self.capacity * MAX_LEASE_SHARE,
                   max(known * LEVEL_SHARE, self.rate_per_s * NEAR_LIMIT_S))

    def ask(self, need: float) -> float:
        """Tokens to ask the store for when a request needs `need` of this lease now (0:
        a top-up): the request's shortfall, or the block's, whichever is more."""
        return max(0.0, need - self.balance, self.block() - self.balance)

    def wants_top_up(self, now_s: float) -> bool:
        """Under its low water with a block worth a request, away from the limit: ask before
        a request waits. At the limit a replica asks only for requests it has (a top-up
        there would take the refill from replicas whose requests are waiting)."""
        block = self.block()
        known = self.capacity if math.isnan(self.store_level) else self.store_level
        near = known * LEVEL_SHARE < max(self.size, self.rate_per_s * NEAR_LIMIT_S)
        return (not near and block >= self.size and self.balance < LOW_WATER * block
                and now_s >= self.empty_until_s)

    def granted(self, now_s: float, answer: Exchange, asked: float, need: float) -> None:
        """The store's answer to a lease of `asked` for a request needing `need` (0: a top-up
        or a give-back)."""
        self.balance += answer.granted
        self.store_level = answer.level
        if answer.granted < asked:  # the store ran dry: ask again once it has refilled
            # what the request lacks, or a near-limit block: one statement per block
            want = max(need - self.balance, min(asked, self.rate_per_s * NEAR_LIMIT_S))
            self.empty_until_s = now_s + max(
                MIN_WAIT_S, (want - max(0.0, answer.level)) / self.rate_per_s)

    def surplus(self, now_s: float) -> float:
        """Tokens to give back: all of an idle lease, or what refunds piled above a block."""
        if self.balance <= 0.0:
            return 0.0
        if now_s - self.seen_s >= IDLE_RETURN_S:
            return self.balance
        keep = 2.0 * max(self.block(), self.size)
        return self.balance - keep if self.balance > keep else 0.0

    def wait_s(self, now_s: float, need: float) -> float:
        """Seconds until `need` may be there (inf: more than the limit)."""
        if need > self.capacity:
            return math.inf
        if self.empty_until_s > now_s:
            return max(MIN_WAIT_S, self.empty_until_s - now_s)
        level = 0.0 if math.isnan(self.store_level) else max(0.0, self.store_level)
        return max(MIN_WAIT_S, (need - self.balance - level) / self.rate_per_s)

    def remaining(self) -> float:
        """What the tenant may still use as this replica last saw it (for the headers)."""
        level = self.capacity if math.isnan(self.store_level) else self.store_level
        return max(0.0, min(self.capacity, level + self.balance))
