"""Routing policies (pure). Each takes a non-empty candidate list and returns an index."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from gateway.routing.base import Candidate, RoutingContext, RoutingPolicy
from gateway.routing.slo_energy import slo_energy


def round_robin(candidates: Sequence[Candidate], ctx: RoutingContext) -> int:
    return ctx.sequence % len(candidates)


def _least_key(c: Candidate) -> tuple[float, float]:
    return (c.load, c.kv_usage if c.kv_usage is not None else 0.0)


def least_load(candidates: Sequence[Candidate], ctx: RoutingContext) -> int:
    """Fewest queued+running requests (per unit weight); KV usage breaks ties, then rotation."""
    n = len(candidates)
    best = ctx.sequence % n  # rotate the starting point so ties spread
    best_key = _least_key(candidates[best])
    for step in range(1, n):
        i = (ctx.sequence + step) % n
        key = _least_key(candidates[i])
        if key < best_key:
            best, best_key = i, key
    return best


def _affinity(prefix: bytes, name: str) -> int:
    # Stable across processes and replicas (Python's hash() is salted per process).
    digest = hashlib.blake2b(prefix + b"\x00" + name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def prefix_affinity(candidates: Sequence[Candidate], ctx: RoutingContext) -> int:
    """Rendezvous hashing on the prompt prefix, with a load bound (consistent hashing with
    bounded loads): the highest-ranked endpoint whose load is within `load_bound` x the mean
    (+1) takes the request, so one hot prefix cannot pile onto a single engine."""
    if not ctx.prefix_key:
        return least_load(candidates, ctx)
    mean = sum(c.load for c in candidates) / len(candidates)
    limit = ctx.load_bound * (mean + 1.0)
    ranked = sorted(range(len(candidates)),
                    key=lambda i: _affinity(ctx.prefix_key, candidates[i].name), reverse=True)
    for i in ranked:
        if candidates[i].load <= limit:
            return i
    return least_load(candidates, ctx)


POLICIES: dict[str, RoutingPolicy] = {
    "round_robin": round_robin,
    "least_load": least_load,
    "prefix_affinity": prefix_affinity,
    "slo_energy": slo_energy,
}


def policy_for(name: str) -> RoutingPolicy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown routing policy {name!r}; known: {', '.join(POLICIES)}") from None
