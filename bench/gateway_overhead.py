"""Gateway overhead: a fast engine directly and behind wattgate, nginx and vllm-router, side by side.

    python -m bench.gateway_overhead            # full: 5 interleaved runs per cell (wall time
                                                # printed first, ~26 min on 2 cores)
    python -m bench.gateway_overhead --runs 3   # fewer runs per cell
    python -m bench.gateway_overhead --quick    # smoke: 1 short run per cell, ~2 min
    python -m bench.gateway_overhead --profile  # py-spy profile of wattgate, c=1 and c=64 streaming

`wattgate` is the gateway as users run it (bench/overhead/configs.py): `vllm` engines whose
/metrics are scraped, least_load, two aliases over four endpoints, accounting on; beside it the
same without accounting and a lean configuration. The engine (bench/overhead/fast_engine.c,
compiled here, one process on four ports) and the load client (wrk) share core 0; the proxy
under test has core 1. Cells: streaming 16 events (separate writes / one write) and
non-streaming, at c=1, 16, 64; each cell's requests alternate the two aliases and, for streams,
clients that do and that do not ask for usage. Runs are interleaved (run 1 of every cell, then
run 2, ...) with the target order rotated each run, so drift on a shared machine spreads over
all targets. The full run writes bench/results/gateway_overhead.{json,md}; see bench/README.md.
"""

from __future__ import annotations

import argparse
import http.client
import importlib.metadata
import itertools
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.overhead import report
from bench.overhead.measure import BODIES, PATH, run_wrk
from bench.overhead.profile import profile
from bench.overhead.targets import (
    API_KEY,
    BENCH_VENV,
    REPO,
    STARTERS,
    Target,
    ensure_tools,
    fleet,
    log,
    nginx_bin,
)

PROXIES = tuple(STARTERS)
ACCOUNTING_TARGETS = report.HEADLINES  # their runs are followed by the settle window
RESULTS = REPO / "bench" / "results"
TOKEN_EVENT = b'"text":" tok"'
USAGE_CHUNK = b'"usage":{'
# What a wrk run costs beyond its duration (start, connect, report), and starting the fleet
# (vllm-router takes the longest): for the wall-time estimate printed before a run.
WRK_OVERHEAD_S = 0.2
STARTUP_S = 15.0


def _post(url: str, body: bytes) -> tuple[int, bytes]:
    host_port = url.removeprefix("http://")
    conn = http.client.HTTPConnection(host_port, timeout=10)
    try:
        conn.request("POST", PATH, body=body, headers={"Content-Type": "application/json",
                                                       "Authorization": f"Bearer {API_KEY}"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _check_answer(name: str, mode: str, body: bytes, status: int, data: bytes) -> None:
    """Raises unless the answer is a full one: 16 token events and [DONE] for a stream, with a
    usage chunk exactly when the client asked for it; usage with 16 tokens otherwise."""
    if status != 200:
        raise RuntimeError(f"{name} {mode}: HTTP {status}: {data[:200]!r}")
    if mode == "nonstream":
        if orjson.loads(data).get("usage", {}).get("completion_tokens") != 16:
            raise RuntimeError(f"{name} {mode}: unexpected body {data[:200]!r}")
        return
    events, usage = data.count(TOKEN_EVENT), data.count(USAGE_CHUNK)
    wanted = 1 if b"include_usage" in body else 0
    if events != 16 or b"data: [DONE]" not in data or usage != wanted:
        raise RuntimeError(f"{name} {mode} {body!r}: {events} token events, {usage} usage "
                           f"chunks (wanted {wanted}), body {data[:300]!r}")


def preflight(targets: list[Target]) -> list[str]:
    """Every target answers every body of every mode correctly; notes whether the streamed bytes
    equal the direct path's. Raises on a wrong answer."""
    notes = []
    direct: dict[tuple[str, int], bytes] = {}
    for target in targets:
        for mode, bodies in BODIES.items():
            same = []
            for i, body in enumerate(bodies):
                status, data = _post(target.url, body)
                _check_answer(target.name, mode, body, status, data)
                if target.name == "direct":
                    direct[(mode, i)] = data
                elif mode != "nonstream":
                    same.append(data == direct[(mode, i)])
            if same:
                identical = "byte-identical to" if all(same) else "differs from"
                notes.append(f"{target.name} {mode}: 16 token events + [DONE], a usage chunk "
                             f"only for the clients that asked, stream {identical} the direct "
                             "path")
    return notes


def _version(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except OSError:
        return "?"
    text = (out.stdout + out.stderr).strip().splitlines()
    return text[0] if text else "?"


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def meta(args: argparse.Namespace) -> dict[str, Any]:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    commit = _version(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    router = _version([str(BENCH_VENV / "bin" / "python"), "-c",
                       "import importlib.metadata as m; print(m.version('vllm-router'))"])
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit, "quick": args.quick, "runs": args.runs, "duration_s": args.duration,
        "settle_s": args.settle,
        "connections": args.connections, "cpu": cpu, "cpus": os.cpu_count(),
        "kernel": f"Linux {platform.release()}",
        "loadavg": _loadavg(),
        "versions": {
            "python": platform.python_version(),
            "aiohttp": importlib.metadata.version("aiohttp"),
            "uvloop": importlib.metadata.version("uvloop"),
            "httptools": importlib.metadata.version("httptools"),
            "nginx": _version([nginx_bin(), "-v"]).rsplit("/", 1)[-1],
            "wrk": _version(["wrk", "-v"]).split()[1] if _version(["wrk", "-v"]) != "?" else "?",
            "vllm-router": router,
        },
    }


def bench(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    info = meta(args)
    with fleet(workdir, args.targets) as targets:
        notes = preflight(targets)
        for note in notes:
            log(note)
        engine_pids = targets[0].pids
        log("warm-up")
        for target, mode in itertools.product(targets, args.modes):
            run_wrk(target.url, mode, 16, args.warmup, target.cpu_pids, engine_pids)
        raw: list[dict[str, Any]] = []
        cells = [(m, c) for m in args.modes for c in args.connections]
        total = args.runs * len(cells) * len(targets)
        started = time.monotonic()
        for run in range(args.runs):
            for index, (mode, conns) in enumerate(cells):
                # Rotate who goes first so slow drift on the shared machine hits all alike.
                shift = (run + index) % len(targets)
                for target in targets[shift:] + targets[:shift]:
                    # Only accounting defers work past the response.
                    settle = args.settle if target.accounting else 0.0
                    res = run_wrk(target.url, mode, conns, args.duration, target.cpu_pids,
                                  engine_pids, settle_s=settle)
                    raw.append({"run": run, "mode": mode, "connections": conns,
                                "target": target.name, "requests": res.requests,
                                "duration_s": res.duration_s, "rps": res.rps,
                                "p50_ms": res.p50_ms, "p99_ms": res.p99_ms, "errors": res.errors,
                                "proxy_cpu_s": res.proxy_cpu_s, "engine_cpu_s": res.engine_cpu_s,
                                "client_cpu_s": res.client_cpu_s, "settled_s": res.settled_s,
                                "proxy_cpu_us_per_req": res.proxy_cpu_us_per_req,
                                "core0_busy": res.core0_busy})
                    done = len(raw)
                    eta = (time.monotonic() - started) / done * (total - done)
                    log(f"[{done}/{total}] run {run + 1} {mode} c={conns} {target.name}: "
                        f"{res.rps:,.0f} req/s p50 {res.p50_ms:.3f} ms p99 {res.p99_ms:.3f} ms "
                        f"cpu {res.proxy_cpu_us_per_req:.0f} us/req err {res.errors} "
                        f"(eta {eta:.0f} s)")
    summary = report.summarise(raw)
    info["loadavg_end"] = _loadavg()
    return {"meta": info, "preflight": notes, "summary": summary,
            "checks": report.checks(summary, raw), "raw": raw}


def planned_wall_s(args: argparse.Namespace) -> float:
    """About how long the run takes: every run of every cell for every target (and the direct
    path), the settle window after the accounting gateway's runs, the warm-up and the start."""
    targets = len(args.targets) + 1
    settles = sum(1 for name in args.targets if name in ACCOUNTING_TARGETS)
    cells = len(args.modes) * len(args.connections)
    per_cell = targets * (args.duration + WRK_OVERHEAD_S) + settles * args.settle
    warmup = targets * len(args.modes) * (args.warmup + WRK_OVERHEAD_S)
    return float(args.runs * cells * per_cell + warmup + STARTUP_S)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.gateway_overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 run of 1 s per cell (smoke check)")
    p.add_argument("--runs", type=int, default=None,
                   help="interleaved runs per cell (5; --quick: 1); the spread is over these")
    p.add_argument("--duration", type=int, default=None, help="whole seconds per run (4)")
    p.add_argument("--settle", type=float, default=4.0,
                   help="seconds after each run of the accounting gateway still counted in "
                        "its CPU, so deferred work is charged to the run that caused it: "
                        "accounting apportions an interval settle_s (2 s) after it ends; "
                        "longer while its processes still work (up to 30 s more)")
    p.add_argument("--connections", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--modes", nargs="+", default=list(report.MODES), choices=report.MODES)
    p.add_argument("--targets", nargs="+", default=list(PROXIES), choices=PROXIES)
    p.add_argument("--install", action="store_true",
                   help="apt-get/pip install missing tools (wrk, nginx, vllm-router, py-spy)")
    p.add_argument("--out-dir", type=Path, default=None,
                   help="where JSON + Markdown go (bench/results; --quick: a temp dir)")
    p.add_argument("--profile", action="store_true",
                   help="profile a wattgate target (--profile-target) with py-spy (native "
                   "frames too) instead")
    p.add_argument("--profile-target", default="wattgate",
                   choices=[t for t in PROXIES if t.startswith("wattgate")],
                   help="the wattgate configuration --profile samples")
    p.add_argument("--profile-seconds", type=float, default=10.0)
    p.add_argument("--profile-mode", default="stream16", choices=report.MODES,
                   help="load shape while profiling")
    p.add_argument("--profile-connections", type=int, nargs="+", default=[1, 64],
                   help="connections while profiling, one profile each")
    p.add_argument("--top", type=int, default=25, help="frames to list in --profile")
    args = p.parse_args(argv)
    args.runs = args.runs or (1 if args.quick else 5)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    if args.quick:
        args.settle = min(args.settle, 0.5)
    args.duration = args.duration or (1 if args.quick else 4)
    args.warmup = 1.0  # wrk takes whole seconds
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.cpu_count() is None or os.cpu_count() < 2:  # type: ignore[operator]
        raise SystemExit("needs at least 2 CPUs (engine+client on core 0, proxy on core 1)")
    if not args.profile:
        wall_s = planned_wall_s(args)
        log(f"this run takes about {wall_s / 60:.0f} min ({wall_s:.0f} s): {args.runs} run(s) x "
            f"{len(args.modes) * len(args.connections)} cells x {len(args.targets) + 1} targets "
            f"x {args.duration} s, plus {args.settle:g} s settle after each accounting run")
    ensure_tools(args.install)
    workdir = Path(tempfile.mkdtemp(prefix="wattgate-bench-"))
    log(f"work dir {workdir}")
    if args.profile:
        profile(args, workdir)
        return 0
    result = bench(args, workdir)
    out_dir = args.out_dir or (workdir if args.quick else RESULTS)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gateway_overhead.json").write_bytes(
        orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    md = report.markdown(result)
    (out_dir / "gateway_overhead.md").write_text(md)
    print(md)
    log(f"wrote {out_dir / 'gateway_overhead.json'} and {out_dir / 'gateway_overhead.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
