"""Tenants by request id, kept for the apportioner's reads of work rows, sized by what is not
yet final.

Work rows carry no tenant: the apportioner looks each request's up once (ledger rows) and
reads its work interval after interval, so the tenant is kept from the request's append until
its last interval is apportioned. Entries live in two generations: appends fill the young
one; once every engine this process apportions has passed the latest finish in the old one
(`settle`), none of its requests' work will be read again (but for late work, which looks
its tenant up again), so it is dropped and the young one becomes old. The cache so holds
about two windows of requests not yet final, not a fixed count of the latest; `limit_n`
caps a generation where nothing settles (a process that records but does not apportion).
Tenant names are interned: the many entries of one tenant share one string.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable

TENANT_CACHE = 100_000  # entries in a generation at most (one that never settles)


class TenantCache:
    def __init__(self, limit_n: int = TENANT_CACHE):
        self.limit_n = limit_n
        self._young: dict[str, str] = {}
        self._old: dict[str, str] = {}
        self._young_until_s = -math.inf  # the latest finish among the young generation's
        self._old_until_s = -math.inf
        # failed requests' billing cuts (failed.bill_until), by request id: only those
        self._cuts: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._young) + len(self._old)

    def add(self, request_id: str, tenant: str, finished_s: float | None = None,
            cut_s: float | None = None) -> None:
        """Keep a request's tenant (and its billing cut, for a failed one); `finished_s`
        (wall clock) None for one looked up, not appended."""
        self._young[request_id] = sys.intern(tenant)
        if finished_s is not None and finished_s > self._young_until_s:
            self._young_until_s = finished_s
        if cut_s is not None:
            self._cuts[request_id] = cut_s
        if len(self._young) >= self.limit_n:
            self._rotate()

    def get(self, request_id: str, default: str) -> str:
        tenant = self._young.get(request_id)
        if tenant is None:
            tenant = self._old.get(request_id, default)
        return tenant

    def cut(self, request_id: str, default: float) -> float:
        return self._cuts.get(request_id, default)

    def missing(self, request_ids: Iterable[str]) -> list[str]:
        return [r for r in request_ids if r not in self._young and r not in self._old]

    def settle(self, final_before_s: float) -> None:
        """Every request that finished before `final_before_s` (wall clock) is final on
        every engine this process apportions: drop the old generation once it is all such."""
        if self._old_until_s < final_before_s and (self._old or self._young):
            self._rotate()

    def _rotate(self) -> None:
        for request_id in self._old:
            self._cuts.pop(request_id, None)
        self._old, self._young = self._young, {}
        self._old_until_s, self._young_until_s = self._young_until_s, -math.inf
