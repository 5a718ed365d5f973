"""Prompt and output length distributions (pure, seeded) and prompt synthesis.

Prompts are synthesised as N whitespace-separated words: the simulated engine counts one prompt
token per word, and real tokenizers give roughly one token per common English word. For chat
requests the engine adds 4 tokens per message, which `words_for_tokens` subtracts.
"""

from __future__ import annotations

import bisect
import functools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Common short English words: one token each in BPE vocabularies of Llama-class models.
_WORD_TEXT = """
the of and to in is that for it as was with be by on not he this are or his from at
which but have an they you were her she there one all we their can has been if more when
will would who so no out up into do only new some could time these two may then first
any my now such like our over man me even most made after also did many before must
through back years where much your way well down should because each just those people
how too little state good very make world still own see men work long get here between
both life being under never day same another know while last might us great old year off
come since against go came right used take three
"""
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())
CHAT_TOKENS_PER_MESSAGE = 4


@dataclass(frozen=True, slots=True)
class LengthDist:
    """kind: fixed(value) | uniform(low, high) | lognormal(median, sigma) | zipf(s, max) |
    empirical(values). Samples are clamped to [min, max]."""

    kind: str
    value: int = 0
    low: int = 1
    high: int = 1
    median: float = 1.0
    sigma: float = 0.5
    s: float = 1.2
    values: tuple[int, ...] = ()
    min: int = 1
    max: int = 1_000_000

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            n = self.value
        elif self.kind == "uniform":
            n = rng.randint(self.low, self.high)
        elif self.kind == "lognormal":
            n = round(rng.lognormvariate(math.log(self.median), self.sigma))
        elif self.kind == "zipf":
            n = _zipf(rng, self.s, self.max)
        elif self.kind == "empirical":
            n = rng.choice(self.values)
        else:
            raise ValueError(f"unknown length kind {self.kind!r}")
        return min(max(n, self.min), self.max)

    @property
    def mean_hint(self) -> float:
        """Approximate mean, for sizing runs."""
        if self.kind == "fixed":
            return float(self.value)
        if self.kind == "uniform":
            return (self.low + self.high) / 2
        if self.kind == "lognormal":
            return self.median * math.exp(self.sigma**2 / 2)
        if self.kind == "empirical" and self.values:
            return sum(self.values) / len(self.values)
        return float(self.min)


def _zipf(rng: random.Random, s: float, n_max: int) -> int:
    """Zipf(s) on 1..min(n_max, 100000) by inverse CDF."""
    cdf = _zipf_cdf(s, min(n_max, 100_000))
    return bisect.bisect_left(cdf, rng.random() * cdf[-1]) + 1


@functools.lru_cache(maxsize=16)
def _zipf_cdf(s: float, cap: int) -> tuple[float, ...]:
    total, cdf = 0.0, []
    for k in range(1, cap + 1):
        total += k ** -s
        cdf.append(total)
    return tuple(cdf)


def fixed(n: int) -> LengthDist:
    return LengthDist("fixed", value=n, min=1, max=max(n, 1))


def from_spec(spec: int | Mapping[str, Any]) -> LengthDist:
    """From an int (fixed) or a mapping like {"kind": "lognormal", "median": 200, "sigma": 0.6}."""
    if isinstance(spec, int):
        return fixed(spec)
    kind = str(spec.get("kind", "fixed"))
    allowed = {"fixed", "uniform", "lognormal", "zipf", "empirical"}
    if kind not in allowed:
        raise ValueError(f"unknown length kind {kind!r}; allowed: {', '.join(sorted(allowed))}")
    kwargs: dict[str, Any] = {k: spec[k] for k in ("value", "low", "high", "median", "sigma", "s",
                                                  "min", "max") if k in spec}
    if "values" in spec:
        kwargs["values"] = tuple(int(v) for v in spec["values"])
    return LengthDist(kind, **kwargs)


def empirical(values: Sequence[int]) -> LengthDist:
    return LengthDist("empirical", values=tuple(values), min=1, max=max(values, default=1))


def words_for_tokens(tokens: int, chat: bool) -> int:
    return max(1, tokens - CHAT_TOKENS_PER_MESSAGE) if chat else max(1, tokens)


def synth_prompt(rng: random.Random, n_words: int, prefix: str = "") -> str:
    """`n_words` words (prefix words included) drawn from WORDS."""
    pre = prefix.split()
    body = [WORDS[rng.randrange(len(WORDS))] for _ in range(max(0, n_words - len(pre)))]
    return " ".join(pre[:n_words] + body)


def block_words(block_id: int, n: int = 512) -> list[str]:
    """The deterministic words of a 512-token prefix block (Mooncake hash id)."""
    rng = random.Random(f"block:{block_id}")
    return [WORDS[rng.randrange(len(WORDS))] for _ in range(n)]


def prompt_from_blocks(hash_ids: Sequence[int], n_words: int) -> str:
    """A prompt whose prefix blocks repeat across requests that share hash ids."""
    words: list[str] = []
    for h in hash_ids:
        if len(words) >= n_words:
            break
        words.extend(block_words(h))
    while len(words) < n_words:
        words.extend(block_words(-len(words) - 1))
    return " ".join(words[:n_words])
