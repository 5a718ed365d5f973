"""Where the engine read a long prompt that queued behind other prompts (pure).

An engine with chunked prefill reads its waiting prompts first come, first served, as one
stream of tokens cut into steps of CHUNK_TOKENS: a queued prompt's first chunk shares the step
that read the previous prompt's last tokens, its last chunk the step that reads the next
prompt's first. One record alone cannot say where those cuts fell (a queued prompt's head is
CHUNK_TOKENS less the previous prompt's tail, anywhere from one token to a whole chunk); the
records of the engine's earlier prompts can. Each streamed record with a first token is
remembered here, with the tokens it left in its last step (its tail) and where that step
began (`step_from_s`: the engine's previous step's last token event); a queued prompt's
predecessor is the prompt dispatched before it whose first token came last before its own
(after its dispatch). Its chunks then follow: its head in the predecessor's last step, whole
chunks after it, its tail in its own last step. The first prompt of a queue read whole
chunks from a step's start and its tail in its last step, beside the next prompt's head.

In `bench.accounting_strategies`, six 10,000-16,000-token prompts 0.05 s apart are read back
to back over about two seconds. The records of fifteen kept runs recorded again with this
placement billed them within 2.7 % of their Shapley shares at p95 on average (5.5 % in the
worst run), where each record's own first token and step placed them 14.5 % (21.7 %) off;
given the simulator's own steps, 1.5 % (2.5 %).

A record is placed this way only once every prompt that could have been read before it was
seen (the recorder holds it until then, accounting/recorder.py): placed with what had come
so far (records come as requests finish, in no order of their reading), the same prompts
were 18.2 % (29.5 %) off.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from typing import NamedTuple, Protocol

from accounting.prefill import CHUNK_TOKENS, MIN_CHUNK_STEP_S, QUEUED_STEPS
from core.records import RequestRecord

# Records remembered per engine: those whose first token came this long before the latest
# dispatch seen are forgotten (a prompt queued longer than this is placed by its own record).
MEMORY_S = 30.0
# Token events less than this apart are one step's (gateway/pipeline/flight.py, STEP_GAP_S):
# two prompts whose first tokens came this close were read in the same step.
SAME_STEP_S = 0.003
# Whole chunks between the head and the tail that the steps' times contradict by more than
# this many steps: the prompts were not read back to back (a preemption, another order).
MISMATCH_STEPS = 1.0
# Prompts whose first token came between a prompt's dispatch and its own looked at, at most,
# for the one dispatched before it (a busy engine's others were dispatched after it).
LOOK_BACK = 64
# An engine's remembered prompts are kept in blocks of BLOCK to 2 * BLOCK (_Engine).
BLOCK = 512

Chunks = list[tuple[float, float, float]]  # (tokens, start, end) per step, wall clock


class PlacesPrompts(Protocol):
    """What the recorder asks: `QueuedPrompts.place`."""

    def place(self, rec: RequestRecord, rate: float, /) -> Chunks | None: ...


class _Seen(NamedTuple):
    dispatched: float  # wall clock
    first: float  # its first token, the end of its last step
    last_start: float  # where its last step began
    tail: float  # its tokens in that step


class _Engine:
    """One engine's remembered prompts in order of first token, in blocks of at most
    2 * BLOCK (`firsts` beside them: the bisections compare floats; `maxes`: each block's
    last first token). Records come as requests finish, so a prompt's first token can be a
    long stream's length behind the latest: one flat list would move every later entry on
    each insert."""

    __slots__ = ("firsts", "latest", "maxes", "seen")

    def __init__(self) -> None:
        self.firsts: list[list[float]] = []
        self.seen: list[list[_Seen]] = []
        self.maxes: list[float] = []
        self.latest = -math.inf  # the latest dispatch seen

    def forget(self, t_disp: float) -> None:
        """Forget the prompts whose first token came MEMORY_S before the latest dispatch."""
        if t_disp > self.latest:
            self.latest = t_disp
        edge = self.latest - MEMORY_S
        maxes = self.maxes
        if not maxes or self.firsts[0][0] >= edge:
            return
        drop = bisect_left(maxes, edge)
        if drop:
            del self.firsts[:drop], self.seen[:drop], maxes[:drop]
        if maxes:
            cut = bisect_left(self.firsts[0], edge)
            del self.firsts[0][:cut], self.seen[0][:cut]

    def add(self, s: _Seen) -> None:
        maxes, first = self.maxes, s.first
        if not maxes:
            self.firsts.append([first])
            self.seen.append([s])
            maxes.append(first)
            return
        k = bisect_right(maxes, first)
        if k == len(maxes):  # after every remembered prompt: the last block's end
            k -= 1
        firsts, seen = self.firsts[k], self.seen[k]
        i = bisect_right(firsts, first)
        firsts.insert(i, first)
        seen.insert(i, s)
        maxes[k] = firsts[-1]
        if len(firsts) > 2 * BLOCK:
            self.firsts[k + 1:k + 1] = [firsts[BLOCK:]]
            self.seen[k + 1:k + 1] = [seen[BLOCK:]]
            del firsts[BLOCK:], seen[BLOCK:]
            maxes.insert(k, firsts[-1])

    def predecessor(self, t_disp: float, t_first: float) -> _Seen | None:
        """The prompt read just before one dispatched at t_disp: of those dispatched before
        it, the one whose first token came last up to its own (and after its dispatch),
        looked for among the LOOK_BACK prompts whose first token came last up to its own."""
        maxes = self.maxes
        if not maxes:
            return None
        k = bisect_right(maxes, t_first)
        if k == len(maxes):
            k -= 1
            i = len(self.firsts[k])
        else:
            i = bisect_right(self.firsts[k], t_first)
        seen = self.seen[k]
        for _ in range(LOOK_BACK):
            if i == 0:
                if k == 0:
                    return None
                k -= 1
                seen = self.seen[k]
                i = len(seen)
            i -= 1
            s = seen[i]
            if s.first <= t_disp:
                return None
            if s.dispatched < t_disp:
                return s
        return None


def _tail(tokens: float) -> float:
    """The tokens of a prompt's last step where its reading began at a step's start (1 to
    CHUNK_TOKENS)."""
    return ((tokens - 1.0) % CHUNK_TOKENS) + 1.0


def queued_behind(rec: RequestRecord, rate: float) -> bool:
    """Whether a streamed prompt longer than one chunk waited behind others: its first token
    came later after its dispatch than its reading time plus QUEUED_STEPS of a chunk's."""
    if (rec.first_token_s is None or rec.dispatched_s is None or rate <= 0.0
            or rec.prompt_tokens <= CHUNK_TOKENS or rec.step_from_s is None):
        return False
    waited = rec.first_token_s - rec.dispatched_s
    return waited > (rec.prompt_tokens + QUEUED_STEPS * CHUNK_TOKENS) / rate


class QueuedPrompts:
    """Per engine, the recent prompts' last steps; `place` remembers a record and returns
    where a queued long prompt's chunks were read (None: placed by its own record)."""

    __slots__ = ("_engines",)

    def __init__(self) -> None:
        self._engines: dict[str, _Engine] = {}

    def place(self, rec: RequestRecord, rate: float) -> Chunks | None:
        """Remember a streamed record's last step and tail; where it is a queued prompt
        longer than a chunk (`queued_behind`) read after a remembered predecessor, its chunks.
        `rate`: the engine's learnt prefill rate for its length (a chunk's step time)."""
        t_first, t_disp, engine = rec.first_token_s, rec.dispatched_s, rec.engine
        if t_first is None or t_disp is None or not engine or not rec.prompt_tokens:
            return None
        off = float(rec.arrived_wall_s - rec.arrived_s)  # floats out, whatever came in
        t_disp += off
        t_first += off
        prompt = float(rec.prompt_tokens)  # what can raise, before anything is remembered
        step_s = CHUNK_TOKENS / rate if rate > 0.0 else 0.0
        step_from = rec.step_from_s
        last_start, sure = t_first - step_s, False
        if step_from is not None and t_first - (step_from + off) >= MIN_CHUNK_STEP_S:
            last_start, sure = step_from + off, True
        eng = self._engines.get(engine)
        if eng is None:
            eng = self._engines[engine] = _Engine()
        eng.forget(t_disp)
        pred = eng.predecessor(t_disp, t_first)
        chunks = None
        if pred is None:
            tail = _tail(prompt)
            if sure and step_s > 0.0:
                chunks = _first(prompt, t_disp, last_start, t_first, step_s)
        elif t_first - pred.first < SAME_STEP_S:
            last_start, tail = pred.last_start, pred.tail + prompt  # read in its last step
        elif step_from is not None and step_s > 0.0:
            chunks, tail = _chain(pred, prompt, t_disp, last_start, t_first, step_s, sure)
            if chunks is not None:
                last_start = chunks[-1][1]
        else:
            tail = _tail(prompt)
        eng.add(_Seen(t_disp, t_first, last_start, tail))
        if chunks is None or not queued_behind(rec, rate):
            return None
        return chunks


def _first(prompt: float, t_disp: float, last_start: float, t_first: float, step_s: float
           ) -> Chunks | None:
    """The chunks of the first prompt of a queue (none read before it): whole chunks from a
    step's start, a chunk's time each, back to back up to its last step, which holds its
    tail and the next prompt's head."""
    tail = _tail(prompt)
    whole = round((prompt - tail) / CHUNK_TOKENS)
    if whole == 0 or not (last_start - t_disp) / step_s >= whole - MISMATCH_STEPS:  # NaN too
        return None
    start = max(t_disp, last_start - whole * step_s)
    each = (last_start - start) / whole
    per = (prompt - tail) / whole
    out: Chunks = [(per, start + s * each, start + (s + 1) * each) for s in range(whole)]
    out.append((tail, last_start, t_first))
    return out


def _chain(pred: _Seen, prompt: float, t_disp: float, last_start: float, t_first: float,
           step_s: float, sure: bool) -> tuple[Chunks | None, float]:
    """A prompt's chunks after its predecessor's last step, and its tail (the tokens of its
    last step). Its head fills that step's budget after the predecessor's tail, unless it
    came while that step ran (then its reading began at the next). `sure`: its last step's
    start is the engine's previous step's last token event, not a guess."""
    if t_disp > pred.last_start:
        head, first = min(prompt, CHUNK_TOKENS), None
    else:
        head = min(prompt, max(0.0, CHUNK_TOKENS - pred.tail))
        first = (head, pred.last_start, pred.first) if head > 0.0 else None
    rest = prompt - head
    if rest <= 0.0 or (sure and last_start < pred.first - SAME_STEP_S):
        return None, _tail(prompt)
    tail = _tail(rest)
    in_whole = prompt - tail - (head if first is not None else 0.0)
    whole = round(in_whole / CHUNK_TOKENS)
    if not sure:  # its whole steps a chunk's time each after the predecessor's
        last_start = min(t_first, pred.first + whole * step_s)
    if last_start < pred.first:  # the same token event, through two records' clocks
        last_start = pred.first
    if not abs((last_start - pred.first) / step_s - whole) <= MISMATCH_STEPS:  # NaN too
        return None, tail
    chunks: Chunks = [first] if first is not None else []
    if whole:  # whole steps from the predecessor's first token to its own last step
        each = (last_start - pred.first) / whole
        per = in_whole / whole
        chunks += [(per, pred.first + s * each, pred.first + (s + 1) * each)
                   for s in range(whole)]
    chunks.append((tail, last_start, t_first))
    return chunks, tail


def queued_prompts() -> PlacesPrompts:
    """A QueuedPrompts: compiled where it was built (accounting/_queued.c: the same prompts
    remembered, the same chunks to the bit, about a fifth of the CPU), else this module's."""
    try:
        from accounting._queued import QueuedPrompts as Compiled
    except ImportError:  # pragma: no cover - a build without a C compiler
        return QueuedPrompts()
    return Compiled(chunk_tokens=CHUNK_TOKENS, min_chunk_step_s=MIN_CHUNK_STEP_S,
                    queued_steps=QUEUED_STEPS, memory_s=MEMORY_S, same_step_s=SAME_STEP_S,
                    mismatch_steps=MISMATCH_STEPS, look_back=LOOK_BACK, block=BLOCK)
