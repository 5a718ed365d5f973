"""A work row's fields: `WorkRow` (named), `Work` (the plain tuple work_rows builds) and
`WorkColumns` (rows column by column, as the apportioner reads them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class WorkRow(NamedTuple):
    """One request's work in one interval, with its fields named. `work_rows` builds the same
    values as plain tuples (`Work`: 4x cheaper to build than this class, and the spreading of
    every record over the grid is mostly row building); the ledger reads rows back as this."""

    request_id: str
    interval_idx: int
    prefill_tokens: float
    decode_tokens: float
    residency_s: float
    start_s: float = 0.0  # offset of the residency span from the interval start
    kv_tokens: float = 0.0  # sum over decoded tokens of their context length (KV read work)
    # the head of the span (accounting/heads.py): its seconds from the span's start (a
    # prefill's, or up to where the pace changed; 0: none) and the decode tokens in it
    head_s: float = 0.0
    head_decode: float = 0.0


# A WorkRow's fields as a plain tuple, in WorkRow's order. A WorkRow is one.
Work = tuple[str, int, float, float, float, float, float, float, float]
# A Work as `work_rows` builds it before its head is found (accounting/heads.py): its last
# field is the prefill's seconds, and head_decode is not there yet.
HeadlessWork = tuple[str, int, float, float, float, float, float, float]


class WorkColumns(NamedTuple):
    """Work rows column by column, named (one C-level transpose of the rows): what the
    apportioner reads instead of indexing each row."""

    request_id: tuple[str, ...]
    interval_idx: tuple[int, ...]
    prefill_tokens: tuple[float, ...]
    decode_tokens: tuple[float, ...]
    residency_s: tuple[float, ...]
    start_s: tuple[float, ...]
    kv_tokens: tuple[float, ...]
    head_s: tuple[float, ...]
    head_decode: tuple[float, ...]

    @classmethod
    def of(cls, rows: Sequence[Work]) -> WorkColumns:
        if not rows:
            return EMPTY_COLUMNS
        return cls._make(zip(*rows, strict=True))


EMPTY_COLUMNS = WorkColumns((), (), (), (), (), (), (), (), ())
