"""The simulated engine's own `/metrics` (its load and serving stats) in each dialect: vLLM
Prometheus text and trtllm-serve iteration stats.

Both are pure renderings of plain state, so they are tested without a server.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from engines.sim.state import Emission, IterationStat

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                  2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


@dataclass(slots=True)
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1


@dataclass(slots=True)
class ServingStats:
    """Counters and histograms fed from the engine's token emissions (engine-clock seconds)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    success: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS_S))

    def observe(self, em: Emission, arrived_s: float, prompt_tokens: int,
                last_token_s: float | None) -> None:
        self.generation_tokens += em.tokens
        if em.first:
            self.prompt_tokens += prompt_tokens
            if em.tokens:  # a pooling request (embeddings) ends without a first token
                self.ttft.observe(em.time_s - arrived_s)
        elif last_token_s is not None:
            self.itl.observe(em.time_s - last_token_s)
        if em.done:
            self.success += 1


def _fmt(value: float) -> str:
    return repr(float(value))


def _histogram_lines(name: str, labels: str, h: Histogram) -> list[str]:
    lines = [f"# HELP {name} Histogram of {name.split(':')[1].replace('_', ' ')}.",
             f"# TYPE {name} histogram"]
    cumulative = 0
    for bound, count in zip(h.bounds, h.counts, strict=False):
        cumulative += count
        lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {_fmt(cumulative)}')
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {_fmt(h.n)}')
    lines.append(f"{name}_count{{{labels}}} {_fmt(h.n)}")
    lines.append(f"{name}_sum{{{labels}}} {_fmt(h.total)}")
    return lines


def render_vllm(stats: ServingStats, model_name: str, running: int, waiting: int,
                kv_usage: float) -> bytes:
    """Prometheus text with vLLM's metric names and labels (model_name, engine="0")."""
    labels = f'engine="0",model_name="{model_name}"'
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {_fmt(running)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} {_fmt(waiting)}",
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{labels}}} {_fmt(kv_usage)}",
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{{{labels}}} {_fmt(stats.prompt_tokens)}",
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{labels}}} {_fmt(stats.generation_tokens)}",
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{{labels},finished_reason="length"}} {_fmt(stats.success)}',
    ]
    lines += _histogram_lines("vllm:time_to_first_token_seconds", labels, stats.ttft)
    lines += _histogram_lines("vllm:inter_token_latency_seconds", labels, stats.itl)
    return ("\n".join(lines) + "\n").encode()


def render_trtllm(stats: Sequence[IterationStat], wall_of_engine_s: float,
                  time_scale: float, max_active: int) -> bytes:
    """trtllm-serve's `/metrics`: a JSON list of iteration stats (oldest first)."""
    out: list[dict[str, Any]] = []
    for st in stats:
        wall = wall_of_engine_s + st.end_s / time_scale
        out.append({
            "iter": st.iteration,
            "iterLatencyMS": st.latency_s * 1000.0,
            "timestamp": time.strftime("%m-%d-%Y %H:%M:%S", time.gmtime(wall)),
            "numActiveRequests": st.active,
            "numQueuedRequests": st.queued,
            "numCompletedRequests": st.completed,
            "maxNumActiveRequests": max_active,
            "gpuMemUsage": 0,
            "cpuMemUsage": 0,
            "pinnedMemUsage": 0,
            "kvCacheStats": {
                "maxNumBlocks": st.max_blocks,
                "freeNumBlocks": st.max_blocks - st.used_blocks,
                "usedNumBlocks": st.used_blocks,
                "tokensPerBlock": st.tokens_per_block,
                "allocTotalBlocks": st.used_blocks,
                "allocNewBlocks": 0,
                "reusedBlocks": 0,
            },
            "inflightBatchingStats": {
                "numScheduledRequests": st.active,
                "numContextRequests": 0,
                "numGenRequests": st.active,
                "numPausedRequests": 0,
                "numCtxTokens": 0,
                "microBatchId": 0,
            },
        })
    return orjson.dumps(out)
