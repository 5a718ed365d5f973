"""Markdown and plot of `bench.gpu_energy`'s result."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.gpu_sampling import Samples


# ---- output -----------------------------------------------------------------------------------

def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.2f} %"


def markdown(res: dict[str, Any]) -> str:
    info = res["gpu"]
    lines = [f"# NVML meter on a real GPU ({info['name']}, driver {info['driver']})", "",
             f"Run {res['when']}{' (DRY RUN: fake NVML, no load)' if res['dry_run'] else ''}. "
             "Produced by `python -m bench.gpu_energy`.", "", "## The meter", "",
             "| window | seconds | NVML meter J | meter W | nvidia-smi J (its span) | nvidia-smi W "
             "| meter vs nvidia-smi (W) | nvidia-smi vs counter over its span "
             "| instant power integral vs meter | 1 s average power integral vs meter |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for w in res["meter"]["windows"]:
        smi = (f"{w['smi_j']:.1f} ({w['smi_seconds']:.2f} s)", f"{w['smi_avg_w']:.1f}",
               _pct(w["meter_vs_smi_avg_power_rel"]), _pct(w["smi_vs_sampler_rel"])) \
            if "smi_j" in w else ("n/a", "n/a", "n/a", "n/a")
        lines.append(f"| {w['window']} | {w['seconds']:.2f} | {w['meter_j']:.1f} | {w['meter_avg_w']:.1f} "
                     f"| {smi[0]} | {smi[1]} | {smi[2]} | {smi[3]} "
                     f"| {_pct(w['instant_power_integral_vs_meter_rel'])} "
                     f"| {_pct(w['avg_power_integral_vs_meter_rel'])} |")
    mm = res["meter"]["windows"][1]
    rc = res["meter"]["read_costs"]
    cad = res["meter"].get("cadence_busy")
    lines += ["",
              f"- Load: {mm['tflop']:.0f} TFLOP of bf16 8192^3 products"
              + (f", {mm['tflop_per_s']:.0f} TFLOP/s, {mm['j_per_tflop']:.3f} J/TFLOP."
                 if "tflop_per_s" in mm else "."),
              f"- The counter, polled as fast as it answers under load, changed every "
              f"{cad['median_ms']:.1f} ms median (p10 {cad['p10_ms']:.1f}, p90 {cad['p90_ms']:.1f}; "
              f"{cad['reads']} reads in 1.5 s)." if cad
              else "- The counter changed too rarely to tell how often.",
              f"- A read: `nvmlDeviceGetTotalEnergyConsumption` {rc['nvml_call_us_median']:.1f} us median "
              f"(p99 {rc['nvml_call_us_p99']:.1f}); "
              f"`NvmlMeter.read_sync` {rc['meter_read_sync_us_median']:.1f} us.",
              ]
    if res["meter"].get("smi_error"):
        lines.append(f"- nvidia-smi could not be compared: {res['meter']['smi_error'][:300]} "
                     "The NVML call read directly on a thread of its own is the reference instead.")
    ag = res["meter"]["agent"]
    lines.append(f"- `wattgate agent`: {ag['error'][:200]}" if "error" in ag else
                 f"- `wattgate agent --gpus 0`: GET /v1/energy against a direct read just after it: "
                 f"at most {ag['max_abs_diff_j']:.2f} J apart over {len(ag['reads'])} reads.")
    gw = res.get("gateway")
    lines += ["", "## The gateway charging this GPU's energy", ""]
    if not gw or "error" in gw:
        lines.append(f"Did not run: {gw and gw.get('error', '')[:500]}")
        return "\n".join(lines) + "\n"
    iv = gw["interval_vs_sampler_rel"]
    traffic = gw["traffic"]
    lines += [f"{traffic['ok']} requests ({traffic['failed']} failed) from two tenants through "
              "`wattgate serve` to a simulated engine whose endpoint is metered by "
              f"`{{kind: nvml, gpus: [0]}}`, while the GPU ran the matmul load in "
              f"{len(gw['load_windows'])} bursts. The ledger apportioned {gw['intervals']} one-second "
              f"intervals, {gw['energy_j']:.0f} J in all.", "",
              "- Conservation: shares + idle against each interval's energy, worst "
              f"{gw['conservation_max_rel']:.1e} relative.",
              "- Bills + idle against the metered energy: "
              f"{gw['bills_plus_idle_vs_energy_rel']:.1e} relative; {gw['requests']} requests in the "
              f"ledger, {gw['requests_without_shares']} without a share.",
              ("- Each interval's energy against the counter sampled independently at 20 Hz and "
               f"interpolated at the interval's edges: median |diff| {100 * iv['median_abs']:.2f} %, "
               f"p95 {100 * iv['p95_abs']:.2f} %, worst {100 * iv['max_abs']:.2f} % ({iv['n']} "
               "intervals, all but the first, which is measured from the gateway's first reading on); "
               f"over the whole span {_pct(gw['span_energy_vs_sampler_rel'])} (where the power "
               "steps at an end, interpolating between the gateway's readings can miss by up to "
               f"{gw.get('span_interpolation_bound_j', 0.0):.1f} J).") if iv else "",
              "", "| tenant | requests | energy J | carbon g | cost USD |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for b in gw["bills"]:
        lines.append(f"| {b['tenant']} | {b['requests']} | {b['energy_j']:.1f} | {b['carbon_g']:.4f} "
                     f"| {b['cost_usd']:.6f} |")
    lines.append(f"| idle | | {gw['idle_j']:.1f} | | |")
    return "\n".join(lines) + "\n"


def plot(res: dict[str, Any], samples: Samples, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 7.5), layout="constrained")
    ax1, ax2 = fig.subplots(2, 1)
    t0 = samples.t[0]
    ts = [t - t0 for t in samples.t]
    # Power from the counter: its difference over ~0.5 s spans.
    k = max(1, int(0.5 / 0.05))
    ct = [(samples.t[i] + samples.t[i - k]) / 2 - t0 for i in range(k, len(samples.t))]
    cw = [(samples.counter_j[i] - samples.counter_j[i - k]) / (samples.t[i] - samples.t[i - k])
          for i in range(k, len(samples.t))]
    ax1.plot(ct, cw, label="energy counter (difference over 0.5 s)", lw=1.2)
    ax1.plot(ts, samples.avg_w, label="nvmlDeviceGetPowerUsage (1 s average)", lw=0.8, alpha=0.8)
    if any(w is not None for w in samples.inst_w):
        ax1.plot(ts, [math.nan if w is None else w for w in samples.inst_w], label="instant power",
                 lw=0.6, alpha=0.6)
    ax1.set_ylabel("W")
    ax1.set_xlabel("seconds")
    ax1.set_title(f"GPU 0 ({res['gpu']['name']}): power over the whole run")
    ax1.legend(loc="upper left", fontsize=8)
    gw = res.get("gateway") or {}
    rows = [r for r in gw.get("rows", []) if r["sampled_j"] is not None]
    if rows:
        x = [r["start_s"] - t0 for r in rows]
        ax2.bar(x, [r["shares_j"] for r in rows], width=0.9, align="edge", label="tenants' shares")
        ax2.bar(x, [r["idle_j"] for r in rows], width=0.9, align="edge",
                bottom=[r["shares_j"] for r in rows], label="idle account")
        ax2.plot([xi + 0.5 for xi in x], [r["sampled_j"] for r in rows], "k.",
                 label="counter sampled at 20 Hz")
        ax2.set_ylabel("J per 1 s interval")
        ax2.set_xlabel("seconds")
        ax2.set_title("The gateway's ledger: each interval's measured energy split between requests and idle")
        ax2.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, fontsize=8)
    fig.savefig(path, dpi=110)
