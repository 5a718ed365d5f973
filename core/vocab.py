"""The gateway's fixed vocabularies, each written once as a `Literal`, and the SLO class.

The config parser takes each field's allowed values from these (`typing.get_args`), so a new
precision or policy is added here and its spelling is checked by mypy wherever it is used.
This module imports nothing of ours: loadgen and the pure modules (timing) may use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeVar, dataclass_transform, get_args

Precision = Literal["bf16", "fp16", "fp8", "int8", "int4"]
EngineKind = Literal["vllm", "trtllm", "openai"]  # an engine server's dialect (adapters)
PolicyName = Literal["round_robin", "least_load", "prefix_affinity", "slo_energy"]
# engines/meters/registry.py builds meters from its own name table (engines import nothing of
# ours); tests/unit/test_vocab.py holds the two spellings equal
MeterKind = Literal["nvml", "dcgm", "sim", "agent", "model"]
LedgerKind = Literal["sqlite", "postgres"]
# where apportioning runs: a child of `wattgate serve`, the gateway's own event loop, or
# elsewhere (`wattgate apportioner`, e.g. its own Deployment)
ApportionerMode = Literal["process", "inline", "external"]
LogFormat = Literal["text", "json"]  # json: one JSON object per line
LogLevel = Literal["debug", "info", "warning", "error"]
# How a request ended, where the ending is fixed; core/outcomes.py holds each one's record
# status and HTTP status (an error's ending is its own code, not one of these)
Outcome = Literal["ok", "client_disconnected", "internal_error", "upstream_error_event"]
# The four kinds of ending every reader counts by (core/outcomes.py `outcome_class`):
# served (the engine answered), refused (the gateway, or the engine about the request itself,
# said no: 4xx), failed (an engine or the gateway broke: 5xx, an engine's 429, timeouts,
# protocol errors), cancelled (the client left first)
OutcomeClass = Literal["served", "refused", "failed", "cancelled"]
# How a record's prompt_tokens was counted (core/tokenizer.py): the engine's usage, its
# /tokenize, the gateway's tokenizer for the model, or an estimate from the prompt's bytes
PromptSource = Literal["engine", "engine_tokenize", "gateway", "estimate"]
# Who pays for the energy of a failed request (accounting/failed.py): the engine's
# `failed` account, beside its idle account, or the tenant as for any other request
FailedEnergy = Literal["failed_account", "tenant"]

_T = TypeVar("_T")


@dataclass_transform(frozen_default=True)
def value_type(cls: type[_T]) -> type[_T]:
    """A frozen dataclass to the type checker, a plain slotted dataclass at run time, for the
    values the request path builds on every request (its record, latencies, routing
    candidates). A frozen dataclass's `__init__` sets each field through `object.__setattr__`:
    3-4x slower (a RequestRecord took 4.6 µs to build, 1.2 µs now). mypy still refuses any
    assignment to a field; instances are not hashable."""
    return dataclass(slots=True)(cls)


PRECISIONS: tuple[Precision, ...] = get_args(Precision)
ENGINE_KINDS: tuple[EngineKind, ...] = get_args(EngineKind)
ROUTING_POLICIES: tuple[PolicyName, ...] = get_args(PolicyName)
METER_KIND_NAMES: tuple[MeterKind, ...] = get_args(MeterKind)
LEDGER_KINDS: tuple[LedgerKind, ...] = get_args(LedgerKind)
APPORTIONER_MODES: tuple[ApportionerMode, ...] = get_args(ApportionerMode)
OUTCOME_CLASSES: tuple[OutcomeClass, ...] = get_args(OutcomeClass)
FAILED_ENERGY: tuple[FailedEnergy, ...] = get_args(FailedEnergy)


@dataclass(frozen=True, slots=True)
class SloClass:
    """A named latency objective; a limit left None is not checked. Seconds.

    Class names are the config's own (`slo_classes:`), so they have no Literal.
    """

    name: str
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
