"""vLLM's OpenAI server: `/health`, Prometheus text at `/metrics` (docs/architecture.md, "Sources")."""

from __future__ import annotations

from typing import ClassVar

from engines.adapters.base import EngineLoad, MetricsParseError
from engines.adapters.promtext import sample_sums

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"  # releases before the V1 engine
WANTED = frozenset({RUNNING, WAITING, KV_USAGE, KV_USAGE_OLD})


class VllmAdapter:
    kind: ClassVar[str] = "vllm"
    health_path: ClassVar[str] = "/health"
    serves_embeddings: ClassVar[bool] = True
    metrics_path: ClassVar[str | None] = "/metrics"

    def parse_load(self, body: bytes) -> EngineLoad:
        sums, counts = sample_sums(body, WANTED)
        if RUNNING not in sums and WAITING not in sums:
            raise MetricsParseError("no vllm:num_requests_running/waiting in metrics")
        kv_name = KV_USAGE if KV_USAGE in sums else KV_USAGE_OLD
        kv = sums[kv_name] / counts[kv_name] if kv_name in sums else None  # mean over engines
        return EngineLoad(running=sums.get(RUNNING, 0.0), waiting=sums.get(WAITING, 0.0), kv_usage=kv)
