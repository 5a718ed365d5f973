"""The default work coefficients follow the engine profiles the simulator models: a prompt
token, a decoded token and a one-token decode step cost, relative to each other, what the
simulator's power model says, for vLLM and for TensorRT-LLM."""

from __future__ import annotations

import pytest

from accounting.coefficients import default_for
from engines.sim.catalog import deployment
from engines.sim.perf import DECODE, PREFILL, SeqWork, kernel_profile, step_cost
from engines.sim.power import step_energy

ARMS = [(kind, prec) for kind in ("vllm", "trtllm") for prec in ("bf16", "fp8", "int8", "int4")]


def step_j(kind: str, prec: str, work: list[SeqWork]) -> float:
    d = deployment("h100", "llama-3.1-8b", prec, 1)
    prof = kernel_profile(kind, prec)
    return sum(step_energy(d, prof, step_cost(d, prof, work)).seq_dynamic_j)


@pytest.mark.parametrize(("kind", "prec"), ARMS)
def test_defaults_match_the_simulated_profile(kind: str, prec: str) -> None:
    c = default_for(prec, kind)
    alpha = (step_j(kind, prec, [SeqWork(4096, 0, PREFILL)])
             - step_j(kind, prec, [SeqWork(2048, 0, PREFILL)])) / 2048
    one = step_j(kind, prec, [SeqWork(1, 0, DECODE)])
    beta = (step_j(kind, prec, [SeqWork(1, 0, DECODE)] * 128)
            - step_j(kind, prec, [SeqWork(1, 0, DECODE)] * 64)) / 64
    delta_1 = one - beta
    assert c.alpha == pytest.approx(alpha, rel=0.25)
    assert c.beta == pytest.approx(beta, rel=0.25)
    assert (c.delta_1 if c.delta_1 is not None else c.delta) == pytest.approx(delta_1, rel=0.1)
