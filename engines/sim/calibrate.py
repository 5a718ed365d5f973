"""Closed-batch runs of the pure engine core, for calibration tables and tests (no sleeping)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from engines.sim.catalog import deployment
from engines.sim.perf import KernelProfile, kernel_profile
from engines.sim.scheduler import BatchingCore

CAL_PROMPT_TOKENS = 512  # calibration workload: chat-like prompt and answer lengths
CAL_OUTPUT_TOKENS = 512


@dataclass(frozen=True, slots=True)
class BatchResult:
    batch: int
    duration_s: float
    energy_j: float
    output_tokens: int
    tpot_s: float  # median over requests
    ttft_s: float  # median over requests

    @property
    def j_per_token(self) -> float:
        return self.energy_j / self.output_tokens

    @property
    def avg_power_w(self) -> float:
        return self.energy_j / self.duration_s


def run_batch(gpu: str, model: str, precision: str, dialect: str, batch: int, *, tp: int = 1,
              prompt_tokens: int = CAL_PROMPT_TOKENS,
              output_tokens: int = CAL_OUTPUT_TOKENS,
              profile: KernelProfile | None = None) -> BatchResult:
    """`batch` identical requests arriving together, run to completion on the pure core
    (`profile`: kernel coefficients other than the dialect's, for sensitivity checks)."""
    d = deployment(gpu, model, precision, tp)
    prof = profile if profile is not None else kernel_profile(dialect, precision)
    core = BatchingCore(d, prof, max_batch=max(batch, 1))
    for i in range(batch):
        core.submit(f"r{i}", prompt_tokens, output_tokens, 0.0)
    while (wake := core.next_wakeup_s()) is not None:
        core.advance(wake)
    truths = core.take_finished()
    tpots = [t.tpot_s for t in truths if t.tpot_s is not None]
    ttfts = [t.ttft_s for t in truths if t.ttft_s is not None]
    return BatchResult(batch, core.now_s, core.ledger.counter_j, batch * output_tokens,
                       statistics.median(tpots), statistics.median(ttfts))


CAL_BATCHES = (1, 8, 16, 64, 128, 256)
CAL_ARMS = (("vllm", "bf16"), ("vllm", "fp8"), ("vllm", "int8"), ("vllm", "int4"),
            ("trtllm", "fp16"), ("trtllm", "fp8"))


def calibration_runs(gpu: str = "h100", model: str = "llama-3.1-8b",
                     output_tokens: int = CAL_OUTPUT_TOKENS) -> dict[tuple[str, str, int], BatchResult]:
    """(dialect, precision, batch) -> closed-batch result for the calibration table."""
    return {
        (dialect, prec, batch): run_batch(gpu, model, prec, dialect, batch,
                                          output_tokens=output_tokens)
        for dialect, prec in CAL_ARMS for batch in CAL_BATCHES
    }


def markdown_table(runs: dict[tuple[str, str, int], BatchResult]) -> str:
    """J per output token / median TPOT (ms) / mean power (W) per arm and batch."""
    head = "| engine, precision | " + " | ".join(f"batch {b}" for b in CAL_BATCHES) + " |"
    rule = "| --- |" + " --- |" * len(CAL_BATCHES)
    lines = [head, rule]
    for dialect, prec in CAL_ARMS:
        cells = []
        for b in CAL_BATCHES:
            r = runs[(dialect, prec, b)]
            cells.append(f"{r.j_per_token:.3f} J, {r.tpot_s * 1e3:.1f} ms, {r.avg_power_w:.0f} W")
        lines.append(f"| {dialect} {prec} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
