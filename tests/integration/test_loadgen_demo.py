"""`wattgate demo`: starts the simulated fleet and the gateway, runs load, writes the report,
and leaves no process behind."""

from __future__ import annotations

import shutil
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.integration.test_demo_first_screen import check_first_screen
from tests.support.extras import missing
from tests.support.procs import REPO, wattgate_cmd


def demo_processes(out_dir: Path) -> list[str]:
    """Processes of the demo run that wrote to `out_dir` (its configs live there)."""
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines()
            if f"{out_dir}/wattgate-demo-" in line]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str],
                                                                 Path]:
    out = tmp_path_factory.mktemp("demo")
    proc = subprocess.run(wattgate_cmd("demo", "--duration", "8", "--out", str(out)),
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    return proc, out


@pytest.mark.slow
@pytest.mark.timeout(330)
def test_demo_runs_tenants_precisions_and_routing_then_stops_everything(
        demo_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, out = demo_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("acme", "globex", "initech"):
        assert f"\n{name} " in proc.stdout
    # one row per precision in the precision table (the recommended one is marked)
    for prec in ("bf16", "fp8", "int8", "int4"):
        assert f"\n{prec} " in proc.stdout or f"\n{prec} (recommended)" in proc.stdout
    assert any(x in proc.stdout for x in ("\nRecommended: ", "\nNo significant difference ",
                                          "\nNo recommendation ("))
    assert "SLO capacity (req/s, engine time) [95 % CI]" in proc.stdout
    assert "Time base: engine time (simulator time_scale 0.4)" in proc.stdout
    assert "\nleast_load " in proc.stdout and "\nslo_energy " in proc.stdout
    # Energy is shown: gateway accounting when it has records, else the simulated engines'
    # ground truth, labelled as such.
    assert "gateway accounting" in proc.stdout or "simulator ground truth" in proc.stdout
    # The demo waits for its requests' energy to be final (interval after the finish settled
    # and apportioned) before it reports it.
    assert "not final yet" not in proc.stdout + proc.stderr
    html = (out / "demo.html").read_text()
    assert "<svg" in html and "Paired deltas" in html and "Pareto frontier" in html
    assert "<table>" in html and "<details>" in html and "time_scale" in html
    assert "Routing: least_load vs slo_energy" in html
    assert demo_processes(out) == []


@pytest.mark.slow
@pytest.mark.timeout(390)
def test_demo_html_opens_with_the_answer_and_renders_in_a_browser(
        demo_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    """Checked as a person would: headless Chromium renders the page to a non-blank PNG, and
    the answer (recommended precision, tenants' bills) comes before any table."""
    proc, out = demo_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    html = (out / "demo.html").read_text()
    answer = html.index("class='answer'")
    assert answer < html.index("<table>")
    first = html[answer:html.index("<table>")]
    assert any(x in first for x in ("Recommended: ", "No significant difference ",
                                    "No recommendation ("))
    assert "Tenants&#x27; bills" in html or "Tenants' bills" in html
    # the first screen: the recommendation with its interval, the routing saving in %, the
    # tenants' bills with the idle energy apart
    check_first_screen(out / "demo.html", out)
    png = screenshot(out / "demo.html", out / "demo.png")
    assert png.stat().st_size > 50_000  # a page of text, tables and plots, not a blank page
    assert distinct_colours(png) > 50


def screenshot(page: Path, png: Path) -> Path:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        reason = "chromium is not installed (apt-get install -y chromium)"
        missing(reason)
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                    f"--screenshot={png}", "--window-size=1400,3000", page.as_uri()],
                   capture_output=True, timeout=60, check=True)
    return png


def distinct_colours(png: Path) -> int:
    from matplotlib import image

    pixels = image.imread(str(png))
    flat = (pixels[..., :3] * 255).astype("uint8").reshape(-1, 3)
    return len({tuple(p) for p in flat[:: max(1, len(flat) // 200_000)]})


@pytest.mark.slow
@pytest.mark.timeout(300)
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
