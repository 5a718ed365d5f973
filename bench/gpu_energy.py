"""The NVML meter on a real GPU, and the gateway charging that GPU's measured energy.

    python -m bench.gpu_energy                 # on a GPU node with PyTorch: ~2 minutes
    python -m bench.gpu_energy --dry-run       # anywhere: a fake NVML, sleeps for the load

Part 1, the meter: over an idle window and a fixed bf16 matmul load on GPU 0, the joules the
NVML meter (`engines.meters.nvml.NvmlMeter`, the gateway's own code path) reads against
`nvidia-smi --query-gpu=total_energy_consumption` read at the same moments, and against power
sampled at 20 Hz and integrated (instant power where the driver has it; the 1 s average
`nvmlDeviceGetPowerUsage` too, to show why it is not used). Also: how often the counter
steps, what a read costs, and `wattgate agent` serving the same counter.

Part 2, the gateway: a simulated engine's endpoint metered by `{kind: nvml, gpus: [0]}` while
the GPU runs the matmul load 5 s on, 5 s off, and two tenants stream requests through
`wattgate serve`. From its SQLite ledger: every interval's shares plus idle against the
interval's energy (conservation), each interval's energy against the counter sampled
independently at 20 Hz and interpolated at the interval's edges, and the tenants' bills.

Writes gpu_energy.{json,md,png} (default bench/results/). `--dry-run` runs the same code with
bench/fake_nvml/pynvml.py (a counter that is a function of the wall clock, so the gateway's
process reads the same one) and without nvidia-smi or PyTorch, to keep this script working on
machines without a GPU (tests/integration/test_gpu_energy_dry_run.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from bench.gpu_energy_report import markdown, plot
from bench.gpu_ledger_check import part_gateway
from bench.gpu_meter_check import part_meter
from bench.gpu_sampling import Load, Sampler, parse_smi_csv, say

__all__ = ["main", "parse_smi_csv"]  # parse_smi_csv: tests read it from here

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
FAKE_NVML = REPO / "bench" / "fake_nvml"


def gpu_info(nvml: Any) -> dict[str, Any]:
    handle = nvml.nvmlDeviceGetHandleByIndex(0)

    def text(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    info = {"name": text(nvml.nvmlDeviceGetName(handle)), "driver": text(nvml.nvmlSystemGetDriverVersion())}
    with contextlib.suppress(nvml.NVMLError, AttributeError):
        info["power_limit_w"] = nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
    return info


@contextlib.contextmanager
def nvml_module(dry: bool) -> Iterator[Any]:
    if dry:  # this process and the gateway and agent it starts read the fake counter
        sys.path.insert(0, str(FAKE_NVML))
        os.environ["PYTHONPATH"] = os.pathsep.join([str(FAKE_NVML), os.environ.get("PYTHONPATH", "")])
        os.environ["PATH"] = os.pathsep.join([str(FAKE_NVML), os.environ.get("PATH", "")])  # nvidia-smi
    import pynvml

    pynvml.nvmlInit()
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--idle-s", type=float, default=8.0)
    p.add_argument("--load-s", type=float, default=30.0)
    p.add_argument("--traffic-s", type=float, default=30.0)
    p.add_argument("--on-s", type=float, default=5.0)
    p.add_argument("--off-s", type=float, default=5.0)
    p.add_argument("--skip-gateway", action="store_true")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                           "dry_run": args.dry_run, "host": platform.node(),
                           "python": platform.python_version()}
    with nvml_module(args.dry_run) as nvml, tempfile.TemporaryDirectory() as tmp:
        res["gpu"] = gpu_info(nvml)
        say(f"GPU 0: {res['gpu']}")
        load = Load(args.dry_run)
        sampler = Sampler(nvml)
        sampler.start()
        time.sleep(0.5)
        try:
            res["meter"] = part_meter(nvml, load, sampler, args)
            res["instant_power_supported"] = sampler.instant_supported
            _write(args.out, res)  # part 1 stands on its own if part 2 fails
            if not args.skip_gateway:
                try:
                    res["gateway"] = part_gateway(load, sampler, args, Path(tmp))
                except Exception as exc:
                    res["gateway"] = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            sampler.stop()
        _write(args.out, res)
        try:
            plot(res, sampler.samples, args.out / "gpu_energy.png")
        except Exception as exc:
            say(f"plot failed: {exc!r}")
    say(f"wrote {args.out}/gpu_energy.{{json,md,png}}")
    print(markdown(res))


def _write(out: Path, res: dict[str, Any]) -> None:
    (out / "gpu_energy.json").write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2))
    (out / "gpu_energy.md").write_text(markdown(res))


if __name__ == "__main__":
    main()
