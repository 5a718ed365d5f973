"""Configuration of one simulated engine, validated once at the edge (CLI or fleet file)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from engines.sim.catalog import Deployment, deployment

DIALECTS = ("vllm", "trtllm")


class SimConfigError(ValueError):
    """A bad engine configuration; the message names the field and the allowed values."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    gpu: str
    model: str
    precision: str
    dialect: str = "vllm"
    port: int = 8000
    host: str = "127.0.0.1"
    tp: int = 1
    served_model_name: str | None = None
    time_scale: float = 1.0
    seed: int = 0
    max_batch: int = 256
    fixed_ttft_ms: float | None = None
    fixed_itl_ms: float | None = None
    tokens_per_event: int = 1
    name: str | None = None  # label in a fleet's ready lines
    # Share of tokens whose text is "" (a token ending inside a multi-byte character, or a
    # special token), for an all-ASCII prompt and for a prompt with no ASCII text; mixed
    # prompts fall in between. A few percent is what byte-level BPE models show on English.
    empty_text_share: float = 0.02
    empty_text_share_non_ascii: float = 0.25
    # Pause between `data: [DONE]` and the end of a stream (the last HTTP chunk), as a busy
    # vLLM server shows; clients that close at [DONE] (the openai SDK) close within it.
    done_gap_ms: float = 2.0

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model

    @property
    def label(self) -> str:
        return self.name or f"{self.gpu}-{self.precision}-{self.dialect}-{self.port}"

    @property
    def fixed_timing(self) -> bool:
        return self.fixed_ttft_ms is not None

    def resolve(self) -> Deployment:
        """Check every field and the GPU/model/precision/TP combination; raises SimConfigError."""
        if self.dialect not in DIALECTS:
            raise SimConfigError(f"dialect: {self.dialect!r} is not one of {', '.join(DIALECTS)}")
        if not 0 <= self.port <= 65535:
            raise SimConfigError(f"port: {self.port} is not in 0..65535")
        if not 0 < self.time_scale < math.inf:
            raise SimConfigError(f"time_scale: must be a finite number > 0, got {self.time_scale}")
        if self.max_batch < 1:
            raise SimConfigError(f"max_batch: must be >= 1, got {self.max_batch}")
        if self.tokens_per_event < 1:
            raise SimConfigError(f"tokens_per_event: must be >= 1, got {self.tokens_per_event}")
        if not 0.0 <= self.done_gap_ms <= 10_000.0:
            raise SimConfigError(f"done_gap_ms: must be in 0..10000, got {self.done_gap_ms}")
        for name in ("empty_text_share", "empty_text_share_non_ascii"):
            share = getattr(self, name)
            if not 0.0 <= share <= 1.0:
                raise SimConfigError(f"{name}: must be in 0..1, got {share}")
        if (self.fixed_ttft_ms is None) != (self.fixed_itl_ms is None):
            raise SimConfigError("fixed_ttft_ms and fixed_itl_ms must be given together")
        # NaN and infinity too: the engine's timers take neither (the first request failed)
        if self.fixed_ttft_ms is not None and not all(
                0 <= v < math.inf for v in (self.fixed_ttft_ms, self.fixed_itl_ms or 0.0)):
            raise SimConfigError("fixed_ttft_ms / fixed_itl_ms: must be finite numbers >= 0")
        try:
            return deployment(self.gpu, self.model, self.precision, self.tp)
        except ValueError as exc:
            raise SimConfigError(str(exc)) from None


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "port": (int,), "tp": (int,), "seed": (int,), "max_batch": (int,),
    "tokens_per_event": (int,), "time_scale": (int, float), "fixed_ttft_ms": (int, float),
    "fixed_itl_ms": (int, float), "empty_text_share": (int, float),
    "empty_text_share_non_ascii": (int, float), "done_gap_ms": (int, float),
}


def config_from_mapping(raw: Any, where: str) -> SimConfig:
    """A SimConfig from one YAML mapping; `where` prefixes error messages (e.g. engines[2])."""
    if not isinstance(raw, dict):
        raise SimConfigError(f"{where}: must be a mapping")
    known = {f.name for f in fields(SimConfig)}
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in known:
            raise SimConfigError(f"{where}.{key}: unknown field; known: {', '.join(sorted(known))}")
        types = _FIELD_TYPES.get(name, (str,))
        if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
            raise SimConfigError(f"{where}.{key}: expected {types[0].__name__}, got {value!r}")
        kwargs[name] = value
    for required in ("gpu", "model", "precision"):
        if required not in kwargs:
            raise SimConfigError(f"{where}.{required}: required")
    cfg = SimConfig(**kwargs)
    try:
        cfg.resolve()
    except SimConfigError as exc:
        raise SimConfigError(f"{where}: {exc}") from None
    return cfg
