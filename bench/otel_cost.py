"""What OpenTelemetry export costs per request, on the event loop and on the export threads.

    python -m bench.otel_cost            # writes bench/results/otel_cost.{json,md}
    python -m bench.otel_cost --quick    # shorter, prints only

Loop side: the record sink (`gateway/telemetry/export.py`) called on finished records, with
metrics only, traces only and both; best of 5 batches of 90 records, each batch under the span
processor's 512-span export batch and its queue emptied after, so its thread stays asleep and
only the loop's own work is timed. Thread side: encoding one request's five spans into the
OTLP protobuf, as the span processor's thread does before it sends them (sample_ratio scales
it). The collector address is closed: nothing is sent while timing. With telemetry off the
request path only tests `is None` (twice in gateway/proxy.py, once in pipeline/dispatch.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import time
import timeit
from pathlib import Path
from typing import Any

import orjson
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan

from bench.apportion_workload import make_records
from bench.provenance import commit
from core.records import RequestRecord
from core.trace_context import TraceStarter
from gateway.telemetry.config import TelemetryConfig
from gateway.telemetry.export import OtelExport
from gateway.telemetry.spans import engine_infos

RESULTS = Path(__file__).resolve().parent / "results"
BATCH = 90  # records a batch: 450 spans, under the processor's 512-span export batch


def traced(n: int) -> list[RequestRecord]:
    """`n` finished records, each with its trace as the proxy and dispatch leave it."""
    starter = TraceStarter(traces=True, sample_ratio=1.0)
    out = []
    for rec in make_records(n, 4, 60.0, 7):
        trace = starter.begin("/v1/chat/completions", None)
        trace.admitted_s = rec.arrived_s + 0.0001
        trace.engine_headers()
        out.append(dataclasses.replace(rec, trace=trace))
    return out


def export_of(traces: bool, metrics: bool) -> OtelExport:
    tel = TelemetryConfig(otlp_endpoint="http://127.0.0.1:9", traces=traces, metrics=metrics,
                          export_interval_s=3600.0)
    return OtelExport(tel, engine_infos({f"e{i}": ("vllm", f"http://10.0.0.{i}:8000")
                                         for i in range(4)}))


def loop_us(export: OtelExport, recs: list[RequestRecord]) -> float:
    """µs per record of the sink on the loop, best of 5 batches."""
    def run() -> None:
        for r in recs:
            export(r)
        if export.spans is not None:
            export.spans._batch_processor._queue.clear()  # keep its thread asleep

    return min(timeit.repeat(run, number=1, repeat=5)) / len(recs) * 1e6


def encode_us(recs: list[RequestRecord]) -> tuple[float, float]:
    """(µs, bytes) per request of encoding its spans to OTLP protobuf."""
    export = export_of(traces=True, metrics=False)
    spans: list[ReadableSpan] = []

    class Keep:
        def on_end(self, span: ReadableSpan) -> None:
            spans.append(span)

    export.spans = Keep()  # type: ignore[assignment]  # collects instead of queueing
    for r in recs:
        export(r)
    t0 = time.perf_counter()
    data = encode_spans(spans).SerializeToString()
    return (time.perf_counter() - t0) / len(recs) * 1e6, len(data) / len(recs)


def markdown(res: dict[str, Any]) -> str:
    loop = res["loop_us_per_request"]
    return "\n".join([
        "# OpenTelemetry export cost per request",
        "",
        f"Commit {res['commit']}, {res['machine']}, Python {res['python']}; "
        "`python -m bench.otel_cost`.",
        "",
        "| where | what | µs per request |",
        "| --- | --- | --- |",
        f"| event loop | metrics only (4 GenAI histograms) | {loop['metrics']:.1f} |",
        f"| event loop | traces only (5 spans queued) | {loop['traces']:.1f} |",
        f"| event loop | metrics and traces | {loop['both']:.1f} |",
        f"| span export thread | OTLP protobuf encoding of the 5 spans | "
        f"{res['encode_us_per_request']:.1f} ({res['encode_bytes_per_request']:.0f} bytes) |",
        "",
        "Telemetry off: `is None` tests only (two in the proxy, one in dispatch).",
        "",
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    recs = traced(BATCH)
    exports = {"metrics": export_of(False, True), "traces": export_of(True, False),
               "both": export_of(True, True)}
    loop = {name: loop_us(export, recs) for name, export in exports.items()}
    enc_us, enc_bytes = encode_us(traced(BATCH * (1 if args.quick else 10)))
    res = {"commit": commit(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
           "python": platform.python_version(), "loop_us_per_request": loop,
           "encode_us_per_request": enc_us, "encode_bytes_per_request": enc_bytes}
    md = markdown(res)
    print(md)
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "otel_cost.json").write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2))
        (RESULTS / "otel_cost.md").write_text(md)
    os._exit(0)  # the exporters' threads would retry the closed address at exit


if __name__ == "__main__":
    main()
