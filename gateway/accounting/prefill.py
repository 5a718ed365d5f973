"""Each engine's prefill rate (prompt tokens per second), learnt from the gateway's own records.

A request's prefill is placed on the interval grid just before its first token, over the time
the engine needs to read its prompt: prompt_tokens / rate, bounded by the dispatch. A fixed
span charged a 30,000-token prompt's prefill to the last quarter second before its first token
and left the earlier seconds of that prefill to the requests running beside it.

The rate is learnt from streamed requests whose engine reported their usage: each gives
prompt_tokens / (first token - dispatch), a lower bound on the engine's rate (the span also
holds queueing, the network and the engine's first decode step). A high quantile of the recent
samples is what the engine does when it is not queueing. Short prompts say little (fixed
per-step costs dominate), so only prompts of `MIN_PROMPT_TOKENS` or more are used. Until
`MIN_SAMPLES` are in, the default applies. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import deque

from gateway.records import RequestRecord

# Cold start: a GPU engine reads tens of thousands of prompt tokens a second (an 8B model on
# an H100: ~30-40k tok/s, REFERENCE.md's roofline); a lower default only widens the span.
DEFAULT_TOKENS_PER_S = 20_000.0
MIN_PROMPT_TOKENS = 128
MIN_SAMPLES = 8
WINDOW = 64  # recent samples kept per engine
QUANTILE = 0.9


class PrefillRates:
    """Per engine, a window of recent prefill-rate samples and the estimate they give."""

    __slots__ = ("_default", "_rates", "_samples")

    def __init__(self, default_tokens_per_s: float = DEFAULT_TOKENS_PER_S):
        self._default = default_tokens_per_s
        self._samples: dict[str, deque[float]] = {}
        self._rates: dict[str, float] = {}

    def observe(self, rec: RequestRecord) -> None:
        """Learn from one finished request (ignored unless it is a usable sample)."""
        if (rec.prompt_source != "engine" or rec.prompt_tokens < MIN_PROMPT_TOKENS
                or rec.first_token_s is None or rec.dispatched_s is None):
            return
        span_s = rec.first_token_s - rec.dispatched_s
        if span_s <= 0.0:
            return
        window = self._samples.get(rec.engine)
        if window is None:
            window = self._samples[rec.engine] = deque(maxlen=WINDOW)
        window.append(rec.prompt_tokens / span_s)
        if len(window) >= MIN_SAMPLES:
            ordered = sorted(window)
            self._rates[rec.engine] = ordered[min(len(ordered) - 1,
                                                  int(QUANTILE * len(ordered)))]

    def rate(self, engine: str) -> float:
        """Prompt tokens per second the engine prefills at (the default until learnt)."""
        return self._rates.get(engine, self._default)

    def learnt(self) -> dict[str, float]:
        """The engines whose rate is learnt, with it (for /metrics and the admin API)."""
        return dict(self._rates)
