"""One measured load run: wrk (pinned beside the engine) against one target, with CPU accounting.

Proxy CPU is utime+stime of the proxy's processes from /proc/PID/stat, read before the run and
at least `settle_s` after it ends, and then only once the proxy is quiet (under QUIET_SHARE of a
core over QUIET_WINDOW_S, for at most SETTLE_MAX_S more), so work a proxy defers past the
response (wattgate's accounting child records and apportions in the core's idle time, and
apportions each 1-s interval once it has closed) is charged to the run whose requests caused
it, not to whichever run comes next; idle CPU in that window is charged too. The load client's CPU
comes from wait4's rusage; the engine's like the proxy's.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.overhead.targets import API_KEY, ENGINE_CORE, HERE, log

CLK_TCK = os.sysconf("SC_CLK_TCK")
QUIET_SHARE = 0.05  # a proxy using less of a core than this has no deferred work left
QUIET_WINDOW_S = 0.5
SETTLE_MAX_S = 30.0
PATH = "/v1/completions"

MODELS = ("m", "m2")  # the two aliases of the gateway's user configuration
PROMPTS = {"stream16": "split", "stream16_burst": "burst", "nonstream": "plain"}


def _bodies(mode: str) -> tuple[bytes, ...]:
    """The request bodies of one cell, sent in turn: both aliases, and for streams clients that
    do and that do not ask for usage. One that does not is the path most OpenAI clients take:
    the gateway forces include_usage upstream and strips the usage chunk. The engine sends the
    16 events in one write when the prompt says "burst"."""
    out = []
    for i in range(4 if mode != "nonstream" else 2):
        body: dict[str, object] = {"model": MODELS[i % 2], "prompt": PROMPTS[mode], "max_tokens": 16}
        if mode != "nonstream":
            body["stream"] = True
            if i // 2:
                body["stream_options"] = {"include_usage": True}
        out.append(orjson.dumps(body))
    return tuple(out)


BODIES = {mode: _bodies(mode) for mode in PROMPTS}


@dataclass(frozen=True, slots=True)
class RunResult:
    requests: int
    duration_s: float
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    proxy_cpu_s: float
    engine_cpu_s: float
    client_cpu_s: float
    settled_s: float = 0.0  # seconds waited after the run before the proxy's CPU was read

    @property
    def proxy_cpu_us_per_req(self) -> float:
        return self.proxy_cpu_s * 1e6 / self.requests if self.requests else float("nan")

    @property
    def core0_busy(self) -> float:
        """Share of the engine+client core in use: near 1.0 means they, not the proxy, limit."""
        return (self.engine_cpu_s + self.client_cpu_s) / self.duration_s if self.duration_s else 0.0


def cpu_s(pids: list[int]) -> float:
    """utime+stime of the given processes and of their children that have exited, in seconds
    (processes that are gone count 0). With every live process of a tree given, the sum does
    not drop when a child exits: its time moves to its parent's cutime/cstime."""
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # utime, stime, cutime, cstime: fields 14-17 of stat
        ticks += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    return ticks / CLK_TCK


def run_wrk(url: str, mode: str, connections: int, duration_s: float,
            proxy_pids: Callable[[], list[int]], engine_pids: list[int], settle_s: float = 0.0
            ) -> RunResult:
    """One wrk run, bounded by duration (and a hard timeout); raises on a failed run.
    `proxy_pids` gives the proxy's live processes; it is asked before and after the run, so a
    child the proxy starts (or restarts) meanwhile is charged to it too."""
    env = {**os.environ, "BENCH_BODIES": b"\n".join(BODIES[mode]).decode(), "BENCH_API_KEY": API_KEY}
    cmd = ["taskset", "-c", ENGINE_CORE, "wrk", "-t1", f"-c{connections}",
           f"-d{max(1, round(duration_s))}s", "--timeout", "5s", "-s", str(HERE / "post.lua"), url + PATH]
    proxy0, engine0 = cpu_s(proxy_pids()), cpu_s(engine_pids)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + duration_s + 20
    status, rusage = 0, None
    while time.monotonic() < deadline:
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(0.05)
    else:
        proc.kill()
        proc.wait()
        raise TimeoutError(f"wrk against {url} ran past {duration_s + 20:.0f} s")
    settled_s = _settle(proxy_pids, settle_s) if settle_s > 0 else 0.0
    proxy1, engine1 = cpu_s(proxy_pids()), cpu_s(engine_pids)
    assert proc.stdout is not None
    out = proc.stdout.read().decode(errors="replace")
    proc.stdout.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    line = next((ln for ln in out.splitlines() if ln.startswith("BENCH_JSON ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {out[-500:]}")
    r = orjson.loads(line.removeprefix("BENCH_JSON "))
    duration = r["duration_us"] / 1e6
    errors = sum(r[k] for k in ("err_connect", "err_read", "err_write", "err_status", "err_timeout"))
    assert rusage is not None
    return RunResult(requests=r["requests"], duration_s=duration,
                     rps=r["requests"] / duration if duration else 0.0,
                     p50_ms=r["p50_us"] / 1000, p99_ms=r["p99_us"] / 1000, errors=errors,
                     proxy_cpu_s=proxy1 - proxy0, engine_cpu_s=engine1 - engine0,
                     client_cpu_s=rusage.ru_utime + rusage.ru_stime, settled_s=settled_s)


def _settle(proxy_pids: Callable[[], list[int]], settle_s: float) -> float:
    """Wait `settle_s`, then until the proxy is quiet (at most SETTLE_MAX_S more); returns
    the seconds waited."""
    t0 = time.monotonic()
    time.sleep(settle_s)
    before = cpu_s(proxy_pids())
    while True:
        if time.monotonic() - t0 >= settle_s + SETTLE_MAX_S:
            log(f"the proxy was still busy {SETTLE_MAX_S:g} s after --settle: its CPU is read "
                f"anyway (idle cost above {QUIET_SHARE:.0%} of a core, or work deferred longer)")
            break
        time.sleep(QUIET_WINDOW_S)
        now = cpu_s(proxy_pids())
        # A drop (a process left the tree before its time reached a parent) is not quiet
        if 0.0 <= now - before < QUIET_SHARE * QUIET_WINDOW_S:
            break
        before = now
    return time.monotonic() - t0
