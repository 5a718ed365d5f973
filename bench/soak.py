"""Soak: does the gateway hold steady under hours of load with churn?

    python -m bench.soak                      # 30 min, writes bench/results/soak.{json,md,png}
    python -m bench.soak --duration-s 600     # shorter
    python -m bench.soak --quick --out DIR    # about 40 s, for the test suite
    python -m bench.soak --workers 2          # a node: parent, 2 workers, one child
                                              # (writes bench/results/soak_workers2.*)

One `wattgate serve` (accounting on: SQLite ledger, request journal, `sim` meters) in front of
two `wattgate sim` engine processes. A steady open-loop load (`--rate` requests/s, a third
non-streamed, a tenth of the streams dropped by the client after the first chunk), and every
`--churn-s` one engine is SIGKILLed and restarted `--down-s` later. The RSS and open file
descriptors of the gateway and of its accounting child (found among the gateway's children)
are read from /proc every `--sample-s` (with `--workers N` > 1: the parent, each worker and
the node's child). After `--warmup-s` a least-squares line is fitted to each process's RSS
over time. Targets: both RSS slopes at most 2 MB/h, no error but the
injected ones (client drops; failures within a few seconds of an engine kill).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import uvloop
import yaml

from bench.provenance import commit
from bench.soak_load import Engine, Sample, Tally, churn, load, sample
from bench.soak_procs import free_port, gateway_config, process, wait_http, wattgate

RESULTS = Path(__file__).resolve().parent / "results"
SLOPE_TARGET_MB_PER_H = 2.0  # issue 31: "RSS flat after warm-up (<= 2 MB/h)"
ENGINES = (("sim-bf16", "bf16"), ("sim-fp8", "fp8"))


def fit(points: list[tuple[float, float, float]], warmup_s: float) -> dict[str, float]:
    """Slopes per hour of one process's RSS (MB) and fds after the warm-up, with their
    ranges, from its (seconds, RSS, fds) readings."""
    after = [p for p in points if p[0] >= warmup_s]
    if len(after) < 3:
        return {}
    t_h = [t / 3600.0 for t, _, _ in after]
    rss = [r for _, r, _ in after]
    fds = [f for _, _, f in after]
    return {"rss_slope_mb_per_h": statistics.linear_regression(t_h, rss).slope,
            "fd_slope_per_h": statistics.linear_regression(t_h, fds).slope,
            "rss_min_mb": min(rss), "rss_max_mb": max(rss),
            "fd_min": min(fds), "fd_max": max(fds), "samples": float(len(after))}


def series(samples: list[Sample], workers: int) -> dict[str, list[tuple[float, float, float]]]:
    """Each process's (seconds, RSS, fds) readings, by name: the gateway (the parent with
    several workers), each worker by its rank among the first full set of workers' pids (a
    restarted worker's readings, and every worker's after a restart, are left out: a fit
    would mix two processes), the child (readings where it was not running are left out)."""
    out: dict[str, list[tuple[float, float, float]]] = {
        "gateway" if workers == 1 else "parent": [(s.t_s, s.rss_mb, s.fds) for s in samples]}
    if workers > 1:
        first = next(([w[0] for w in s.workers] for s in samples
                      if len(s.workers) == workers), [])
        same = [s for s in samples if [w[0] for w in s.workers] == first]
        for i in range(workers):
            out[f"worker {i + 1}"] = [(s.t_s, s.workers[i][1], s.workers[i][2]) for s in same]
    out["accounting child"] = [(s.t_s, s.child_rss_mb, s.child_fds) for s in samples
                               if s.child_rss_mb is not None and s.child_fds is not None]
    return out


async def soak(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    ran_on = commit()  # what ran, not what the tree holds half an hour later
    engines: list[Engine] = []
    logs = []
    for name, precision in ENGINES:
        log = (work / f"{name}.log").open("wb")
        logs.append(log)
        engines.append(Engine(name, free_port(), precision, log))
    try:
        for eng in engines:
            await asyncio.to_thread(eng.start)
        port = free_port()
        cfg = gateway_config({e.name: (e.url, e.precision) for e in engines},
                             work / "ledger.db", port)
        (work / "gateway.yaml").write_text(yaml.safe_dump(cfg))
        with (work / "gateway.log").open("wb") as glog, process(
                wattgate("serve", "--workers", str(args.workers), "--config",
                         str(work / "gateway.yaml"), "--log-level", "warning"), glog) as gw:
            url = f"http://127.0.0.1:{port}"
            await asyncio.to_thread(wait_http, f"{url}/readyz", gw, 60)
            tally = Tally()
            samples: list[Sample] = []
            t0 = time.monotonic()
            until = t0 + args.duration_s
            await asyncio.gather(
                load(url, args.rate, until, tally, seed=7),
                churn(engines, args.churn_s, args.down_s, until, tally),
                sample(gw.pid, args.sample_s, until, t0, samples, args.progress_s, tally))
            alive = gw.poll() is None
    finally:
        for eng in engines:
            await asyncio.to_thread(eng.stop)
        for log in logs:
            log.close()
    fits = {name: fit(points, args.warmup_s)
            for name, points in series(samples, args.workers).items()}
    errors = sum(tally.errors.values())
    slopes = [f.get("rss_slope_mb_per_h") for f in fits.values()]
    child_pids = sorted({s.child_pid for s in samples if s.child_pid is not None})
    worker_pids = sorted({w[0] for s in samples for w in s.workers})
    return {
        "commit": ran_on, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "settings": {k: getattr(args, k) for k in ("duration_s", "warmup_s", "rate", "churn_s",
                                                   "down_s", "sample_s", "workers")},
        "sent": tally.sent, "ok": tally.ok, "client_disconnects": tally.disconnects,
        "engine_kills": len(tally.kills), "injected_errors": tally.injected_errors,
        "other_errors": dict(tally.errors), "gateway_alive": alive,
        "fits": fits, "fit": fits["gateway" if args.workers == 1 else "parent"],
        "child_fit": fits["accounting child"], "child_pids": child_pids,
        "worker_pids": worker_pids, "samples": samples,
        "target_met": bool(alive and errors == 0 and all(
            s is not None and s <= SLOPE_TARGET_MB_PER_H for s in slopes)),
    }


def markdown(res: dict[str, Any]) -> str:
    st = res["settings"]
    workers = st.get("workers", 1)
    fits: dict[str, dict[str, float]] = res["fits"]
    names = list(fits)

    def row(label: str, fmt: str, key: str, unit: str = "") -> str:
        return f"| {label} | " + " | ".join(_num(fits[n].get(key), fmt) + unit
                                            for n in names) + " |"

    def span(label: str, lo: str, hi: str, fmt: str) -> str:
        return f"| {label} | " + " | ".join(
            f"{_num(fits[n].get(lo), fmt)}-{_num(fits[n].get(hi), fmt)}" for n in names) + " |"

    node = ("the gateway" if workers == 1 else
            f"the parent, each of its {workers} workers")
    flag = "" if workers == 1 else f" --workers {workers}"
    restarts = ("" if workers == 1 else
                f"| worker pids seen ({workers} at the start; a restart adds one) | "
                f"{len(res.get('worker_pids', []))} |\n")
    return f"""# Soak

`python -m bench.soak --duration-s {st['duration_s']:.0f}{flag}` on commit {res['commit']},
{res['machine']}: {st['rate']:.0f} requests/s offered, one engine of two SIGKILLed and
restarted every {st['churn_s']:.0f} s (down {st['down_s']:.0f} s), RSS and fds of {node}
and of the accounting child sampled every {st['sample_s']:.0f} s, a line fitted to each after a
{st['warmup_s']:.0f} s warm-up. Accounting on: SQLite ledger, request journal, `sim` meters.

| | |
| --- | ---: |
| requests sent / ok | {res['sent']} / {res['ok']} |
| client disconnects (injected) | {res['client_disconnects']} |
| engine kills / errors within their windows (injected) | {res['engine_kills']} / {res['injected_errors']} |
| other errors | {sum(res['other_errors'].values())} {res['other_errors'] or ''} |
| accounting child pids seen (a respawn adds one) | {len(res['child_pids'])} |
{restarts}
| after warm-up | {' | '.join(names)} |
| --- |{' ---: |' * len(names)}
{span('RSS min-max (MB)', 'rss_min_mb', 'rss_max_mb', '.1f')}
{row(f'RSS slope (target <= {SLOPE_TARGET_MB_PER_H:g} MB/h)', '+.2f', 'rss_slope_mb_per_h', ' MB/h')}
{span('open fds min-max', 'fd_min', 'fd_max', '.0f')}
{row('fd slope', '+.1f', 'fd_slope_per_h', ' per h')}

Target met (every slope, no other error, gateway alive): {'yes' if res['target_met'] else 'no'}

![RSS and fds of each process]({result_name(workers)}.png)
"""


def _num(x: float | None, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    workers = res["settings"].get("workers", 1)
    samples = [Sample(**{**s, "workers": [tuple(w) for w in s.get("workers", [])]})
               for s in res["samples"]]
    for name, points in series(samples, workers).items():
        t = [p[0] / 60.0 for p in points]
        slope = res["fits"][name].get("rss_slope_mb_per_h")
        a.plot(t, [p[1] for p in points], lw=1, label=f"{name} ({_num(slope, '+.2f')} MB/h)")
        b.plot(t, [p[2] for p in points], lw=1, label=name)
    for ax in (a, b):
        ax.axvline(res["settings"]["warmup_s"] / 60.0, color="grey", ls="--", lw=0.8)
        ax.legend(loc="lower right", fontsize=8)
    a.set_ylabel("RSS (MB)")
    b.set_ylabel("open fds")
    b.set_xlabel("minutes")
    a.set_title("soak: RSS slopes after warm-up")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def result_name(workers: int) -> str:
    """The result files' stem: `soak`, or `soak_workersN` for a node of N workers, so a node's
    run does not overwrite the single process's."""
    return "soak" if workers == 1 else f"soak_workers{workers}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="about 40 s, for the test suite")
    p.add_argument("--duration-s", type=float, default=None, help="default 1800 (quick: 40)")
    p.add_argument("--warmup-s", type=float, default=None, help="default 120 (quick: 10)")
    p.add_argument("--rate", type=float, default=40.0, help="requests/s offered")
    p.add_argument("--churn-s", type=float, default=None, help="default 60 (quick: 12)")
    p.add_argument("--down-s", type=float, default=2.0)
    p.add_argument("--sample-s", type=float, default=None, help="default 5 (quick: 1)")
    p.add_argument("--progress-s", type=float, default=None, help="default 30 (quick: 5)")
    p.add_argument("--workers", type=int, default=1,
                   help="`wattgate serve --workers` (default 1: one serving process)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    # SIGTERM (a `kill` or a timeout) ends the run through its cleanup: the gateway and the
    # engines it started are stopped, not left behind
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    q = args.quick
    for name, full, quick in (("duration_s", 1800.0, 40.0), ("warmup_s", 120.0, 10.0),
                              ("churn_s", 60.0, 12.0), ("sample_s", 5.0, 1.0),
                              ("progress_s", 30.0, 5.0)):
        if getattr(args, name) is None:
            setattr(args, name, quick if q else full)
    with tempfile.TemporaryDirectory(prefix="wattgate-soak-") as d:
        # through JSON, so the plot reads the samples as the file holds them (dicts)
        res = orjson.loads(orjson.dumps(uvloop.run(soak(args, Path(d)))))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / result_name(args.workers)
    stem.with_suffix(".json").write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2))
    stem.with_suffix(".md").write_text(markdown(res))
    plot(res, stem.with_suffix(".png"))
    print(markdown(res))
    return 0 if res["target_met"] or q else 1


if __name__ == "__main__":
    sys.exit(main())
