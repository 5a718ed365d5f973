"""Benchmark clients, unchanged, through the gateway to real vLLM: the gateway's access log agrees
with what each tool reports.

`vllm bench serve` (vLLM's own client, from the installed package) and GuideLLM (its own
virtualenv, .ci/guidellm.sh) each send a few requests (16 and 8) one at a time, so the gateway's
lines after the run, in arrival order, are the tool's requests in its order. Per request:
recorded ok, prompt and completion tokens equal to the tool's (both tools read vLLM's usage), and
for `vllm bench serve` token events and TTFT as its own per-request output has them
(tests/realengine/agreement.py states the TTFT comparison). GuideLLM checks `GET /health`
before its first request.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.loadgen_vs_vllm import VLLM_BENCH_SNIPPET, VLLM_ENV
from tests.realengine import accesslog
from tests.realengine.agreement import TtftPair, summary, ttft_problems
from tests.realengine.conftest import ALIAS, Gateway, require_guidellm
from tests.support.procs import REPO

pytestmark = [pytest.mark.realengine, pytest.mark.timeout(300)]

BENCH_PROMPTS = 16  # TTFT's 2 ms bar is on the closest of them: enough for a busy machine
GUIDELLM_REQUESTS = 8
TOOL_TIMEOUT_S = 240.0


def _tool(cmd: list[str], log: Path, env: dict[str, str]) -> None:
    with open(log, "wb") as out:
        proc = subprocess.run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                              env={**os.environ, **env}, timeout=TOOL_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise AssertionError(f"{cmd[:3]} exited {proc.returncode}:\n{tail}")


def _recorded(rec: dict[str, Any]) -> str | None:
    """Why the record is not an ok stream, or None."""
    if (rec["status"], rec["http_status"], rec["stream"]) != ("ok", 200, True):
        return f"{rec['request_id']}: recorded {rec['status']}/{rec['http_status']}"
    return None


@pytest.mark.parametrize(("backend", "endpoint"), [("openai", "/v1/completions"),
                                                    ("openai-chat", "/v1/chat/completions")])
def test_vllm_bench_serve_requests_are_recorded_as_it_measured_them(
        logged_gateway: Gateway, tiny_model: Path, tmp_path: Path, backend: str,
        endpoint: str) -> None:
    """`vllm bench serve` (random prompts of 8-24 tokens, 4-12 output tokens, one at a time):
    every request recorded ok; per request the prompt tokens, completion tokens and token
    events equal the tool's, and so do the totals; TTFT as in agreement.py."""
    log = logged_gateway.access_log
    assert log is not None
    result = tmp_path / "vllm-bench.json"
    cmd = [sys.executable, "-c", VLLM_BENCH_SNIPPET, "--backend", backend,
           "--base-url", logged_gateway.url, "--endpoint", endpoint, "--model", ALIAS,
           "--tokenizer", str(tiny_model), "--dataset-name", "random",
           "--random-input-len", "16", "--random-output-len", "8", "--random-range-ratio", "0.5",
           "--num-prompts", str(BENCH_PROMPTS), "--max-concurrency", "1", "--seed", "7",
           "--disable-tqdm", "--save-result", "--save-detailed", "--result-dir", str(tmp_path),
           "--result-filename", result.name]
    start, since_s = accesslog.offset(log), time.time()
    _tool(cmd, tmp_path / "vllm-bench.log", {**VLLM_ENV, "OPENAI_API_KEY": logged_gateway.api_key})
    out = orjson.loads(result.read_bytes())
    assert (out["completed"], out["failed"]) == (BENCH_PROMPTS, 0), out["errors"]
    recs = accesslog.after(log, start, since_s, BENCH_PROMPTS)
    assert len(recs) == BENCH_PROMPTS, recs
    problems = [p for p in map(_recorded, recs) if p]
    theirs = list(zip(out["input_lens"], out["output_lens"], (len(i) + 1 for i in out["itls"]),
                      strict=True))
    ours = [(r["prompt_tokens"], r["completion_tokens"], r["token_events"]) for r in recs]
    problems += [f"request {i} {r['request_id']}: gateway (prompt, completion, events) {o}, "
                 f"vllm bench {t}" for i, (r, o, t) in enumerate(zip(recs, ours, theirs,
                                                                    strict=True)) if o != t]
    assert (sum(o[0] for o in ours), sum(o[1] for o in ours)) == (
        out["total_input_tokens"], out["total_output_tokens"])
    timed = [TtftPair(f"request {i} {r['request_id']}", float(t), float(r["ttft_s"]))
             for i, (r, t) in enumerate(zip(recs, out["ttfts"], strict=True))]
    print(f"\n[realengine] vllm bench serve {endpoint}: {summary(timed)}")
    problems += ttft_problems(timed)
    assert not problems, "\n".join(problems)


def test_guidellm_requests_are_recorded_as_it_counted_them(
        logged_gateway: Gateway, tiny_model: Path, tmp_path: Path) -> None:
    """GuideLLM (synchronous, synthetic prompts of 16 tokens, 6 output tokens, chat, its default):
    it passes its `GET /health` check, and every request is recorded ok with GuideLLM's prompt
    and output tokens, request by request and in total."""
    guidellm = require_guidellm()
    log = logged_gateway.access_log
    assert log is not None
    result = tmp_path / "guidellm.json"
    cmd = [str(guidellm), "run",
           "--backend", f"kind=openai_http,target={logged_gateway.url},model={ALIAS},"
                        f"api_key={logged_gateway.api_key}",
           "--profile", "kind=synchronous",
           "--constraint", f"kind=max_requests,count={GUIDELLM_REQUESTS}",
           "--data", "kind=synthetic_text,prompt_tokens=16,output_tokens=6",
           "--tokenizer", f"kind=huggingface_auto,model={tiny_model}",
           "--output", f"kind=json,path={result}", "--disable-console"]
    start, since_s = accesslog.offset(log), time.time()
    _tool(cmd, tmp_path / "guidellm.log", {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    bench = orjson.loads(result.read_bytes())["benchmarks"][0]
    totals = bench["metrics"]["request_totals"]
    assert (totals["successful"], totals["errored"], totals["incomplete"]) == (
        GUIDELLM_REQUESTS, 0, 0)
    theirs = sorted(bench["requests"]["successful"], key=lambda r: r["request_start_time"])
    recs = accesslog.after(log, start, since_s, GUIDELLM_REQUESTS)
    assert len(recs) == GUIDELLM_REQUESTS, recs
    problems = [p for p in map(_recorded, recs) if p]
    for i, (r, t) in enumerate(zip(recs, theirs, strict=True)):
        # The join by order holds only if each line's arrival lies within that request's span.
        assert t["request_start_time"] <= r["ts"] <= t["request_end_time"], (i, r, t)
        if (r["prompt_tokens"], r["completion_tokens"]) != (t["prompt_tokens"],
                                                            t["output_tokens"]):
            problems.append(f"request {i} {r['request_id']}: gateway (prompt, completion) "
                            f"{r['prompt_tokens'], r['completion_tokens']}, GuideLLM "
                            f"{t['prompt_tokens'], t['output_tokens']}")
    assert not problems, "\n".join(problems)
    assert (sum(r["prompt_tokens"] for r in recs), sum(r["completion_tokens"] for r in recs)) == (
        sum(t["prompt_tokens"] for t in theirs), sum(t["output_tokens"] for t in theirs))
