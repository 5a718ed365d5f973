"""Markdown of `bench.apportion`'s result (pure)."""

from __future__ import annotations

from typing import Any


def markdown(result: dict[str, Any]) -> str:
    t, r, w = result["throughput"], result["record"], result["ingest_write"]
    a = result["apportioner"]
    return "\n".join([
        "# Apportioning benchmark",
        "",
        f"Machine: {result['machine']}; Python {result['python']}; CPU yardstick "
        f"sum(range(1000)) = {result['cpu_reference_us']:.1f} us (a current desktop core: "
        "~8-10 us). One process, one core; CPU time of the process (the machine is shared).",
        "",
        "| measure | value | target |",
        "| --- | ---: | ---: |",
        f"| apportioning throughput, requests/s per core (best) | "
        f"{t['requests_per_s_per_core']:,.0f} | >= {t['target_requests_per_s']:,} |",
        f"| apportioning throughput, requests/s per core (median) | "
        f"{t['median_requests_per_s_per_core']:,.0f} | |",
        f"| apportioning throughput, requests/s wall | {t['requests_per_s_wall']:,.0f} | |",
        f"| of which spreading records over the grid (every replica, at ingest), requests/s "
        f"per core (best) | {t['spread_requests_per_s_per_core']:,.0f} | |",
        f"| of which apportioning the work rows (the apportioner), requests/s per core (best) "
        f"| {t['apportion_requests_per_s_per_core']:,.0f} | |",
        f"| of which apportioning the work rows, requests/s per core (median) "
        f"| {t['median_apportion_requests_per_s_per_core']:,.0f} | |",
        f"| work rows per request (1 s grid) | {t['rows_per_request']:.2f} | |",
        f"| hot path `record()`, us per request (best) | {r['record_us']:.3f} | <= "
        f"{r['target_record_us']:.0f} |",
        f"| hot path `record()`, us per request (median) | {r['record_us_median']:.3f} | |",
        f"| off-path ingest (record -> ledger rows), us per request | {w['ingest_us']:.1f} | |",
        f"| off-path SQLite ledger write, us per request | {w['ledger_write_us']:.1f} | |",
        f"| off-path ingest + ledger write, us per request | {w['ingest_write_us']:.1f} | "
        f"<= {w['target_ingest_write_us']:.0f} |",
        f"| apportioner step on SQLite (read work, apportion, price, write shares), us per "
        f"request | {a['apportioner_us']:.1f} | |",
        "",
        "At steady state: records arrive as requests finish, the service steps every 0.5 s "
        "(ingest, SQLite write, apportion), us of CPU per request:",
        "",
        "| apportioner | ingest | ledger write | apportioner step | total | apportioner, "
        "requests/s per core | times each interval was apportioned |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        *(f"| {label} | {x['ingest_us']:.1f} | {x['ledger_write_us']:.1f} | "
          f"{x['apportioner_us']:.1f} | {x['total_us']:.1f} | "
          f"{x['apportioner_requests_per_s_per_core']:,.0f} | "
          f"{x['apportionings_per_interval']:.2f} |"
          for label, x in (("waits for requests in flight (hold_s 60, the default)",
                            result["steady"]), ("does not wait (hold_s 0)",
                                                result["steady_no_hold"]))),
        "",
        f"Workload: {t['requests']:,} streamed requests on 8 engines, prompts 16-4000 tokens, "
        "outputs 4-600 tokens, ~2 tokens per SSE event, 1 s intervals. Ingest and ledger write: "
        f"{w['requests']:,} such requests into a fresh SQLite ledger, {w['batch']} per flush; "
        "CPU time of the process (the ledger's worker thread included). Apportioner step: "
        f"{a['requests']:,} such requests already in the ledger, apportioned interval by "
        "interval as the service does. Steady state: "
        f"{result['steady']['requests']:,} such requests arriving at "
        f"{result['steady']['rate']:,.0f}/s on 4 engines "
        f"({result['steady']['rows_per_request']:.2f} work rows each); the gateway's open "
        "requests are known to the service as the proxy reports them.",
        "",
    ])
