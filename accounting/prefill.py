"""Each engine's prefill rate and decode pace, learnt from the gateway's own records.

A request's prefill is placed on the interval grid just before its first token, over the time
the engine needs to read its prompt, bounded by the dispatch. A fixed span charged a
30,000-token prompt's prefill to the last quarter second before its first token and left the
earlier seconds of that prefill to the requests running beside it.

The rate is learnt from streamed requests whose engine reported their usage: each gives
prompt_tokens / (first token - dispatch), a lower bound on the engine's rate (the span also
holds queueing, the network and the first decode step). A high quantile of the recent samples
is what the engine does when it is not queueing. The rate falls with the prompt's length
(attention grows with the square of it: a simulated H100 reads 3,000-token prompts at ~36k
tokens/s and 30,000-token ones at ~24k), so samples are kept per power-of-two prompt length
and a prompt takes the rate of its own length class, else of the nearest class learnt, else
the default. Short prompts say little (fixed per-step costs dominate) and are not used.

The decode pace (seconds per output token, the median of recent streamed TPOTs) places the
decode of a request without token events (non-streamed) at the end of its engine span, and
its prefill just before it: what comes first in that span is queueing. Pure: no I/O, no clock.
"""

from __future__ import annotations

from bisect import insort
from collections import deque
from statistics import median

from core.records import RequestRecord

# Cold start: a GPU engine reads tens of thousands of prompt tokens a second (an 8B model on
# an H100: ~24-37k tok/s, docs/architecture.md, "Sources"); a lower default only widens the span.
DEFAULT_TOKENS_PER_S = 20_000.0
DEFAULT_TPOT_S = 0.02
MIN_PROMPT_TOKENS = 128
# Prompt tokens one engine step takes at most (vLLM V1's max_num_batched_tokens for online
# serving, which the simulator models): a long prompt is prefilled in chunks of this many,
# one step each.
CHUNK_TOKENS = 8192.0
MIN_SAMPLES = 4  # per length class, before its rate is used
WINDOW = 32  # recent samples kept per length class
TPOT_WINDOW = 64
QUANTILE = 0.9


def length_class(prompt_tokens: float) -> int:
    """The power-of-two class of a prompt length (128-255 -> 7, ..., 32k-64k -> 15)."""
    return max(int(prompt_tokens).bit_length() - 1, 0)


class _EngineRates:
    __slots__ = ("ordered", "rates", "samples", "tpots")

    def __init__(self) -> None:
        self.samples: dict[int, deque[float]] = {}
        # each window's samples in order of value, kept as they come and go: sorting the
        # window at every sample was a microsecond of every record
        self.ordered: dict[int, list[float]] = {}
        self.rates: dict[int, float] = {}  # length class -> learnt rate
        self.tpots: deque[float] = deque(maxlen=TPOT_WINDOW)


class PrefillRates:
    """Per engine, recent prefill-rate samples by prompt length class, and decode paces."""

    __slots__ = ("_default", "_default_tpot", "_engines")

    def __init__(self, default_tokens_per_s: float = DEFAULT_TOKENS_PER_S,
                 default_tpot_s: float = DEFAULT_TPOT_S):
        self._default = default_tokens_per_s
        self._default_tpot = default_tpot_s
        self._engines: dict[str, _EngineRates] = {}

    def observe(self, rec: RequestRecord) -> None:
        """Learn from one finished request (ignored unless it is a usable sample)."""
        if rec.prompt_source != "engine" or rec.first_token_s is None or not rec.engine:
            return
        eng = self._engines.get(rec.engine)
        if eng is None:
            eng = self._engines[rec.engine] = _EngineRates()
        tpot = rec.latency.tpot_s
        if tpot is not None and tpot > 0.0 and rec.status == "ok":
            eng.tpots.append(tpot)
        if rec.prompt_tokens < MIN_PROMPT_TOKENS or rec.dispatched_s is None:
            return
        span_s = rec.first_token_s - rec.dispatched_s
        if span_s <= 0.0:
            return
        k = length_class(rec.prompt_tokens)
        window = eng.samples.get(k)
        if window is None:
            window = eng.samples[k] = deque(maxlen=WINDOW)
            eng.ordered[k] = []
        ordered = eng.ordered[k]
        if len(window) == WINDOW:
            ordered.remove(window[0])  # the sample the append below drops
        sample = rec.prompt_tokens / span_s
        window.append(sample)
        insort(ordered, sample)
        if len(ordered) >= MIN_SAMPLES:
            eng.rates[k] = ordered[min(len(ordered) - 1, int(QUANTILE * len(ordered)))]

    def rate(self, engine: str, prompt_tokens: float = 0.0) -> float:
        """Prompt tokens per second the engine prefills a prompt of this length at: its length
        class's rate, else the nearest class's learnt (the longer one on a tie), else the
        default."""
        eng = self._engines.get(engine)
        if eng is None or not eng.rates:
            return self._default
        k = length_class(prompt_tokens)
        got = eng.rates.get(k)
        if got is not None:
            return got
        nearest = min(eng.rates, key=lambda c: (abs(c - k), -c))
        return eng.rates[nearest]

    def tpot(self, engine: str) -> float:
        """Seconds per output token the engine decodes at (median of recent TPOTs)."""
        eng = self._engines.get(engine)
        if eng is None or not eng.tpots:
            return self._default_tpot
        return median(eng.tpots)

    def learnt(self) -> dict[str, dict[int, float]]:
        """Per engine, the length classes whose rate is learnt, with it."""
        return {name: dict(eng.rates) for name, eng in self._engines.items() if eng.rates}
