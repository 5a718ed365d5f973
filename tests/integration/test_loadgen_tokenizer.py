"""`wattgate loadgen run --tokenizer` end to end: the engine (the loadgen's self-test engine,
counting prompt tokens with the same tokenizer) reports exactly --prompt-tokens for every
request; without --tokenizer the run warns once that lengths are words."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.support.procs import REPO, free_port, running, wattgate_cmd
from tests.unit.test_loadgen_tokens import train_tokenizer


def loadgen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(wattgate_cmd("loadgen", *args), cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


@pytest.fixture(scope="module")
def engine(tokenizer_json: Path) -> Iterator[str]:
    """A self-test engine whose usage counts prompt tokens with the trained tokenizer."""
    port = free_port()
    with running(wattgate_cmd("loadgen", "selftest-engine", "--port", str(port), "--tokenizer",
                              str(tokenizer_json)), f"http://127.0.0.1:{port}/health",
                 timeout_s=60):
        yield f"http://127.0.0.1:{port}"


def run(engine: str, out: Path, api: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return loadgen("run", "--target", engine, "--api", api, "--prompt-tokens", "37",
                   "--output-tokens", "3", "--rate", "20", "--duration", "1", "--requests", "12",
                   "--no-energy", "--quiet", "--out", str(out), *extra)


def engine_prompt_tokens(out: Path) -> list[int]:
    doc = orjson.loads((out / "run.json").read_bytes())
    return [r["prompt_tokens"] for r in doc["runs"][0]["requests"] if r["status"] == "ok"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("api", ["completions", "chat"])
def test_engine_counts_exactly_the_requested_prompt_tokens(engine: str, tokenizer_json: Path,
                                                           tmp_path: Path, api: str) -> None:
    """--tokenizer: every request's usage.prompt_tokens is 37, no warning, and the summary says
    lengths are tokens of that tokenizer."""
    proc = run(engine, tmp_path, api, "--tokenizer", str(tokenizer_json))
    assert proc.returncode == 0, proc.stderr
    counts = engine_prompt_tokens(tmp_path)
    assert len(counts) >= 5 and set(counts) == {37}
    assert "warning" not in proc.stderr
    assert f"prompts: prompt lengths in tokens of {tokenizer_json}" in proc.stdout


@pytest.mark.timeout(240)
def test_without_tokenizer_lengths_are_words_and_the_run_warns_once(engine: str,
                                                                    tmp_path: Path) -> None:
    """No --tokenizer: one warning; the engine's tokenizer counts other than 37 tokens for 37
    words (the tiny vocabulary splits common words), which is why it warns."""
    proc = run(engine, tmp_path, "completions")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("WORDS, not tokens") == 1
    assert "words, not tokens" in proc.stdout
    assert set(engine_prompt_tokens(tmp_path)) != {37}


@pytest.mark.timeout(120)
def test_tokenizer_words_chooses_words_without_a_warning_and_a_bad_path_is_refused(
        engine: str, tmp_path: Path) -> None:
    proc = run(engine, tmp_path, "completions", "--tokenizer", "words")
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr
    bad = run(engine, tmp_path, "completions", "--tokenizer", str(tmp_path / "absent"))
    assert bad.returncode == 2
    assert "no tokenizer.json" in bad.stderr
