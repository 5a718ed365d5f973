"""Every command fails loudly when its target is absent or malformed: a non-zero exit, the
reason on one line, no traceback, and no time spent on a run that cannot succeed."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import wattgate_cli

REPO = Path(__file__).resolve().parents[2]
LOAD = ["--rate", "5", "--duration", "30", "--no-energy", "--quiet", "--tokenizer", "words"]


def invoke(*args: str) -> Result:
    return CliRunner().invoke(wattgate_cli.main, list(args))


def error_line(result: Result) -> str:
    """The one line that says what is wrong (click prints usage hints above a usage error)."""
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.output
    return errors[0]


@pytest.fixture
def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port something else listens on for the test's duration."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


@pytest.mark.parametrize("command", [
    ["loadgen", "run"],
    ["loadgen", "sweep", "--rates", "1,2"],
    ["loadgen", "compare", "--precisions", "fp8,int4"],
    ["loadgen", "preset", "server"],
    ["loadgen", "preset", "offline"],
])
def test_loadgen_fails_at_once_when_nothing_listens(command: list[str], closed_port: int) -> None:
    """Refused before the run: not after --duration 30 of connect errors."""
    t0 = time.monotonic()
    result = invoke(*command, "--target", f"http://127.0.0.1:{closed_port}", *LOAD)
    assert result.exit_code == 1
    assert f"cannot connect to http://127.0.0.1:{closed_port}" in error_line(result)
    assert time.monotonic() - t0 < 10


def test_compare_checks_every_arm_target(busy_port: int, closed_port: int) -> None:
    result = invoke("loadgen", "compare", "--target", f"http://127.0.0.1:{busy_port}",
                    "--precisions", "fp8,int4", "--arm-target",
                    f"int4=http://127.0.0.1:{closed_port}", *LOAD)
    assert result.exit_code == 1
    assert f"127.0.0.1:{closed_port}" in error_line(result)


@pytest.mark.parametrize("target", ["http://127.0.0.1:abc", "http://127.0.0.1:99999",
                                    "127.0.0.1:8080", "http://:80"])
def test_loadgen_refuses_a_malformed_target(target: str) -> None:
    result = invoke("loadgen", "run", "--target", target, *LOAD)
    assert result.exit_code == 2
    assert "is not an http:// or https:// URL" in error_line(result)


def test_report_without_a_ledger_is_one_line(tmp_path: Path) -> None:
    result = invoke("report", "--sqlite", str(tmp_path / "none.db"))
    assert result.exit_code == 1
    assert "no ledger at" in error_line(result)


def test_config_check_of_a_missing_file_exits_2_naming_it(tmp_path: Path) -> None:
    result = invoke("config", "check", str(tmp_path / "gw.yaml"))
    assert result.exit_code == 2
    assert "gw.yaml" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_config_check_of_a_fleet_file_says_what_it_is() -> None:
    result = invoke("config", "check", str(REPO / "deploy" / "examples" / "fleet.yaml"))
    assert result.exit_code == 2
    assert "simulator fleet file" in result.output and "wattgate sim fleet" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_sim_on_a_port_in_use_exits_1(busy_port: int) -> None:
    result = invoke("sim", "--gpu", "h100", "--model", "llama-3.1-8b", "--precision", "fp8",
                    "--port", str(busy_port))
    assert result.exit_code == 1
    assert "address already in use" in error_line(result)


def test_sim_fleet_base_port_in_use_exits_1(tmp_path: Path, busy_port: int) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("defaults: {gpu: h100, model: llama-3.1-8b}\n"
                     "engines:\n  - {name: a, precision: fp8, port: 1}\n")
    result = invoke("sim", "fleet", str(fleet), "--base-port", str(busy_port))
    assert result.exit_code == 1
    assert f"{busy_port}" in error_line(result) and "in use" in error_line(result)


def test_engines_launch_names_a_missing_model_directory(tmp_path: Path) -> None:
    result = invoke("engines", "launch", "--model", str(tmp_path / "nope"), "--precision", "fp8",
                    "--dry-run")
    assert result.exit_code == 2
    assert "no such model directory" in error_line(result)


def test_demo_serve_refuses_a_port_in_use_before_starting_anything(tmp_path: Path,
                                                                   busy_port: int) -> None:
    result = invoke("demo", "--serve", "--out", str(tmp_path), "--port", str(busy_port))
    assert result.exit_code == 1
    assert f"cannot listen on 127.0.0.1:{busy_port}: address already in use" in error_line(result)
    assert not (tmp_path / "fleet.log").exists()


@pytest.mark.parametrize(("text", "says"), [
    ("tenants: [1, 2\n", "invalid YAML at line 2"),
    ("model: x\ntenants: 5\n", "workload.yaml: "),
    ("- just\n- a list\n", "expected a mapping"),
])
def test_loadgen_names_a_malformed_workload_file(tmp_path: Path, busy_port: int, text: str,
                                                 says: str) -> None:
    path = tmp_path / "workload.yaml"
    path.write_text(text)
    result = invoke("loadgen", "run", "--target", f"http://127.0.0.1:{busy_port}", "--workload",
                    str(path))
    assert result.exit_code == 2
    assert says in error_line(result)


def test_sim_fleet_names_a_bad_entry(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("engines: [{name: a}]\n")
    result = invoke("sim", "fleet", str(fleet))
    assert result.exit_code == 1
    assert "engines[0].gpu: required" in error_line(result)


def test_serve_refuses_a_ledger_it_cannot_open_at_once(tmp_path: Path) -> None:
    """A ledger path that cannot be opened ends `serve` with one line and exit 1, before the
    apportioner child or a port: not a trace after the child's 30 s of restarts."""
    import subprocess
    import sys

    cfg = (Path(wattgate_cli.__file__).parent / "deploy" / "examples" / "local.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(cfg.replace("path: ../../out/wattgate-ledger.db", "path: /proc/ledger.db"))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "wattgate_cli", "serve", "--config", str(bad),
                           "--port", "0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("wattgate: ledger unavailable: ")
    assert time.monotonic() - t0 < 20
    assert "/proc/ledger.db" in bad.read_text()  # the example's ledger line was replaced


@pytest.mark.parametrize(("args", "option"), [
    (["--rate", "0"], "--rate"),  # ZeroDivisionError
    (["--rate", "nan"], "--rate"),  # a run of 100000 requests all cancelled
    (["--duration", "nan"], "--duration"),  # a run that never ended
    (["--duration", "-5"], "--duration"),
    (["--attainment", "5"], "--attainment"),
    (["--workers", "0"], "--workers"),
    (["--rates", "1,x"], "--rates"),  # ValueError
    (["--rates", "1,nan"], "--rates"),
    (["--quality", "fp8=abc"], "--quality"),  # ValueError
    (["--quality", "fp8=2"], "--quality"),
    (["--quality", "fp16=0.9"], "--quality"),  # not an arm: was ignored without a word
    (["--min-quality", "nan"], "--min-quality"),  # a floor nothing is under
    (["--tolerance", "0"], "--tolerance"),
])
def test_compare_refuses_nonsense_numbers_naming_the_option(args: list[str], option: str,
                                                           closed_port: int) -> None:
    """Refused as a usage error (exit 2) before anything is reached or run."""
    result = invoke("loadgen", "compare", "--precisions", "fp8,int4",
                    "--target", f"http://127.0.0.1:{closed_port}", *LOAD, *args)
    assert result.exit_code == 2, result.output
    assert option in error_line(result)
