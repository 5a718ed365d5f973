"""Accounting against the simulator's truth: does every request's bill hold?

A simulated fleet (4 engines: BF16 and FP8 on the vllm and trtllm dialects) behind a real
`wattgate serve` with accounting on (`sim` meters, SQLite ledger) serves a mixed workload of
four tenants (loadgen/truth/workload.py): short chat at ~10 req/s, 3,000-token documents with
800-token answers (5 % dropped by the client, half just before the end), on/off bursts of
medium requests, prompts of 8k-30k tokens with max_tokens 1, non-streamed requests, and an
adversarial tenant using every strategy that could move its energy onto others. Every
request is joined to its bill (GET /admin/v1/requests/{id}, once final) and to the energy
the simulated engine says it caused (GET /sim/requests/{id}). A second run repeats the same
seeded plan with a busy-loop process on the gateway's CPUs.

    python -m bench.accounting_truth            # ~5 min: both runs, writes bench/results
    python -m bench.accounting_truth --quick    # ~40 s smoke: one short run, short outputs
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import uvloop

from bench.provenance import commit
from loadgen.truth import fleet, join, summary, workload

RESULTS = Path(__file__).resolve().parent / "results"


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)




async def measure(f: fleet.Fleet, plan: list[workload.Planned], label: str,
                  deadline_s: float, final_wait_s: float) -> dict[str, Any]:
    say(f"{label}: {len(plan)} requests over {max(p.at_s for p in plan):.0f} s")
    sent = await workload.drive(f.gateway_url, plan, say, deadline_s)
    say(f"{label}: {len(sent)} requests answered; joining bills and the simulator's truth")
    rows = await join.join(f.gateway_url, f.engine_urls, sent, final_wait_s, say)
    balances = join.balances(f.ledger_path)
    s = summary.run_summary(label, len(plan), rows, balances)
    o = s["overall"]
    say(f"{label}: median |error| {o['median_abs']:.2%}, p95 {o['p95_abs']:.2%}; tenants "
        + ", ".join(f"{t['name']} {t['total_error']:+.2%}" for t in s["tenants"]))
    return s


def one_run(work: Path, plan: list[workload.Planned], label: str, hog: bool,
            deadline_s: float, final_wait_s: float) -> dict[str, Any]:
    with fleet.running_fleet(work, workload.TENANTS) as f, contextlib.ExitStack() as stack:
        if hog:
            log = stack.enter_context(open(work / "hog.log", "wb"))
            stack.enter_context(fleet.cpu_hog(f.gateway_pid, log))
        time.sleep(1.5)  # the meters' first readings open the interval grid
        return uvloop.run(measure(f, plan, label, deadline_s, final_wait_s))


def write(out: Path, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "accounting_truth.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2
                                                             | orjson.OPT_SERIALIZE_NUMPY))
    lines = ["# Accounting against the simulator's truth", "",
             f"`python -m bench.accounting_truth{' --quick' if result['quick'] else ''}` at "
             f"commit {result['commit']}; {result['duration_s']:.0f} s of traffic per run, "
             f"seed {result['seed']}; fleet {', '.join(result['fleet'])} (simulated H100, "
             "Llama-3.1-8B); one `wattgate serve` with accounting on (`sim` meters, 1-s "
             "intervals, SQLite ledger). Error = (bill - truth) / truth per request; "
             "the truth is GET /sim/requests/{id}.", ""]
    for s in result["runs"]:
        lines += summary.markdown_run(s)
    lines.append("Plot: `accounting_truth.png` (signed error by class per run).")
    (out / "accounting_truth.md").write_text("\n".join(lines) + "\n")
    summary.plot(result["runs"], out / "accounting_truth.png")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", "--dry-run", action="store_true",
                   help="one short run, outputs cut to a quarter, no CPU-loaded run")
    p.add_argument("--duration-s", type=float, default=None,
                   help="seconds of traffic per run (default 90; 8 with --quick)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--no-loaded", action="store_true", help="skip the CPU-loaded run")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    duration = args.duration_s or (8.0 if args.quick else 90.0)
    plan = workload.mixed_plan(duration, args.seed)
    if args.quick:
        plan = workload.scaled(plan, 0.25)
    labels = [("baseline", False)]
    if not (args.quick or args.no_loaded):
        labels.append(("cpu-loaded (busy loop on the gateway's CPUs)", True))
    runs = []
    with tempfile.TemporaryDirectory(prefix="wattgate-truth-") as tmp:
        for i, (label, hog) in enumerate(labels):
            runs.append(one_run(Path(tmp) / f"run{i}", plan, label, hog,
                                deadline_s=duration + 60.0, final_wait_s=30.0))
    result = {"commit": commit(), "quick": args.quick, "duration_s": duration,
              "seed": args.seed, "fleet": [f"{s.name} ({s.dialect} {s.precision})"
                                          for s in fleet.FLEET],
              "targets": {"median_abs": summary.MEDIAN_MAX, "p95_abs": summary.P95_MAX,
                          "tenant": summary.TENANT_MAX},
              "runs": runs,
              "all_met": all(t["met"] for s in runs for t in s["targets"])}
    write(args.out, result)
    say(f"wrote {args.out}/accounting_truth.{{json,md,png}}; all targets met: {result['all_met']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
