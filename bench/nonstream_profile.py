"""The gateway's CPU per request, this tree against another commit's, side by side in one run.

    git worktree add /tmp/base <commit>
    python -m bench.nonstream_profile --base /tmp/base           # CPU per request, 3 runs
    python -m bench.nonstream_profile --base /tmp/base --cprofile  # cProfile top entries
    python -m bench.nonstream_profile --parts models metrics record  # what each part costs

The harness of bench/gateway_overhead.py (the fast engine and wrk on core 0, the gateway on
core 1, the user configuration: `vllm` engines scraped, least_load, the `model` meter) with
four gateways: this tree and the base tree, each with accounting on and off. Runs are
interleaved and the order rotates each run. CPU per request is utime+stime of the gateway's
processes (its accounting child included) over the run, read after a settle window for the
accounting gateways, divided by the requests: the figure a shared machine moves least.
`--parts` measures this tree's gateway without accounting beside copies with parts of the
request path made no-ops (bench/overhead/stubbed_serve.py): what each part costs, free of
cProfile's cost per call. Writes bench/results/nonstream_profile.{json,md} (--parts:
nonstream_parts.{json,md}) unless --out-dir says otherwise.
"""

from __future__ import annotations

import argparse
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from bench.overhead import configs
from bench.overhead.measure import cpu_s, run_wrk
from bench.overhead.targets import (
    ENGINE_CORE,
    PROXY_CORE,
    REPO,
    Fleet,
    Target,
    build_engine,
    free_port,
    log,
    process_tree,
    start_engine,
    wait_ready,
)

RESULTS = REPO / "bench" / "results"
WRAPPER = REPO / "bench" / "overhead" / "cprofile_serve.py"
STUBBED = REPO / "bench" / "overhead" / "stubbed_serve.py"


def _commit(tree: Path) -> str:
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, check=False)
    return out.stdout.strip() or "?"


def start_gateway(fleet: Fleet, name: str, tree: Path, engine_urls: list[str],
                  accounting: bool, profile_out: Path | None = None,
                  stubbed: str | None = None) -> Target:
    """`wattgate serve` from `tree`'s sources (PYTHONPATH), pinned to the proxy core; under
    cProfile with `profile_out`, with the `stubbed` parts made no-ops."""
    port = free_port()
    ledger = fleet.workdir / f"{name}.db" if accounting else None
    cfg = fleet.workdir / f"{name}.yaml"
    cfg.write_bytes(configs.wattgate_user(engine_urls, port, ledger))
    serve = ["serve", "--config", str(cfg), "--port", str(port), "--log-level", "warning"]
    if profile_out is not None:
        cmd = [sys.executable, str(WRAPPER), str(profile_out), *serve]
    elif stubbed is not None:
        cmd = [sys.executable, str(STUBBED), stubbed, *serve]
    else:
        cmd = [sys.executable, "-m", "wattgate_cli", *serve]
    out = open(fleet.workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed by the fleet
    fleet.logs.append(out)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(tree)}
    proc = subprocess.Popen(["taskset", "-c", PROXY_CORE, *cmd], cwd=tree, stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True, env=env)
    fleet.procs.append(proc)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/readyz", proc, 60)
    return Target(name, url, proc, process_tree(proc.pid), accounting)


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def gateways(args: argparse.Namespace, fleet: Fleet, engine_urls: list[str]) -> list[Target]:
    """Both trees with and without accounting; with --parts, this tree without accounting,
    whole and with each part set stubbed."""
    if args.parts:
        return [start_gateway(fleet, "whole", REPO, engine_urls, False)] + [
            start_gateway(fleet, f"without {parts}", REPO, engine_urls, False, stubbed=parts)
            for parts in args.parts]
    trees = {"new": REPO, "base": args.base}
    return [start_gateway(fleet, f"{label}-{'acct' if acct else 'noacct'}", tree,
                          engine_urls, acct)
            for label, tree in trees.items() for acct in (True, False)]


def measure(args: argparse.Namespace, fleet: Fleet, engine_urls: list[str],
            engine_pids: list[int]) -> list[dict[str, Any]]:
    targets = gateways(args, fleet, engine_urls)
    for target in targets:  # warm-up: connections, routing models, the first records
        for mode in args.modes:
            run_wrk(target.url, mode, 16, 1.0, target.cpu_pids, engine_pids)
    raw = []
    for run in range(args.runs):
        for mode in args.modes:
            for conns in args.connections:
                shift = run % len(targets)
                for target in targets[shift:] + targets[:shift]:
                    settle = args.settle if target.accounting else 0.0
                    main = [target.pids[0]]  # the gateway's own process, without its child
                    main0 = cpu_s(main)
                    res = run_wrk(target.url, mode, conns, args.duration, target.cpu_pids,
                                  engine_pids, settle_s=settle)
                    main_us = (cpu_s(main) - main0) * 1e6 / max(res.requests, 1)
                    raw.append({"run": run, "mode": mode, "connections": conns,
                                "target": target.name, "requests": res.requests,
                                "rps": res.rps, "p99_ms": res.p99_ms, "errors": res.errors,
                                "cpu_us_per_req": res.proxy_cpu_us_per_req,
                                "gateway_cpu_us_per_req": main_us})
                    log(f"run {run + 1} {mode} c={conns} {target.name}: {res.rps:,.0f} req/s "
                        f"cpu {res.proxy_cpu_us_per_req:.1f} us/req (gateway process "
                        f"{main_us:.1f}) err {res.errors}")
    return raw


def summarise(raw: list[dict[str, Any]]) -> dict[str, Any]:
    """Per cell and gateway: CPU per request of all its processes, and of the gateway's own
    process; per tree, what accounting adds to each (paired by run)."""
    cells: dict[str, dict[str, dict[str, list[float]]]] = {}
    for row in raw:
        key = f"{row['mode']} c={row['connections']}"
        by_target = cells.setdefault(key, {})
        for figure in ("cpu_us_per_req", "gateway_cpu_us_per_req"):
            by_target.setdefault(figure, {}).setdefault(row["target"], []).append(row[figure])
    out: dict[str, Any] = {}
    for key, figures in cells.items():
        out[key] = {}
        for figure, by_name in figures.items():
            rows = out[key][figure] = {name: _spread(v) for name, v in by_name.items()}
            for label in ("new", "base"):
                acct, noacct = by_name.get(f"{label}-acct"), by_name.get(f"{label}-noacct")
                if acct and noacct:
                    rows[f"{label}: accounting adds"] = _spread(
                        [a - b for a, b in zip(acct, noacct, strict=True)])
            whole = by_name.get("whole")
            for name, values in by_name.items():
                if whole and name.startswith("without "):
                    rows[f"{name.removeprefix('without ')} costs"] = _spread(
                        [a - b for a, b in zip(whole, values, strict=True)])
    return out


def cprofile(args: argparse.Namespace, fleet: Fleet, engine_urls: list[str],
             engine_pids: list[int]) -> dict[str, list[str]]:
    """cProfile of each tree's accounting gateway over one load window: the top entries by
    own time, as text."""
    tops = {}
    for label, tree in (("new", REPO), ("base", args.base)):
        out = fleet.workdir / f"{label}.prof"
        gw = start_gateway(fleet, f"prof-{label}", tree, engine_urls, True, out)
        run_wrk(gw.url, args.modes[0], 16, 1.0, gw.cpu_pids, engine_pids)
        assert gw.proc is not None
        load = threading.Thread(target=run_wrk, args=(gw.url, args.modes[0],
                                                      args.connections[0],
                                                      args.duration + 2, gw.cpu_pids,
                                                      engine_pids))
        load.start()
        time.sleep(1.0)
        os.kill(gw.proc.pid, signal.SIGUSR1)
        time.sleep(args.duration)
        os.kill(gw.proc.pid, signal.SIGUSR2)
        load.join()
        time.sleep(1.0)
        stats = pstats.Stats(str(out))
        entries = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)  # type: ignore[attr-defined]
        total = sum(v[2] for _, v in entries) or 1.0
        # one record per request: the count the others are divided by
        requests = sum(v[1] for (_, _, func), v in entries if func == "publish") or 1
        python = sum(v[1] for (file, _, _), v in entries if file != "~") / requests
        builtin = sum(v[1] for (file, _, _), v in entries if file == "~") / requests
        lines = [f"{requests} requests; per request {python:.1f} Python function calls (a "
                 f"coroutine's every resumption counts), {builtin:.1f} calls of C functions", ""]
        for (file, line, func), (_cc, ncalls, tottime, cumtime, _callers) in entries[:args.top]:
            where = f"{Path(file).parent.name}/{Path(file).name}:{line}" if line else file
            lines.append(f"{100 * tottime / total:5.1f}% own {cumtime:7.3f}s cum "
                         f"{ncalls:>8} calls  {func} ({where})")
        tops[label] = lines
    text = [f"# cProfile of the accounting gateway, {args.modes[0]} c={args.connections[0]}, "
            f"{args.duration} s", "",
            f"`python -m bench.nonstream_profile {' '.join(sys.argv[1:])}`, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Top entries by own time "
            "(cProfile's cost per call inflates every entry; the shares and the call counts, "
            "not the seconds, compare). uvloop's methods are invisible to cProfile: the two "
            "`send` entries hold the socket writes.", ""]
    for label, lines in tops.items():
        tree = REPO if label == "new" else args.base
        text += [f"## {label} ({_commit(tree)})", "", "```", *lines, "```", ""]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "nonstream_cprofile.md").write_text("\n".join(text))
    print("\n".join(text))
    return tops


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    title = (f"what parts of the request path cost, {meta['commit']}" if meta["parts"]
             else f"{meta['commit']} against {meta['base_commit']}")
    lines = [f"# Gateway CPU per request: {title}", "",
             f"`{meta['command']}`, {meta['date']}, {meta['cpu']}; {meta['runs']} interleaved "
             f"runs of {meta['duration_s']} s per cell, the gateway pinned to one core; "
             "CPU-µs per request, median (min–max).", ""]
    for cell, figures in result["summary"].items():
        lines += [f"## {cell}", "", "| gateway | all its processes | the gateway process |",
                  "| --- | ---: | ---: |"]
        whole, own = figures["cpu_us_per_req"], figures["gateway_cpu_us_per_req"]
        for name, s in whole.items():
            o = own[name]
            lines.append(f"| {name} | {s['median']:.1f} ({s['min']:.1f}–{s['max']:.1f}) | "
                         f"{o['median']:.1f} ({o['min']:.1f}–{o['max']:.1f}) |")
        lines.append("")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.nonstream_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", type=Path, help="a worktree of the base commit")
    p.add_argument("--parts", nargs="+", default=[],
                   help="part sets to stub, each comma-separated (models, metrics, record)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--duration", type=int, default=4, help="whole seconds per run")
    p.add_argument("--settle", type=float, default=3.0)
    p.add_argument("--modes", nargs="+", default=["nonstream"],
                   choices=["nonstream", "stream16", "stream16_burst"])
    p.add_argument("--connections", type=int, nargs="+", default=[16])
    p.add_argument("--cprofile", action="store_true", help="profile instead of measuring")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.base is None and not args.parts:
        p.error("--base is needed unless --parts is given")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="wattgate-nonstream-"))
    fleet = Fleet(workdir)
    try:
        engine_urls = start_engine(fleet, build_engine(workdir))
        engine_pids = process_tree(fleet.procs[0].pid)
        log(f"engine on core {ENGINE_CORE}, gateways on core {PROXY_CORE}, work dir {workdir}")
        if args.cprofile:
            cprofile(args, fleet, engine_urls, engine_pids)
            return 0
        raw = measure(args, fleet, engine_urls, engine_pids)
    finally:
        fleet.stop_all()
    cpu = next((ln.split(":", 1)[1].strip() for ln in
                Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")),
               "?")
    meta = {"commit": _commit(REPO), "parts": args.parts,
            "base_commit": _commit(args.base) if args.base else None, "runs": args.runs,
            "duration_s": args.duration, "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                               time.gmtime()),
            "cpu": cpu, "command": "python -m bench.nonstream_profile " + " ".join(
                sys.argv[1:] if argv is None else argv)}
    result = {"meta": meta, "summary": summarise(raw), "raw": raw}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = "nonstream_parts" if args.parts else "nonstream_profile"
    (args.out_dir / f"{stem}.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    md = markdown(result)
    (args.out_dir / f"{stem}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
