"""Bills against the simulator's truth under a tenant who plans (loadgen/truth/strategies.py):
cheap neighbour then long prompts, riders after a long prompt (streamed and not), bursts of
30, three non-streamed requests in one interval, cut-off streams. One simulated engine (vllm
BF16, H100) behind a real `wattgate serve` (accounting on, `sim` meters, SQLite ledger).
Targets are against the Shapley truth; the residency view is reported beside.

    python -m bench.accounting_strategies             # 2 rounds of 24 s, ~2 min
    python -m bench.accounting_strategies --rounds 1  # ~1.5 min
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
from loadgen.truth import fleet, join, strategies, summary, workload

RESULTS = Path(__file__).resolve().parent / "results"
SPECS = (fleet.EngineSpec("vllm-bf16", "bf16", "vllm"),)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def measure(f: fleet.Fleet, plan: list[workload.Planned], deadline_s: float
                  ) -> dict[str, Any]:
    say(f"{len(plan)} requests over {max(p.at_s for p in plan):.0f} s")
    sent = await workload.drive(f.gateway_url, plan, say, deadline_s)
    rows = await join.join(f.gateway_url, f.engine_urls, sent, 30.0, say)
    s = summary.run_summary("strategies", len(plan), rows, join.balances(f.ledger_path),
                            strategies.targets)
    for t in s["targets"]:
        say(f"  {t['name']}: {t['value']:.3g} (limit {t['limit']:.3g}) "
            f"{'met' if t['met'] else 'NOT MET'}")
    return s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="rounds of the strategies, 24 s each")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    plan = strategies.plan(args.rounds, seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="wattgate-strategies-") as tmp, \
            fleet.running_fleet(Path(tmp), workload.TENANTS, SPECS) as f:
        time.sleep(1.5)  # the meters' first readings open the interval grid
        run = uvloop.run(measure(f, plan, deadline_s=plan[-1].at_s + 60.0))
    result = {"commit": commit(), "rounds": args.rounds, "seed": args.seed,
              "fleet": [f"{s.name} ({s.dialect} {s.precision})" for s in SPECS],
              "runs": [run], "all_met": all(t["met"] for t in run["targets"])}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "accounting_strategies.json").write_bytes(
        orjson.dumps(result, option=orjson.OPT_INDENT_2))
    lines = ["# Bills under a tenant who plans, against the simulator's Shapley truth", "",
             f"`python -m bench.accounting_strategies --rounds {args.rounds}` at commit "
             f"{result['commit']}; seed {args.seed}; one simulated engine, vllm BF16 on an "
             "H100 (Llama-3.1-8B); one `wattgate serve` with accounting on (`sim` meters, 1-s "
             "intervals, SQLite ledger). Error = (bill - truth) / truth per request; the truth "
             "is GET /sim/requests/{id}: `truth_shapley_j` (targets), `truth_residency_j` "
             "(beside).", ""]
    lines += summary.markdown_run(run)
    (args.out / "accounting_strategies.md").write_text("\n".join(lines) + "\n")
    say(f"wrote {args.out}/accounting_strategies.{{json,md}}; all targets met: {result['all_met']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
