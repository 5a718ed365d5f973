"""A precision's output quality: a score relative to the 16-bit model, its benchmark and source.

A gateway endpoint may state its own (`quality: {score, benchmark, source}` in the config);
without one it gets the published figure for its format below. The defaults are the
accuracy recovery (quantized score / BF16 score) that Kurtic et al., "Give Me BF16 or Give Me
Death? Accuracy-Performance Trade-Offs in LLM Quantization" (2024, arXiv:2411.02355), report
for the Llama-3.1 family, read from the paper's summary of each format, rounded down to the
low end of its range so that a floor is never met by rounding up:

- W8A8-FP8: "effectively lossless" at every model size, above 99 % recovery: 0.99.
- W8A8-INT8 (SmoothQuant/GPTQ, tuned): 1-3 % below BF16: 0.98 (its midpoint).
- W4A16-INT4 (GPTQ/AWQ, group 128): "competitive", about 97-99 % recovery (the 8B
  checkpoint's MMLU 5-shot recovery is 97.9 %): 0.97.

A score measured on your own workload should replace them (config, or `--quality` of
`wattgate loadgen compare`).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.config_fields import FieldReader
from core.errors import ConfigError

PAPER = ("Kurtic et al., 'Give Me BF16 or Give Me Death? Accuracy-Performance Trade-Offs in "
         "LLM Quantization', 2024 (arXiv:2411.02355), Llama-3.1")
BENCHMARK = "accuracy recovery vs BF16, academic and real-world tasks"


@dataclass(frozen=True, slots=True)
class Quality:
    score: float  # in [0, 1]: the precision's benchmark score relative to the 16-bit model
    benchmark: str
    source: str

    def text(self) -> str:
        return f"{self.score:g} ({self.benchmark}; {self.source})"


REFERENCE = Quality(1.0, BENCHMARK, "16-bit reference")
PUBLISHED: dict[str, Quality] = {
    "bf16": REFERENCE,
    "fp16": REFERENCE,
    "fp8": Quality(0.99, BENCHMARK + " (W8A8-FP8: above 99 %)", PAPER),
    "int8": Quality(0.98, BENCHMARK + " (W8A8-INT8: 1-3 % lower)", PAPER),
    "int4": Quality(0.97, BENCHMARK + " (W4A16-INT4: about 97-99 %)", PAPER),
}


def published(precision: str) -> Quality | None:
    """The published default for a precision (an arm label "fp8 (vllm)" works too)."""
    return PUBLISHED.get(precision.split(" ", 1)[0].lower())


def excluded_text(label: str, q: Quality, floor: float) -> str:
    return f"{label} excluded: quality {q.score:g} < floor {floor:g}"


def parse_quality(r: FieldReader, precision: str) -> Quality | None:
    """An endpoint's `quality: {score, benchmark, source}` read from its config mapping `r`;
    absent, its precision's published figure."""
    if r.get("quality") is None:
        return published(precision)
    q = r.sub("quality")
    score = q.number("score", None, inclusive=True)
    if score > 1.0:
        raise ConfigError(q.at("score"), "must be a number from 0 to 1 (relative to 16-bit)")
    out = Quality(score, q.text("benchmark"), q.text("source"))
    q.finish()
    return out
