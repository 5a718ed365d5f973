"""Aggregate raw runs into medians with their spread, and evaluate the performance targets (pure).

Every check compares the headline `wattgate` (the gateway as users run it, accounting on) with a
reference in the same cell: vllm-router, the direct path, or the same gateway without
accounting. Each gives the median ratio, the spread of the per-run ratios (run r of one target
against run r of the other: they ran back to back), whether the goal is met, and the margin:
how far past the goal, as a share of the goal (the targets ask for 15 %).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

MODES = ("stream16", "stream16_burst", "nonstream")
MODE_TITLES = {
    "stream16": "Streaming, 16 token events, each in its own engine write",
    "stream16_burst": "Streaming, 16 token events arriving in one engine write",
    "nonstream": "Non-streaming (one JSON response with usage)",
}
TARGET_ORDER = ("direct", "wattgate", "wattgate-tenants", "wattgate-noacct", "wattgate-lean",
                "aiohttp-naive", "nginx", "vllm-router")
# the configurations with accounting on, each checked against the targets below
HEADLINES = ("wattgate", "wattgate-tenants")
MARGIN_GOAL = 0.15  # targets count as met with 15 % to spare
P99_VS_NOACCT = 1.3  # p99 with accounting <= 1.3x the same gateway without it, every mode and c
NONSTREAM_VS_ROUTER = 0.8  # non-streaming req/s >= 0.8x vllm-router's at c >= 16
BURST_VS_ROUTER = 1.5  # burst streams/s >= 1.5x vllm-router's
CPU_VS_ROUTER = 1.0  # stream16 CPU-us per stream <= 1.0x vllm-router's, every c

Run = dict[str, Any]


def _finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if not math.isnan(v)]


def _median(values: Sequence[float]) -> float:
    finite = _finite(values)
    return statistics.median(finite) if finite else math.nan


def _spread(values: Sequence[float]) -> tuple[float, float]:
    finite = _finite(values)
    return (min(finite), max(finite)) if finite else (math.nan, math.nan)


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 and not math.isnan(a) else math.nan


def summarise(raw: Sequence[Run]) -> list[dict[str, Any]]:
    """One row per (mode, connections, target): medians over runs with min/max; added p50/p99
    against the direct path are taken per run (same run, same cell) before the median."""
    direct = {(r["run"], r["mode"], r["connections"]): r for r in raw if r["target"] == "direct"}
    cells: dict[tuple[str, int, str], list[Run]] = {}
    for r in raw:
        cells.setdefault((r["mode"], r["connections"], r["target"]), []).append(r)
    rows = []
    for (mode, conns, target), runs in cells.items():
        row: dict[str, Any] = {"mode": mode, "connections": conns, "target": target,
                               "runs": len(runs), "errors": sum(r["errors"] for r in runs),
                               "requests": sum(r["requests"] for r in runs)}
        for key in ("rps", "p50_ms", "p99_ms", "proxy_cpu_us_per_req", "core0_busy"):
            values = [r[key] for r in runs]
            row[key] = _median(values)
            row[f"{key}_min"], row[f"{key}_max"] = _spread(values)
        for pct in ("p50", "p99"):
            added = [r[f"{pct}_ms"] - direct[(r["run"], mode, conns)][f"{pct}_ms"] for r in runs
                     if (r["run"], mode, conns) in direct]
            row[f"added_{pct}_ms"] = _median(added) if target != "direct" else 0.0
            row[f"added_{pct}_ms_min"], row[f"added_{pct}_ms_max"] = (
                _spread(added) if target != "direct" else (0.0, 0.0))
        rows.append(row)
    order = {m: i for i, m in enumerate(MODES)}
    rows.sort(key=lambda x: (order.get(x["mode"], 99), x["connections"],
                             TARGET_ORDER.index(x["target"]) if x["target"] in TARGET_ORDER
                             else 99))
    return rows


def _row(rows: Sequence[dict[str, Any]], mode: str, conns: int, target: str
         ) -> dict[str, Any] | None:
    return next((r for r in rows if (r["mode"], r["connections"], r["target"])
                 == (mode, conns, target)), None)


def _per_run(raw: Sequence[Run], mode: str, conns: int, target: str) -> dict[int, Run]:
    return {r["run"]: r for r in raw
            if (r["mode"], r["connections"], r["target"]) == (mode, conns, target)}


def _verdict(check: str, value: float, low: float, high: float, goal: float, at_least: bool,
             **extra: Any) -> dict[str, Any]:
    """One check: `value` (a ratio or ms) against `goal`, from below (`at_least`) or above;
    margin = the share of the goal to spare (negative: missed by that much)."""
    margin = (value - goal) / goal if at_least else (goal - value) / goal  # NaN stays NaN
    worst = low if at_least else high
    return {"check": check, "value": value, "min": low, "max": high, "goal": goal,
            "at_least": at_least, "margin": margin, "met": not math.isnan(margin) and margin >= 0,
            "met_with_margin": not math.isnan(margin) and margin >= MARGIN_GOAL,
            "met_every_run": not math.isnan(worst) and (worst >= goal if at_least
                                                        else worst <= goal), **extra}


def _vs(raw: Sequence[Run], mode: str, conns: int, ours_target: str, ref: str,
        metric: Callable[[Run, Run], float]) -> tuple[list[float], float]:
    """Per-run values of metric(our run, reference run) and the number of paired runs."""
    ours, theirs = _per_run(raw, mode, conns, ours_target), _per_run(raw, mode, conns, ref)
    values = [metric(ours[i], theirs[i]) for i in sorted(ours.keys() & theirs.keys())]
    return values, len(values)


def _ratio_check(rows: Sequence[dict[str, Any]], raw: Sequence[Run], ours_target: str,
                 check: str, mode: str, conns: int, ref: str, key: str, goal: float,
                 at_least: bool) -> dict[str, Any] | None:
    """ours[key] / ref[key] against `goal`, with its spread over the paired runs."""
    ours, theirs = _row(rows, mode, conns, ours_target), _row(rows, mode, conns, ref)
    if ours is None or theirs is None:
        return None
    per_run, _ = _vs(raw, mode, conns, ours_target, ref, lambda a, b: _ratio(a[key], b[key]))
    low, high = _spread(per_run)
    return _verdict(f"{ours_target}: {check}", _ratio(ours[key], theirs[key]), low, high, goal,
                    at_least, mode=mode, connections=conns, unit="x", target=ours_target,
                    wattgate=ours[key], reference=theirs[key], reference_target=ref)


def _checks_of(rows: Sequence[dict[str, Any]], raw: Sequence[Run], ours: str, conns_all: list[int]
               ) -> list[dict[str, Any] | None]:
    out: list[dict[str, Any] | None] = []
    for mode in MODES:
        for conns in conns_all:
            out.append(_ratio_check(rows, raw, ours, f"{mode} c={conns}: p99 <= "
                                    f"{P99_VS_NOACCT:g}x without accounting", mode, conns,
                                    "wattgate-noacct", "p99_ms", P99_VS_NOACCT, False))
    for conns in conns_all:
        if conns >= 16:
            out.append(_ratio_check(rows, raw, ours, f"nonstream c={conns}: req/s >= "
                                    f"{NONSTREAM_VS_ROUTER:g}x vllm-router", "nonstream", conns,
                                    "vllm-router", "rps", NONSTREAM_VS_ROUTER, True))
        out.append(_ratio_check(rows, raw, ours, f"stream16 c={conns}: CPU-µs per stream <= "
                                f"{CPU_VS_ROUTER:g}x vllm-router", "stream16", conns,
                                "vllm-router", "proxy_cpu_us_per_req", CPU_VS_ROUTER, False))
        out.append(_ratio_check(rows, raw, ours, f"stream16_burst c={conns}: streams/s >= "
                                f"{BURST_VS_ROUTER:g}x vllm-router", "stream16_burst", conns,
                                "vllm-router", "rps", BURST_VS_ROUTER, True))
    return out


def checks(rows: Sequence[dict[str, Any]], raw: Sequence[Run]) -> list[dict[str, Any]]:
    """The speed targets for each accounting configuration that ran, every cell that has the
    targets they need."""
    conns_all = sorted({r["connections"] for r in rows})
    out = [c for ours in HEADLINES for c in _checks_of(rows, raw, ours, conns_all)]
    return [c for c in out if c is not None]


def _fmt(v: float | None, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:,.{digits}f}"


def _range(row: dict[str, Any], key: str, digits: int) -> str:
    if row["runs"] < 2:
        return _fmt(row[key], digits)
    return (f"{_fmt(row[key], digits)} ({_fmt(row[f'{key}_min'], digits)}–"
            f"{_fmt(row[f'{key}_max'], digits)})")


def _verdict_text(c: dict[str, Any]) -> str:
    if not c["met"]:
        return "**no**"
    return "yes" if c["met_with_margin"] else "yes, margin < 15 %"


def _intro(meta: dict[str, Any]) -> list[str]:
    quick = " --quick" if meta["quick"] else ""
    return [
        "# Gateway overhead benchmark",
        "",
        f"Generated by `python -m bench.gateway_overhead{quick} --runs {meta['runs']}` on "
        f"{meta['date']} (commit `{meta['commit']}`).",
        "",
        f"Machine: {meta['cpu']} ({meta['cpus']} CPUs), {meta['kernel']}. The engine (C epoll "
        "server on 4 ports) and the load client (wrk "
        f"{meta['versions'].get('wrk', '?')}, 1 thread) are pinned to core 0, the proxy under "
        f"test to core 1. {meta['runs']} interleaved run(s) of {meta['duration_s']:g} s per "
        f"cell; medians shown, (min–max) over runs. Load average (1/5/15 min) at start: "
        f"{meta['loadavg']}, at the end: {meta.get('loadavg_end', '?')}.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in sorted(meta["versions"].items())) + ".",
        "",
        "Targets: `wattgate` is the gateway as users run it (4 `vllm` endpoints whose /metrics "
        "are scraped, 2 model aliases, `least_load`, accounting on with the SQLite ledger); "
        "`wattgate-noacct` the same without accounting; `wattgate-lean` one `openai` endpoint "
        "per alias, `round_robin`, no scraping, no accounting; `wattgate-tenants` the user "
        "configuration plus the tenant's rate limits, concurrency cap and joule budget and the "
        "write-ahead journal, set so that nothing is refused. nginx and vllm-router "
        "(`round_robin`) front the same 4 listeners; `direct` and `aiohttp-naive` use the "
        "first. Each cell's requests alternate both aliases and, for streams, clients that do "
        "and that do not ask for `stream_options.include_usage`.",
        "",
        "Columns: req/s (streams/s for streaming), p50/p99 latency to the end of the response, "
        "added p50/p99 against the direct path in the same run, proxy CPU-µs per request "
        "(utime+stime of the proxy's processes over the run; for the accounting gateway until "
        f"at least {meta.get('settle_s', 0):g} s after it and until its processes are quiet "
        "(under 5 % of a core), so the work its requests defer is charged to them; idle CPU "
        "included; for `direct` the engine's own), `vs vllm-router` = req/s "
        "ratio, core-0 busy (engine + client; near 1.0 means they, not the proxy, were the "
        "limit).",
        "",
    ]


def _cell_tables(rows: Sequence[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    conns_all = sorted({r["connections"] for r in rows})
    for mode in MODES:
        if not any(r["mode"] == mode for r in rows):
            continue
        lines += [f"## {MODE_TITLES[mode]}", "",
                  "| c | target | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms "
                  "| proxy CPU-µs/req | vs vllm-router | core-0 busy | errors |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for conns in conns_all:
            vr = _row(rows, mode, conns, "vllm-router")
            for r in rows:
                if r["mode"] != mode or r["connections"] != conns:
                    continue
                vs = r["rps"] / vr["rps"] if vr and vr["rps"] else None
                lines.append(
                    f"| {conns} | {r['target']} | {_range(r, 'rps', 0)} | {_fmt(r['p50_ms'], 3)} "
                    f"| {_fmt(r['p99_ms'], 3)} | {_range(r, 'added_p50_ms', 3)} "
                    f"| {_range(r, 'added_p99_ms', 3)} | {_range(r, 'proxy_cpu_us_per_req', 0)} "
                    f"| {_fmt(vs, 2)} | {_fmt(r['core0_busy'], 2)} | {r['errors']} |")
        lines.append("")
    return lines


def _check_table(result_checks: Sequence[dict[str, Any]]) -> list[str]:
    lines = ["## Targets (accounting on: `wattgate` as users run it, `wattgate-tenants` with "
             "tenant controls and the journal)", "",
             "Value: the ratio of the medians (or ms); min–max: the same over the paired runs; "
             "margin: the share of the goal to spare (the targets ask for 15 %).", "",
             "| check | wattgate | reference | value | min–max | margin | met | every run |",
             "|---|---:|---:|---:|---:|---:|---|---|"]
    for c in result_checks:
        digits, suffix = (3, " ms") if c["unit"] == "ms" else (2, "x")
        # against vllm-router the compared numbers are req/s or CPU-µs, else milliseconds
        ours_digits = 0 if c["reference_target"] == "vllm-router" else 3
        margin = "–" if math.isnan(c["margin"]) else f"{100 * c['margin']:+.0f} %"
        lines.append(
            f"| {c['check']} | {_fmt(c['wattgate'], ours_digits)} "
            f"| {_fmt(c['reference'], ours_digits)} | {_fmt(c['value'], digits)}{suffix} "
            f"| {_fmt(c['min'], digits)}–{_fmt(c['max'], digits)} | {margin} "
            f"| {_verdict_text(c)} | {'yes' if c['met_every_run'] else 'no'} |")
    met = sum(1 for c in result_checks if c["met"])
    spare = sum(1 for c in result_checks if c["met_with_margin"])
    lines += ["", f"{met} of {len(result_checks)} checks met, {spare} with the 15 % margin.", ""]
    return lines


def markdown(result: dict[str, Any]) -> str:
    lines = _intro(result["meta"]) + _cell_tables(result["summary"])
    lines += _check_table(result["checks"])
    if result.get("preflight"):
        lines += ["## Response checks before the load", ""]
        lines += [f"- {p}" for p in result["preflight"]]
        lines.append("")
    return "\n".join(lines)
