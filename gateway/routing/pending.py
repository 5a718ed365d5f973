"""Prefill dispatched to an endpoint and not done yet, as the routing snapshots show it.

A burst's prompts all land on the cheapest open engine within milliseconds; their prefill
lengthens the steps its running streams decode in, which the learnt curves (latency by
requests resident, at a steady arrival rate) do not foresee. The learner sees, at every
routing decision, each candidate's in-flight count: a rise since the last decision is a
dispatch (a fall, requests finishing). Each dispatch adds the endpoint's mean prompt (from
its records), and what was added drains as first tokens come: exponentially, with the time
constant of the TTFT the endpoint's curves predict at its load, behind the prefill already
pending. It also keeps the output of a short stream there (the low tail of its recent
outputs): the streams a burst's prefill slows most per token. Departures between two
decisions hide dispatches, so the estimate is low at a steady rate and close during a burst,
the case it is for. O(1) per endpoint and decision; no allocation.
"""

from __future__ import annotations

import math


class PendingPrefill:
    """One endpoint's estimate of prompt tokens dispatched whose first token has not come."""

    __slots__ = ("inflight", "log_out", "prompt_mean", "prompt_w", "t_s", "tokens")

    SIZE_DECAY = 0.98  # per record: sizes of about the last 50 requests count

    def __init__(self) -> None:
        self.tokens = 0.0
        self.t_s: float | None = None
        self.inflight = 0
        self.prompt_mean = 0.0
        self.prompt_w = 0.0
        self.log_out = _LogMoments()

    def observe_request(self, prompt_tokens: float, output_tokens: float) -> None:
        """A finished request's size: its prompt (the size the next dispatches are counted
        at) and its output (the streams a burst's prefill would slow)."""
        if prompt_tokens > 0.0 and math.isfinite(prompt_tokens):
            self.prompt_w = self.prompt_w * self.SIZE_DECAY + 1.0
            self.prompt_mean += (prompt_tokens - self.prompt_mean) / self.prompt_w
        if output_tokens > 1.0 and math.isfinite(output_tokens):
            self.log_out.add(math.log(output_tokens), self.SIZE_DECAY)

    @property
    def short_output_tokens(self) -> float:
        """The output of a short stream on this endpoint: the 10th percentile of a lognormal
        fitted to recent outputs (inf before any). A burst's prefill must not push such a
        stream past the SLO either, whichever request brings it."""
        m = self.log_out
        return math.exp(m.mean - 1.2816 * m.std) if m.w > 0.0 else math.inf

    def observe(self, t_s: float, inflight: int, drain_s: float) -> float:
        """The in-flight count routing saw at `t_s`; `drain_s`: the TTFT now predicted (the
        time a dispatched prompt stays pending). Returns the pending tokens at `t_s`. A clock
        that steps back decays nothing."""
        if self.t_s is not None and t_s > self.t_s:
            self.tokens *= math.exp(-(t_s - self.t_s) / drain_s) if drain_s > 0.0 else 0.0
        if self.t_s is None or t_s >= self.t_s:
            self.t_s = t_s
        if inflight > self.inflight:
            self.tokens += (inflight - self.inflight) * self.prompt_mean
        self.inflight = inflight
        return self.tokens


class _LogMoments:
    """Decayed weight, mean and variance (West's weighted update)."""

    __slots__ = ("m2", "mean", "w")

    def __init__(self) -> None:
        self.w = 0.0
        self.mean = 0.0
        self.m2 = 0.0

    def add(self, x: float, decay: float) -> None:
        self.w = self.w * decay + 1.0
        self.m2 *= decay
        delta = x - self.mean
        self.mean += delta / self.w
        self.m2 += delta * (x - self.mean)

    @property
    def std(self) -> float:
        return math.sqrt(max(self.m2, 0.0) / self.w) if self.w > 1.0 else 0.0
