"""deploy/docker/Dockerfile lint: no Docker engine here, so check what a review would."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.procs import REPO

DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"

pytestmark = pytest.mark.timeout(30)


@dataclass(frozen=True)
class Instruction:
    op: str
    args: str


def parse(text: str) -> list[Instruction]:
    """Instructions with line continuations joined and comments dropped."""
    out: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        op, _, args = full.partition(" ")
        out.append(Instruction(op.upper(), args.strip()))
    assert not pending, "Dockerfile ends inside a continued line"
    return out


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    result: list[list[Instruction]] = []
    for ins in instructions:
        if ins.op == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse(DOCKERFILE.read_text())


def test_parser_joins_continuations_and_drops_comments() -> None:
    parsed = parse("# c\nFROM a AS b\nRUN x \\\n  # inner\n  && y\nUSER 1\n")
    assert parsed == [Instruction("FROM", "a AS b"), Instruction("RUN", "x  && y"),
                      Instruction("USER", "1")]


def test_multi_stage_on_python_311_slim(instructions: list[Instruction]) -> None:
    args = {i.args.split("=")[0]: i.args.split("=", 1)[1] for i in instructions
            if i.op == "ARG" and "=" in i.args}
    froms = [i.args for i in instructions if i.op == "FROM"]
    assert len(froms) >= 2
    bases = [f.split()[0].replace("${PYTHON_IMAGE}", args.get("PYTHON_IMAGE", "")) for f in froms]
    assert all(b == "python:3.11-slim" for b in bases), bases


def test_final_stage_runs_as_a_numeric_non_root_user(instructions: list[Instruction]) -> None:
    final = stages(instructions)[-1]
    users = [i.args for i in final if i.op == "USER"]
    assert users, "final stage has no USER"
    user, _, group = users[-1].partition(":")
    assert user.isdigit() and int(user) != 0 and (not group or int(group) != 0)
    run = " ".join(i.args for i in final if i.op == "RUN")
    assert f"--uid {user}" in run  # the user exists in the image


def test_no_remote_add_no_dev_extra_no_secrets(instructions: list[Instruction]) -> None:
    assert not [i for i in instructions if i.op == "ADD"], "use COPY (ADD fetches URLs, unpacks)"
    text = " ".join(i.args for i in instructions)
    assert "[dev]" not in text and "pytest" not in text
    assert not re.search(r"(?i)(password|token|secret)\s*=", text)
    installs = [i.args for i in instructions if i.op == "RUN" and "pip install" in i.args]
    assert installs and all("--no-index" in a for a in installs)


def test_copied_sources_exist_and_pass_the_dockerignore(instructions: list[Instruction]) -> None:
    allowed = [line[1:].rstrip("/*") for line in
               (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().splitlines()
               if line.startswith("!")]
    for ins in instructions:
        if ins.op != "COPY" or "--from=" in ins.args:
            continue
        *sources, _dest = shlex.split(ins.args)
        for src in sources:
            assert (REPO / src).exists(), src
            assert src.rstrip("/") in allowed, f"{src} is excluded by Dockerfile.dockerignore"
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    copied = {shlex.split(i.args)[0] for i in instructions if i.op == "COPY"}
    assert {p.rstrip("*") for p in packages} <= copied


def test_entrypoint_is_the_console_script(instructions: list[Instruction]) -> None:
    entry = [json.loads(i.args) for i in instructions if i.op == "ENTRYPOINT"]
    assert entry == [["wattgate"]]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert "wattgate" in scripts
    cmd = json.loads(next(i.args for i in instructions if i.op == "CMD"))
    assert cmd[:1] == ["serve"] and "--config" in cmd


def healthcheck_argv(instructions: list[Instruction]) -> list[str]:
    args = next(i.args for i in instructions if i.op == "HEALTHCHECK")
    assert " CMD " in f" {args} "
    argv: list[str] = json.loads(args.split("CMD", 1)[1].strip())
    return argv


def test_healthcheck_command_tells_up_from_down(instructions: list[Instruction],
                                                tmp_path: Path) -> None:
    """The HEALTHCHECK one-liner exits 0 on a 200 and non-zero when nothing listens."""
    import http.server
    import threading

    from tests.support.procs import free_port

    env_default = next(i.args for i in instructions if i.op == "ENV" and "WATTGATE_HEALTH_URL" in i.args)
    assert "/healthz" in env_default and ":8080" in env_default
    argv = healthcheck_argv(instructions)
    assert argv[0] == "python"

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/healthz"
        up = subprocess.run([sys.executable, *argv[1:]], env={"WATTGATE_HEALTH_URL": url},
                            capture_output=True, timeout=10, check=False)
        assert up.returncode == 0, up.stderr
    finally:
        server.shutdown()
        server.server_close()
    down = subprocess.run([sys.executable, *argv[1:]], capture_output=True, timeout=10,
                          env={"WATTGATE_HEALTH_URL": f"http://127.0.0.1:{free_port()}/healthz"},
                          check=False)
    assert down.returncode != 0


@pytest.mark.timeout(60)
def test_copied_files_alone_build_a_wheel_with_the_cli_and_every_package(
        instructions: list[Instruction], tmp_path: Path) -> None:
    """What the build stage copies is enough for `pip wheel .` (no file outside it is needed)."""
    import shutil
    import zipfile

    build = stages(instructions)[0]
    context = tmp_path / "src"
    context.mkdir()
    for ins in build:
        if ins.op != "COPY":
            continue
        *sources, _dest = shlex.split(ins.args)
        for src in sources:
            path = REPO / src
            if path.is_dir():
                shutil.copytree(path, context / src,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(path, context / src)
    out = tmp_path / "wheels"
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                             "--no-build-isolation", "-q", "-w", str(out), str(context)],
                            capture_output=True, text=True, timeout=50, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    [wheel] = list(out.glob("wattgate-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(z.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert "wattgate_cli.py" in names
    for package in ("core", "accounting", "gateway", "engines", "loadgen"):
        assert f"{package}/__init__.py" in names and f"{package}/py.typed" in names
    assert "accounting/ledger/postgres.py" in names and "engines/sim/fleet.py" in names
    assert re.search(r"^wattgate\s*=\s*wattgate_cli:main$", entry_points, re.M)
