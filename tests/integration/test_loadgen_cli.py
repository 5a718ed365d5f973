"""`wattgate loadgen` end to end, as a user runs it (subprocesses on free 127.0.0.1 ports)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import orjson
import pytest

from tests.support.procs import REPO, free_port, running, wattgate_cmd

PRECISIONS = ("bf16", "fp8", "int8", "int4")


def loadgen(*args: str, timeout_s: float = 170) -> subprocess.CompletedProcess[str]:
    return subprocess.run(wattgate_cmd("loadgen", *args), cwd=REPO, capture_output=True,
                          text=True, timeout=timeout_s, check=False)


@pytest.fixture(scope="module")
def sim_fleet() -> Iterator[dict[str, str]]:
    """Four simulated H100 engines serving llama-3.1-8b, one per precision."""
    urls = {p: f"http://127.0.0.1:{free_port()}" for p in PRECISIONS}
    with ExitStack() as stack:
        for prec, url in urls.items():
            port = url.rsplit(":", 1)[1]
            stack.enter_context(running(
                wattgate_cmd("sim", "--gpu", "h100", "--model", "llama-3.1-8b", "--precision",
                             prec, "--port", port), f"{url}/health", timeout_s=60))
        yield urls


@pytest.fixture
def selftest_engine() -> Iterator[str]:
    port = free_port()
    with running(wattgate_cmd("loadgen", "selftest-engine", "--port", str(port), "--ttft-ms",
                              "20", "--itl-ms", "2"), f"http://127.0.0.1:{port}/health"):
        yield f"http://127.0.0.1:{port}"


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_compare_over_four_simulated_precisions_reports_j_per_token_and_pareto(
        sim_fleet: dict[str, str]) -> None:
    """Identical seeded schedule against BF16/FP8/INT8/INT4 engines: a table with J/token per
    precision, paired deltas, each arm's format and accuracy condition, and an HTML report with
    the Pareto plot, in under 3 minutes."""
    arm_args = [a for p, u in sim_fleet.items() for a in ("--arm-target", f"{p}={u}")]
    with tempfile.TemporaryDirectory() as tmp:
        start = time.monotonic()
        proc = loadgen("compare", "--target", sim_fleet["bf16"], *arm_args, "--rate", "4",
                       "--duration", "4", "--prompt-tokens", "256", "--output-tokens", "32",
                       "--quality", "fp8=0.71", "--quiet", "--out", tmp)
        elapsed = time.monotonic() - start
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert elapsed < 180
        out = proc.stdout
        for prec in PRECISIONS:
            assert f"\n{prec} " in out
        assert "quality score 0.71 (user-supplied)" in out
        assert "int4: INT4 AWQ weights, 16-bit activations (W4A16); accuracy not measured" in out
        assert "simulator ground truth" in out
        doc = orjson.loads((Path(tmp) / "compare.json").read_bytes())
        runs = {r["label"]: r for r in doc["runs"]}
        j = {p: runs[p]["energy"]["j_per_output_token"] for p in PRECISIONS}
        assert all(v > 0 for v in j.values())
        # Identical plans: the same prompts and lengths went to every arm.
        sent = {p: [(q["index"], q["prompt_tokens"]) for q in runs[p]["requests"]]
                for p in PRECISIONS}
        assert all(sent[p] == sent["bf16"] for p in PRECISIONS)
        assert len(doc["deltas"]) == 3 and doc["deltas"][0]["pairs"] > 0
        html = (Path(tmp) / "compare.html").read_text()
        assert "Pareto frontier" in html and html.count("<svg") >= 2


@pytest.mark.timeout(60)
def test_run_writes_summary_table_json_csv_and_html(selftest_engine: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        proc = loadgen("run", "--target", selftest_engine, "--rate", "40", "--duration", "1",
                       "--output-tokens", "8", "--arrival", "gamma", "--burstiness", "0.5",
                       "--seed", "3", "--no-energy", "--quiet", "--out", tmp,
                       "--lag-threshold-ms", "10000")  # a busy machine's lag grades anyway
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "TTFT p50" in proc.stdout and "graded from intended arrival" in proc.stdout
        doc = orjson.loads((Path(tmp) / "run.json").read_bytes())
        summary = doc["runs"][0]["summary"]
        assert summary["ok"] == summary["requests"] == len(doc["runs"][0]["requests"]) > 10
        assert 0.020 <= summary["from_send"]["ttft_s"]["p50"] < 0.040
        csv_lines = (Path(tmp) / "run.csv").read_text().splitlines()
        assert len(csv_lines) == summary["requests"] + 1
        assert "<svg" in (Path(tmp) / "run.html").read_text()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_workload_file_with_a_trace_runs_two_tenants(selftest_engine: str, tmp_path: Path) -> None:
    sample = loadgen("trace-sample", "mooncake", str(tmp_path / "t.jsonl"), "--requests", "40")
    assert sample.returncode == 0
    (tmp_path / "w.yaml").write_text("""
model: m
seed: 1
slo_classes: {fast: {ttft_s: 0.5}}
tenants:
  - {name: acme, api_key: k1}
  - {name: globex, api_key: k2}
traces:
  - {path: t.jsonl, format: mooncake, tenant: acme, speedup: 20}
  - {path: t.jsonl, format: mooncake, tenant: globex, speedup: 40}
""")
    proc = loadgen("run", "--target", selftest_engine, "--workload", str(tmp_path / "w.yaml"),
                   "--no-energy", "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "\nacme " in proc.stdout and "\nglobex " in proc.stdout


def test_loadgen_help_lists_the_subcommands() -> None:
    proc = subprocess.run([sys.executable, "-m", "wattgate_cli", "loadgen", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=30, check=False)
    for cmd in ("run", "compare", "sweep", "preset", "trace-sample"):
        assert cmd in proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_sweep_reports_max_goodput_at_the_target_attainment(selftest_engine: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        proc = loadgen("sweep", "--target", selftest_engine, "--rates", "20,40", "--duration",
                       "1", "--output-tokens", "4", "--attainment", "0.9", "--no-energy",
                       "--quiet", "--out", tmp)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "run: max goodput" in proc.stdout
        assert "goodput vs offered rate" in (Path(tmp) / "sweep.html").read_text().lower()
        doc = orjson.loads((Path(tmp) / "sweep.json").read_bytes())
        assert [p["rate_rps"] for p in doc["sweep"]["points"]] == [20.0, 40.0]


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_presets_offline_sends_everything_at_once_and_server_finds_a_rate(
        selftest_engine: str) -> None:
    off = loadgen("preset", "offline", "--target", selftest_engine, "--requests", "40",
                  "--output-tokens", "4", "--no-energy", "--quiet")
    assert off.returncode == 0, off.stderr[-2000:]
    assert "offline: 40/40 ok" in off.stdout
    srv = loadgen("preset", "server", "--target", selftest_engine, "--rates", "10,20",
                  "--duration", "1", "--output-tokens", "4", "--no-energy", "--quiet",
                  "--lag-threshold-ms", "50")
    assert srv.returncode == 0, srv.stderr[-2000:]
    assert "server: highest rate meeting TTFT<=500 ms and TPOT<=50 ms for 99% of requests: 20 " \
        "req/s" in srv.stdout


@pytest.mark.timeout(60)
def test_run_against_an_unreachable_target_fails_loudly() -> None:
    port = free_port()  # nothing listens there
    proc = loadgen("run", "--target", f"http://127.0.0.1:{port}", "--rate", "5", "--duration",
                   "0.5", "--no-energy", "--quiet", "--tokenizer", "words")
    assert proc.returncode == 1
    assert f"cannot connect to http://127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.timeout(60)
def test_run_refuses_a_target_that_is_not_a_url() -> None:
    proc = loadgen("run", "--target", "localhost:8080", "--rate", "5", "--duration", "0.5",
                   "--no-energy", "--quiet")
    assert proc.returncode == 2 and "is not an http:// or https:// URL" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_compare_search_that_never_saturates_says_so(sim_fleet: dict[str, str]) -> None:
    """`compare --search` capped below the engines' capacity: each arm's capacity reads
    '>= 4 (max tested, not saturated)', with the method, the time base and every trial in
    the JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = loadgen("compare", "--target", sim_fleet["bf16"], "--arm-target",
                       f"bf16={sim_fleet['bf16']}", "--arm-target", f"fp8={sim_fleet['fp8']}",
                       "--precisions", "bf16,fp8", "--search", "--rate", "2", "--max-rate",
                       "4", "--trials", "2", "--duration", "1.5", "--output-tokens", "8",
                       "--quiet", "--out", tmp)
        assert proc.returncode == 0, proc.stderr[-2000:]
        out = proc.stdout
        rows = [x for x in out.splitlines() if x.startswith(("bf16 ", "fp8 "))]
        assert len(rows) == 2 and all(">= 4 (max tested, not saturated)" in x for x in rows)
        assert "Time base: wall time" in out and "95 % Student t" in out
        doc = orjson.loads((Path(tmp) / "compare.json").read_bytes())
        arms = doc["search"]["arms"]
        assert [a["label"] for a in arms] == ["bf16", "fp8"]
        assert all(not a["saturated"] and [s["rate_rps"] for s in a["steps"]] == [2.0, 4.0]
                   and all(len(s["trials"]) == 2 for s in a["steps"]) for a in arms)
        assert len(doc["runs"]) == 8  # 2 arms x 2 rates x 2 trials
        assert "search trials" not in doc  # the trials are the runs themselves
        assert "<svg" in (Path(tmp) / "compare.html").read_text()
