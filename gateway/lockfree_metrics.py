"""Lock-free counters and histograms for the request path, exposed through prometheus_client.

prometheus_client's children take a lock per `inc()`/`observe()` (about 1-2 us each); one stream
makes 20+ such calls. The gateway's metrics are only touched from its event-loop thread, and
`/metrics` is rendered on that same thread, so plain Python numbers suffice. Exposition still goes
through prometheus_client (a custom Collector on the gateway's registry), so names, types and
text format are the standard ones.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector


class HistogramChild:
    """One label set's buckets; `observe` is a bisect and two additions. `observe_many` only
    appends: a stream's 30-odd ITL values are bucketed later, a batch at a time (one C-level
    sort and a bisect per bound), when read or when the batch is full."""

    __slots__ = ("_counts", "_pending", "_sum", "bounds")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self._counts = [0] * (len(bounds) + 1)  # last slot: +Inf
        self._sum = 0.0
        self._pending: list[float] = []

    @property
    def counts(self) -> list[int]:
        """Observations per bucket (not cumulative), the +Inf bucket last."""
        self._settle()
        return self._counts

    @property
    def sum(self) -> float:
        self._settle()
        return self._sum

    def observe(self, value: float) -> None:
        self._counts[bisect_left(self.bounds, value)] += 1
        self._sum += value

    def observe_many(self, values: Iterable[float]) -> None:
        pending = self._pending
        pending.extend(values)
        if len(pending) >= _PENDING_MAX:
            self._settle()

    def observe_zeros(self, n: int) -> None:
        """`n` observations of 0 (events that arrived in the same read)."""
        self._counts[0] += n

    def _settle(self) -> None:
        """Bucket the pending values: a value goes to the first bucket whose bound is >= it,
        so a bucket's share of the sorted batch ends at bisect_right of its bound."""
        pending = self._pending
        if not pending:
            return
        self._sum += sum(pending)  # left to right, before the sort: as per-value additions
        pending.sort()
        counts = self._counts
        below = 0
        for i, bound in enumerate(self.bounds):
            upto = bisect_right(pending, bound, below)
            counts[i] += upto - below
            below = upto
        counts[-1] += len(pending) - below
        pending.clear()


# values held per child before they are bucketed (bounds the memory a busy child holds)
_PENDING_MAX = 4096


class CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class _Family:
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]):
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)


class FastHistogram(_Family):
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 buckets: Sequence[float]):
        super().__init__(name, documentation, labelnames)
        self.bounds = tuple(float(b) for b in buckets)
        self.children: dict[tuple[str, ...], HistogramChild] = {}

    def labels(self, *values: str) -> HistogramChild:
        child = self.children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}")
            child = self.children[values] = HistogramChild(self.bounds)
        return child

    def collect(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in self.children.items():
            cumulative = 0
            buckets = []
            for bound, count in zip((*self.bounds, float("inf")), child.counts, strict=True):
                cumulative += count
                buckets.append((_le(bound), float(cumulative)))
            family.add_metric(list(values), buckets, child.sum)
        return family


class FastCounter(_Family):
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]):
        super().__init__(name, documentation, labelnames)
        self.children: dict[tuple[str, ...], CounterChild] = {}

    def labels(self, *values: str) -> CounterChild:
        child = self.children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}")
            child = self.children[values] = CounterChild()
        return child

    def collect(self) -> Metric:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in self.children.items():
            family.add_metric(list(values), child.value)
        return family


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


class FastCollector(Collector):
    """Exposes a set of fast families on a prometheus_client registry."""

    def __init__(self, families: Sequence[FastHistogram | FastCounter]):
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        for family in self.families:
            yield family.collect()

    def describe(self) -> Iterator[Metric]:
        # Empty families: lets the registry check for duplicate names at registration.
        for family in self.families:
            if isinstance(family, FastHistogram):
                yield HistogramMetricFamily(family.name, family.documentation,
                                            labels=family.labelnames)
            else:
                yield CounterMetricFamily(family.name, family.documentation,
                                          labels=family.labelnames)
