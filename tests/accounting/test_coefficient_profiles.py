"""The default work coefficients follow the engine profiles the simulator models: a prompt
token, a decoded token and a one-token decode step cost, relative to each other, what the
simulator's power model says, for vLLM and for TensorRT-LLM. A prompt token's alpha is its
GEMMs alone: the attention of a prompt over its own context is the separate, quadratic
`PREFILL_ATTENTION_PER_KV` work, so it is taken out of the simulator's difference."""

from __future__ import annotations

import pytest

from accounting.coefficients import default_for
from accounting.work import PREFILL_ATTENTION_PER_KV
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
    pair_j = c.gamma * PREFILL_ATTENTION_PER_KV  # one prompt token over one context token
    attention_j = pair_j * (4096 * 4097 - 2048 * 2049) / 2.0
    alpha = (step_j(kind, prec, [SeqWork(4096, 0, PREFILL)])
             - step_j(kind, prec, [SeqWork(2048, 0, PREFILL)]) - attention_j) / 2048
    one = step_j(kind, prec, [SeqWork(1, 0, DECODE)])
    beta = (step_j(kind, prec, [SeqWork(1, 0, DECODE)] * 128)
            - step_j(kind, prec, [SeqWork(1, 0, DECODE)] * 64)) / 64
    delta_1 = one - beta
    assert c.alpha == pytest.approx(alpha, rel=0.05)
    assert c.beta == pytest.approx(beta, rel=0.25)
    assert (c.delta_1 if c.delta_1 is not None else c.delta) == pytest.approx(delta_1, rel=0.1)


@pytest.mark.parametrize(("kind", "prec"), ARMS)
def test_prefill_attention_matches_the_simulated_profile(kind: str, prec: str) -> None:
    """A 2,048-token chunk over 8,192 tokens of context costs what the same chunk with none
    does plus its attention over them: 2,048 x 8,192 pairs at gamma x PREFILL_ATTENTION_PER_KV
    vLLM's FP8 prefill runs at the board's power cap, where a pair costs all of (TDP - idle)
    over its time rather than 0.88 of it: 14 % more, which one weight for every profile (the
    work rows carry the prefill's attention before an engine's coefficients apply) leaves."""
    c = default_for(prec, kind)
    pair_j = (step_j(kind, prec, [SeqWork(2048, 8192, PREFILL)])
              - step_j(kind, prec, [SeqWork(2048, 0, PREFILL)])) / (2048 * 8192)
    capped = (kind, prec) == ("vllm", "fp8")
    assert c.gamma * PREFILL_ATTENTION_PER_KV == pytest.approx(pair_j, rel=0.15 if capped
                                                               else 0.05)
