"""`wattgate serve` with parts of the request path made no-ops, to read what each part costs
(bench/nonstream_profile.py --parts). Measurement only: a gateway run so keeps no metrics,
learns nothing or records nothing.

    python bench/overhead/stubbed_serve.py models,metrics serve --config ... --port ...

Parts: `models` (the learnt routing models: the loads routing saw and each record), `metrics`
(the Prometheus request metrics of each record), `record` (the whole record step: the record
built and every sink, the two above included).
"""

from __future__ import annotations

import sys

# run as a script, its folder leads sys.path, and its profile.py would shadow the stdlib's
sys.path.pop(0)

from typing import Any

PARTS = ("models", "metrics", "record")


def _none(*args: Any, **kwargs: Any) -> None:
    return None


def stub(parts: list[str]) -> None:
    from gateway.pipeline.record import RecordPublisher
    from gateway.routing.learner import RoutingModels
    from gateway.serving_metrics import GatewayMetrics

    unknown = set(parts) - set(PARTS)
    if unknown:
        raise SystemExit(f"unknown parts {sorted(unknown)}; known: {', '.join(PARTS)}")
    if "models" in parts:
        RoutingModels.__call__ = _none  # type: ignore[method-assign]
        RoutingModels.observe_loads = _none  # type: ignore[method-assign]
    if "metrics" in parts:
        GatewayMetrics.observe = _none  # type: ignore[method-assign]
    if "record" in parts:
        RecordPublisher.publish = _none  # type: ignore[method-assign]


def main() -> None:
    parts, argv = sys.argv[1], sys.argv[2:]
    stub([p for p in parts.split(",") if p])
    import wattgate_cli

    sys.argv = ["wattgate", *argv]
    wattgate_cli.main()


if __name__ == "__main__":
    main()
