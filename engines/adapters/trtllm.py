"""trtllm-serve: `/health`, JSON iteration stats at `/metrics` (docs/architecture.md, "Sources").

Reading `/metrics` may consume the queued stats, so only one scraper should poll it; the last
(newest) iteration in the list is the current load.
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson

from engines.adapters.base import EngineLoad, MetricsParseError


class TrtllmAdapter:
    kind: ClassVar[str] = "trtllm"
    health_path: ClassVar[str] = "/health"
    serves_embeddings: ClassVar[bool] = False
    metrics_path: ClassVar[str | None] = "/metrics"

    def parse_load(self, body: bytes) -> EngineLoad:
        try:
            stats: Any = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise MetricsParseError(f"trtllm metrics are not JSON: {exc}") from None
        if isinstance(stats, dict):
            stats = [stats]
        if not isinstance(stats, list):
            raise MetricsParseError("trtllm metrics must be a JSON list of iteration stats")
        if not stats:
            return EngineLoad()
        last = stats[-1]
        if not isinstance(last, dict):
            raise MetricsParseError("trtllm iteration stats must be objects")
        active = float(last.get("numActiveRequests", 0))
        queued = float(last.get("numQueuedRequests", 0))
        kv = last.get("kvCacheStats") or {}
        kv_usage = None
        max_blocks = kv.get("maxNumBlocks")
        if max_blocks:
            used = kv.get("usedNumBlocks")
            if used is None:
                used = max_blocks - kv.get("freeNumBlocks", max_blocks)
            kv_usage = float(used) / float(max_blocks)
        return EngineLoad(running=active, waiting=queued, kv_usage=kv_usage)
