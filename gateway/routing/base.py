"""What a routing policy sees: a snapshot of candidate endpoints, never aiohttp or sockets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import TYPE_CHECKING, Protocol

from core.vocab import value_type

if TYPE_CHECKING:
    from gateway.routing.models import Curves


@value_type
class Candidate:
    """One healthy endpoint that may take the request, with its load at snapshot time."""

    name: str
    precision: str
    inflight: int = 0  # this gateway's requests on it now
    running: float = 0.0  # engine gauge (last scrape)
    waiting: float = 0.0  # engine gauge (last scrape)
    kv_usage: float | None = None  # 0..1 (last scrape)
    weight: float = 1.0

    @property
    def load(self) -> float:
        """Queue-depth estimate: the engine's count, or ours when the scrape is older than us."""
        return (max(float(self.inflight), self.running + self.waiting)) / self.weight


@value_type
class RoutingContext:
    sequence: int  # a per-pool counter, for round robin
    prefix_key: bytes  # a prompt prefix, for affinity ("" when none)
    load_bound: float = 1.25
    # slo_energy: the tenant's SLO class (None: no limit), the share of it predictions must
    # stay under, the request's size, each endpoint's learnt curves, and the endpoints the
    # hysteresis holds as full for this (model, SLO class)
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None
    slo_margin: float = 0.8
    prompt_tokens: float = 0.0
    output_tokens: float = 0.0
    curves: Mapping[str, Curves] = field(default_factory=dict)
    full: frozenset[str] = frozenset()


class RoutingPolicy(Protocol):
    def __call__(self, candidates: Sequence[Candidate], ctx: RoutingContext) -> int:
        """Index into `candidates` (non-empty) of the chosen endpoint."""
        ...
