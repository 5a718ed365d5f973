"""A long prompt's bill, with the simulator's exact steps as the gateway's timing, is its
Shapley share within a few percent on every engine kind and precision: the coefficients
(alpha, the prefill attention weight) price a prompt as the simulator's cost model does.

24 decoders (200 prompt, 300 output tokens) run; a prompt of 4,000 to 24,000 tokens with
max_tokens 1 arrives at 2 s, and 8 more decoders after it. With trtllm alphas that also held
a 2k-4k-token prompt's attention, the 4,000-token prompt was billed +10 % (BF16) to +26 %
(FP8) over its share.
"""

from __future__ import annotations

import pytest

from accounting.coefficients import default_for
from tests.accounting.sim_steps import bills, run_core

ARMS = [(kind, prec) for kind in ("vllm", "trtllm") for prec in ("bf16", "fp8", "int8", "int4")]
LONG_MAX = 0.08  # the long prompt's |bill - truth| / truth


def workload(prompt_tokens: int) -> list[tuple[str, int, int, float]]:
    out = [(f"bg{i}", 200, 300, 0.05 * i) for i in range(24)]
    out.append(("long", prompt_tokens, 1, 2.0))
    out += [(f"bg{24 + i}", 200, 300, 2.5 + 0.1 * i) for i in range(8)]
    return out


@pytest.mark.parametrize(("kind", "prec"), ARMS)
@pytest.mark.parametrize("prompt_tokens", [4000, 12000, 24000])
def test_long_prompt_is_billed_its_shapley_share(kind: str, prec: str,
                                                 prompt_tokens: int) -> None:
    run = run_core(kind, prec, workload(prompt_tokens), until_s=60.0)
    billed, truth, residual = bills(run, default_for(prec, kind))
    assert abs(residual) < 1e-9  # shares + idle == metered, every interval
    assert set(billed) == set(truth)
    err = billed["long"] / truth["long"] - 1.0
    assert abs(err) <= LONG_MAX, f"{kind} {prec} {prompt_tokens}: {err:+.1%}"
    decoders = [k for k in truth if k != "long"]
    total = sum(billed[k] for k in decoders) / sum(truth[k] for k in decoders) - 1.0
    assert abs(total) <= 0.05, f"the decoders together {total:+.1%}"
