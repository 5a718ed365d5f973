"""What a routing policy sees: a snapshot of candidate endpoints, never aiohttp or sockets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class RoutingContext:
    sequence: int  # a per-pool counter, for round robin
    prefix_key: bytes  # a prompt prefix, for affinity ("" when none)
    load_bound: float = 1.25


class RoutingPolicy(Protocol):
    def __call__(self, candidates: Sequence[Candidate], ctx: RoutingContext) -> int:
        """Index into `candidates` (non-empty) of the chosen endpoint."""
        ...
