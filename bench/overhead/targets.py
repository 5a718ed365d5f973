"""Start the benchmark's processes (fast engine, wattgate, nginx, vllm-router), pinned to cores.

The engine listens on several ports (one process): every proxy fronts all of them, as the
user configuration's endpoints; the direct path and the naive proxy use the first. Every
process runs in its own session so it can be stopped as a group; `Fleet` stops them all on
exit, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.overhead import configs
from bench.overhead.configs import API_KEY

__all__ = ["API_KEY", "Target", "ensure_tools", "fleet", "log", "nginx_bin"]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BENCH_VENV = REPO / ".venv-bench"
ENGINE_CORE = "0"  # the engine and the load client
PROXY_CORE = "1"  # the proxy under test


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_tools(install: bool) -> None:
    """wrk, nginx, gcc, taskset on PATH and vllm-router in .venv-bench; installs what is missing
    when `install` is set (Debian packages with apt-get, vllm-router and py-spy with pip)."""
    missing = [t for t in ("wrk", "gcc", "taskset") if shutil.which(t) is None]
    if not (shutil.which("nginx") or Path("/usr/sbin/nginx").exists()):
        missing.append("nginx")
    if missing:
        if not install:
            raise SystemExit(f"missing tools {missing}: apt-get install wrk nginx-light gcc util-linux "
                             f"(or rerun with --install)")
        log(f"installing {missing} with apt-get")
        pkgs = ["nginx-light" if t == "nginx" else "util-linux" if t == "taskset" else t
                for t in missing]
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-q"], check=True, env=env, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-q", *pkgs], check=True, env=env, timeout=600)
    router = BENCH_VENV / "bin" / "vllm-router"
    if not router.exists():
        if not install:
            raise SystemExit(f"missing {router}: python3 -m venv .venv-bench && "
                             f".venv-bench/bin/pip install vllm-router py-spy (or rerun with --install)")
        log("creating .venv-bench with vllm-router and py-spy")
        subprocess.run([sys.executable, "-m", "venv", str(BENCH_VENV)], check=True, timeout=300)
        subprocess.run([str(BENCH_VENV / "bin" / "pip"), "install", "-q", "vllm-router", "py-spy"],
                       check=True, timeout=900)


def nginx_bin() -> str:
    return shutil.which("nginx") or "/usr/sbin/nginx"


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status == 200:
                    return
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout_s:.0f} s: {last}")


@dataclass
class Target:
    """One way to reach the engine: directly or through a proxy."""

    name: str
    url: str  # base URL the load client hits
    proc: subprocess.Popen[bytes] | None = None  # the proxy; None for the direct path
    pids: list[int] = field(default_factory=list)  # processes whose CPU is the proxy's
    accounting: bool = False  # defers work past the response (charged with a settle window)

    def cpu_pids(self) -> list[int]:
        """The proxy's processes now: a gateway may start helpers (the apportioner) after it
        answered ready, and they are charged to it too."""
        return process_tree(self.proc.pid) if self.proc is not None else self.pids


@dataclass
class Fleet:
    workdir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[object] = field(default_factory=list)

    def spawn(self, name: str, cmd: Sequence[str], core: str) -> subprocess.Popen[bytes]:
        out = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed in stop_all
        self.logs.append(out)
        proc = subprocess.Popen(["taskset", "-c", core, *cmd], cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        for out in self.logs:
            out.close()  # type: ignore[attr-defined]


def process_tree(root: int) -> list[int]:
    """`root` and all its descendants (nginx: master and worker)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(parents.get(pid, []))
    return tree


def build_engine(workdir: Path) -> Path:
    binary = workdir / "fast_engine"
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(HERE / "fast_engine.c")], check=True,
                   timeout=120)
    return binary


ENGINE_LISTENERS = len(configs.USER_ENDPOINTS)


def start_engine(fleet: Fleet, binary: Path) -> list[str]:
    """The fast engine on ENGINE_LISTENERS ports; their base URLs."""
    ports = [free_port() for _ in range(ENGINE_LISTENERS)]
    proc = fleet.spawn("engine", [str(binary), *map(str, ports)], ENGINE_CORE)
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    for url in urls:
        wait_ready(url + "/health", proc, 10)
    return urls


def _start_wattgate(fleet: Fleet, name: str, config: bytes, port: int, accounting: bool
                    ) -> Target:
    cfg = fleet.workdir / f"{name}.yaml"
    cfg.write_bytes(config)
    proc = fleet.spawn(name, [sys.executable, "-m", "wattgate_cli", "serve", "--config",
                              str(cfg), "--port", str(port), "--log-level", "warning"],
                       PROXY_CORE)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/readyz", proc, 60)
    return Target(name, url, proc, process_tree(proc.pid), accounting)


def start_wattgate(fleet: Fleet, engine_urls: list[str]) -> Target:
    port = free_port()
    config = configs.wattgate_user(engine_urls, port, fleet.workdir / "ledger.db")
    return _start_wattgate(fleet, "wattgate", config, port, accounting=True)


def start_wattgate_tenants(fleet: Fleet, engine_urls: list[str]) -> Target:
    port = free_port()
    config = configs.wattgate_tenants(engine_urls, port, fleet.workdir / "ledger-tenants.db")
    return _start_wattgate(fleet, "wattgate-tenants", config, port, accounting=True)


def start_wattgate_noacct(fleet: Fleet, engine_urls: list[str]) -> Target:
    port = free_port()
    config = configs.wattgate_user(engine_urls, port, None)
    return _start_wattgate(fleet, "wattgate-noacct", config, port, accounting=False)


def start_wattgate_lean(fleet: Fleet, engine_urls: list[str]) -> Target:
    port = free_port()
    return _start_wattgate(fleet, "wattgate-lean", configs.wattgate_lean(engine_urls[0], port),
                           port, accounting=False)


def start_nginx(fleet: Fleet, engine_urls: list[str]) -> Target:
    port = free_port()
    conf = fleet.workdir / "nginx.conf"
    conf.write_text(configs.nginx(fleet.workdir, port, engine_urls))
    proc = fleet.spawn("nginx", [nginx_bin(), "-p", str(fleet.workdir), "-c", str(conf)],
                       PROXY_CORE)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/health", proc, 20)
    time.sleep(0.2)  # let the master fork its worker before the process tree is read
    return Target("nginx", url, proc, process_tree(proc.pid))


def start_vllm_router(fleet: Fleet, engine_urls: list[str]) -> Target:
    """vllm-router over the same listeners, round_robin: its cheapest policy, so the
    comparison is not flattered by a heavier one (its default is cache_aware)."""
    port = free_port()
    cmd = [str(BENCH_VENV / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
           "--worker-urls", *engine_urls, "--policy", "round_robin", "--log-level", "warning",
           "--prometheus-port", str(free_port()), "--worker-startup-check-interval", "1"]
    proc = fleet.spawn("vllm-router", cmd, PROXY_CORE)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/health", proc, 90)
    return Target("vllm-router", url, proc, process_tree(proc.pid))


def start_aiohttp_naive(fleet: Fleet, engine_urls: list[str]) -> Target:
    port = free_port()
    proc = fleet.spawn("aiohttp-naive", [sys.executable, str(HERE / "naive_proxy.py"), str(port),
                                         engine_urls[0]], PROXY_CORE)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/health", proc, 30)
    return Target("aiohttp-naive", url, proc, process_tree(proc.pid))


STARTERS: dict[str, Callable[[Fleet, list[str]], Target]] = {
    "wattgate": start_wattgate, "wattgate-tenants": start_wattgate_tenants,
    "wattgate-noacct": start_wattgate_noacct,
    "wattgate-lean": start_wattgate_lean, "nginx": start_nginx,
    "vllm-router": start_vllm_router, "aiohttp-naive": start_aiohttp_naive,
}


@contextlib.contextmanager
def fleet(workdir: Path, names: Sequence[str]) -> Iterator[list[Target]]:
    """The engine plus each named proxy, all running; the direct path is always first."""
    f = Fleet(workdir)
    try:
        engine_urls = start_engine(f, build_engine(workdir))
        log(f"fast engine on {', '.join(engine_urls)} (core {ENGINE_CORE})")
        engine_pids = process_tree(f.procs[0].pid)
        targets = [Target("direct", engine_urls[0], None, engine_pids)]
        for name in names:
            target = STARTERS[name](f, engine_urls)
            log(f"{name} on {target.url} (core {PROXY_CORE}, pids {target.pids})")
            targets.append(target)
        yield targets
    finally:
        f.stop_all()
