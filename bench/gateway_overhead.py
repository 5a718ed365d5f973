"""Gateway overhead: a fast engine directly and behind wattgate, nginx and vllm-router, side by side.

    python -m bench.gateway_overhead            # full: 5 interleaved runs per cell, ~15 min
    python -m bench.gateway_overhead --quick    # smoke: 1 short run per cell, ~1 min
    python -m bench.gateway_overhead --profile  # py-spy profile of wattgate at c=64 streaming
                                                # (--profile-connections 1: at c=1)

The engine (bench/overhead/fast_engine.c, compiled here) and the load client (wrk) share core 0;
the proxy under test has core 1. Cells: streaming 16 events (separate writes / one write) and
non-streaming, at c=1, 16, 64. Runs are interleaved (run 1 of every cell, then run 2, ...) with
the target order rotated each run, so drift on a shared machine spreads over all targets. The
full run writes bench/results/gateway_overhead.{json,md}; see bench/README.md.
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
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from bench.overhead import report
from bench.overhead.measure import BODIES, PATH, run_wrk
from bench.overhead.targets import (
    API_KEY,
    BENCH_VENV,
    ENGINE_CORE,
    REPO,
    Target,
    ensure_tools,
    fleet,
    log,
    nginx_bin,
)

PROXIES = ("wattgate", "wattgate-noacct", "nginx", "vllm-router", "aiohttp-naive")
RESULTS = REPO / "bench" / "results"
TOKEN_EVENT = b'"text":" tok"'


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


def preflight(targets: list[Target]) -> list[str]:
    """Every target answers every mode correctly (16 token events, [DONE], no unasked-for usage
    chunk); notes whether streamed bytes equal the direct path's. Raises on a wrong answer."""
    notes = []
    direct: dict[str, bytes] = {}
    for target in targets:
        for mode, body in BODIES.items():
            status, data = _post(target.url, body)
            if status != 200:
                raise RuntimeError(f"{target.name} {mode}: HTTP {status}: {data[:200]!r}")
            if mode == "nonstream":
                usage = orjson.loads(data).get("usage", {})
                if usage.get("completion_tokens") != 16:
                    raise RuntimeError(f"{target.name} {mode}: unexpected body {data[:200]!r}")
                continue
            events = data.count(TOKEN_EVENT)
            if events != 16 or b"data: [DONE]" not in data or b'"usage"' in data:
                raise RuntimeError(f"{target.name} {mode}: {events} token events, body "
                                   f"{data[:300]!r}")
            if target.name == "direct":
                direct[mode] = data
            else:
                same = "byte-identical to" if data == direct[mode] else "differs from"
                notes.append(f"{target.name} {mode}: 16 token events + [DONE], no usage chunk, "
                             f"stream {same} the direct path")
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
            run_wrk(target.url, mode, 16, args.warmup, target.pids, engine_pids)
        raw: list[dict[str, Any]] = []
        cells = [(m, c) for m in args.modes for c in args.connections]
        total = args.runs * len(cells) * len(targets)
        started = time.monotonic()
        for run in range(args.runs):
            for index, (mode, conns) in enumerate(cells):
                # Rotate who goes first so slow drift on the shared machine hits all alike.
                shift = (run + index) % len(targets)
                for target in targets[shift:] + targets[:shift]:
                    # Only wattgate defers work past the response (its accounting).
                    settle = args.settle if target.name.startswith("wattgate") else 0.0
                    res = run_wrk(target.url, mode, conns, args.duration, target.pids, engine_pids,
                                  settle_s=settle)
                    raw.append({"run": run, "mode": mode, "connections": conns,
                                "target": target.name, "requests": res.requests,
                                "duration_s": res.duration_s, "rps": res.rps,
                                "p50_ms": res.p50_ms, "p99_ms": res.p99_ms, "errors": res.errors,
                                "proxy_cpu_s": res.proxy_cpu_s, "engine_cpu_s": res.engine_cpu_s,
                                "client_cpu_s": res.client_cpu_s,
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
            "checks": report.checks(summary), "raw": raw}


def profile(args: argparse.Namespace, workdir: Path) -> None:
    """py-spy record of the gateway while wrk drives load (c=64 unless told); prints the top
    frames."""
    py_spy = BENCH_VENV / "bin" / "py-spy"
    out = workdir / "wattgate.pyspy.txt"
    with fleet(workdir, ["wattgate"]) as targets:
        gw, engine_pids = targets[1], targets[0].pids
        assert gw.proc is not None
        load = threading.Thread(target=run_wrk, args=(gw.url, args.profile_mode,
                                                      args.profile_connections,
                                                      args.profile_seconds + 3, gw.pids,
                                                      engine_pids))
        load.start()
        time.sleep(1.0)
        log(f"py-spy recording wattgate pid {gw.pids[0]} for {args.profile_seconds:g} s")
        subprocess.run(["taskset", "-c", ENGINE_CORE, str(py_spy), "record", "--pid",
                        str(gw.pids[0]), "--rate", "250", "--duration",
                        str(int(args.profile_seconds)), "--format", "raw", "--nonblocking",
                        "--output", str(out)], check=True, timeout=args.profile_seconds + 60,
                       stdout=subprocess.DEVNULL)
        load.join(timeout=args.profile_seconds + 30)
    print(summarise_profile(out.read_text(), args.top))


def _function(frame: str) -> str:
    """`f (path/file.py:123)` -> `f (path/file.py)`: line numbers split one function apart."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if where else name


def _area(frame: str) -> str:
    for key, area in (("gateway/", "gateway"), ("aiohttp/client", "aiohttp client"),
                      ("aiohttp/web", "aiohttp server"), ("aiohttp/", "aiohttp other"),
                      ("prometheus_client", "prometheus_client"), ("asyncio/runners", "event loop (C)"),
                      ("asyncio/", "asyncio"), ("multidict", "multidict"), ("yarl", "yarl")):
        if key in frame:
            return area
    return "other"


def summarise_profile(raw: str, top: int) -> str:
    """Self time by area and by function, inclusive time of gateway functions, from py-spy's raw
    (collapsed) stacks."""
    self_fn: Counter[str] = Counter()
    self_area: Counter[str] = Counter()
    incl_fn: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [_function(f) for f in stack.split(";")[1:]]  # drop the process frame
        n = int(count)
        total += n
        if frames:
            self_fn[frames[-1]] += n
            self_area[_area(stack.split(";")[-1])] += n
        for frame in set(frames):
            incl_fn[frame] += n
    lines = [f"py-spy: {total} samples", "", "Self time by area"]
    lines += [f"  {100 * n / total:5.1f}%  {a}" for a, n in self_area.most_common()]
    lines += ["", "Top self time by function"]
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in self_fn.most_common(top)]
    lines += ["", "Inclusive time of gateway/ functions"]
    gateway = [(f, n) for f, n in incl_fn.most_common() if "gateway/" in f]
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in gateway[:top]]
    lines += ["", "Inclusive time of aiohttp entry points"]
    aio = [(f, n) for f, n in incl_fn.most_common() if "aiohttp/" in f]
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in aio[:12]]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.gateway_overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 run of 1 s per cell (smoke check)")
    p.add_argument("--runs", type=int, default=None, help="interleaved runs per cell (5)")
    p.add_argument("--duration", type=int, default=None, help="whole seconds per run (4)")
    p.add_argument("--settle", type=float, default=4.0,
                   help="seconds after each wattgate run still counted in its CPU, so deferred "
                        "work is charged to the run that caused it: accounting apportions an "
                        "interval settle_s (2 s) after it ends, polling every 0.25 s")
    p.add_argument("--connections", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--modes", nargs="+", default=list(report.MODES), choices=report.MODES)
    p.add_argument("--targets", nargs="+", default=list(PROXIES), choices=PROXIES)
    p.add_argument("--install", action="store_true",
                   help="apt-get/pip install missing tools (wrk, nginx, vllm-router, py-spy)")
    p.add_argument("--out-dir", type=Path, default=None,
                   help="where JSON + Markdown go (bench/results; --quick: a temp dir)")
    p.add_argument("--profile", action="store_true", help="profile wattgate with py-spy instead")
    p.add_argument("--profile-seconds", type=float, default=10.0)
    p.add_argument("--profile-mode", default="stream16", choices=report.MODES,
                   help="load shape while profiling")
    p.add_argument("--profile-connections", type=int, default=64,
                   help="connections while profiling")
    p.add_argument("--top", type=int, default=25, help="frames to list in --profile")
    args = p.parse_args(argv)
    args.runs = args.runs or (1 if args.quick else 5)
    if args.quick:
        args.settle = min(args.settle, 0.5)
    args.duration = args.duration or (1 if args.quick else 4)
    args.warmup = 1.0  # wrk takes whole seconds
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.cpu_count() is None or os.cpu_count() < 2:  # type: ignore[operator]
        raise SystemExit("needs at least 2 CPUs (engine+client on core 0, proxy on core 1)")
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
