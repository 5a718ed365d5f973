"""Cold-start curves per engine kind and precision: what an endpoint's model predicts before
its own samples are in (and keeps as the shape of load bins it has not seen yet).

The values are the simulator's calibration for Llama-3.1-8B on an H100 (docs/simulator.md,
"Calibration"; itself fitted to ML.ENERGY v3 and vendor figures in REFERENCE.md): TPOT and
J per output token at batch 1 and batch 64. They are only a prior: every endpoint replaces
them with its own measurements as records and apportioned intervals come in, and the prior's
level is rescaled by what was measured (a bigger model or another GPU keeps the shape).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Prior:
    tpot_b1_s: float  # TPOT at batch 1
    tpot_b64_s: float  # TPOT at batch 64
    j_out_b1: float  # J per output token at batch 1 (idle share included)
    j_out_b64: float  # J per output token at batch 64
    idle_w: float = 75.0  # H100 idle with a CUDA context (REFERENCE.md: 60-120 W)
    ttft_base_s: float = 0.03  # a short prompt on an idle engine
    prefill_s_per_token: float = 2e-5  # ~50k prompt tokens/s on an H100 (compute-bound)
    # A prompt token costs a small share of an output token's energy: prefill runs many tokens
    # per weight read (compute-bound, near TDP but for a short time).
    j_prompt_per_j_out_b64: float = 0.15

    def tpot_s(self, load: float) -> float:
        return _log_interp(load, self.tpot_b1_s, self.tpot_b64_s)

    def j_out(self, load: float) -> float:
        return _log_interp(load, self.j_out_b1, self.j_out_b64)

    def j_prompt(self, load: float) -> float:
        ratio = self.j_out(load) / self.j_out_b64
        return float(self.j_out_b64 * self.j_prompt_per_j_out_b64 * math.sqrt(ratio))

    def ttft_s(self, load: float, prompt_tokens: float) -> float:
        # Chunked prefill shares steps with the running decodes: each running request adds
        # about one decode step's time to the wait.
        return self.ttft_base_s + self.prefill_s_per_token * prompt_tokens + load * self.tpot_s(
            load) * 0.5

    def power_w(self, load: float) -> float:
        if load <= 0.0:
            return self.idle_w
        return self.j_out(load) * load / self.tpot_s(load)


def _log_interp(load: float, at1: float, at64: float) -> float:
    """Log-log interpolation between batch 1 and 64 (J/token and TPOT are near power laws in
    batch over that range), flat below 1, extrapolated above 64."""
    x = math.log(max(load, 1.0)) / math.log(64.0)
    return float(at1 * (at64 / at1) ** x)


# (engine kind, precision) -> prior. docs/simulator.md calibration table, batch 1 and 64.
_PRIORS: dict[tuple[str, str], Prior] = {
    ("vllm", "bf16"): Prior(0.0070, 0.0133, 2.041, 0.115),
    ("vllm", "fp16"): Prior(0.0070, 0.0133, 2.041, 0.115),
    ("vllm", "fp8"): Prior(0.0085, 0.0120, 3.262, 0.103),
    ("vllm", "int8"): Prior(0.0062, 0.0109, 1.883, 0.090),
    ("vllm", "int4"): Prior(0.0038, 0.0126, 1.062, 0.156),
    ("trtllm", "bf16"): Prior(0.0061, 0.0102, 1.897, 0.096),
    ("trtllm", "fp16"): Prior(0.0061, 0.0102, 1.897, 0.096),
    ("trtllm", "fp8"): Prior(0.0038, 0.0072, 1.133, 0.063),
}
_FALLBACK = _PRIORS[("vllm", "bf16")]


def prior_for(kind: str, precision: str) -> Prior:
    """The cold-start prior of an engine kind at a precision (vLLM BF16's for unknown ones,
    e.g. an `openai` endpoint)."""
    return _PRIORS.get((kind, precision), _PRIORS.get(("vllm", precision), _FALLBACK))
