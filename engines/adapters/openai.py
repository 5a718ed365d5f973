"""A generic OpenAI-compatible server: health via /v1/models, no load metrics."""

from __future__ import annotations

from typing import ClassVar

from engines.adapters.base import EngineLoad


class OpenAIAdapter:
    kind: ClassVar[str] = "openai"
    health_path: ClassVar[str] = "/v1/models"
    serves_embeddings: ClassVar[bool] = True
    metrics_path: ClassVar[str | None] = None

    def parse_load(self, body: bytes) -> EngineLoad:
        return EngineLoad()
