"""How the gateway treats its engines, as configured: timeouts, retries, outlier detection
(Envoy's consecutive-failure and failure-percentage ejection, its healthy-panic threshold)
and active health checks. Part of the gateway config (config.py)."""

from __future__ import annotations

from dataclasses import dataclass

from core.config_fields import FieldReader, section
from core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float = 2.0
    first_byte_s: float = 60.0  # request sent -> response headers
    read_s: float = 30.0  # longest silence between two reads of a stream
    total_s: float = 600.0


@dataclass(frozen=True, slots=True)
class Retries:
    max_attempts: int = 3
    deadline_s: float = 10.0  # no new attempt starts after this many seconds
    # Envoy's retry budget: retries in flight stay within this share of the requests in
    # flight (but min_retry_concurrency are always allowed), so a failing fleet is not
    # hammered with retries on top of its load
    budget_percent: float = 20.0
    min_retry_concurrency: int = 3


@dataclass(frozen=True, slots=True)
class OutlierDetection:
    """Envoy-style passive ejection: an engine that keeps failing requests (connect errors,
    timeouts and stalls, invalid HTTP, 5xx and 429, broken, truncated or unparsable answers)
    leaves the pool for a while, whatever its health endpoint says; and Envoy's healthy-panic
    threshold: under panic_threshold_percent of a pool available, route to all of it."""

    consecutive_failures: int = 5
    base_ejection_s: float = 30.0  # times the number of times it was ejected
    max_ejection_s: float = 300.0
    max_ejection_percent: float = 50.0  # of a pool at once (one may always be ejected)
    panic_threshold_percent: float = 50.0  # 0: never panic (answer 503 when none is healthy)
    # Envoy's failure-percentage ejection: an engine whose recent requests (the success window,
    # decayed, since its last ejection) fail at least this often, over at least the volume, is
    # ejected too: one that fails every other request never makes a run of
    # consecutive_failures. 0: off.
    failure_percentage_threshold: float = 50.0
    failure_percentage_request_volume: int = 10


@dataclass(frozen=True, slots=True)
class HealthCheck:
    interval_s: float = 2.0
    timeout_s: float = 1.0
    unhealthy_after: int = 2  # consecutive failures before ejection
    healthy_after: int = 1  # consecutive successes before recovery
    scrape_metrics: bool = True


def parse_outlier_detection(r: FieldReader) -> OutlierDetection:
    policy = section(r, OutlierDetection, minimums={"panic_threshold_percent": 0.0,
                                                    "failure_percentage_threshold": 0.0})
    for name in ("max_ejection_percent", "panic_threshold_percent", "failure_percentage_threshold"):
        if getattr(policy, name) > 100.0:
            raise ConfigError(f"outlier_detection.{name}", "must be at most 100 (a percentage)")
    return policy
