"""Engine kinds and their dialects, picked from a name -> class table."""

from __future__ import annotations

from engines.adapters.base import EngineAdapter, EngineLoad, MetricsParseError
from engines.adapters.openai import OpenAIAdapter
from engines.adapters.trtllm import TrtllmAdapter
from engines.adapters.vllm import VllmAdapter

ADAPTERS: dict[str, type[EngineAdapter]] = {
    "vllm": VllmAdapter,
    "trtllm": TrtllmAdapter,
    "openai": OpenAIAdapter,
}


def adapter_for(kind: str) -> EngineAdapter:
    """The adapter of an engine kind (`vllm`, `trtllm`, `openai`)."""
    try:
        return ADAPTERS[kind]()
    except KeyError:
        raise ValueError(f"unknown engine kind {kind!r}; known: {', '.join(ADAPTERS)}") from None


__all__ = ["ADAPTERS", "EngineAdapter", "EngineLoad", "MetricsParseError", "adapter_for"]
