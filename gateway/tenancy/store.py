"""Budget reservations and concurrency caps in the shared ledger, so they hold across replicas.

A budgeted (or concurrency-capped) tenant's admission is one short write transaction,
serialised per tenant on every replica (a PostgreSQL transaction-level advisory lock; SQLite's
one writer): purge what no longer holds (through indexes: the rows it deletes, not all the
tenant's), read the tenant's hourly charges since its longest period began and what its live
reservations hold (their totals per replica, which triggers keep as reservations are written:
a row per replica, however many the tenant holds), then insert this request's reservation if
every budget still has room for it (and the cap is not reached).

A reservation's life: inserted at admission with the estimate (open: it counts against the
concurrency cap); settled when the request ends to the estimate of what it really used
(prompt + completion tokens; no longer open), or dropped if no engine ran it; deleted in a
later admission once the request is final (the interval after its last one is apportioned),
when its shares are in `tenant_hours`, written in the same transaction as the shares. Between
its first share and its finality a request counts twice (reservation and charges): budgets
err on the side of holding. Reservations nobody settled (a replica killed) expire after
`reservation_ttl_s`; their open flag counts only while their replica is live. Far from the
limits, requests are admitted from allowances reserved ahead (allowance.py, renewal.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from accounting.ledger.base import LedgerError
from accounting.ledger.budget_store import Batch, BudgetStore, Query, lock_key
from accounting.pricing import Pricing
from core.tasks import cancel_and_wait
from gateway.config import Tenant
from gateway.tenancy.allowance import Allowance, Unwritten, allowance_id, flush_allowances
from gateway.tenancy.budget import Cost, Rates, Spend, estimate, period_start_hour, spends
from gateway.tenancy.config import Budget, TenantControlsConfig
from gateway.tenancy.learning import RATE_EVERY_S, learn
from gateway.tenancy.rates import RatesMemo, TenantRates
from gateway.tenancy.renewal import (
    REPLICA_LIVE_S,
    Ask,
    StoreVerdict,
    admission_reads,
    decide_asks,
    held_of,
)
from gateway.tenancy.renewal import renew as renew_allowance

log = logging.getLogger("wattgate.tenancy")

SETTLE_EVERY_S = 0.05
MAX_BATCH = 256  # admissions of one tenant decided in one transaction at most
STOP_WAIT_S = 5.0  # how long a stop waits for the admission transactions under way


class TenancyStore:
    def __init__(self, ledger: BudgetStore, replica: str, cfg: TenantControlsConfig,
                 pricing: Pricing, wall: Callable[[], float]):
        self.ledger = ledger
        self.replica = replica
        self.cfg = cfg
        self.pricing = pricing
        self.wall = wall
        self.replicas = 1
        self.rates: dict[str, TenantRates] = {}  # budgeted tenant -> its learnt rates
        self._priced = RatesMemo(pricing)
        self.budgeted: tuple[str, ...] = ()  # whose rates `refresh` learns
        self.interval_s = 1.0  # the accounting grid: a request's shares start this before it
        self._rates_at = -math.inf
        # (tenant, request id, settlement; None: drop it), flushed in tenant order
        self._queue: list[tuple[str, str, tuple[Any, ...] | None]] = []
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._asks: dict[str, list[Ask]] = {}  # per tenant, waiting for its next transaction
        self._drains: dict[str, asyncio.Task[None]] = {}
        self._allow: dict[str, Allowance] = {}  # per tenant, this replica's (allowance.py)
        # this store's own among the replica's allowances: a node's workers share its name
        self._holder = secrets.token_hex(4)
        self._unwritten = Unwritten()  # admitted from one, their rows not committed yet
        self._flushing: asyncio.Event | None = None  # set when the flush under way ends
        self._renewing: dict[str, asyncio.Task[None]] = {}  # per tenant (renewal.py)
        self._retired: list[Allowance] = []  # renewed, to give back; ids: _next_id
        self._generation = 0

    def rates_of(self, tenant: str, precision: str, prompt_tokens: float, now_s: float
                 ) -> Rates:
        """What a prompt and an output token of `tenant`'s request cost at `precision`."""
        return self._priced.rates(self.rates, tenant, precision, prompt_tokens, now_s)

    async def admit(self, tenant: Tenant, request_id: str, prompt_tokens: float,
                    output_tokens: float, first: str, cheaper: Sequence[str],
                    rates: Mapping[str, Rates] | None = None, cost: Cost | None = None
                    ) -> StoreVerdict:
        """Decide a request in its tenant's next admission transaction: those of a tenant
        arriving while one runs are decided together in the next, in order, each against
        what the ones before it reserved. `rates` (of `first` and `cheaper` at least) and
        `cost` (at `first`): as the caller priced them, else priced now."""
        if self._stopping:  # nothing may take room that stop's give-back would not return
            raise LedgerError("admission stopped")
        if rates is None:
            now = self.wall()
            rates = {p: self.rates_of(tenant.name, p, prompt_tokens, now)
                     for p in (first, *cheaper)}
        allowance = self._allow.get(tenant.name)
        if allowance is not None and tenant.name not in self._asks:  # none waits before it
            if cost is None:
                cost = estimate(prompt_tokens, output_tokens, rates[first])
            if self._from_allowance(tenant, allowance, request_id, cost):
                return StoreVerdict(True, precision=first, cost=cost)
        loop = asyncio.get_running_loop()
        ask = Ask(tenant, request_id, prompt_tokens, output_tokens, first, cheaper, rates,
                  loop.create_future())
        queue = self._asks.get(tenant.name)
        if queue is None:
            queue = self._asks[tenant.name] = []
            self._drains[tenant.name] = loop.create_task(self._drain(tenant.name, queue))
        queue.append(ask)
        try:
            return await ask.future
        except asyncio.CancelledError:
            # left after its verdict came and before it could act on it: nothing holds it
            if ask.future.done() and not ask.future.cancelled() \
                    and ask.future.exception() is None and ask.future.result().allowed:
                self.settle(tenant.name, request_id, None, "", None)
            raise

    def _from_allowance(self, tenant: Tenant, allowance: Allowance, request_id: str,
                        cost: Cost) -> bool:
        """Admit a request costing `cost` from `allowance` if it has room for it; start its
        renewal once it is due."""
        now = self.wall()
        if not allowance.take(request_id, cost, now):
            return False
        self._unwritten.ids.add(request_id)
        if allowance.due(now) and tenant.name not in self._renewing:
            task = asyncio.get_running_loop().create_task(self._renew(tenant, allowance))
            self._renewing[tenant.name] = task  # until it ends, even cancelled unstarted
            task.add_done_callback(lambda _: self._renewing.pop(tenant.name, None))
        return True

    def _admit_queued(self, name: str, queue: list[Ask]) -> None:
        """The asks that queued while a transaction ran, in arrival order, from the allowance
        it took while that has room: else under load each transaction's newcomers waited for
        the next one, and the tenant never left the transactions for its allowance."""
        allowance = self._allow.get(name)
        done = 0
        while done < len(queue) and allowance is not None and not self._stopping:
            a = queue[done]
            if not a.future.done():
                cost = estimate(a.prompt_tokens, a.output_tokens, a.rates[a.first])
                if not self._from_allowance(a.tenant, allowance, a.request_id, cost):
                    break
                a.future.set_result(StoreVerdict(True, precision=a.first, cost=cost))
            done += 1
        del queue[:done]

    async def _drain(self, name: str, queue: list[Ask]) -> None:
        """Decide `name`'s asks a batch per transaction until none waits."""
        batch: list[Ask] = []
        try:
            while queue:
                batch = [a for a in queue[:MAX_BATCH] if not a.future.done()]
                del queue[:MAX_BATCH]
                if batch:
                    await self._decide(name, batch)
                self._admit_queued(name, queue)
        except BaseException as exc:  # stopped (cancelled) or a fault: nobody waits for ever
            if not isinstance(exc, asyncio.CancelledError):
                log.exception("tenant controls: admission of %s failed", name)
            for ask in (*batch, *queue):  # the batch too: cancelled before its transaction
                if not ask.future.done():
                    ask.future.set_exception(LedgerError("admission stopped"))
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            if self._asks.get(name) is queue:  # not one a stop cleared (or its successor)
                del self._asks[name], self._drains[name]

    async def _decide(self, name: str, asks: list[Ask]) -> None:
        while self._flushing is not None or name in self._renewing:  # each may move its rows
            await (self._flushing.wait() if self._flushing is not None
                   else asyncio.wait([self._renewing[name]]))
        # This replica's allowances (current and retired) go back first, in the same
        # transaction: decided against what its requests hold, a new one may be taken after.
        old = self._allow.pop(name, None)
        retired = [a for a in self._retired if a.tenant == name]
        self._retired = [a for a in self._retired if a.tenant != name]
        back = [*retired, *([old] if old is not None else [])]
        pendings = [a.pending for a in back]
        written = [(name, rid) for p in pendings for rid, _, _ in p]
        consumed = self._unwritten.consumed(written)
        before = [q for a in back for q in a.give_back(self._unwritten.settled)]
        now, new_id = self.wall(), self._next_id(name)  # not on the ledger's thread (decide)
        verdicts: list[StoreVerdict] = []
        taken: list[Allowance] = []

        def decide(rows: list[list[tuple[Any, ...]]]) -> Sequence[Batch]:
            verdicts[:], new, out = decide_asks(asks, rows[len(before):], self.replica,
                                                self.replicas, now, new_id)
            taken[:] = [new] if new is not None else []
            return out

        try:
            budgets = [b for a in asks for b in a.tenant.budgets.budgets]
            await self.ledger.locked(lock_key(name), [*before, *self._reads(name, now, budgets)],
                                     decide)
        except BaseException as exc:  # each waiting request gets the ledger's error
            for gone, pending in zip(back, pendings, strict=True):  # nothing was written:
                gone.pending[:0] = pending  # they hold their requests still
            self._retired += retired
            if old is not None:
                self._allow.setdefault(name, old)
            failed = exc if isinstance(exc, LedgerError) else LedgerError(f"admission: {exc!r}")
            for a in asks:
                if not a.future.done():
                    a.future.set_exception(failed)
            if isinstance(exc, LedgerError):
                return
            raise
        self._queue += self._unwritten.wrote(written, consumed)
        if taken:
            self._allow[name] = taken[0]
        for a, verdict in zip(asks, verdicts, strict=True):
            if not a.future.done():
                a.future.set_result(verdict)
            elif verdict.allowed:  # its request went away while it was decided
                self.settle(name, a.request_id, None, "", None)

    def _next_id(self, tenant: str) -> str:
        self._generation += 1
        return allowance_id(tenant, self.replica, self._holder, self._generation)

    async def _renew(self, tenant: Tenant, old: Allowance) -> None:
        """Renew `old` in the background (renewal.py); it admits until its successor is in
        the ledger, then is retired. Without room for one, or if the ledger fails, it is not
        renewed again: it runs out and the next request waits for a transaction."""
        name = tenant.name
        try:
            while self._flushing is not None:  # it may be moving rows of `old`
                await self._flushing.wait()
            if self._allow.get(name) is not old:  # given back meanwhile
                return
            now = self.wall()
            try:
                reads = self._reads(name, now, tenant.budgets.budgets)
                new = await renew_allowance(self.ledger, tenant, old, self._next_id(name),
                                            reads, self.replicas, now)
            except BaseException:
                old.renewable = False
                raise
            if new is None:
                old.renewable = False
            elif self._allow.get(name) is old:
                self._allow[name] = new
                self._retired.append(old)
            else:  # given back meanwhile: the successor goes back at the next flush too
                self._retired.append(new)
        except Exception as exc:  # logged here: nobody awaits a renewal (a fault: its trace too)
            log.warning("tenant controls: renewing the allowance of %s: %s", name, exc,
                        exc_info=not isinstance(exc, LedgerError))

    def settle(self, tenant: str, request_id: str, cost: Cost | None, engine: str,
               last_interval: int | None) -> None:
        """Queue a reservation's settlement (None cost: no engine ran it, drop it); that of
        a request admitted from an allowance whose row is not written waits for its row
        (written settled, if the settlement is there by then)."""
        row = None if cost is None or not engine or last_interval is None else (
            cost.j, cost.gco2e, cost.usd, engine, last_interval, request_id)
        if not self._unwritten.settle(request_id, row):
            self._queue.append((tenant, request_id, row))

    async def flush(self, give_back: bool = False) -> None:
        """Settle what is queued, in one transaction, in tenant order: each replica's
        settlements then take the rows of the tenants' totals in one order, so on PostgreSQL
        they do not deadlock on them with each other or with an admission (which writes its
        own tenant's only). One case remains: a request still running past
        `reservation_ttl_s`, settled while an admission purges its reservation as expired;
        PostgreSQL then aborts one of the two (the flush is retried, the admission's requests
        answered 503).

        First the retired allowances and those LIFE_S old (all: `give_back`) go back with the
        rows of the requests admitted from them (allowance.py); one being renewed is left to
        its renewal."""
        retired, self._retired = self._retired, []
        before, moved = flush_allowances(self._allow, self.wall(), give_back,
                                         self._unwritten.settled, self._renewing, retired)
        written = [(a.tenant, rid) for a, pending in moved for rid, _, _ in pending]
        consumed = self._unwritten.consumed(written)
        queue, self._queue = self._queue, []
        if not queue and not before:
            return
        queue.sort(key=lambda q: (q[0], q[1]))
        changes = [(rid, row) for _, rid, row in queue]
        self._flushing = flushing = asyncio.Event()
        try:
            if before:
                await self.ledger.settle_reservations(changes, before)
            else:
                await self.ledger.settle_reservations(changes)
        except LedgerError:
            self._queue[:0] = queue
            for a, pending in moved:  # nothing was written: they hold their requests
                a.pending[:0] = pending
                if any(a is r for r in retired):
                    self._retired.append(a)
                else:
                    self._allow.setdefault(a.tenant, a)
            raise
        finally:
            self._flushing = None
            flushing.set()
        self._queue += self._unwritten.wrote(written, consumed)

    async def standing(self, tenant: Tenant) -> list[Spend]:
        """A budgeted tenant's spend per budget, as its next admission would see it (after
        the same purge, in the same locked transaction; nothing reserved)."""
        now = self.wall()
        budgets = tenant.budgets.budgets
        out: list[Spend] = []

        def read(rows: list[list[tuple[Any, ...]]]) -> Sequence[Batch]:
            out[:] = spends(budgets, rows[2], held_of(rows[3][0])[0], now)
            return ()

        reads = self._reads(tenant.name, now, budgets)
        await self.ledger.locked(lock_key(tenant.name), reads, read)
        return out

    def _reads(self, name: str, now: float, budgets: Iterable[Budget]) -> list[Query]:
        """An admission's purge and reads: hours since the longest of `budgets` began."""
        since = min((period_start_hour(b.period, now) for b in budgets), default=0)
        return admission_reads(name, now, since, self.cfg.reservation_ttl_s)

    async def refresh(self) -> None:
        """Live replicas (this one at least), and each budgeted tenant's rates from its own
        recent final bills."""
        now = self.wall()
        self.replicas = max(1, await self.ledger.live_replicas(now - REPLICA_LIVE_S))
        if now - self._rates_at < RATE_EVERY_S:
            return
        self._rates_at = now
        self.rates = {tenant: await learn(self.ledger, tenant, now, self.interval_s)
                      for tenant in self.budgeted}

    async def run(self, on_refresh: Callable[[], Any]) -> None:
        """Settle every SETTLE_EVERY_S, refresh every refresh_s, until cancelled."""
        last = -math.inf
        while True:
            try:
                await self.flush()
                if self.wall() - last >= self.cfg.refresh_s:
                    last = self.wall()
                    await self.refresh()
                    await on_refresh()
            except LedgerError as exc:
                log.warning("tenant controls: ledger: %s", exc)
            await asyncio.sleep(SETTLE_EVERY_S)

    def start(self, on_refresh: Callable[[], Any]) -> None:
        self._stopping = False
        self._task = asyncio.get_running_loop().create_task(self.run(on_refresh))

    async def stop(self) -> None:
        # Flushes, admissions (up to STOP_WAIT_S) and renewals under way are let finish: a
        # cancelled write may commit all the same, and what it took would be held until expiry.
        self._stopping = True
        while self._flushing is not None:
            await self._flushing.wait()
        await cancel_and_wait(self._task)
        self._task = None
        if self._drains:
            await asyncio.wait(list(self._drains.values()), timeout=STOP_WAIT_S)
        for task in list(self._drains.values()):
            await cancel_and_wait(task)
        while self._renewing:
            await asyncio.wait(list(self._renewing.values()))
        # a drain cancelled before its first step never ran its own clean-up
        for queue in self._asks.values():
            for ask in queue:
                if not ask.future.done():
                    ask.future.set_exception(LedgerError("admission stopped"))
        self._asks.clear()
        self._drains.clear()
        with contextlib.suppress(LedgerError):
            await self.flush(give_back=True)
