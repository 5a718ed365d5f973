"""`wattgate demo`: starts the simulated fleet and the gateway, runs load, writes the report,
and leaves no process behind."""

from __future__ import annotations

import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.support.procs import REPO, wattgate_cmd


def demo_processes(out_dir: Path) -> list[str]:
    """Processes of the demo run that wrote to `out_dir` (its configs live there)."""
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines()
            if f"{out_dir}/wattgate-demo-" in line]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_demo_runs_tenants_and_precisions_then_stops_everything(tmp_path: Path) -> None:
    proc = subprocess.run(wattgate_cmd("demo", "--duration", "8", "--out", str(tmp_path)),
                          cwd=REPO, capture_output=True, text=True, timeout=140, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("acme", "globex", "initech"):
        assert f"\n{name} " in proc.stdout
    for prec in ("bf16", "fp8", "int8", "int4"):
        assert f"\n{prec} " in proc.stdout
    assert "accuracy not measured" in proc.stdout
    # Energy per precision is shown: gateway accounting when it has records, else the
    # simulated engines' ground truth, labelled as such.
    assert "gateway accounting" in proc.stdout or "simulator ground truth" in proc.stdout
    # The demo waits for its requests' energy to be final (interval after the finish settled
    # and apportioned) before it reports it.
    assert "not final yet" not in proc.stdout + proc.stderr
    html = (tmp_path / "demo.html").read_text()
    assert "<svg" in html and "Paired deltas" in html and "Pareto frontier" in html
    assert demo_processes(tmp_path) == []


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_keep_running_prints_urls_serves_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    # Ctrl-C as at a terminal, even when this test runs under a shell that started it in the
    # background (which leaves SIGINT ignored, and the demo would inherit that)
    with subprocess.Popen(wattgate_cmd("demo", "--duration", "6", "--keep-running", "--out",
                                       str(tmp_path)), cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)
                          ) as proc:
        try:
            assert proc.stdout is not None
            lines = []
            for line in proc.stdout:
                lines.append(line)
                if line.startswith("running; Ctrl-C"):
                    break
            urls = {ln.split(":", 1)[0]: ln.split(":", 1)[1].split()[0]
                    for ln in lines if ln.startswith(("gateway API", "metrics", "report"))}
            assert set(urls) == {"gateway API", "metrics", "report"}
            with urllib.request.urlopen(urls["metrics"], timeout=5) as resp:
                assert b"wattgate_requests_total" in resp.read()
            assert Path(urls["report"]).exists()
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 130
        finally:
            if proc.poll() is None:
                proc.kill()
    assert demo_processes(tmp_path) == []
