"""Where the gateway's time goes under load: py-spy (native frames too) and the kernel's count.

py-spy samples the gateway's processes (the server and the apportioner child) with native
stacks, so time inside uvloop/libuv, httptools/llhttp, the C parts of aiohttp and libc's
syscall wrappers is seen as such, not charged to the Python frame that called them. py-spy
samples every thread on the wall clock; a sample blocked in a wait (a lock, a condition, the
GIL, epoll with nothing ready, fsync) is counted apart as off-CPU, and the rest is split by
process and thread, then by area of the innermost frame; inclusive time is listed for
wattgate's own functions. User against system CPU of the
gateway's processes over the same window (from /proc) gives the kernel's share, which no
profiler of the process sees. Native sampling stops the process for each sample, so rates
under profile are lower than in the benchmark.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

from bench.overhead.measure import CLK_TCK, run_wrk
from bench.overhead.targets import BENCH_VENV, ENGINE_CORE, fleet, log

OURS = ("gateway/", "wire/", "engines/", "wattgate_cli")
# (substring of a frame's location, area); the first match wins, Python frames first
PY_AREAS = (("aiohttp/", "aiohttp (Python)"), ("asyncio/", "asyncio (Python)"),
            ("prometheus_client", "prometheus_client (Python)"))
NATIVE_AREAS = (
    (("gc_collect",), "garbage collector (C)"),
    (("loop.c", "core.c", "linux.c", "stream.c", "tcp.c", "loop-watcher.c", "uv-common.c",
      "timer.c", "queue.h", "handles/"), "uvloop/libuv (C)"),
    (("llhttp", "parser.c", "api.c", "http.c", "httptools"), "httptools/llhttp (C)"),
    (("_http_parser", "_http_writer", "multidict", "yarl", "propcache", "frozenlist"),
     "aiohttp C extensions"),
    (("orjson",), "orjson"),
    (("libc.so", "libpthread"), "libc (syscall wrappers)"),
    (("_asynciomodule.c",), "asyncio (C)"),
    (("_sqlite", "sqlite3"), "sqlite"),
    (("libpython", "ceval.c", "object.h"), "CPython interpreter (C)"),
)
# a sample whose stack holds one of these is waiting, not running
WAITS = ("pthread_cond_wait", "pthread_cond_timedwait", "PyThread_acquire_lock_timed", "take_gil",
         "epoll_wait", "epoll_pwait", "sem_wait", "sem_timedwait", "os_fsync", "fdatasync",
         "select (", "poll (", "nanosleep", "clock_nanosleep")
FRAME = re.compile(r"^(?P<name>.*) \((?P<where>[^()]*)\)$")


def _where(frame: str) -> str:
    m = FRAME.match(frame)
    return m.group("where") if m else ""


def _function(frame: str) -> str:
    """`f (path/file.py:123)` -> `f (path/file.py)`: line numbers split one function apart."""
    m = FRAME.match(frame)
    if not m:
        return frame
    return f"{m.group('name')} ({m.group('where').rsplit(':', 1)[0]})"


def _is_ours(frame: str) -> bool:
    where = _where(frame)
    return where.split(":", 1)[0].endswith(".py") and any(k in where for k in OURS)


def area(frame: str) -> str:
    """The area that spends a sample whose innermost frame is `frame`."""
    where = _where(frame)
    if where.startswith(("<string>", "<frozen")):
        return "generated Python (dataclass __init__) and importlib"
    if where.split(":", 1)[0].endswith(".py"):
        if any(k in where for k in OURS):
            return "wattgate (Python)"
        return next((a for k, a in PY_AREAS if k in where), "other Python (stdlib, libraries)")
    for keys, name in NATIVE_AREAS:
        if any(k in frame for k in keys):  # the name too: gc_collect_main is in libpython
            return name
    return "other C (stdlib modules, OpenSSL)"


def _lines(title: str, counts: Counter[str], total: int, top: int) -> list[str]:
    return ["", title] + [f"  {100 * n / total:5.1f}%  {k}" for k, n in counts.most_common(top)]


def _where_running(processes: list[str], frames: list[str]) -> str:
    """Which process and thread a sample belongs to: the server's event loop, its other
    threads (journal, ledger writer), or the apportioner child."""
    if processes and " apportioner " in processes[-1]:
        return "apportioner process"
    if any("uv_run" in f or "run_forever" in f for f in frames):
        return "server, event-loop thread"
    return "server, other threads"


def summarise_profile(raw: str, top: int) -> str:
    """From py-spy's raw (collapsed) stacks: running samples by process and thread; for the
    server process, self time by area and by function and inclusive time of wattgate's
    functions; the apportioner's top functions."""
    by: dict[str, Counter[str]] = {k: Counter() for k in (
        "running", "waiting", "area", "self", "ours", "apportioner")}
    server = under_ours = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        parts = stack.split(";")
        frames = [f for f in parts if not f.startswith("process ")]
        if not frames or not count.isdigit():
            continue
        n = int(count)
        place = _where_running([f for f in parts if f.startswith("process ")], frames)
        if any(w in f for f in frames for w in WAITS):
            by["waiting"][place] += n
            continue
        by["running"][place] += n
        if place == "apportioner process":
            by["apportioner"][_function(frames[-1])] += n
            continue
        server += n
        by["self"][_function(frames[-1])] += n
        by["area"][area(frames[-1])] += n
        ours = {_function(f) for f in frames if _is_ours(f)}
        under_ours += n if ours else 0
        for fn in ours:
            by["ours"][fn] += n
    running = sum(by["running"].values())
    if not server:
        return "py-spy: no running samples of the server"
    lines = [f"py-spy: {running} running samples ({sum(by['waiting'].values())} waiting, left "
             f"out); of the server's, {100 * under_ours / server:.1f}% with a wattgate frame "
             "on the stack"]
    lines += _lines("Running samples by process and thread", by["running"], running, 5)
    lines += _lines("Server: self time by area", by["area"], server, 20)
    lines += _lines("Server: top self time by function", by["self"], server, top)
    lines += _lines("Server: inclusive time of wattgate's functions", by["ours"], server, top)
    apportioner = sum(by["apportioner"].values())
    if apportioner:
        lines += _lines("Apportioner process: top self time by function", by["apportioner"],
                        apportioner, 8)
    return "\n".join(lines)


def _cpu_split(pids: list[int]) -> tuple[float, float]:
    """(user, system) CPU seconds of the processes."""
    user = system = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        user, system = user + int(fields[11]), system + int(fields[12])
    return user / CLK_TCK, system / CLK_TCK


def _thread_cpu(pids: list[int]) -> dict[str, float]:
    """CPU seconds so far of each thread of the processes, keyed by process and thread
    (py-spy's native sampling is skewed by the stops it makes; the kernel's count is not)."""
    out: dict[str, float] = {}
    for pid in pids:
        try:
            proc = Path(f"/proc/{pid}/comm").read_text().strip()
            tids = [p.name for p in Path(f"/proc/{pid}/task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            try:
                name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
                fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            role = "main thread" if tid == str(pid) else f"thread {tid}"
            key = f"{pid} {proc} {role} ({name})"
            out[key] = out.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def _cpu_lines(before: dict[str, float], after: dict[str, float], requests: float) -> str:
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    lines = ["CPU by process/thread over the window (/proc, no profiler stops in it):"]
    for key, s in sorted(delta.items(), key=lambda kv: -kv[1]):
        if s > 0:
            lines.append(f"  {s:7.2f} s  {1e6 * s / max(requests, 1):7.0f} us/req  {key}")
    return "\n".join(lines)


def profile(args: argparse.Namespace, workdir: Path) -> None:
    """First the kernel's count of CPU per process and thread of the gateway under load (no
    profiler attached), then a py-spy record, once per connection count; prints each summary
    with the window's user/system CPU split."""
    py_spy = BENCH_VENV / "bin" / "py-spy"
    name = args.profile_target
    with fleet(workdir, [name]) as targets:
        gw, engine_pids = targets[1], targets[0].pids
        for conns in args.profile_connections:
            run_wrk(gw.url, args.profile_mode, conns, 1, gw.cpu_pids, engine_pids)  # warm-up
            pids = gw.cpu_pids()
            before = _thread_cpu(pids)
            clean = run_wrk(gw.url, args.profile_mode, conns, int(args.profile_seconds),
                            gw.cpu_pids, engine_pids)
            time.sleep(args.settle)  # deferred work (settlement, apportioning) of the window
            requests = clean.requests
            print(f"\n=== {name} {args.profile_mode} c={conns}, unprofiled: {requests} "
                  f"requests in {args.profile_seconds:g} s ===")
            print(_cpu_lines(before, _thread_cpu(gw.cpu_pids()), requests))
            out = workdir / f"{name}-c{conns}.pyspy.txt"
            load = threading.Thread(target=run_wrk, args=(
                gw.url, args.profile_mode, conns, args.profile_seconds + 3, gw.cpu_pids,
                engine_pids))
            load.start()
            time.sleep(1.0)
            pids = gw.cpu_pids()
            log(f"py-spy recording {name} pids {pids} for {args.profile_seconds:g} s at c={conns}")
            user0, sys0 = _cpu_split(pids)
            subprocess.run(["taskset", "-c", ENGINE_CORE, str(py_spy), "record", "--pid",
                            str(pids[0]), "--subprocesses", "--native", "--rate", "250",
                            "--duration", str(int(args.profile_seconds)), "--format", "raw",
                            "--output", str(out)], check=True,
                           timeout=args.profile_seconds + 60, stdout=subprocess.DEVNULL)
            user1, sys1 = _cpu_split(pids)
            load.join(timeout=args.profile_seconds + 30)
            user, system = user1 - user0, sys1 - sys0
            print(f"\n=== {name} {args.profile_mode} c={conns}: gateway CPU over the window "
                  f"{user + system:.2f} s, of which kernel (system) "
                  f"{100 * system / max(user + system, 1e-9):.0f}% ===")
            print(summarise_profile(out.read_text(), args.top))
