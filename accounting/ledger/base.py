"""What the accounting service stores, and the one interface both ledger stores implement."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import add, itemgetter
from typing import Any, NamedTuple, Protocol

from accounting.counters import CounterState
from accounting.failed import BILL_ALL
from accounting.work import Work, WorkRow
from core.errors import WattgateError
from core.records import RequestRecord

HOUR_S = 3600.0


class LedgerError(WattgateError):
    """The ledger store failed (cannot open, migrate, read or write)."""

    default_code = "ledger_error"


def hour_of(t_s: float) -> int:
    return math.floor(t_s / HOUR_S)


class RequestRow(NamedTuple):
    """A finished request as the ledger stores it: the fields in the order of its INSERT, so
    the row is its own statement parameters (one tuple per request, built once at ingest)."""

    request_id: str
    tenant: str
    model: str
    engine: str
    precision: str
    slo_class: str
    status: str
    stream: int  # 1 when streamed
    arrived_s: float  # wall clock
    finished_s: float  # wall clock
    finished_hour: int
    prompt_tokens: int
    completion_tokens: int
    slo_met: int  # 1 when every SLO of its class was met
    first_interval: int | None  # the first interval of its work; None when it has no work
    last_interval: int | None  # the interval of its finish, or of its last work if later;
    # None when no engine ran it
    replica: str
    # "engine" (usage), "engine_tokenize" (its /tokenize), "gateway" (tokenizer), "estimate"
    prompt_source: str = "engine"
    http_status: int | None = None  # what the client was answered (None: before schema v9)
    outcome: str = "served"  # its outcome class (core/outcomes.py)
    # wall clock of the last read that carried a token event to the client (None: none did);
    # where a failed request's bill stops (accounting/failed.py)
    delivered_s: float | None = None

    @classmethod
    def from_record(cls, rec: RequestRecord, interval_s: float, replica: str,
                    work: Sequence[Work]) -> RequestRow:
        """The request's row; `work` is its work rows (`work_rows(rec, interval_s)`), whose
        span of intervals is kept so its shares are found by key."""
        finished = rec.arrived_wall_s + (rec.finished_s - rec.arrived_s)  # rec.wall(finished)
        ran = bool(rec.engine) and rec.dispatched_s is not None
        last = math.floor(finished / interval_s) if ran else None
        first = None
        if work:
            if len(work) == 1:
                first = hi = work[0][1]
            else:
                ks = list(map(_interval, work))
                first, hi = min(ks), max(ks)
            if last is None or hi > last:
                last = hi  # work stamped after the finish (clock skew) still has shares
        times = rec.read_times
        # Positional, in the fields' order (tests/accounting/test_ledger_rows.py checks each
        # by name): a row per request, and keywords took twice the time to build it
        return cls(
            rec.request_id, rec.tenant, rec.model, rec.engine, rec.precision, rec.slo_class,
            rec.status, 1 if rec.stream else 0, rec.arrived_wall_s, finished,
            math.floor(finished / HOUR_S), rec.prompt_tokens, rec.completion_tokens,
            1 if rec.slo_met else 0, first, last, replica, rec.prompt_source, rec.http_status,
            rec.outcome, rec.arrived_wall_s + (times[-1] - rec.arrived_s) if times else None)


_interval = itemgetter(1)  # a Work tuple's interval


class EngineWork(NamedTuple):
    """A work row as the ledger stores it: a WorkRow's fields and the engine, in the order of
    its INSERT (the row is its own statement parameters)."""

    request_id: str
    interval_idx: int
    prefill_tokens: float
    decode_tokens: float
    residency_s: float
    start_s: float
    kv_tokens: float
    head_s: float
    head_decode: float
    engine: str


def engine_work(engine: str, rows: Sequence[Work]) -> list[EngineWork]:
    """The ledger's work rows of one request on `engine`: each a WorkRow's fields (`Work`, in
    its order) and the engine, which EngineWork's fields extend them with."""
    return list(map(EngineWork._make, map(add, rows, repeat((engine,)))))


# What `Ledger.append` takes as work: rows by engine (the recorder's: no row is rebuilt with
# its engine), or EngineWork rows
WorkByEngine = Mapping[str, Sequence[Work]] | Sequence[EngineWork]


def work_by_engine(work: WorkByEngine) -> Mapping[str, Sequence[Work]]:
    """Work rows by engine, each a `Work` tuple."""
    if isinstance(work, Mapping):
        return work
    out: dict[str, list[Work]] = {}
    for w in work:
        out.setdefault(w.engine, []).append(w[:9])
    return out


@dataclass(frozen=True, slots=True)
class EngineState:
    """Where apportioning of one engine stopped: the next interval and the energy boundary,
    with the counters the boundary's joules are counted on (so a restarted gateway continues
    the same series) and the energy of the intervals apportioned since the check began."""

    engine: str
    next_interval: int
    boundary_s: float
    boundary_j: float
    resets: int = 0
    counter: CounterState | None = None  # None: a model meter, or written before schema v6
    apportioned_j: float | None = None  # None: the check has not begun


@dataclass(frozen=True, slots=True)
class IntervalRow:
    engine: str
    interval_idx: int
    start_s: float
    interval_s: float
    model: str
    precision: str
    gpus: int
    energy_j: float
    static_j: float
    dynamic_j: float
    idle_j: float
    idle_s: float
    idle_carbon_g: float
    idle_cost_usd: float
    estimated: bool
    alpha: float
    beta: float
    gamma: float
    # the engine's failed account: failed requests' energy not billed (failed.py)
    failed_j: float = 0.0
    failed_carbon_g: float = 0.0
    failed_cost_usd: float = 0.0


class ShareRow(NamedTuple):
    """One request's share of one interval, fields in the order of its INSERT."""

    request_id: str
    engine: str
    interval_idx: int
    start_s: float
    hour_idx: int
    energy_j: float
    static_j: float
    dynamic_j: float
    gpu_s: float
    carbon_g: float
    cost_usd: float
    estimated: int  # 1 when the interval's energy is estimated, not measured
    failed_j: float = 0.0  # its share that went to the failed account (failed.py), not billed


class Watermark(NamedTuple):
    """What one replica may still record: work no earlier than `open_since_s` (the wall-clock
    arrival of its oldest request being served or not yet written; None: nothing), as of
    `seen_s` on its clock."""

    replica: str
    open_since_s: float | None
    seen_s: float


class PendingWork(NamedTuple):
    """A work row read back for apportioning, with its tenant and, for a failed request, up
    to when (wall clock) its residency is billed if failures go to the failed account
    (`failed.bill_until`; BILL_ALL for every other request)."""

    tenant: str
    row: WorkRow
    bill_until_s: float = BILL_ALL


class WorkSnapshot(NamedTuple):
    """Work rows of some intervals and those intervals' versions, read in one snapshot."""

    rows: list[PendingWork]
    versions: dict[int, int]  # interval -> version of its work when read


@dataclass(frozen=True, slots=True)
class UsageData:
    """Raw aggregates for chargeback, grouped by (tenant, model, precision, engine, hour)."""

    # dims..., energy_j, static_j, carbon_g, cost_usd, estimated, failed_j (not billed)
    energy: list[tuple[Any, ...]]
    # dims..., requests, ok, prompt, completion, slo_met, first arrived_s, last finished_s,
    # then the requests per outcome class: served, refused, failed, cancelled
    requests: list[tuple[Any, ...]]
    # engine, model, precision, hour, idle_j, carbon, cost, estimated, first start_s, last end_s
    idle: list[tuple[Any, ...]]
    # engine, model, precision, hour, failed_j, carbon, cost, estimated (the failed account)
    failed: list[tuple[Any, ...]] = field(default_factory=list)


class Ledger(Protocol):
    kind: str

    async def open(self) -> None:
        """Connect and migrate the schema to the current version."""
        ...

    async def close(self) -> None: ...

    async def append(self, requests: Sequence[RequestRow], work: WorkByEngine,
                     watermark: Watermark | None = None) -> None:
        """Store finished requests and their work rows (idempotent per request id), and the
        replica's watermark in the same transaction."""
        ...

    async def open_since(self, seen_after_s: float) -> float | None:
        """The earliest watermark of the replicas heard from at or after `seen_after_s`
        (None: none of them has a request open)."""
        ...

    async def acquire_apportioner(self) -> bool:
        """Try (without waiting) to become the one apportioner; True while held."""
        ...

    async def release_apportioner(self) -> None: ...

    async def states(self) -> dict[str, EngineState]: ...

    async def snapshot(self, engine: str, ranges: Sequence[tuple[int, int]]) -> WorkSnapshot:
        """The work rows of `engine` in each (first, last) range of intervals, with the
        versions of those intervals, as of one moment."""
        ...

    async def tenant_shares(self, engine: str, first: int, last: int
                            ) -> list[tuple[int, str, float, float, float]]:
        """(interval, tenant, energy_j, carbon_g, cost_usd) of the stored shares."""
        ...

    async def dirty(self, engine: str, before: int) -> list[int]:
        """Intervals < before written to since they were apportioned (late records)."""
        ...

    async def intervals(self, engine: str, idxs: Sequence[int]) -> list[IntervalRow]: ...

    async def commit(self, engine: str, intervals: Sequence[IntervalRow],
                     shares: Sequence[ShareRow], done: Sequence[tuple[int, int]],
                     state: EngineState | None) -> None:
        """Atomically replace the shares of `intervals`, mark the `done` (interval, version
        read) intervals clean unless written to since, and move the engine's state."""
        ...

    async def store_counter(self, engine: str, counter: CounterState) -> None:
        """Store an engine's counters as last read (an engine with a state only), leaving
        where its apportioning stands as it is."""
        ...

    async def request(self, request_id: str) -> dict[str, Any] | None:
        """One request with its energy, carbon and cost totals and finality."""
        ...

    async def prune(self, before_s: float, interval_s: float, batch_rows: int) -> bool:
        """Delete one batch of final per-request rows older than `before_s` (the hourly
        rollups keep their sums); True when more is left (ledger/retention.py)."""
        ...

    async def usage(self, since_s: float, until_s: float, tenant: str | None, *,
                    per_request: bool = False,
                    group_by: Sequence[str] = ("tenant", "model", "precision", "engine", "hour")
                    ) -> UsageData:
        """Usage of [since, until): whole hours from the hourly rollups (summed over the
        dimensions not in `group_by`), the rest (all of it with `per_request`) from the
        per-request rows (ledger/rollups.py)."""
        ...
