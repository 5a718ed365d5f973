"""Do `wattgate loadgen run` and `vllm bench serve` agree on the same engine and workload?

Both clients run, alternating, against one simulated engine (`wattgate sim`, H100, Llama 3.1 8B,
BF16), in its roofline mode and in fixed-timing modes. Every run gets the same workload: the same
request count, the same Poisson rate and seed, the same prompts (loadgen's seeded plan, handed to
vLLM as a ShareGPT-format file), the same output length (ignore_eos), /v1/completions, streaming
with include_usage. Per run we keep TTFT, TPOT and E2E medians: vLLM's `median_ttft_ms`,
`median_tpot_ms`, `median_e2el_ms`, and loadgen's *from-send* medians (vLLM measures from its
send). The engine's wire times for exactly the requests of each run (`GET /sim/requests/{id}`)
sit beside them, so a disagreement can be traced to the client that adds time. `--repeats`
interleaved rounds (the
client order rotates each round); the medians over rounds are compared: ratio = loadgen / vLLM,
agreement = within 5%. Exit status 1 when any metric misses.

    .venv/bin/python -m bench.loadgen_vs_vllm [--requests 100] [--rate 5] [--repeats 3]
        [--modes roofline,fixed:50/10,fixed:200/20]

Writes bench/results/loadgen_vs_vllm.json and .md; progress goes to stderr.

`vllm bench serve` is run as `python -c` over `vllm.benchmarks.serve.add_cli_args` and `main`,
which is exactly what the `vllm bench serve` subcommand calls; installs whose `vllm` console script
cannot read its package metadata (the CPU build here) have no other entry point.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from loadgen import lengths  # noqa: E402
from loadgen.arrivals import Poisson  # noqa: E402
from loadgen.procs import free_port, process, wait_http  # noqa: E402
from loadgen.workload import TenantSpec, Workload, build_plan  # noqa: E402

RESULTS = REPO / "bench" / "results"
TOKENIZER_DIR = REPO / ".cache" / "tiny-llama"
TOLERANCE = 0.05  # the bar: medians agree within 5%
METRICS = ("ttft", "tpot", "e2e")
SIM_ARGS = ("--gpu", "h100", "--model", "llama-3.1-8b", "--precision", "bf16")
MODEL = "llama-3.1-8b"
# `vllm bench serve` without the console script: the subcommand's own two calls.
VLLM_BENCH_SNIPPET = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "p = FlexibleArgumentParser(prog='vllm bench serve')\n"
    "add_cli_args(p)\n"
    "main(p.parse_args(sys.argv[1:]))\n")
# Offline: the tokenizer is a local directory, and nothing may phone home.
VLLM_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1", "VLLM_LOGGING_LEVEL": "WARNING"}


@dataclass(frozen=True, slots=True)
class Spec:
    """One side-by-side workload. Both clients get exactly these."""

    requests: int
    rate_rps: float
    seed: int
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class Medians:
    """Medians of one run, in ms. Truth rows have no E2E of their own (nan)."""

    ttft_ms: float
    tpot_ms: float
    e2e_ms: float
    ok: int
    requests: int
    wall_s: float


def plan_prompts(spec: Spec) -> list[str]:
    """The prompts `wattgate loadgen run` sends for this spec (its seeded plan), in order."""
    tenant = TenantSpec("default", prompt_tokens=lengths.fixed(spec.prompt_tokens),
                        output_tokens=lengths.fixed(spec.output_tokens))
    w = Workload(MODEL, (tenant,), Poisson(spec.rate_rps), duration_s=run_duration_s(spec),
                 max_requests=spec.requests, seed=spec.seed, api="completions")
    return [r.prompt for r in build_plan(w)]


def run_duration_s(spec: Spec) -> float:
    # Generous, so the request count (not the duration) ends the schedule, as in vLLM.
    return 4.0 * spec.requests / spec.rate_rps + 10.0


def write_sharegpt(prompts: Sequence[str], path: Path) -> None:
    """vLLM's ShareGPT dataset format; the reply text is ignored (--sharegpt-output-len)."""
    rows = [{"id": str(i), "conversations": [{"from": "human", "value": p},
                                             {"from": "gpt", "value": "unused reply text"}]}
            for i, p in enumerate(prompts)]
    path.write_bytes(orjson.dumps(rows))


def vllm_cmd(url: str, spec: Spec, dataset: Path, result: Path, tokenizer: Path) -> list[str]:
    return [sys.executable, "-c", VLLM_BENCH_SNIPPET,
            "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
            "--model", MODEL, "--tokenizer", str(tokenizer),
            "--dataset-name", "sharegpt", "--dataset-path", str(dataset),
            "--sharegpt-output-len", str(spec.output_tokens), "--ignore-eos",
            "--num-prompts", str(spec.requests), "--request-rate", str(spec.rate_rps),
            "--seed", str(spec.seed), "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--disable-tqdm", "--save-result", "--result-dir", str(result.parent),
            "--result-filename", result.name]


def loadgen_cmd(url: str, spec: Spec, out_dir: Path) -> list[str]:
    return [sys.executable, "-m", "wattgate_cli", "loadgen", "run", "--target", url,
            "--model", MODEL, "--api", "completions", "--arrival", "poisson",
            "--rate", str(spec.rate_rps), "--requests", str(spec.requests),
            "--duration", str(run_duration_s(spec)), "--seed", str(spec.seed),
            "--prompt-tokens", str(spec.prompt_tokens),
            "--output-tokens", str(spec.output_tokens),
            "--no-energy", "--quiet", "--out", str(out_dir)]


def _run(cmd: list[str], log: Path, timeout_s: float, env: dict[str, str] | None = None
         ) -> float:
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                              env={**os.environ, **(env or {})}, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-30:]
        raise RuntimeError(f"{cmd[2] if len(cmd) > 2 else cmd[0]} exited {proc.returncode}:\n"
                           + "\n".join(tail))
    return time.monotonic() - started


def parse_vllm(result: dict[str, Any], wall_s: float) -> Medians:
    return Medians(float(result["median_ttft_ms"]), float(result["median_tpot_ms"]),
                   float(result["median_e2el_ms"]), int(result["completed"]),
                   int(result["num_prompts"]), wall_s)


def parse_loadgen(doc: dict[str, Any], wall_s: float) -> Medians:
    s = doc["runs"][0]["summary"]
    send = s["from_send"]  # what vLLM measures: from the actual send
    return Medians(send["ttft_s"]["p50"] * 1e3, send["tpot_s"]["p50"] * 1e3,
                   send["e2e_s"]["p50"] * 1e3, int(s["ok"]), int(s["requests"]), wall_s)


def sim_request_ids(url: str) -> dict[str, dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/sim/requests", timeout=10) as resp:
        rows: list[dict[str, Any]] = orjson.loads(resp.read())["requests"]
    return {str(r["request_id"]): r for r in rows}


def truth(url: str, before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]
          ) -> Medians:
    """The engine's own medians over the requests one run added. TTFT and TPOT are wire times:
    from the HTTP request reaching the engine to the token events' socket writes (engine clock),
    i.e. what a client with zero overhead of its own would measure. E2E is the engine's."""
    new = [rid for rid, r in after.items() if rid not in before and r["status"] == "finished"]
    if not new:
        return Medians(math.nan, math.nan, math.nan, 0, 0, 0.0)
    ttft, tpot, e2e = [], [], []
    for rid in new:
        with urllib.request.urlopen(f"{url}/sim/requests/{urllib.parse.quote(rid, safe='')}",
                                    timeout=10) as resp:
            r = orjson.loads(resp.read())
        if r.get("wire_ttft_s") is not None and r.get("wire_tpot_s") is not None:
            ttft.append(r["wire_ttft_s"])
            tpot.append(r["wire_tpot_s"])
        e2e.append(r["finished"] - r["arrived"])
    med = statistics.median
    return Medians(med(ttft) * 1e3 if ttft else math.nan, med(tpot) * 1e3 if tpot else math.nan,
                   med(e2e) * 1e3, len(new), len(new), 0.0)


def run_vllm(url: str, spec: Spec, dataset: Path, work: Path, tag: str, tokenizer: Path,
             timeout_s: float) -> Medians:
    result = work / f"vllm-{tag}.json"
    wall = _run(vllm_cmd(url, spec, dataset, result, tokenizer), work / f"vllm-{tag}.log",
                timeout_s, VLLM_ENV)
    return parse_vllm(orjson.loads(result.read_bytes()), wall)


def run_loadgen(url: str, spec: Spec, work: Path, tag: str, timeout_s: float) -> Medians:
    out = work / f"loadgen-{tag}"
    wall = _run(loadgen_cmd(url, spec, out), work / f"loadgen-{tag}.log", timeout_s)
    return parse_loadgen(orjson.loads((out / "run.json").read_bytes()), wall)


def ratios(ours: Medians, vllm: Medians) -> dict[str, float]:
    return {"ttft": ours.ttft_ms / vllm.ttft_ms, "tpot": ours.tpot_ms / vllm.tpot_ms,
            "e2e": ours.e2e_ms / vllm.e2e_ms}


def within(ratio: float, tolerance: float = TOLERANCE) -> bool:
    return abs(ratio - 1.0) <= tolerance


def median_of(runs: Sequence[Medians]) -> dict[str, float]:
    return {m: statistics.median(getattr(r, f"{m}_ms") for r in runs) for m in METRICS}


def sim_cmd(port: int, fixed: tuple[float, float] | None) -> list[str]:
    cmd = [sys.executable, "-m", "wattgate_cli", "sim", *SIM_ARGS, "--port", str(port)]
    if fixed is not None:
        cmd += ["--fixed-ttft-ms", f"{fixed[0]:g}", "--fixed-itl-ms", f"{fixed[1]:g}"]
    return cmd


@contextlib.contextmanager
def sim_engine(fixed: tuple[float, float] | None, log: Path) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out, process(sim_cmd(port, fixed), out) as proc:
        wait_http(f"{url}/health", proc, timeout_s=60)
        yield url


CLIENTS = ("vllm", "loadgen")  # the compared pair


def side_by_side(url: str, spec: Spec, repeats: int, work: Path, tokenizer: Path,
                 timeout_s: float, label: str, clients: Sequence[str] = CLIENTS
                 ) -> dict[str, Any]:
    """`repeats` interleaved rounds on one engine; the order rotates every round."""
    slug = "".join(c if c.isalnum() else "-" for c in label)
    dataset = work / f"prompts-{slug}.json"
    write_sharegpt(plan_prompts(spec), dataset)
    rounds: list[dict[str, Any]] = []
    for i in range(repeats):
        order = [clients[(i + k) % len(clients)] for k in range(len(clients))]
        got: dict[str, Medians] = {}
        for who in order:
            before = sim_request_ids(url)
            tag = f"{slug}-{i}"
            print(f"[{label} {i + 1}/{repeats}] {who}: {spec.requests} requests at "
                  f"{spec.rate_rps:g} req/s ...", file=sys.stderr, flush=True)
            if who == "vllm":
                got[who] = run_vllm(url, spec, dataset, work, tag, tokenizer, timeout_s)
            else:
                got[who] = run_loadgen(url, spec, work, tag, timeout_s)
            got[f"truth_{who}"] = truth(url, before, sim_request_ids(url))
            m, t = got[who], got[f"truth_{who}"]
            print(f"[{label} {i + 1}/{repeats}] {who}: TTFT {m.ttft_ms:.2f} TPOT "
                  f"{m.tpot_ms:.3f} E2E {m.e2e_ms:.2f} ms, ok {m.ok}/{m.requests}; engine wire "
                  f"TTFT {t.ttft_ms:.2f} TPOT {t.tpot_ms:.3f} ms", file=sys.stderr, flush=True)
        rounds.append({"order": order, **{k: asdict(v) for k, v in got.items()}})
    med = {who: median_of([Medians(**r[who]) for r in rounds]) for who in clients}
    ratio = {who: {m: med[who][m] / med["vllm"][m] for m in METRICS}
             for who in clients if who != "vllm"}
    return {"label": label, "repeats": rounds, "median_ms": med,
            "ratio_to_vllm": ratio, "ratio": ratio["loadgen"],
            "within_5pct": {m: within(ratio["loadgen"][m]) for m in METRICS},
            "truth_median_ms": {who: median_of([Medians(**r[f"truth_{who}"]) for r in rounds])
                                for who in clients},
            "ttft_over_engine_wire_ms": {
                who: statistics.median(r[who]["ttft_ms"] - r[f"truth_{who}"]["ttft_ms"]
                                       for r in rounds) for who in clients}}


def markdown(doc: dict[str, Any]) -> str:
    s = doc["spec"]
    out = ["# `wattgate loadgen run` vs `vllm bench serve`: latency medians", "",
           f"Simulated engine `wattgate sim {' '.join(SIM_ARGS)}`; {s['requests']} requests per "
           f"run, Poisson {s['rate_rps']:g} req/s, seed {s['seed']}, {s['prompt_tokens']}-token "
           f"prompts (the same text for every client), {s['output_tokens']} output tokens "
           f"(ignore_eos), /v1/completions streamed with include_usage. {doc['repeats']} "
           "interleaved rounds per engine mode (the client order rotates each round); medians "
           "over the rounds. loadgen's numbers are from the send, as vLLM measures. Ratio = "
           f"loadgen / vLLM; agreement = within {TOLERANCE:.0%}. vLLM {doc['vllm_version']}. "
           "Engine wire = the engine's own time from the "
           "request reaching it to the token's socket write (`/sim/requests/{id}`), the floor "
           "any client measures.", "",
           f"Machine: {doc['machine']['cpus']} CPUs, load average "
           f"{doc['machine']['loadavg_start']} at start, {doc['machine']['loadavg_end']} at end "
           "(other work shares these cores).", "",
           "| engine mode | metric | loadgen ms | vLLM ms | ratio | within 5% | engine wire ms "
           "(loadgen / vLLM runs) |",
           "|---|---|---|---|---|---|---|"]
    for mode in doc["modes"]:
        med, t = mode["median_ms"], mode["truth_median_ms"]
        for m in METRICS:
            wire = ("-" if m == "e2e" else f"{t['loadgen'][m]:.2f} / {t['vllm'][m]:.2f}")
            out.append(
                f"| {mode['label']} | {m.upper()} | {med['loadgen'][m]:.2f} | "
                f"{med['vllm'][m]:.2f} | {mode['ratio'][m]:.4f} | "
                f"{'yes' if mode['within_5pct'][m] else '**no**'} | {wire} |")
    out += ["", "Client TTFT over the engine's wire TTFT (median over rounds): " + "; ".join(
        f"{mode['label']}: " + ", ".join(f"{who} {v:+.2f} ms" for who, v in
                                         mode["ttft_over_engine_wire_ms"].items())
        for mode in doc["modes"]), "", "Per run (ms, TTFT / TPOT / E2E, in run order):", ""]
    for mode in doc["modes"]:
        for i, r in enumerate(mode["repeats"]):
            cells = [f"{who} {r[who]['ttft_ms']:.2f} / {r[who]['tpot_ms']:.3f} / "
                     f"{r[who]['e2e_ms']:.2f} (ok {r[who]['ok']}/{r[who]['requests']})"
                     for who in r["order"]]
            out.append(f"- {mode['label']} round {i + 1}: " + "; ".join(cells))
    out += ["", f"All loadgen/vLLM medians within 5%: "
            f"{'yes' if doc['all_within_5pct'] else 'no'}."]
    return "\n".join(out)


def parse_mode(text: str) -> tuple[str, tuple[float, float] | None]:
    """`roofline` or `fixed:TTFT_MS/ITL_MS` -> (label, fixed timing or None)."""
    if text == "roofline":
        return "roofline", None
    kind, _, timing = text.partition(":")
    ttft, _, itl = timing.partition("/")
    if kind != "fixed" or not ttft or not itl:
        raise ValueError(f"mode must be roofline or fixed:TTFT_MS/ITL_MS, got {text!r}")
    return f"fixed {float(ttft):g}/{float(itl):g} ms", (float(ttft), float(itl))


def vllm_version() -> str:
    proc = subprocess.run([sys.executable, "-c", "import vllm; print(vllm.__version__)"],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, **VLLM_ENV})
    return proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout else "?"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--rate", type=float, default=5.0, help="Poisson requests/s")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default="roofline,fixed:50/10,fixed:200/20",
                    help="comma-separated: roofline, fixed:TTFT_MS/ITL_MS")
    ap.add_argument("--tokenizer", type=Path, default=TOKENIZER_DIR,
                    help="local tokenizer directory for vLLM (no hub download)")
    ap.add_argument("--run-timeout", type=float, default=300.0, help="seconds per client run")
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.requests > 2000 or args.repeats > 9:
        ap.error("bounded: at most 2000 requests and 9 repeats")
    if not (args.tokenizer / "tokenizer.json").is_file():
        ap.error(f"no tokenizer at {args.tokenizer}; build it with "
                 "`python -m tests.realengine.tinymodel`")
    spec = Spec(args.requests, args.rate, args.seed, args.prompt_tokens, args.output_tokens)
    machine = {"cpus": os.cpu_count(), "machine": platform.machine(),
               "python": platform.python_version(),
               "loadavg_start": " ".join(f"{x:.2f}" for x in os.getloadavg())}
    modes = []
    with tempfile.TemporaryDirectory(prefix="loadgen-vs-vllm-") as tmp:
        work = Path(tmp)
        for i, text in enumerate(m.strip() for m in args.modes.split(",") if m.strip()):
            label, fixed = parse_mode(text)
            with sim_engine(fixed, work / f"sim-{i}.log") as url:
                modes.append(side_by_side(url, spec, args.repeats, work, args.tokenizer,
                                          args.run_timeout, label))
    machine["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    doc = {"benchmark": "loadgen_vs_vllm", "spec": asdict(spec), "repeats": args.repeats,
           "tolerance": TOLERANCE, "vllm_version": vllm_version(), "machine": machine,
           "modes": modes,
           "all_within_5pct": all(all(m["within_5pct"].values()) for m in modes),
           "unix_time": int(time.time())}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "loadgen_vs_vllm.json").write_bytes(
        orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    md = markdown(doc)
    (args.out_dir / "loadgen_vs_vllm.md").write_text(md + "\n")
    print(md)
    return 0 if doc["all_within_5pct"] else 1


if __name__ == "__main__":
    sys.exit(main())
