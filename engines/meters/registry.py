"""Meter kinds by name, built from a plain spec (engines never see gateway configuration)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from engines.meters.base import Meter
from engines.meters.dcgm import DcgmMeter
from engines.meters.httpjson import HttpJsonMeter
from engines.meters.model import ModelMeter, PowerModel
from engines.meters.nvml import NvmlMeter


@dataclass(frozen=True, slots=True)
class MeterSpec:
    kind: str  # one of METER_KINDS
    url: str = ""
    gpus: tuple[int, ...] = ()  # empty: every GPU the source reports (sim, agent)
    power_model: PowerModel = field(default_factory=PowerModel)  # kind "model" only
    api_key: str = field(default="", repr=False)  # kind "agent": its `--api-key`, "" none


def _nvml(s: MeterSpec) -> Meter:
    return NvmlMeter(s.gpus or (0,))


def _dcgm(s: MeterSpec) -> Meter:
    return DcgmMeter(s.url, s.gpus or (0,))


def _sim(s: MeterSpec) -> Meter:
    return HttpJsonMeter("sim", s.url, "/sim/energy", s.gpus or None)


def _agent(s: MeterSpec) -> Meter:
    headers = {"Authorization": f"Bearer {s.api_key}"} if s.api_key else None
    return HttpJsonMeter("agent", s.url, "/v1/energy", s.gpus or None, headers=headers)


def _model(s: MeterSpec) -> Meter:
    return ModelMeter(s.power_model)


METER_KINDS: dict[str, Callable[[MeterSpec], Meter]] = {
    "nvml": _nvml, "dcgm": _dcgm, "sim": _sim, "agent": _agent, "model": _model,
}
URL_KINDS = frozenset({"dcgm", "sim", "agent"})


def make_meter(spec: MeterSpec) -> Meter:
    """Build the meter for a spec; raises KeyError for an unknown kind, MeterError at start."""
    return METER_KINDS[spec.kind](spec)
