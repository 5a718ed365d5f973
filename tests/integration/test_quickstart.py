"""The README's Quick start, copied from the README and run as written by bash, on a machine
where the example ports (8080 for the gateway, 8101-8105 for the simulated engines) are taken."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import REPO, running, wait_http, wattgate_cmd

EXAMPLE_PORTS = (8080, 8101, 8102, 8103, 8104, 8105)


@contextlib.contextmanager
def ports_taken(ports: tuple[int, ...]) -> Iterator[None]:
    """Listen on each port that is free (one taken by something else is taken already)."""
    with contextlib.ExitStack() as stack:
        for port in ports:
            s = stack.enter_context(socket.socket())
            with contextlib.suppress(OSError):
                s.bind(("127.0.0.1", port))
                s.listen()
        yield


def quick_start() -> str:
    """The first shell block under "## Quick start", without `make install` (done already)."""
    text = (REPO / "README.md").read_text()
    block = text.split("## Quick start", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [line for line in block.splitlines() if not line.startswith("make install")]
    return "\n".join(lines) + "\n"


def venv_here(where: Path) -> None:
    """`.venv/bin/wattgate` in `where`, running this interpreter's wattgate."""
    bin_dir = where / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "wattgate"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -m wattgate_cli "$@"\n')
    script.chmod(0o755)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_readme_quick_start_runs_as_written_where_the_example_ports_are_taken(
        tmp_path: Path) -> None:
    venv_here(tmp_path)
    script = quick_start()
    assert "demo --serve" in script and "kill %1" in script
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    with ports_taken(EXAMPLE_PORTS):
        proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=200, check=False)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "data: [DONE]" in out  # the curl's stream
    assert "goodput" in out  # loadgen's tables
    bill = [line for line in out.splitlines() if line.startswith("acme ")]
    assert bill and "requests" in bill[0]  # the report's row for the tenant
    url = next(line.split()[1] for line in out.splitlines() if line.startswith("gateway "))
    assert not url.endswith(tuple(f":{p}" for p in EXAMPLE_PORTS))
    # `kill %1` stopped the stack: it removes gateway.url once its processes are stopped
    deadline = time.monotonic() + 30
    while (tmp_path / "out/quick/gateway.url").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not (tmp_path / "out/quick/gateway.url").exists()
    config = (tmp_path / "out/quick/gateway.yaml").read_text()
    assert f"port: {url.rsplit(':', 1)[1]}" in config  # the URL printed is the one it listens on


@pytest.mark.timeout(60)
def test_sim_fleet_base_port_0_moves_every_engine_to_a_free_port(tmp_path: Path) -> None:
    """The example fleet's ports taken: `--base-port 0` serves each engine on a free port and
    says which in its `ready NAME URL` line."""
    log = tmp_path / "fleet.log"
    with ports_taken(EXAMPLE_PORTS), \
            running(wattgate_cmd("sim", "fleet", "deploy/examples/fleet.yaml", "--base-port", "0"),
                    log=log) as fleet:
        deadline = time.monotonic() + 30
        ready: list[str] = []
        while len(ready) < 5 and time.monotonic() < deadline:
            assert fleet.poll() is None, log.read_text()
            ready = [ln for ln in log.read_text().splitlines() if ln.startswith("ready ")]
            time.sleep(0.1)
        urls = [ln.split()[2] for ln in ready]
        assert len(urls) == 5 and len(set(urls)) == 5
        for url in urls:
            assert not url.endswith(tuple(f":{p}" for p in EXAMPLE_PORTS))
            wait_http(f"{url}/health", 10, fleet)


def test_demo_serve_killed_outright_leaves_nothing_running(tmp_path: Path) -> None:
    """SIGKILL (or a closed terminal's SIGHUP) of `demo --serve` takes its fleet, its gateway
    and the gateway's apportioner with it: a rerun finds its ports free."""
    out = tmp_path / "quick"
    log = tmp_path / "demo.log"
    with open(log, "wb") as sink:
        demo = subprocess.Popen([*wattgate_cmd(), "demo", "--serve", "--out", str(out)],
                                cwd=REPO, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not (out / "gateway.url").exists() and time.monotonic() < deadline:
            assert demo.poll() is None, log.read_text()
            time.sleep(0.5)
        url = (out / "gateway.url").read_text().strip()
        wait_http(url + "/readyz", 10)
        demo.kill()
        demo.wait(10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _ours(out):
            time.sleep(0.5)
        assert _ours(out) == [], log.read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(demo.pid, 9)
        for pid in _ours(out):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def _ours(out: Path) -> list[int]:
    """The processes whose command line names this run's output folder."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
                if str(out).encode() in cmd and b"wattgate_cli" in cmd:
                    pids.append(int(proc.name))
    return pids
