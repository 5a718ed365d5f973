"""Part 1 of `bench.gpu_energy`: the NVML meter against nvidia-smi and integrated power, the
counter's cadence, what a read costs, and `wattgate agent` serving the same counter."""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import orjson

from bench.gpu_sampling import Load, Sampler, rel, say, smi_energy_j
from loadgen.run_summary import percentile


def window(name: str, seconds: float, busy: Callable[[float], Any] | None, meter: Any,
           sampler: Sampler, use_smi: bool) -> dict[str, Any]:
    """One measured window: meter and nvidia-smi read at both ends, power integrated between."""
    smi0 = smi_energy_j() if use_smi else None
    m0 = meter.read_sync()
    if busy is None:
        time.sleep(seconds)
    else:
        busy(seconds)
    m1 = meter.read_sync()
    smi1 = smi_energy_j() if use_smi else None
    time.sleep(3 * sampler.period_s)  # the sampler's span covers both ends
    s = sampler.samples
    meter_j = m1.total_j - m0.total_j
    dt = m1.timestamp_s - m0.timestamp_s
    out: dict[str, Any] = {"window": name, "seconds": dt, "meter_j": meter_j,
                           "meter_avg_w": meter_j / dt}
    if smi0 and smi1:
        # nvidia-smi reads at other moments (a process start each): compare each source over
        # its own span, and the meter's counter re-read by the sampler over nvidia-smi's span.
        out["smi_j"] = smi1[1] - smi0[1]
        out["smi_seconds"] = smi1[0] - smi0[0]
        out["sampler_over_smi_span_j"] = s.energy_at(smi1[0]) - s.energy_at(smi0[0])
        out["smi_vs_sampler_rel"] = rel(out["smi_j"], out["sampler_over_smi_span_j"])
        out["smi_avg_w"] = out["smi_j"] / out["smi_seconds"]
        out["meter_vs_smi_avg_power_rel"] = rel(out["meter_avg_w"], out["smi_avg_w"])
    out["sampler_j"] = s.energy_at(m1.timestamp_s) - s.energy_at(m0.timestamp_s)
    out["meter_vs_sampler_rel"] = rel(meter_j, out["sampler_j"])
    for key, series in (("instant_power_integral_j", s.inst_w), ("avg_power_integral_j", s.avg_w)):
        val = s.integrate(series, m0.timestamp_s, m1.timestamp_s)
        out[key] = val
        out[key.replace("_j", "_vs_meter_rel")] = None if val is None else rel(val, meter_j)
    say(f"{name}: {dt:.1f} s, meter {meter_j:.1f} J ({out['meter_avg_w']:.1f} W)"
        + (f", nvidia-smi {out['smi_j']:.1f} J over {out['smi_seconds']:.2f} s" if "smi_j" in out else ""))
    return out


def quantile(xs: list[float], q: float) -> float:
    return percentile(sorted(xs), 100.0 * q)


def read_costs(nvml: Any, meter: Any, n: int = 2000) -> dict[str, float]:
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    direct, via_meter = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        t1 = time.perf_counter()
        meter.read_sync()
        t2 = time.perf_counter()
        direct.append(t1 - t0)
        via_meter.append(t2 - t1)
    return {"nvml_call_us_median": statistics.median(direct) * 1e6,
            "nvml_call_us_p99": quantile(direct, 0.99) * 1e6,
            "meter_read_sync_us_median": statistics.median(via_meter) * 1e6}


def counter_cadence(nvml: Any, seconds: float) -> dict[str, Any] | None:
    """Polls the counter as fast as it answers for `seconds`: how often its value changes."""
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    changes, reads, last = [], 0, None
    end = time.perf_counter() + seconds
    while (now := time.perf_counter()) < end:
        value = nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        reads += 1
        if last is not None and value != last:
            changes.append(now)
        last = value
    steps = [b - a for a, b in itertools.pairwise(changes)]
    if len(steps) < 3:
        return None
    return {"median_ms": statistics.median(steps) * 1e3, "p10_ms": quantile(steps, 0.1) * 1e3,
            "p90_ms": quantile(steps, 0.9) * 1e3, "changes": len(changes), "reads": reads}


def agent_check(nvml: Any) -> dict[str, Any]:
    """`wattgate agent` serving GPU 0: its joules against a direct read right after."""
    from loadgen.procs import free_port, started, wait_http

    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/energy"
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with tempfile.TemporaryFile("w+") as log, \
            started(["agent", "--host", "127.0.0.1", "--port", str(port), "--gpus", "0"], log) as proc:
        try:
            wait_http(url, proc, 60)
        except (RuntimeError, TimeoutError) as exc:
            log.seek(0)
            return {"error": f"{exc}: {log.read()[-2000:]}"}
        diffs = []
        for _ in range(5):
            with urllib.request.urlopen(url, timeout=5) as resp:
                doc = orjson.loads(resp.read())
            direct_j = nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0
            after = time.time()
            agent_j = next(g["energy_j"] for g in doc["gpus"] if g["index"] == 0)
            diffs.append({"agent_j": agent_j, "direct_j": direct_j,
                          "direct_minus_agent_j": direct_j - agent_j,
                          "read_apart_s": after - doc["timestamp_s"]})
            time.sleep(0.2)
    return {"reads": diffs, "max_abs_diff_j": max(abs(d["direct_minus_agent_j"]) for d in diffs)}


def part_meter(nvml: Any, load: Load, sampler: Sampler, args: argparse.Namespace) -> dict[str, Any]:
    from engines.meters.nvml import NvmlMeter

    meter = NvmlMeter([0], nvml=nvml)
    use_smi, smi_note = True, None
    try:
        smi_energy_j()
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        use_smi = False  # then the NVML call read directly (the sampler) is the reference
        smi_note = f"{exc}: {getattr(exc, 'stdout', '') or ''}{getattr(exc, 'stderr', '') or ''}".strip()
        say(f"nvidia-smi cannot report the energy counter: {smi_note}")
    out: dict[str, Any] = {"smi_error": smi_note, "read_costs": read_costs(nvml, meter),
                           "cadence_idle": counter_cadence(nvml, 1.5)}
    out["windows"] = [window("idle", args.idle_s, None, meter, sampler, use_smi),
                      window("matmul", args.load_s, load.run_for, meter, sampler, use_smi)]
    mm = out["windows"][1]
    mm["tflop"] = load.tflop
    if not args.dry_run:
        mm["tflop_per_s"] = mm["tflop"] / mm["seconds"]
        mm["j_per_tflop"] = mm["meter_j"] / mm["tflop"]
    busy = threading.Thread(target=load.run_for, args=(2.5,), daemon=True)
    busy.start()
    time.sleep(0.5)
    out["cadence_busy"] = counter_cadence(nvml, 1.5)
    busy.join()
    out["agent"] = agent_check(nvml)
    return out
