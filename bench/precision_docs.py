"""Is the documented `loadgen compare --search` example stable from run to run?

Runs the example of docs/loadgen.md as a user would, once per seed, each on a fresh
`wattgate demo --serve` stack (the quick-start fleet, real time: four vLLM-dialect H100
engines and one TensorRT-LLM FP8 engine behind a least_load gateway). The command is read
from the docs (the `loadgen compare ... --search` example), its target and --out replaced,
`--seed S` added.

and checks the runs against each other as bench/precision_search.py does: the same
recommendation (or "no significant difference"), each arm's capacity inside the other runs'
intervals and repeat ranges.

    .venv/bin/python -m bench.precision_docs [--seeds 0,1000,2000] [--name precision_docs]
    .venv/bin/python -m bench.precision_docs --rerun 0 --why "..."   # one run again

A run takes about half an hour. The arms' capacities are what two cores can carry at real
time, so other load on the machine lowers them (the client falls behind its schedule):
`--rerun` runs the seeds named again and keeps the others from the results file.

Writes bench/results/N.json and .md (N: precision_docs).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.precision_search import OUT, run_rows, write  # noqa: E402
from bench.provenance import commit  # noqa: E402
from loadgen.search_repeat import checks  # noqa: E402

WATTGATE = [sys.executable, "-m", "wattgate_cli"]
DOC = REPO / "docs" / "loadgen.md"


def documented_example(doc: Path = DOC) -> list[str]:
    """The options of the docs' `wattgate loadgen compare ... --search` example, without
    its --target and --out."""
    text = doc.read_text().replace("\\\n", " ")
    found = [ln for ln in text.splitlines()
             if ln.startswith("wattgate loadgen compare --target http") and " --search " in ln]
    if len(found) != 1:
        raise SystemExit(f"{doc}: {len(found)} 'loadgen compare ... --search' examples, not 1")
    words = shlex.split(found[0])[3:]
    for opt in ("--target", "--out"):
        if opt in words:
            i = words.index(opt)
            del words[i:i + 2]
    return words


def _wait_url(url_file: Path, proc: subprocess.Popen[bytes], limit_s: float) -> str:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if url_file.exists():
            return url_file.read_text().strip()
        if proc.poll() is not None:
            raise RuntimeError(f"wattgate demo --serve exited {proc.returncode}")
        time.sleep(0.5)
    raise TimeoutError("the demo stack was not ready in time")


def one_run(seed: int, example: list[str]) -> tuple[dict[str, Any], float]:
    """One run of the example on a fresh stack: its search report and wall seconds."""
    with tempfile.TemporaryDirectory(prefix="wattgate-bench-") as tmp_name:
        tmp = Path(tmp_name)
        with open(tmp / "stack.log", "wb") as log:
            stack = subprocess.Popen([*WATTGATE, "demo", "--serve", "--out", str(tmp / "stack")],
                                     cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
            try:
                url = _wait_url(tmp / "stack" / "gateway.url", stack, 120)
                t0 = time.monotonic()
                with subprocess.Popen([*WATTGATE, "loadgen", "compare", "--target", url,
                                       *example, "--seed", str(seed), "--out",
                                       str(tmp / "out")], cwd=REPO) as compare:
                    try:
                        if compare.wait() != 0:
                            raise RuntimeError(f"loadgen compare exited {compare.returncode}")
                    finally:
                        if compare.poll() is None:
                            compare.terminate()
                took_s = time.monotonic() - t0
            finally:
                os.killpg(stack.pid, signal.SIGTERM)
                stack.wait(60)
        doc = orjson.loads((tmp / "out" / "compare.json").read_bytes())
    return doc["search"], took_s


def markdown(doc: dict[str, Any]) -> str:
    s = doc["settings"]
    r0 = doc["runs"][0]
    per_run = ", ".join(f"seed {seed}: {x / 60:.0f} min at {c}"
                        for seed, x, c in zip(s["seeds"], s["wall_s"], s["run_commits"],
                                              strict=True))
    lines = ["# Precision search: three runs of the documented `loadgen compare --search` "
             "example", "",
             f"`python -m bench.precision_docs --seeds {','.join(map(str, s['seeds']))}` on a "
             "shared 2-core machine: each seed on a fresh `wattgate demo --serve` stack (four "
             "simulated vLLM-dialect H100 engines and one TensorRT-LLM FP8 engine, "
             "llama-3.1-8b, real time, least_load gateway), then "
             f"`wattgate loadgen compare --target URL {' '.join(s['command'])} --seed S` "
             "(docs/loadgen.md's example). "
             f"SLO {r0['slo']}; time base: {r0['time_base']}. Wall time and commit per run: "
             f"{per_run}."]
    if s.get("rerun"):
        lines += ["", f"Seeds {', '.join(map(str, s['rerun']))} run again with `--rerun` "
                  f"(the other runs kept from the results file): {s['rerun_why']}"]
    lines += ["", *run_rows(doc["runs"], s["seeds"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1000,2000")
    ap.add_argument("--name", default="precision_docs", help="results file name")
    ap.add_argument("--rerun", default="",
                    help="run only these of --seeds again, keeping the others' runs from the "
                         "results file (e.g. a run the machine's other load disturbed)")
    ap.add_argument("--why", default="", help="--rerun: why, for the results file")
    args = ap.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")]
    rerun = [int(x) for x in args.rerun.split(",")] if args.rerun else []
    example = documented_example()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the stack on the way out
    ran_on = commit()  # the code as loaded, before the runs
    kept: dict[int, tuple[dict[str, Any], float, str]] = {}
    if rerun:
        old = orjson.loads((OUT / f"{args.name}.json").read_bytes())
        o = old["settings"]
        if o["command"] != example:
            raise SystemExit("the docs' example changed since the kept runs: run them all")
        commits = o.get("run_commits", [old["commit"]] * len(o["seeds"]))
        kept = {seed: (r, w, c) for seed, r, w, c in zip(o["seeds"], old["runs"], o["wall_s"],
                                                         commits, strict=True)
                if seed not in rerun}
    runs, wall_s, run_commits = [], [], []
    for i, seed in enumerate(seeds, 1):
        if seed in kept:
            r, took_s, at = kept[seed]
        else:
            print(f"[{i}/{len(seeds)}] seed {seed}", file=sys.stderr, flush=True)
            (r, took_s), at = one_run(seed, example), ran_on
        runs.append(r)
        wall_s.append(took_s)
        run_commits.append(at)
    doc = {"commit": ran_on,
           "settings": {"seeds": seeds, "command": example, "wall_s": wall_s,
                        "run_commits": run_commits, "rerun": rerun, "rerun_why": args.why},
           "runs": runs, "checks": checks(runs)}
    write(args.name, doc, markdown(doc))


if __name__ == "__main__":
    main()
