"""The gateway's own explicit-bucket histograms (what the OTLP metrics export reads)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.telemetry.histograms import HistogramSet, attrs_of

BOUNDS = (0.1, 1.0, 10.0)


def test_buckets_are_upper_inclusive_and_series_kept_apart() -> None:
    h = HistogramSet({"d": BOUNDS})
    a, b = attrs_of({"m": "x", "op": "chat"}), attrs_of({"op": "chat", "m": "y"})
    h.record([("d", a, 0.1), ("d", a, 0.5), ("d", a, 10.0), ("d", a, 11.0), ("d", b, 0.0)])
    points = {p.attributes: p for p in h.snapshot()}
    pa, pb = points[a], points[b]
    assert pa.bucket_counts == (1, 1, 1, 1)  # (..0.1], (0.1..1], (1..10], (10..)
    assert (pa.count, pa.sum, pa.min, pa.max) == (4, 21.6, 0.1, 11.0)
    assert pb.bucket_counts == (1, 0, 0, 0) and pb.count == 1
    assert attrs_of({"op": "chat", "m": "x"}) == a  # one key whatever the dict's order


@given(st.lists(st.floats(min_value=0, max_value=100, allow_nan=False), max_size=50))
def test_counts_add_up(values: list[float]) -> None:
    h = HistogramSet({"d": BOUNDS})
    key = attrs_of({"k": 1})
    h.record([("d", key, v) for v in values])
    points = h.snapshot()
    if not values:
        assert points == []
        return
    (p,) = points
    assert sum(p.bucket_counts) == p.count == len(values)
    assert p.sum == sum(values)
