"""What the gateway needs to know about an engine kind: where its health and load live."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol


class MetricsParseError(ValueError):
    """An engine's metrics payload could not be read."""


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """Load gauges scraped from one engine (summed over its model/engine label sets)."""

    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float | None = None  # fraction of KV cache in use, 0..1; None if not exposed


class EngineAdapter(Protocol):
    kind: ClassVar[str]
    health_path: ClassVar[str]
    metrics_path: ClassVar[str | None]  # None: the engine exposes no load metrics
    serves_embeddings: ClassVar[bool]  # POST /v1/embeddings (trtllm-serve has none)

    def parse_load(self, body: bytes) -> EngineLoad:
        """Parse the body of `metrics_path` into load gauges; raises MetricsParseError."""
        ...
