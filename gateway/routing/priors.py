"""Cold-start curves per engine kind and precision: what an endpoint's model predicts before
its own samples are in (and keeps as the shape of load bins it has not seen yet).

The values are the simulator's calibration for Llama-3.1-8B on an H100 (docs/simulator.md,
"Calibration"; itself fitted to ML.ENERGY v3 and vendor figures, docs/architecture.md,
"Sources of the constants"): TPOT and J per output token at batch 1, 8, 16, 64, 128 and
256, interpolated log-log between them.
All six points matter: TPOT is nearly flat to batch 16 and nearly linear past 64 (attention
reads grow with the batch), so a power law through batch 1 and 64 alone predicted a
TensorRT-LLM FP8 engine 8.5 ms at batch 192 where it takes ~15 ms, and packing overshot the
SLO. They are only a prior: every endpoint replaces
them with its own measurements as records and apportioned intervals come in, and the prior's
level is rescaled by what was measured (a bigger model or another GPU keeps the shape).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

BATCHES: tuple[float, ...] = (1.0, 8.0, 16.0, 64.0, 128.0, 256.0)


@dataclass(frozen=True, slots=True)
class Prior:
    tpot_ms: tuple[float, ...]  # TPOT at each of BATCHES
    j_out_at: tuple[float, ...]  # J per output token at each of BATCHES (idle share included)
    idle_w: float = 75.0  # H100 idle with a CUDA context (docs/architecture.md, "Sources": 60-120 W)
    ttft_base_s: float = 0.03  # a short prompt on an idle engine
    prefill_s_per_token: float = 2e-5  # ~50k prompt tokens/s on an H100 (compute-bound)
    # A prompt token costs a small share of an output token's energy: prefill runs many tokens
    # per weight read (compute-bound, near TDP but for a short time).
    j_prompt_per_j_out_b64: float = 0.15

    def tpot_s(self, load: float) -> float:
        return _log_interp(load, self.tpot_ms) / 1000.0

    def j_out(self, load: float) -> float:
        return _log_interp(load, self.j_out_at)

    def j_prompt(self, load: float) -> float:
        b64 = self.j_out_at[3]
        ratio = self.j_out(load) / b64
        return float(b64 * self.j_prompt_per_j_out_b64 * math.sqrt(ratio))

    def ttft_s(self, load: float, prompt_tokens: float) -> float:
        # Chunked prefill shares steps with the running decodes: each running request adds
        # about one decode step's time to the wait.
        return self.ttft_base_s + self.prefill_s_per_token * prompt_tokens + load * self.tpot_s(
            load) * 0.5

    def power_w(self, load: float) -> float:
        if load <= 0.0:
            return self.idle_w
        return self.j_out(load) * load / self.tpot_s(load)


def _log_interp(load: float, at: tuple[float, ...]) -> float:
    """Piecewise log-log interpolation through (BATCHES, at): J/token and TPOT are near power
    laws in batch between neighbouring points; flat below batch 1, the last segment's slope
    past the last point."""
    x = math.log(max(load, 1.0))
    i = min(max(bisect_right(BATCHES, max(load, 1.0)), 1), len(BATCHES) - 1)
    x0, x1 = math.log(BATCHES[i - 1]), math.log(BATCHES[i])
    y0, y1 = math.log(at[i - 1]), math.log(at[i])
    return float(math.exp(y0 + (y1 - y0) * (x - x0) / (x1 - x0)))


def _p(tpot_ms: tuple[float, ...], j_out: tuple[float, ...]) -> Prior:
    return Prior(tpot_ms, j_out)


# (engine kind, precision) -> prior. docs/simulator.md calibration table: TPOT (ms) and
# J per output token at batch 1, 8, 16, 64, 128, 256.
_VLLM_BF16 = _p((7.0, 7.5, 8.2, 13.3, 20.2, 34.7), (2.041, 0.329, 0.207, 0.115, 0.100, 0.092))
_TRT_FP16 = _p((6.1, 6.5, 6.9, 10.2, 14.7, 24.2), (1.897, 0.297, 0.182, 0.096, 0.082, 0.075))
_PRIORS: dict[tuple[str, str], Prior] = {
    ("vllm", "bf16"): _VLLM_BF16,
    ("vllm", "fp16"): _VLLM_BF16,
    ("vllm", "fp8"): _p((8.5, 8.5, 8.7, 12.0, 17.5, 29.8), (3.262, 0.435, 0.239, 0.103, 0.085, 0.077)),
    ("vllm", "int8"): _p((6.2, 6.4, 6.8, 10.9, 16.9, 29.7), (1.883, 0.279, 0.168, 0.090, 0.079, 0.074)),
    ("vllm", "int4"): _p((3.8, 4.5, 5.2, 12.6, 24.3, 47.7), (1.062, 0.259, 0.200, 0.156, 0.150, 0.146)),
    ("trtllm", "bf16"): _TRT_FP16,
    ("trtllm", "fp16"): _TRT_FP16,
    ("trtllm", "fp8"): _p((3.8, 4.1, 4.5, 7.2, 10.9, 18.3), (1.133, 0.181, 0.113, 0.063, 0.055, 0.051)),
}
_FALLBACK = _PRIORS[("vllm", "bf16")]


def prior_for(kind: str, precision: str) -> Prior:
    """The cold-start prior of an engine kind at a precision (vLLM BF16's for unknown ones,
    e.g. an `openai` endpoint)."""
    return _PRIORS.get((kind, precision), _PRIORS.get(("vllm", precision), _FALLBACK))
