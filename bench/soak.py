"""Soak: does the gateway hold steady under hours of load with churn?

    python -m bench.soak                      # 30 min, writes bench/results/soak.{json,md,png}
    python -m bench.soak --duration-s 600     # shorter
    python -m bench.soak --quick --out DIR    # about 40 s, for the test suite

One `wattgate serve` (accounting on: SQLite ledger, request journal, `sim` meters) in front of
two `wattgate sim` engine processes. A steady open-loop load (`--rate` requests/s, a third
non-streamed, a tenth of the streams dropped by the client after the first chunk), and every
`--churn-s` one engine is SIGKILLed and restarted `--down-s` later. The gateway's RSS and open
file descriptors are read from /proc every `--sample-s`. After `--warmup-s` a least-squares
line is fitted to RSS over time. Targets: RSS slope under 1 MB/h, no error but the injected
ones (client drops; failures within a few seconds of an engine kill).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
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
from bench.soak_load import Engine, Tally, churn, load, sample
from bench.soak_procs import free_port, gateway_config, process, wait_http, wattgate

RESULTS = Path(__file__).resolve().parent / "results"
SLOPE_TARGET_MB_PER_H = 1.0
ENGINES = (("sim-bf16", "bf16"), ("sim-fp8", "fp8"))




def fit(samples: list[tuple[float, float, int]], warmup_s: float) -> dict[str, float]:
    """Slopes per hour of RSS (MB) and fds after the warm-up, with their ranges."""
    after = [s for s in samples if s[0] >= warmup_s]
    if len(after) < 3:
        return {}
    t_h = [s[0] / 3600.0 for s in after]
    rss = [s[1] for s in after]
    fds = [float(s[2]) for s in after]
    return {"rss_slope_mb_per_h": statistics.linear_regression(t_h, rss).slope,
            "fd_slope_per_h": statistics.linear_regression(t_h, fds).slope,
            "rss_min_mb": min(rss), "rss_max_mb": max(rss),
            "fd_min": min(fds), "fd_max": max(fds), "samples": float(len(after))}


async def soak(args: argparse.Namespace, work: Path) -> dict[str, Any]:
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
                wattgate("serve", "--config", str(work / "gateway.yaml"), "--log-level",
                         "warning"), glog) as gw:
            url = f"http://127.0.0.1:{port}"
            await asyncio.to_thread(wait_http, f"{url}/readyz", gw, 60)
            tally = Tally()
            samples: list[tuple[float, float, int]] = []
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
    stats = fit(samples, args.warmup_s)
    errors = sum(tally.errors.values())
    slope = stats.get("rss_slope_mb_per_h")
    return {
        "commit": commit(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "settings": {k: getattr(args, k) for k in
                     ("duration_s", "warmup_s", "rate", "churn_s", "down_s", "sample_s")},
        "sent": tally.sent, "ok": tally.ok, "client_disconnects": tally.disconnects,
        "engine_kills": len(tally.kills), "injected_errors": tally.injected_errors,
        "other_errors": dict(tally.errors), "gateway_alive": alive,
        "fit": stats, "samples": samples,
        "target_met": bool(alive and errors == 0 and slope is not None
                           and slope < SLOPE_TARGET_MB_PER_H),
    }


def markdown(res: dict[str, Any]) -> str:
    f, st = res["fit"], res["settings"]
    slope = f.get("rss_slope_mb_per_h")
    return f"""# Soak

`python -m bench.soak --duration-s {st['duration_s']:.0f}` on commit {res['commit']},
{res['machine']}: {st['rate']:.0f} requests/s offered, one engine of two SIGKILLed and
restarted every {st['churn_s']:.0f} s (down {st['down_s']:.0f} s), RSS and fds of the gateway
sampled every {st['sample_s']:.0f} s, line fitted after a {st['warmup_s']:.0f} s warm-up.

| | |
| --- | ---: |
| requests sent / ok | {res['sent']} / {res['ok']} |
| client disconnects (injected) | {res['client_disconnects']} |
| engine kills / errors within their windows (injected) | {res['engine_kills']} / {res['injected_errors']} |
| other errors | {sum(res['other_errors'].values())} {res['other_errors'] or ''} |
| RSS after warm-up, min-max | {f.get('rss_min_mb', 0):.1f}-{f.get('rss_max_mb', 0):.1f} MB |
| RSS slope after warm-up (target < {SLOPE_TARGET_MB_PER_H:g} MB/h) | {_num(slope, '+.2f')} MB/h |
| open fds after warm-up, min-max | {f.get('fd_min', 0):.0f}-{f.get('fd_max', 0):.0f} |
| fd slope after warm-up | {f.get('fd_slope_per_h', 0):+.1f} per h |
| target met | {'yes' if res['target_met'] else 'no'} |

![RSS and fds](soak.png)
"""


def _num(x: float | None, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s[0] / 60.0 for s in res["samples"]]
    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    a.plot(t, [s[1] for s in res["samples"]], lw=1)
    a.axvline(res["settings"]["warmup_s"] / 60.0, color="grey", ls="--", lw=0.8)
    a.set_ylabel("gateway RSS (MB)")
    b.plot(t, [s[2] for s in res["samples"]], lw=1, color="tab:orange")
    b.set_ylabel("open fds")
    b.set_xlabel("minutes")
    slope = res["fit"].get("rss_slope_mb_per_h")
    a.set_title("soak: " + ("no fit" if slope is None else f"RSS slope {slope:+.2f} MB/h"))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


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
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    q = args.quick
    for name, full, quick in (("duration_s", 1800.0, 40.0), ("warmup_s", 120.0, 10.0),
                              ("churn_s", 60.0, 12.0), ("sample_s", 5.0, 1.0),
                              ("progress_s", 30.0, 5.0)):
        if getattr(args, name) is None:
            setattr(args, name, quick if q else full)
    with tempfile.TemporaryDirectory(prefix="wattgate-soak-") as d:
        res = uvloop.run(soak(args, Path(d)))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2))
    (args.out / "soak.md").write_text(markdown(res))
    plot(res, args.out / "soak.png")
    print(markdown(res))
    return 0 if res["target_met"] or q else 1


if __name__ == "__main__":
    sys.exit(main())
