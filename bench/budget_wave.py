"""A joule budget against the adversarial wave (loadgen/truth/budget_wave.py): a neighbour's
96 cheap streams (50 prompt / 200 output tokens) over 45 s, then waves of 40 streams with
10k-16k-token prompts and max_tokens 1-30 from a tenant with a 5,000 J budget, a wave after
each other's bills are final, until a whole wave is refused. One simulated engine (vllm BF16,
H100) behind a real `wattgate serve` (accounting on, `sim` meters, SQLite ledger). Reports
what the tenant was billed against its budget (target: overshoot <= 5 %) and its bills
against the simulator's Shapley truth.

    python -m bench.budget_wave                 # ~2 min
    python -m bench.budget_wave --neighbour-s 15
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import uvloop

from bench.provenance import commit
from loadgen.truth import budget_wave, fleet, join

RESULTS = Path(__file__).resolve().parent / "results"
SPECS = (fleet.EngineSpec("vllm-bf16", "bf16", "vllm"),)
NEIGHBOUR, TENANT = "acme", "mallory"
OVERSHOOT_MAX = 0.05


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def measure(f: fleet.Fleet, plan: budget_wave.WavePlan, budget_j: float
                  ) -> dict[str, Any]:
    _, waves = await budget_wave.run(f.gateway_url, plan, say)
    st = await budget_wave.standing(f.gateway_url, TENANT)
    admitted = [s for w in waves for s in w if s.http_status == 200]
    rows = await join.join(f.gateway_url, f.engine_urls, admitted, 30.0, say)
    billed = sum(r.bill_j for r in rows)
    truth = sum(r.truth_j for r in rows)
    return {
        "budget_j": budget_j, "spent_j": st.spent_j, "held_j": st.held_j,
        "overshoot": st.spent_j / budget_j - 1.0, "overshoot_max": OVERSHOOT_MAX,
        "met": st.spent_j / budget_j - 1.0 <= OVERSHOOT_MAX,
        "waves": [{"sent": len(w), "admitted": sum(1 for s in w if s.http_status == 200),
                   "refused": sum(1 for s in w if s.http_status == 429),
                   "other": sorted({s.http_status for s in w} - {200, 429})} for w in waves],
        "admitted_billed_j": billed, "admitted_truth_j": truth,
        "largest_bill_j": max((r.bill_j for r in rows), default=0.0),
        "statuses": sorted({s.http_status for w in waves for s in w}),
        "learnt_rates": st.rates,
    }


def markdown(result: dict[str, Any]) -> list[str]:
    r = result["run"]
    p = result["plan"]
    lines = ["# A joule budget against the adversarial wave", "",
             f"`python -m bench.budget_wave` at commit {result['commit']}; seed {p['seed']}; one "
             "simulated engine, vllm BF16 on an H100 (Llama-3.1-8B), behind one `wattgate "
             "serve` with accounting on (`sim` meters, 1-s intervals, SQLite ledger). The "
             f"neighbour ({NEIGHBOUR}) sends {p['neighbour_streams']} streams of 50 prompt / "
             f"200 output tokens over {p['neighbour_s']:g} s; then {TENANT}, with a budget of "
             f"{r['budget_j']:g} J (a daily period, so that no run straddles a period's end; "
             "the period does not enter the estimate), sends waves of "
             f"{p['wave']} streams at once with {p['prompt_tokens'][0]:,}-"
             f"{p['prompt_tokens'][1]:,}-token prompts and max_tokens {p['max_tokens'][0]}-"
             f"{p['max_tokens'][1]}, {p['final_wait_s']:g} s after each wave, until a whole "
             "wave is refused.", "",
             "| measure | value |", "| --- | ---: |",
             f"| budget | {r['budget_j']:,.0f} J |",
             f"| billed (ledger, `/v1/usage` spent) | {r['spent_j']:,.1f} J |",
             f"| overshoot (target <= {r['overshoot_max']:.0%}) | {r['overshoot']:+.1%} "
             f"({'met' if r['met'] else 'NOT MET'}) |",
             f"| still reserved at the end | {r['held_j']:.1f} J |",
             f"| admitted requests' bills / Shapley truth | {r['admitted_billed_j']:,.1f} J / "
             f"{r['admitted_truth_j']:,.1f} J |",
             f"| largest single bill | {r['largest_bill_j']:.1f} J |", "",
             "| wave | sent | admitted | refused (429) | other statuses |",
             "| ---: | ---: | ---: | ---: | --- |"]
    lines += [f"| {i + 1} | {w['sent']} | {w['admitted']} | {w['refused']} | "
              f"{', '.join(map(str, w['other'])) or '-'} |" for i, w in enumerate(r["waves"])]
    lines += ["", "Rates its reservations learnt from its own bills (J per token):", "",
              "| precision | prompt band | J per prompt token | J per output token |",
              "| --- | --- | ---: | ---: |"]
    lines += [f"| {x['precision']} | {x['prompt_tokens']} | {x['j_per_prompt_token']:.4f} | "
              f"{x['j_per_output_token']:.3f} |" for x in r["learnt_rates"]]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget-j", type=float, default=5000.0)
    p.add_argument("--neighbour-s", type=float, default=45.0)
    p.add_argument("--waves", type=int, default=6)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    plan = budget_wave.WavePlan(NEIGHBOUR, TENANT, neighbour_s=args.neighbour_s,
                                waves=args.waves, seed=args.seed)
    extra = {TENANT: {"budgets": [{"period": "day", "j": args.budget_j}]}}
    with tempfile.TemporaryDirectory(prefix="wattgate-budget-wave-") as tmp, \
            fleet.running_fleet(Path(tmp), (NEIGHBOUR, TENANT), SPECS, tenant_extra=extra) as f:
        time.sleep(1.5)  # the meters' first readings open the interval grid
        run = uvloop.run(measure(f, plan, args.budget_j))
    result = {"commit": commit(), "plan": {
        "neighbour_streams": plan.neighbour_streams, "neighbour_s": plan.neighbour_s,
        "waves": plan.waves, "wave": plan.wave, "prompt_tokens": list(plan.prompt_tokens),
        "max_tokens": list(plan.max_tokens), "final_wait_s": plan.final_wait_s,
        "seed": plan.seed}, "run": run}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "budget_wave.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    (args.out / "budget_wave.md").write_text("\n".join(markdown(result)) + "\n")
    say(f"billed {run['spent_j']:.1f} J against {args.budget_j:g} J ({run['overshoot']:+.1%}); "
        f"wrote {args.out}/budget_wave.{{json,md}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
