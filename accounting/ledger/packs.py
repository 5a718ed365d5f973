"""Work rows stored in packs: one ledger row per (engine, interval) and append, holding every
work row that append wrote for that interval (schema version 11; rows with `head_s` and
`head_decode` from version 14: a pack written before holds arrays without them, which read
as 0).

A work row per request and interval was a B-tree insert for each (about 7 per streamed
request); a pack is one for all of an append's requests in the interval. The pack's key is
the interval's version after the append bumped it (`work_versions`), so packs of one
interval are ordered as they were written, and the rows are a MessagePack array of `Work`
tuples (`WorkRow`'s fields; floats as 64-bit doubles, so the same bits come back).

A request id written twice (a journal replayed) keeps its first rows, as the per-row table's
`ON CONFLICT DO NOTHING` did: `unpack` drops a (request, interval) seen earlier.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from accounting.work import Work, WorkRow

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list[WorkRow])

# An append's packs, after it bumped each interval's version: the version is read back in the
# statement (two replicas' appends to one interval are serialised by that version's row lock).
INSERT_PACK = """INSERT INTO work_packs (engine, interval_idx, version, n_rows, packed)
    VALUES (?, ?, (SELECT version FROM work_versions WHERE engine = ? AND interval_idx = ?),
    ?, ?)"""
SELECT_PACKS = """SELECT packed FROM work_packs
    WHERE engine = ? AND interval_idx >= ? AND interval_idx <= ? ORDER BY interval_idx, version"""


def pack_params(work: Mapping[str, Sequence[Work]]) -> list[tuple[Any, ...]]:
    """INSERT_PACK's parameters for work rows by engine: one pack per (engine, interval), its
    rows in the order given (of a request's two rows in one interval the first still wins).
    Grouped in one pass (a sort of the rows cost twice as much)."""
    out: list[tuple[Any, ...]] = []
    encode = _encoder.encode
    for engine, rows in work.items():
        groups: defaultdict[int, list[Work]] = defaultdict(list)
        for row in rows:
            groups[row[1]].append(row)
        out += [(engine, k, engine, k, len(groups[k]), encode(groups[k]))
                for k in sorted(groups)]
    return out


def unpack(legacy: Sequence[Sequence[Any]], packs: Iterable[Sequence[Any]]) -> list[WorkRow]:
    """The work rows of per-row `legacy` rows (written before packs, so first) and of
    SELECT_PACKS' rows, each (request, interval) once: the first written."""
    rows = list(map(WorkRow._make, legacy))
    for (packed,) in packs:
        rows += _decoder.decode(packed)
    if not legacy and len(rows) < 2:
        return rows
    seen = {(r.request_id, r.interval_idx) for r in rows}
    if len(seen) == len(rows):
        return rows
    first: dict[tuple[str, int], WorkRow] = {}
    for r in rows:
        first.setdefault((r.request_id, r.interval_idx), r)
    return list(first.values())
