"""A tenant who plans cannot overspend its joule budget: reservations follow its own shape.

Through a real `wattgate serve` (accounting on, `sim` meters) in front of one simulated
engine: a neighbour's cheap traffic first (short prompts, long outputs: cheap per token),
then the attacker's waves of long-prompt, few-token requests sent all at once, again and
again after each 429, against a joule budget. Reservations learnt from every tenant's bills
took the neighbour's cheap rate and let a whole wave in, so the attacker was billed far past
its budget; reservations learnt from the attacker's own bills (the prior until it has some)
hold the bill within 5 % of the budget.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import uvloop

from loadgen.truth.budget_wave import WavePlan, run, standing
from loadgen.truth.fleet import EngineSpec, running_fleet

pytestmark = pytest.mark.timeout(420)
BUDGET_J = 1200.0
# One 9k-12k-token request of the attacker's costs 150-300 J; a reservation learnt from its
# own bills of that shape errs by a few percent of that (the same shape on a busier or idler
# engine), so the bound is a fraction of one request: 5 % of the budget, 60 J.
OVERSHOOT = 0.05
WAVES = 7
WAVE = 10  # requests sent at once


PLAN = WavePlan("neighbour", "attacker", neighbour_streams=20, neighbour_s=2.0, waves=WAVES,
                wave=WAVE, prompt_tokens=(9000, 12000))


def test_neighbour_then_long_prompts_stays_within_the_budget(tmp_path: Path) -> None:
    extra = {"attacker": {"budgets": [{"period": "month", "j": BUDGET_J}]}}
    with running_fleet(tmp_path, ("neighbour", "attacker"),
                       (EngineSpec("vllm-bf16", "bf16", "vllm"),), tenant_extra=extra) as f:
        neighbour, waves = uvloop.run(run(f.gateway_url, PLAN, print))
        st = uvloop.run(standing(f.gateway_url, "attacker"))
    assert all(s.http_status == 200 for s in neighbour), [s.http_status for s in neighbour]
    statuses = [s.http_status for w in waves for s in w]
    spent, held, rates = st.spent_j, st.held_j, st.rates
    admitted = statuses.count(200)
    overshoot = spent / BUDGET_J - 1.0
    print(f"attacker: {admitted} of {len(statuses)} admitted, billed {spent:.1f} J against "
          f"{BUDGET_J:g} J ({overshoot:+.1%}), {held:.1f} J still reserved; learnt {rates}")
    assert set(statuses) <= {200, 429}
    assert admitted >= 3, "the budget let some of the attack in"
    assert held == 0
    assert overshoot <= OVERSHOOT
    # learnt from its own long-prompt bills only: nothing of the neighbour's short prompts
    assert rates and all(r["prompt_tokens"] == [8192, None] for r in rates), rates
