"""`wattgate serve --workers 1` and `--workers 2` side by side: CPU per request and throughput.

    python -m bench.workers            # 11 interleaved pairs of 4 s runs per cell, ~20 min
    python -m bench.workers --quick    # 1 short run per cell
    python -m bench.workers --cells 1/nonstream/1 0,1/stream16/16 --runs 5  # some cells, no files

The fast engine (bench/overhead/fast_engine.c, one process on four ports) and the load client
(wrk) run on core 0, as in bench/gateway_overhead.py. The node (its parent, its workers and
its accounting child, the user configuration with accounting on) runs in two layouts, each
with 1 and with 2 workers, so within a layout the only difference is the number of workers:
on core 1 alone (over-subscribed: two workers share the core one worker had; over 1
connection only one of them serves, which shows what the worker's link costs, and over 16
both take turns on the core) and on cores 0 and 1 (a worker per core, as the default starts
them; a second worker also competes with the engine and the client for core 0). CPU is utime+stime of the
node's whole process tree from /proc, read after a settle window (the child's deferred
recording and apportioning is charged to the run that caused it). Runs are interleaved
(1 worker then 2 workers, then 2 then 1, ...) so drift on a shared machine falls on both.
Each cell's ratio is the median of its pairs' ratios with a distribution-free interval of at
least 95 % (order statistics of the pairs; 98.8 % with 11 pairs, none with fewer than 6): on a
shared host one run's CPU per request moves by 10-20 %
with its neighbours, so a cell needs many short pairs, not a few long runs, to tell a 10 %
difference from noise. The host's steal share during each run is recorded beside it.

What a 2-core machine can show: the CPU each request costs the node with one worker and with
two (the parent and the merged /metrics cost nothing per request; a node's worker sends a
frame per turn of its event loop instead of one per 20 ms), and that traffic lands
on both workers. What it cannot show: throughput scaling. The engine and the load client
already take most of core 0; a second worker on cores 0 and 1 raises req/s where one worker
left core 1 idle between its turns, but how a node of N workers scales on N free cores needs a
machine with cores to spare beyond the engine and the client.
Writes bench/results/workers.{json,md}.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from bench.overhead import configs
from bench.overhead.measure import cpu_s, run_wrk
from bench.overhead.targets import (
    Fleet,
    Target,
    build_engine,
    free_port,
    log,
    process_tree,
    start_engine,
    wait_ready,
)

RESULTS = Path(__file__).resolve().parent / "results"
LAYOUTS = ("1", "0,1")  # the node's cores
WORKERS = (1, 2)
MODES = ("nonstream", "stream16")
# 1: one request at a time, the machine not saturated (CPU per request without contention);
# 16: the machine saturated (throughput, and CPU per request under contention)
CONNECTIONS = (1, 16)


def start_node(fleet: Fleet, engine_urls: list[str], cores: str, workers: int) -> Target:
    port = free_port()
    name = f"node-{cores.replace(',', '')}-{workers}"
    cfg = fleet.workdir / f"{name}.yaml"
    cfg.write_bytes(configs.wattgate_user(engine_urls, port, fleet.workdir / f"{name}.db"))
    proc = fleet.spawn(name, [sys.executable, "-m", "wattgate_cli", "serve",
                              "--workers", str(workers), "--config", str(cfg),
                              "--log-level", "warning"], cores)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/readyz", proc, 90)
    return Target(f"workers={workers}", url, proc, process_tree(proc.pid), accounting=True)


def accounting_child(target: Target) -> list[int]:
    """The node's accounting child (`wattgate apportioner`)."""
    out = []
    for pid in target.cpu_pids():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"apportioner" in cmd:
            out.append(pid)
    return out


def scrape(target: Target) -> list[str]:
    with urllib.request.urlopen(target.url + "/metrics", timeout=10) as resp:
        return list(resp.read().decode().splitlines())


def per_worker(target: Target) -> list[float]:
    """Each worker's completion requests (the node's merged /metrics)."""
    return [float(line.split()[1]) for line in scrape(target)
            if line.startswith("wattgate_worker_requests_total{")]


def child_restarts(target: Target) -> float:
    """Times the node's accounting child was restarted (missed liveness probes under load)."""
    return sum(float(line.split()[1]) for line in scrape(target)
               if line.startswith("wattgate_apportioner_restarts_total"))


Cell = tuple[str, str, int]  # the node's cores, mode, connections


def all_cells() -> list[Cell]:
    return list(itertools.product(LAYOUTS, MODES, CONNECTIONS))


def parse_cells(texts: list[str]) -> list[Cell]:
    """Cells written `cores/mode/connections` (cores as in LAYOUTS), in all_cells()' order."""
    wanted = set()
    for part in texts:
        try:
            cores, mode, conns = part.strip().split("/")
            cell = (cores, mode, int(conns))
        except ValueError:
            raise SystemExit(f"--cells: {part!r} is not cores/mode/connections") from None
        if cell not in all_cells():
            raise SystemExit(f"--cells: {part!r} is none of "
                             f"{', '.join('/'.join(map(str, c)) for c in all_cells())}")
        wanted.add(cell)
    return [c for c in all_cells() if c in wanted]


def bench(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    fleet = Fleet(workdir)
    cells: list[dict[str, Any]] = []
    layouts = sorted({c[0] for c in args.cells}, key=LAYOUTS.index)
    try:
        engine_urls = start_engine(fleet, build_engine(workdir))
        engine_pids = process_tree(fleet.procs[0].pid)
        nodes = {(cores, w): start_node(fleet, engine_urls, cores, w)
                 for cores in layouts for w in WORKERS}
        for target in nodes.values():  # warm-up: connections, learnt models, first intervals
            run_wrk(target.url, "nonstream", 16, args.warmup, target.cpu_pids, engine_pids)
        for run, (cores, mode, conns) in itertools.product(range(args.runs), args.cells):
            # ABBA: odd runs measure 2 workers first, so a drift within a pair falls on
            # each side equally often
            for w in (WORKERS if run % 2 == 0 else WORKERS[::-1]):
                target = nodes[cores, w]
                child, root = accounting_child(target), target.cpu_pids()[:1]
                child0, root0, steal0 = cpu_s(child), cpu_s(root), steal_ticks()
                res = run_wrk(target.url, mode, conns, args.duration,
                              target.cpu_pids, engine_pids, settle_s=args.settle)
                steal1 = steal_ticks()
                steal = (steal1[0] - steal0[0]) / max(steal1[1] - steal0[1], 1)
                # None where the child was restarted meanwhile (its CPU is then in the
                # parent's, which the node's total counts)
                child_us = ((cpu_s(child) - child0) * 1e6 / max(res.requests, 1)
                            if accounting_child(target) == child else None)
                # the node's root process: with 1 worker the gateway itself, with 2 the parent
                root_us = (cpu_s(root) - root0) * 1e6 / max(res.requests, 1)
                workers_us = (None if child_us is None else res.proxy_cpu_us_per_req - child_us
                              - (root_us if w > 1 else 0.0))
                cells.append({"cores": cores, "workers": w, "mode": mode,
                              "connections": conns, "run": run,
                              "requests": res.requests, "rps": res.rps,
                              "p50_ms": res.p50_ms, "p99_ms": res.p99_ms,
                              "errors": res.errors, "node_cpu_s": res.proxy_cpu_s,
                              "cpu_us_per_req": res.proxy_cpu_us_per_req,
                              "child_cpu_us_per_req": child_us,
                              "parent_cpu_us_per_req": root_us if w > 1 else None,
                              "workers_cpu_us_per_req": workers_us,
                              "engine_client_core_busy": res.core0_busy,
                              "steal_share": steal})
                log(f"run {run} cores {cores} {mode} c={conns} workers={w}: "
                    f"{res.rps:.0f} req/s, {res.proxy_cpu_us_per_req:.0f} us CPU/req "
                    f"(child {_us(child_us)}, workers {_us(workers_us)}), errors {res.errors}, "
                    f"steal {steal:.1%}")
        spread = {f"{c}/{w}": per_worker(t) for (c, w), t in nodes.items() if w > 1}
        restarts = {f"{c}/{w}": child_restarts(t) for (c, w), t in nodes.items()}
    finally:
        fleet.stop_all()
    return {"meta": meta(args), "cells": cells, "summary": summary(cells, args.cells),
            "requests_per_worker": {str(w): s for w, s in spread.items()},
            "child_restarts": {str(w): n for w, n in restarts.items()}}


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """Distribution-free interval for the median: order statistics x(k), x(n+1-k) with the
    largest k whose binomial coverage is at least `level`; None where even the whole range
    covers less (fewer than 6 values at 95 %)."""
    xs, n = sorted(values), len(values)
    if n == 0 or 1 - 2 / 2 ** n < level:
        return None
    k = 1
    while k + 1 <= n // 2:
        tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n  # P(Binom(n, 1/2) <= k)
        if 1 - 2 * tail < level:
            break
        k += 1
    return xs[k - 1], xs[n - k]


def steal_ticks() -> tuple[int, int]:
    """(steal, all) ticks of the host's CPUs so far, from /proc/stat's `cpu` line."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return fields[7], sum(fields)


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def summary(cells: list[dict[str, Any]], which: list[Cell]) -> list[dict[str, Any]]:
    out = []
    for cores, mode, conns in which:
        row: dict[str, Any] = {"cores": cores, "mode": mode, "connections": conns}
        for w in WORKERS:
            mine = [c for c in cells if c["mode"] == mode and c["workers"] == w
                    and c["connections"] == conns and c["cores"] == cores]
            row[f"cpu_us_per_req_{w}"] = statistics.median(c["cpu_us_per_req"] for c in mine)
            row[f"cpu_us_per_req_{w}_range"] = [min(c["cpu_us_per_req"] for c in mine),
                                                max(c["cpu_us_per_req"] for c in mine)]
            row[f"rps_{w}"] = statistics.median(c["rps"] for c in mine)
            for part in ("child", "workers", "parent"):
                row[f"{part}_cpu_us_per_req_{w}"] = _median([c.get(f"{part}_cpu_us_per_req")
                                                             for c in mine])
        # each run's 2-worker cell against the 1-worker cell measured beside it
        ratios = sorted(b["cpu_us_per_req"] / a["cpu_us_per_req"] for a, b in zip(
            [c for c in cells if (c["cores"], c["mode"], c["connections"], c["workers"])
             == (cores, mode, conns, 1)],
            [c for c in cells if (c["cores"], c["mode"], c["connections"], c["workers"])
             == (cores, mode, conns, 2)], strict=True))
        row["cpu_ratio"] = statistics.median(ratios)
        row["cpu_ratio_range"] = [ratios[0], ratios[-1]]
        interval = median_interval(ratios)
        row["cpu_ratio_ci95"] = None if interval is None else list(interval)
        row["steal_share"] = statistics.median(
            c["steal_share"] for c in cells
            if (c["cores"], c["mode"], c["connections"]) == (cores, mode, conns))
        out.append(row)
    return out


def meta(args: argparse.Namespace) -> dict[str, Any]:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    if subprocess.run(["git", "diff", "--quiet", "HEAD"], check=False).returncode == 1:
        commit += "+dirty"  # the tree measured is not that commit's
    return {"commit": commit, "python": platform.python_version(), "cpus": os.cpu_count(),
            "layouts": list(LAYOUTS), "connections": list(CONNECTIONS),
            "duration_s": args.duration, "runs": args.runs, "settle_s": args.settle,
            "loadavg": Path("/proc/loadavg").read_text().split()[:3]}


def markdown(result: dict[str, Any]) -> str:
    m = result["meta"]
    lines = [
        "# `wattgate serve --workers 1` and `--workers 2`", "",
        f"`python -m bench.workers` at commit {m['commit']}: the user configuration with "
        f"accounting on, over the fast engine; wrk with 1 and with 16 connections for "
        f"{m['duration_s']} s per run, {m['runs']} interleaved runs per cell (median, and the "
        "range over the runs); the engine and wrk on core 0; the node on core 1 alone, or on "
        f"cores 0 and 1; {m['cpus']} CPUs in all, load average at the start "
        f"{' '.join(m['loadavg'])}. The ratio is the median over the runs of each run's "
        "2-worker CPU per request over the 1-worker one measured beside it (1 worker first in "
        "even runs, 2 workers first in odd ones), with a distribution-free interval of at least "
        "95 % for that median (order statistics of the pairs; 98.8 % with 11 pairs; none with "
        "fewer than 6) and the range. Being a median of paired ratios, it can differ from the "
        "ratio of the two CPU/req columns (each a median of its own runs). Within 10 % "
        "(2 workers at most 1.10x): yes when the interval's top is at most 1.10, median only "
        "when the median is but the top is not. Steal is the "
        "host's steal share of all CPU time during the cell's runs (median).", "",
        "| node's cores | mode | connections | CPU/req, 1 worker (us) | CPU/req, 2 workers (us) "
        "| ratio | interval (range) | within 10 % | steal | req/s, 1 worker "
        "| req/s, 2 workers | child's share, 1 / 2 workers (us) "
        "| workers' share, 1 / 2 workers (us) | parent's share, 2 workers (us) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["summary"]:
        lo, hi = r["cpu_ratio_range"]
        if r["cpu_ratio_ci95"] is None:  # too few pairs for a 95 % interval
            interval, verdict = f"- ({lo:.2f}-{hi:.2f})", "-"
        else:
            ci_lo, ci_hi = r["cpu_ratio_ci95"]
            interval = f"{ci_lo:.2f}-{ci_hi:.2f} ({lo:.2f}-{hi:.2f})"
            verdict = (("yes" if ci_hi <= 1.10 else "median only") if r["cpu_ratio"] <= 1.10
                       else "**no**")
        lines.append(
            f"| {r['cores']} | {r['mode']} | {r['connections']} | "
            f"{r['cpu_us_per_req_1']:.0f} | {r['cpu_us_per_req_2']:.0f} | "
            f"{r['cpu_ratio']:.2f} | {interval} | {verdict} | "
            f"{r['steal_share']:.1%} | {r['rps_1']:.0f} | {r['rps_2']:.0f} | "
            f"{_us(r['child_cpu_us_per_req_1'])} / {_us(r['child_cpu_us_per_req_2'])} | "
            f"{_us(r['workers_cpu_us_per_req_1'])} / {_us(r['workers_cpu_us_per_req_2'])} | "
            f"{_us(r['parent_cpu_us_per_req_2'])} |")
    spread = "; ".join(f"cores {k.split('/')[0]}: {', '.join(f'{v:.0f}' for v in vals)}"
                       for k, vals in result["requests_per_worker"].items())
    restarts = ", ".join(f"{v:.0f} (cores {k.split('/')[0]}, {k.split('/')[1]} worker"
                         f"{'s' if k.split('/')[1] != '1' else ''})"
                         for k, v in result["child_restarts"].items())
    lines += ["", f"Requests per worker over the whole run with 2 workers: {spread}. "
              f"Accounting child restarted (missed liveness probes while starved): {restarts} "
              "(a run where it was has no child share).", "",
              "CPU per request is the node's whole process tree (parent, workers, accounting "
              "child), read after a settle window. On core 1 alone the node is over-subscribed: "
              "over 1 connection only one of its two workers serves (what the worker's link "
              "costs: a record frame per turn of its event loop), over 16 both take turns on "
              "the core one worker had. On cores 0 and 1 there is a worker per core, as the "
              "default starts them; a second worker also competes with the engine and the load "
              "client for core 0. "
              "What this 2-core machine cannot show is throughput scaling: the engine and the "
              "load client take most of core 0. On cores 0 and 1 a second worker raises req/s "
              "where one worker left core 1 idle between its turns; how a node of N workers "
              "scales on N free cores needs cores to spare beyond the engine and the client.",
              ""]
    return "\n".join(lines)


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=11, help="pairs per cell")
    p.add_argument("--duration", type=float, default=4.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--settle", type=float, default=2.0)
    p.add_argument("--quick", action="store_true", help="1 run of 3 s per cell, no files")
    p.add_argument("--cells", nargs="+", metavar="CORES/MODE/CONNECTIONS",
                   help="only these cells, e.g. 1/nonstream/1 0,1/stream16/16 (no files)")
    args = p.parse_args(argv)
    if args.quick:
        args.runs, args.duration, args.warmup = 1, 3.0, 1.0
    args.partial = args.cells is not None
    args.cells = parse_cells(args.cells) if args.partial else all_cells()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="wattgate-workers-") as tmp:
        result = bench(args, Path(tmp))
    result["meta"]["wall_s"] = round(time.monotonic() - t0, 1)
    print(markdown(result))
    if not args.quick and not args.partial:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "workers.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
        (RESULTS / "workers.md").write_text(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
