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

from bench.precision_search import run_rows, write  # noqa: E402
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
    lines = ["# Precision search: three runs of the documented `loadgen compare --search` "
             "example", "",
             f"Commit {doc['commit']}. `python -m bench.precision_docs --seeds "
             f"{','.join(map(str, s['seeds']))}` on a shared 2-core machine: each seed on a "
             "fresh `wattgate demo --serve` stack (four simulated vLLM-dialect H100 engines and "
             "one TensorRT-LLM FP8 engine, llama-3.1-8b, real time, least_load gateway), then "
             f"`wattgate loadgen compare --target URL {' '.join(s['command'])} --seed S` "
             "(docs/loadgen.md's example). "
             f"SLO {r0['slo']}; time base: {r0['time_base']}. Wall time per run: "
             + ", ".join(f"{x / 60:.0f} min" for x in s["wall_s"]) + ".", ""]
    lines += run_rows(doc["runs"], s["seeds"])
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1000,2000")
    ap.add_argument("--name", default="precision_docs", help="results file name")
    args = ap.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")]
    example = documented_example()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the stack on the way out
    ran_on = commit()  # the code as loaded, before the runs
    runs, wall_s = [], []
    for i, seed in enumerate(seeds, 1):
        print(f"[{i}/{len(seeds)}] seed {seed}", file=sys.stderr, flush=True)
        r, took_s = one_run(seed, example)
        runs.append(r)
        wall_s.append(took_s)
    doc = {"commit": ran_on, "settings": {"seeds": seeds, "command": example, "wall_s": wall_s},
           "runs": runs, "checks": checks(runs)}
    write(args.name, doc, markdown(doc))


if __name__ == "__main__":
    main()
