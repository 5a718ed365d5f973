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
its prefill just before it: what comes first in that span is queueing.

`read_span` places a streamed prompt's reading from its first token, the engine's steps and
its rate. Pure: no I/O, no clock.
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


# A prompt whose first token came later after its dispatch than its reading time plus this
# many steps' time (a chunk's) waited behind other prompts, and is read back to back with
# them; one read from (about) its dispatch keeps its reading up to its first token (a
# 12,000-token prompt that 30 prompts of 8 tokens joined: its last step read its own tail
# and theirs, and ending its reading half way through that step moved their bills by up to
# 4 points).
QUEUED_STEPS = 0.25
# Token events of one step that a busy gateway relays more than STEP_GAP_S apart
# (gateway/pipeline/flight.py) mark a "step" of a few milliseconds; a step that read a prompt
# chunk beside other sequences takes longer than this.
MIN_CHUNK_STEP_S = 0.02


def read_span(step_from_s: float | None, off: float, prompt: float, t_disp: float,
               t_first: float, prefill_s: float, rate: float) -> tuple[float, float]:
    """Where the engine read a prompt whose first token came at t_first: its start and end
    (the dispatch bounds the start later). By default prompt / rate just before the first
    token. A prompt of one chunk that shared its step with others (a burst's) was read for
    that whole step, from the engine's previous step on (`step_from_s`): longer than its own
    tokens take. A longer prompt queued behind others was read back to back with them, in
    steps of CHUNK_TOKENS: its last chunk shares its step with the next prompt's first, so
    its reading ended inside that step, not at its end: half way through a full step (its
    tail is anywhere from 1 to CHUNK_TOKENS tokens), at its end in a step shorter than half a
    chunk's time (nothing after it in that step)."""
    start = t_first - prefill_s
    if step_from_s is None:
        return start, t_first
    t_step = step_from_s + off
    if prompt <= CHUNK_TOKENS:
        if prompt >= MIN_PROMPT_TOKENS and t_step < start:
            return t_step, t_first
        return start, t_first
    if rate <= 0.0 or t_step <= t_disp:
        return start, t_first
    step_s = CHUNK_TOKENS / rate
    if start <= t_disp + QUEUED_STEPS * step_s:
        return start, t_first  # read from (about) its dispatch: nothing queued before it
    last = t_first - t_step
    if last < MIN_CHUNK_STEP_S:
        last = step_s  # one step's events read apart, not a step: take a full one
    end = t_first - last + (last if last > step_s else step_s) / 2.0
    if end > t_first:
        end = t_first
    return end - prefill_s, end


# A prompt token's attention over one token of the context before it, in units of that
# token's GEMMs, in the time of a prefill step: 1.18 ns a pair (work.py,
# PREFILL_ATTENTION_PER_KV) against 24.5 us of GEMMs a token (2 x 7.0e9 matmul parameters
# at the H100's BF16 rate and the kernels' efficiency; engines/sim/perf.py) for
# Llama-3.1-8B. At 10,000 tokens of context a token takes 1.5 times its GEMMs' time.
ATTENTION_PER_CONTEXT = 4.8e-5


def chunk_spans(prompt: float, t0: float, t1: float) -> list[tuple[float, float, float]]:
    """Where the engine read each chunk of a prompt read over t0..t1: (tokens, start, end)
    per chunk of CHUNK_TOKENS (the last holds the rest), one step each, each step as long as
    its tokens' work (their GEMMs and their attention over the context before them). A
    12,000-token prompt is read as 8,192 tokens in 0.24 s and 3,808 in 0.15 s, not at one
    rate: spread evenly over its 0.4 s, 600 tokens of the first step's were placed in the
    last 0.15 s, and if an interval began between them its requests (30 riders of that last
    step, two decoders) were billed 5-10 % under their Shapley shares and the prompt 3.5 %
    over. A prompt of one chunk is one span."""
    if prompt <= CHUNK_TOKENS or t1 <= t0:
        return [(prompt, t0, t1)]
    sizes: list[float] = []
    left = prompt
    while left > 0.0:
        size = CHUNK_TOKENS if left > CHUNK_TOKENS else left
        sizes.append(size)
        left -= size
    works: list[float] = []
    done = 0.0
    for size in sizes:
        works.append(size * (1.0 + ATTENTION_PER_CONTEXT * (done + size / 2.0)))
        done += size
    per_work = (t1 - t0) / sum(works)
    out: list[tuple[float, float, float]] = []
    start = t0
    for size, work in zip(sizes, works, strict=True):
        end = start + work * per_work
        out.append((size, start, end))
        start = end
    last = out[-1]
    out[-1] = (last[0], last[1], t1)  # the reading ends where it was placed to, exactly
    return out


def length_class(prompt_tokens: float) -> int:
    """The power-of-two class of a prompt length (128-255 -> 7, ..., 32k-64k -> 15)."""
    return max(int(prompt_tokens).bit_length() - 1, 0)


# The longest length class whose prompts are read in one step (4,096-8,191 tokens).
ONE_CHUNK_CLASS = length_class(CHUNK_TOKENS) - 1


def _one_chunk_floor(rates: dict[int, float]) -> dict[int, float]:
    """The rates a prompt without a first token is placed by: each class of one-chunk
    prompts at least as fast as the shorter classes. One step reads such a prompt, in a fixed
    time plus its tokens' time, so a longer prompt is read at more tokens a second, not
    fewer. A class learnt slower than a shorter one was learnt from queued samples only (a
    burst's prompts each waited for the others' steps: 3,200 tokens/s learnt for 512-1,023
    tokens beside 25,000 for 128-255 tokens in bench.accounting_strategies), and spread a
    1,000-token prompt's reading over ten times the 30 ms it took. A streamed prompt keeps
    its own class's rate: its reading is placed by its first token and the engine's steps
    (read_span), which a queued burst's samples describe."""
    out: dict[int, float] = {}
    floor = 0.0
    for k in sorted(rates):
        r = rates[k]
        if k <= ONE_CHUNK_CLASS:
            if r < floor:
                r = floor
            floor = r
        out[k] = r
    return out


class _EngineRates:
    __slots__ = ("ordered", "placed", "rates", "samples", "tpots")

    def __init__(self) -> None:
        self.samples: dict[int, deque[float]] = {}
        # each window's samples in order of value, kept as they come and go: sorting the
        # window at every sample was a microsecond of every record
        self.ordered: dict[int, list[float]] = {}
        self.rates: dict[int, float] = {}  # length class -> learnt rate
        self.placed: dict[int, float] = {}  # length class -> rate placed by (_one_chunk_floor)
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
            got = ordered[min(len(ordered) - 1, int(QUANTILE * len(ordered)))]
            if eng.rates.get(k) != got:
                eng.rates[k] = got
                eng.placed = _one_chunk_floor(eng.rates)

    def rate(self, engine: str, prompt_tokens: float = 0.0, stepped: bool = True) -> float:
        """Prompt tokens per second the engine prefills a prompt of this length at: its length
        class's rate, else the nearest class's learnt (the longer one on a tie), else the
        default. `stepped=False`: for a request without a first token (non-streamed), whose
        record shows no step of the engine to place its prompt in, the learnt rates with a
        one-chunk class at least as fast as the shorter ones (_one_chunk_floor)."""
        eng = self._engines.get(engine)
        if eng is None or not eng.rates:
            return self._default
        k = length_class(prompt_tokens)
        rates = eng.rates if stepped else eng.placed
        got = rates.get(k)
        if got is not None:
            return got
        nearest = min(rates, key=lambda c: (abs(c - k), -c))
        return rates[nearest]

    def tpot(self, engine: str) -> float:
        """Seconds per output token the engine decodes at (median of recent TPOTs)."""
        eng = self._engines.get(engine)
        if eng is None or not eng.tpots:
            return self._default_tpot
        return median(eng.tpots)

    def learnt(self) -> dict[str, dict[int, float]]:
        """Per engine, the length classes whose rate is learnt, with it."""
        return {name: dict(eng.rates) for name, eng in self._engines.items() if eng.rates}
