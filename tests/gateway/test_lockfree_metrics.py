"""The lock-free families expose exactly what prometheus_client's own would."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway.lockfree_metrics import FastCollector, FastCounter, FastHistogram

BUCKETS = (0.005, 0.01, 0.1, 1.0, 10.0)


@given(st.lists(st.floats(min_value=0, max_value=50, allow_nan=False), max_size=40),
       st.integers(min_value=0, max_value=5))
def test_fast_families_render_like_prometheus_client(values: list[float], zeros: int) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    h = FastHistogram("x_seconds", "doc", ("a",), BUCKETS)
    c = FastCounter("y", "doc", ("a",))
    ours.register(FastCollector([h, c]))
    ph = Histogram("x_seconds", "doc", ("a",), buckets=BUCKETS, registry=theirs)
    pc = Counter("y", "doc", ("a",), registry=theirs)
    h.labels("1").observe_many(values)
    h.labels("1").observe_zeros(zeros)
    child = ph.labels("1")
    for v in [*values, *[0.0] * zeros]:
        child.observe(v)
    c.labels("1").inc(3)
    pc.labels("1").inc(3)
    ours_text = [ln for ln in generate_latest(ours).decode().splitlines() if "_created" not in ln]
    theirs_text = [ln for ln in generate_latest(theirs).decode().splitlines()
                   if "_created" not in ln]
    assert _samples(ours_text) == _samples(theirs_text)


@given(st.lists(st.lists(st.floats(min_value=0, max_value=50, allow_nan=False), max_size=12),
                max_size=12))
def test_batched_observations_land_in_the_buckets_one_at_a_time_would(
        batches: list[list[float]]) -> None:
    h = FastHistogram("x_seconds", "doc", ("a",), BUCKETS)
    child = h.labels("1")
    seen = 0
    for batch in batches:
        child.observe_many(batch)
        seen += len(batch)
        # read now and then, as a scrape does: later values still land where they belong
        if len(batch) % 3 == 0:
            assert sum(child.counts) == seen
    expected = [0] * (len(BUCKETS) + 1)
    for v in (v for b in batches for v in b):
        expected[next((i for i, b in enumerate(BUCKETS) if v <= b), len(BUCKETS))] += 1
    assert child.counts == expected
    assert abs(child.sum - sum(v for b in batches for v in b)) < 1e-9


def _samples(lines: list[str]) -> dict[str, float]:
    out = {}
    for ln in lines:
        if ln.startswith("#"):
            continue
        name, value = ln.rsplit(" ", 1)
        out[name] = round(float(value), 6)
    return out
