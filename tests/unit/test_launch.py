"""Launch specs: precision -> the real vLLM / TensorRT-LLM command lines."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shlex
import shutil
from pathlib import Path

import click
import orjson
import pytest
from click.testing import CliRunner

from engines import cli as engines_cli
from engines.cli import engines
from engines.launch import (
    LaunchRequest,
    LaunchSpecError,
    checkpoint_mismatch,
    launch_spec,
    parse_gpus,
    to_dict,
    to_shell,
    trtllm_spec,
    vllm_spec,
)


def _flag(argv: tuple[str, ...], name: str) -> str | None:
    """The value after `name` in argv, or None when the flag is absent."""
    return argv[argv.index(name) + 1] if name in argv else None


def _req(**kw: object) -> LaunchRequest:
    base: dict[str, object] = {"engine": "vllm", "model": "/models/llama-3.1-8b",
                               "precision": "bf16"}
    base.update(kw)
    return LaunchRequest(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("precision", "dtype"), [("bf16", "bfloat16"), ("fp16", "float16")])
def test_vllm_half_precisions_set_dtype_without_quantization(precision: str, dtype: str) -> None:
    argv = vllm_spec(_req(precision=precision)).serve.argv
    assert argv[:3] == ("vllm", "serve", "/models/llama-3.1-8b")
    assert _flag(argv, "--dtype") == dtype
    assert "--quantization" not in argv
    assert "--kv-cache-dtype" not in argv


def test_vllm_fp8_uses_dynamic_fp8_and_fp8_kv_cache() -> None:
    argv = vllm_spec(_req(precision="fp8")).serve.argv
    assert _flag(argv, "--quantization") == "fp8"
    assert _flag(argv, "--kv-cache-dtype") == "fp8"
    assert _flag(argv, "--dtype") == "bfloat16"


def test_vllm_fp8_kv_cache_can_be_turned_off_and_on_for_other_precisions() -> None:
    off = vllm_spec(_req(precision="fp8", kv_cache_dtype="auto")).serve.argv
    assert "--kv-cache-dtype" not in off
    argv = vllm_spec(_req(precision="bf16", kv_cache_dtype="fp8")).serve.argv
    assert _flag(argv, "--kv-cache-dtype") == "fp8"


@pytest.mark.parametrize(("precision", "kind", "methods"), [
    ("int8", "hf-w8a8", ("compressed-tensors",)),
    ("int4", "hf-awq", ("awq", "awq_marlin")),
])
def test_vllm_int_precisions_pass_no_quantization_flag_and_require_prequantized_checkpoint(
        precision: str, kind: str, methods: tuple[str, ...]) -> None:
    spec = vllm_spec(_req(precision=precision))
    assert "--quantization" not in spec.serve.argv
    assert spec.checkpoint.kind == kind
    assert spec.checkpoint.quant_methods == methods
    assert not spec.checkpoint.unquantized_ok
    assert any("checkpoint must be" in note for note in spec.notes)


def test_vllm_tensor_parallel_port_host_name_and_gpus() -> None:
    spec = vllm_spec(_req(precision="fp8", tp=2, gpus=(2, 3), port=8101, host="0.0.0.0",
                          served_model_name="llama-3.1-8b"))
    argv = spec.serve.argv
    assert _flag(argv, "--tensor-parallel-size") == "2"
    assert _flag(argv, "--port") == "8101"
    assert _flag(argv, "--host") == "0.0.0.0"
    assert _flag(argv, "--served-model-name") == "llama-3.1-8b"
    assert dict(spec.env) == {"CUDA_VISIBLE_DEVICES": "2,3"}


def test_vllm_no_gpus_leaves_cuda_visible_devices_alone() -> None:
    assert dict(vllm_spec(_req()).env) == {}


def test_vllm_module_runner_uses_api_server_with_model_flag() -> None:
    argv = vllm_spec(_req(extra=("--max-model-len", "512")), runner="module",
                     python="/venv/bin/python").serve.argv
    assert argv[:5] == ("/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server",
                        "--model", "/models/llama-3.1-8b")
    assert argv[-2:] == ("--max-model-len", "512")


@pytest.mark.parametrize(("precision", "qformat", "dtype"), [
    ("bf16", "full_prec", "bfloat16"), ("fp16", "full_prec", "float16"),
    ("fp8", "fp8", "bfloat16"), ("int8", "int8_sq", "float16"), ("int4", "int4_awq", "float16"),
])
def test_trtllm_flow_quantizes_builds_then_serves(precision: str, qformat: str, dtype: str) -> None:
    spec = trtllm_spec(_req(engine="trtllm", precision=precision, tp=4, gpus=(0, 1, 2, 3),
                            port=8105, work_dir="/work/trt"))
    quantize, build, serve = spec.steps
    assert [s.name for s in spec.steps] == ["quantize", "build", "serve"]
    assert quantize.argv[1].endswith("quantization/quantize.py")
    assert _flag(quantize.argv, "--qformat") == qformat
    assert _flag(quantize.argv, "--dtype") == dtype
    assert _flag(quantize.argv, "--tp_size") == "4"
    assert _flag(quantize.argv, "--model_dir") == "/models/llama-3.1-8b"
    # The checkpoint the quantizer writes is what the builder reads; its engine is what is served.
    assert _flag(build.argv, "--checkpoint_dir") == _flag(quantize.argv, "--output_dir")
    assert serve.argv[:2] == ("trtllm-serve", _flag(build.argv, "--output_dir"))
    assert _flag(serve.argv, "--tp_size") == "4"
    assert _flag(serve.argv, "--port") == "8105"
    assert _flag(serve.argv, "--tokenizer") == "/models/llama-3.1-8b"
    assert _flag(serve.argv, "--backend") == "tensorrt"
    assert dict(spec.env) == {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert (_flag(quantize.argv, "--kv_cache_dtype") == "fp8") == (precision == "fp8")


def test_trtllm_specs_for_different_precisions_write_to_different_dirs() -> None:
    a = trtllm_spec(_req(engine="trtllm", precision="fp8"))
    b = trtllm_spec(_req(engine="trtllm", precision="int4"))
    assert a.serve.argv[1] != b.serve.argv[1]


@pytest.mark.parametrize(("kw", "match"), [
    ({"precision": "fp4"}, "precision must be one of"),
    ({"engine": "sglang"}, "engine must be one of"),
    ({"tp": 0}, "tp must be"),
    ({"tp": 2, "gpus": (0,)}, "needs exactly 2 GPU"),
    ({"port": 70000}, "port must be"),
    ({"model": ""}, "model must"),
    ({"kv_cache_dtype": "int8"}, "kv_cache_dtype must be one of"),
])
def test_bad_requests_raise_with_the_allowed_values(kw: dict[str, object], match: str) -> None:
    with pytest.raises(LaunchSpecError, match=match):
        launch_spec(_req(**kw))


def test_parse_gpus_accepts_lists_and_rejects_junk() -> None:
    assert parse_gpus("0,1") == (0, 1)
    assert parse_gpus("") == ()
    for bad in ("a,b", "0,0", "-1"):
        with pytest.raises(LaunchSpecError):
            parse_gpus(bad)


def test_checkpoint_mismatch_names_what_is_wrong() -> None:
    awq = vllm_spec(_req(precision="int4")).checkpoint
    assert checkpoint_mismatch(awq, {"quantization_config": {"quant_method": "awq"}}) is None
    assert "no quantization_config" in (checkpoint_mismatch(awq, {}) or "")
    assert "'gptq'" in (checkpoint_mismatch(awq, {"quantization_config": {"quant_method": "gptq"}})
                        or "")
    bf16 = vllm_spec(_req()).checkpoint
    assert checkpoint_mismatch(bf16, {}) is None
    assert checkpoint_mismatch(bf16, {"quantization_config": {"quant_method": "awq"}}) is not None


def test_shell_output_is_runnable_text_with_env_prefix() -> None:
    spec = vllm_spec(_req(precision="fp8", tp=2, gpus=(0, 1)))
    lines = [line for line in to_shell(spec).splitlines() if not line.startswith("#")]
    assert len(lines) == 1
    words = shlex.split(lines[0])
    assert words[0] == "CUDA_VISIBLE_DEVICES=0,1"
    assert tuple(words[1:]) == spec.serve.argv


def test_json_output_round_trips_the_argv() -> None:
    spec = trtllm_spec(_req(engine="trtllm", precision="int8"))
    data = orjson.loads(orjson.dumps(to_dict(spec)))
    assert [tuple(s["argv"]) for s in data["steps"]] == [s.argv for s in spec.steps]


def test_cli_launch_spec_prints_the_documented_vllm_command() -> None:
    result = CliRunner().invoke(engines, [
        "launch-spec", "--engine", "vllm", "--model", "M", "--precision", "fp8", "--tp", "2",
        "--gpus", "0,1", "--port", "8000", "--", "--max-model-len", "8192"])
    assert result.exit_code == 0, result.output
    command = [line for line in result.output.splitlines() if not line.startswith("#")]
    assert command == [
        "CUDA_VISIBLE_DEVICES=0,1 vllm serve M --dtype bfloat16 --quantization fp8 "
        "--kv-cache-dtype fp8 --tensor-parallel-size 2 --host 127.0.0.1 --port 8000 "
        "--max-model-len 8192"]


def test_cli_launch_spec_json_for_trtllm() -> None:
    result = CliRunner().invoke(engines, [
        "launch-spec", "--engine", "trtllm", "--model", "M", "--precision", "int4",
        "--format", "json"])
    assert result.exit_code == 0, result.output
    data = orjson.loads(result.output)
    assert [s["name"] for s in data["steps"]] == ["quantize", "build", "serve"]


def test_cli_rejects_tp_gpu_mismatch_with_usage_error() -> None:
    result = CliRunner().invoke(engines, [
        "launch-spec", "--engine", "vllm", "--model", "M", "--precision", "bf16", "--tp", "2",
        "--gpus", "0"])
    assert result.exit_code == 2
    assert "needs exactly 2 GPU" in result.output


def test_cli_launch_refuses_trtllm() -> None:
    result = CliRunner().invoke(engines, [
        "launch", "--engine", "trtllm", "--model", "M", "--precision", "fp8", "--dry-run"])
    assert result.exit_code == 2
    assert "launch runs vLLM only" in result.output


def _write_config(tmp_path: Path, config: dict[str, object]) -> str:
    (tmp_path / "config.json").write_bytes(orjson.dumps(config))
    return str(tmp_path)


def test_cli_launch_refuses_a_checkpoint_that_does_not_fit_the_precision(tmp_path: Path) -> None:
    """int4 on an unquantized local checkpoint stops before vLLM starts, saying why."""
    model = _write_config(tmp_path, {"architectures": ["LlamaForCausalLM"]})
    result = CliRunner().invoke(engines, [
        "launch", "--model", model, "--precision", "int4", "--dry-run"])
    assert result.exit_code == 2
    assert "AWQ" in result.output
    assert "no quantization_config" in result.output


def test_cli_launch_dry_run_prints_the_module_form_where_the_console_script_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _write_config(tmp_path, {"quantization_config": {"quant_method": "awq"}})
    monkeypatch.setattr(engines_cli, "detect_vllm_runner", lambda: "module")
    # vLLM counts as installed here whatever this Python has, so the output is the same on
    # every machine
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: (
        object() if name == "vllm" else real_find_spec(name, *args)))
    result = CliRunner().invoke(engines, [
        "launch", "--model", model, "--precision", "int4", "--gpus", "1", "--port", "8123",
        "--dry-run", "--", "--max-model-len", "512"])
    assert result.exit_code == 0, result.output
    words = shlex.split(result.output.strip())
    assert words[:2] == ["env", "CUDA_VISIBLE_DEVICES=1"]
    assert words[3:6] == ["-m", "vllm.entrypoints.openai.api_server", "--model"]
    assert words[-2:] == ["--max-model-len", "512"]


class _FakeDist:
    pass


@pytest.mark.parametrize(("has_package", "has_dist", "expected"), [
    (True, False, "module"),  # the vllm-cpu build: package present, no `vllm` distribution
    (True, True, "console"),
])
def test_detect_vllm_runner(monkeypatch: pytest.MonkeyPatch, has_package: bool, has_dist: bool,
                            expected: str) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        if name == "vllm":
            return object() if has_package else None
        return real_find_spec(name, *args)  # type: ignore[arg-type]

    def distribution(name: str) -> _FakeDist:
        if name == "vllm" and has_dist:
            return _FakeDist()
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    assert engines_cli.detect_vllm_runner() == expected


def test_detect_vllm_runner_without_vllm_says_how_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real_find_spec(name, *a))
    with pytest.raises(click.ClickException, match=r"vllm-cpu\.sh"):
        engines_cli.detect_vllm_runner()
