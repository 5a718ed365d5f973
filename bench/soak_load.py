"""The soak benchmark's moving parts: a steady open-loop load with client disconnects, engine
churn (SIGKILL and restart of a `wattgate sim` process), and /proc samples of the gateway and
its accounting child."""

from __future__ import annotations

import asyncio
import math
import os
import random
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import aiohttp
import orjson

from bench.soak_procs import MODEL, api_key, spawn, stop, wait_http, wattgate

DISCONNECT_SHARE = 0.1  # requests whose client closes the stream after its first chunk
INJECTED_GRACE_S = 3.0  # an error this close to an engine kill is the kill's doing


@dataclass
class Tally:
    sent: int = 0
    ok: int = 0
    disconnects: int = 0  # injected: the client went away mid-stream, on purpose
    injected_errors: int = 0  # failed within INJECTED_GRACE_S of an engine kill
    errors: Counter[str] = field(default_factory=Counter)  # any other failure, by kind
    # (killed, restarted) monotonic times of engine kills; restarted is inf while it is down
    kills: list[tuple[float, float]] = field(default_factory=list)

    def near_kill(self, t: float) -> bool:
        return any(k0 - 0.5 <= t <= k1 + INJECTED_GRACE_S for k0, k1 in self.kills)


@dataclass
class Engine:
    name: str
    port: int
    precision: str
    log: IO[bytes]
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        cmd = wattgate("sim", "--gpu", "h100", "--model", MODEL, "--precision", self.precision,
                       "--port", str(self.port), "--served-model-name", MODEL)
        self.proc = spawn(cmd, self.log)
        wait_http(f"{self.url}/health", self.proc, 60)

    def kill(self) -> None:
        if self.proc is not None:
            stop(self.proc, signal.SIGKILL)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)


async def one_request(s: aiohttp.ClientSession, gw: str, n: int, rnd: random.Random,
                      tally: Tally) -> None:
    stream = n % 3 != 0
    disconnect = stream and rnd.random() < DISCONNECT_SHARE
    body = {"model": MODEL, "prompt": "soak " * rnd.randint(8, 64),
            "max_tokens": rnd.randint(4, 48), "stream": stream}
    tally.sent += 1
    headers = {"Authorization": f"Bearer {api_key('t' + str(n % 3))}",
               "Content-Type": "application/json"}
    try:
        async with s.post(gw + "/v1/completions", data=orjson.dumps(body),
                          headers=headers) as r:
            if disconnect and r.status == 200:
                await r.content.readany()
                r.close()  # drops the connection mid-stream
                tally.disconnects += 1
                return
            data = await r.read()
            if r.status == 200 and (not stream or data.endswith(b"[DONE]\n\n")):
                tally.ok += 1
                return
            kind = f"http_{r.status}" if r.status != 200 else "stream_cut"
    except (TimeoutError, aiohttp.ClientError) as exc:
        kind = type(exc).__name__
    if tally.near_kill(time.monotonic()):
        tally.injected_errors += 1
    else:
        tally.errors[kind] += 1


async def load(gw: str, rate_per_s: float, until: float, tally: Tally, seed: int,
               max_in_flight: int = 64) -> None:
    """Open-loop arrivals at `rate_per_s` until monotonic `until`; at most `max_in_flight`."""
    rnd = random.Random(seed)
    timeout = aiohttp.ClientTimeout(total=60)
    sem = asyncio.Semaphore(max_in_flight)
    tasks: set[asyncio.Task[None]] = set()

    async def guarded(s: aiohttp.ClientSession, n: int) -> None:
        async with sem:
            await one_request(s, gw, n, rnd, tally)

    async with aiohttp.ClientSession(timeout=timeout) as s:
        n = 0
        next_t = time.monotonic()
        while time.monotonic() < until:
            next_t += rnd.expovariate(rate_per_s)
            await asyncio.sleep(max(0.0, next_t - time.monotonic()))
            if sem.locked():
                continue  # the cap holds: this arrival is shed, not queued without bound
            n += 1
            t = asyncio.create_task(guarded(s, n))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)


async def churn(engines: list[Engine], every_s: float, down_s: float, until: float,
                tally: Tally) -> None:
    """Every `every_s`, SIGKILL one engine (in turn), keep it down `down_s`, restart it."""
    i = 0
    while time.monotonic() + every_s < until:
        await asyncio.sleep(every_s)
        eng = engines[i % len(engines)]
        i += 1
        killed = time.monotonic()
        tally.kills.append((killed, math.inf))
        await asyncio.to_thread(eng.kill)
        await asyncio.sleep(down_s)
        await asyncio.to_thread(eng.start)
        tally.kills[-1] = (killed, time.monotonic())


def proc_sample(pid: int) -> tuple[float, int]:
    """(RSS in MB, open file descriptors) of `pid`, from /proc."""
    rss_kb = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kb = int(line.split()[1])
    return rss_kb / 1024.0, len(os.listdir(f"/proc/{pid}/fd"))


def children(gateway_pid: int) -> list[tuple[int, list[bytes]]]:
    """The gateway's child processes, each with its argv."""
    kids: list[int] = []
    for task in Path(f"/proc/{gateway_pid}/task").iterdir():
        try:
            kids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue  # the thread ended while we looked
    out = []
    for kid in kids:
        try:
            out.append((kid, Path(f"/proc/{kid}/cmdline").read_bytes().split(b"\0")))
        except OSError:
            continue
    return out


def accounting_child(gateway_pid: int) -> int | None:
    """The pid of the gateway's accounting child (`wattgate_cli apportioner ...`), if one runs."""
    return next((kid for kid, argv in children(gateway_pid) if b"apportioner" in argv), None)


@dataclass
class Sample:
    """One /proc reading: seconds since the start; the gateway's RSS (MB) and fds (the parent,
    with `--workers N` > 1); the accounting child's pid, RSS and fds (None while it is not
    running); each worker's (pid, RSS, fds), by pid, with `--workers N` > 1."""
    t_s: float
    rss_mb: float
    fds: int
    child_pid: int | None = None
    child_rss_mb: float | None = None
    child_fds: int | None = None
    workers: list[tuple[int, float, int]] = field(default_factory=list)


def read_sample(gateway_pid: int, t_s: float) -> Sample:
    rss_mb, fds = proc_sample(gateway_pid)
    out = Sample(t_s, rss_mb, fds)
    for kid, argv in sorted(children(gateway_pid)):
        try:
            kid_rss, kid_fds = proc_sample(kid)
        except (OSError, ValueError):
            continue  # it exited between the two reads
        if b"apportioner" in argv:
            out.child_rss_mb, out.child_fds, out.child_pid = kid_rss, kid_fds, kid
        elif b"serve" in argv:
            out.workers.append((kid, kid_rss, kid_fds))
    return out


async def sample(pid: int, every_s: float, until: float, t0: float, out: list[Sample],
                 progress_s: float, tally: Tally) -> None:
    last_print = t0
    while time.monotonic() < until:
        got = read_sample(pid, time.monotonic() - t0)
        out.append(got)
        now = time.monotonic()
        if now - last_print >= progress_s:
            last_print = now
            workers = "".join(f"  worker rss {w[1]:7.1f} MB  fds {w[2]:4d}" for w in got.workers)
            print(f"soak {got.t_s:7.0f} s  rss {got.rss_mb:7.1f} MB  fds {got.fds:4d}{workers}  child "
                  f"rss {got.child_rss_mb or 0:7.1f} MB  fds {got.child_fds or 0:4d}  sent "
                  f"{tally.sent}  ok {tally.ok}  disconnects {tally.disconnects}  kills "
                  f"{len(tally.kills)}  injected errors {tally.injected_errors}  other errors "
                  f"{sum(tally.errors.values())}", flush=True)
        await asyncio.sleep(every_s)
