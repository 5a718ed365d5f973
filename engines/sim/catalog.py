"""GPUs, models and precisions the simulator knows, each constant with its source.

GPU figures are dense (no 2:4 sparsity) datasheet peaks; docs/simulator.md "Constants and sources"
holds the same numbers. Model shapes are the `config.json` of the public
Hugging Face checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


class CatalogError(ValueError):
    """An unknown name or an impossible GPU / model / precision / TP combination."""


@dataclass(frozen=True, slots=True)
class GpuSpec:
    key: str
    name: str
    bf16_flops: float  # dense BF16/FP16 tensor FLOP/s
    fp8_flops: float | None  # dense FP8 FLOP/s; None: no FP8 tensor cores
    int8_ops: float  # dense INT8 tensor OP/s
    hbm_bytes_per_s: float
    memory_bytes: float
    tdp_w: float
    idle_w: float  # idle with a CUDA context held (docs/architecture.md, "Sources": 60-120 W per GPU)
    link_bytes_per_s: float  # per-GPU all-reduce bandwidth between TP ranks
    source: str


GPUS: dict[str, GpuSpec] = {
    "h100": GpuSpec(
        "h100", "NVIDIA H100 SXM5 80GB", 989e12, 1979e12, 1979e12, 3.35e12, 80 * GIB, 700.0,
        75.0, 450e9,
        "NVIDIA H100 datasheet (SXM5, dense); idle with context ~70-80 W (vendor measurements); "
        "NVLink4 900 GB/s bidirectional",
    ),
    "h200": GpuSpec(
        "h200", "NVIDIA H200 SXM 141GB", 989e12, 1979e12, 1979e12, 4.8e12, 141e9, 700.0,
        77.0, 450e9,
        "NVIDIA H200 datasheet (compute as H100, HBM3e 4.8 TB/s); idle 74-80 W (vendor "
        "measurements)",
    ),
    "a100": GpuSpec(
        "a100", "NVIDIA A100 SXM4 80GB", 312e12, None, 624e12, 2.039e12, 80 * GIB, 400.0,
        62.0, 300e9,
        "NVIDIA A100 datasheet (SXM4 80GB, dense); no FP8; NVLink3 600 GB/s bidirectional",
    ),
    "l40s": GpuSpec(
        "l40s", "NVIDIA L40S 48GB", 362e12, 733e12, 733e12, 0.864e12, 48 * GIB, 350.0,
        62.0, 25e9,
        "NVIDIA L40S datasheet (dense); PCIe Gen4 x16, no NVLink",
    ),
    "b200": GpuSpec(
        "b200", "NVIDIA B200 192GB", 2250e12, 4500e12, 4500e12, 8.0e12, 192e9, 1000.0,
        115.0, 900e9,
        "NVIDIA DGX B200 / HGX B200 figures (dense, ~, low confidence); "
        "NVLink5 1.8 TB/s bidirectional",
    ),
}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    key: str
    hf_name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    params: float
    max_context: int
    allowed_tp: tuple[int, ...]

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def lm_head_params(self) -> float:
        return float(self.vocab * self.hidden)

    @property
    def matmul_params(self) -> float:
        """Parameters multiplied per token: all but the input embedding (lookup only)."""
        return self.params - self.lm_head_params

    @property
    def quantizable_params(self) -> float:
        """Linear-layer weights a quantized checkpoint stores at low precision.

        Embeddings and lm_head stay 16-bit in AWQ, SmoothQuant and FP8 checkpoints.
        """
        return self.params - 2 * self.lm_head_params

    def kv_bytes_per_token(self, kv_dtype_bytes: float = 2.0) -> float:
        """K and V for every layer of one token (16-bit KV cache unless told otherwise)."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * kv_dtype_bytes


# Shapes from each checkpoint's config.json on Hugging Face (meta-llama/Llama-3.1-8B,
# meta-llama/Llama-3.1-70B, Qwen/Qwen2.5-7B, Qwen/Qwen2.5-32B); parameter counts from the
# model cards (untied embeddings in all four).
MODELS: dict[str, ModelSpec] = {
    "llama-3.1-8b": ModelSpec("llama-3.1-8b", "meta-llama/Llama-3.1-8B", 32, 4096, 32, 8,
                              14336, 128256, 8.03e9, 131072, (1, 2, 4, 8)),
    "llama-3.1-70b": ModelSpec("llama-3.1-70b", "meta-llama/Llama-3.1-70B", 80, 8192, 64, 8,
                               28672, 128256, 70.55e9, 131072, (1, 2, 4, 8)),
    "qwen2.5-7b": ModelSpec("qwen2.5-7b", "Qwen/Qwen2.5-7B", 28, 3584, 28, 4,
                            18944, 152064, 7.62e9, 32768, (1, 2, 4)),
    "qwen2.5-32b": ModelSpec("qwen2.5-32b", "Qwen/Qwen2.5-32B", 64, 5120, 40, 8,
                             27648, 152064, 32.76e9, 32768, (1, 2, 4, 8)),
}


@dataclass(frozen=True, slots=True)
class PrecisionSpec:
    key: str
    weight_bytes: float  # bytes per quantized weight, scales included
    compute: str  # which tensor-core rate the GEMMs use: "bf16", "fp8" or "int8"
    description: str


PRECISIONS: dict[str, PrecisionSpec] = {
    "bf16": PrecisionSpec("bf16", 2.0, "bf16", "BF16 weights and activations"),
    "fp16": PrecisionSpec("fp16", 2.0, "bf16", "FP16 weights and activations"),
    "fp8": PrecisionSpec("fp8", 1.0, "fp8", "FP8 E4M3 weights and activations (W8A8)"),
    "int8": PrecisionSpec("int8", 1.0, "int8", "INT8 SmoothQuant W8A8"),
    # AWQ W4A16, group size 128: 4-bit weight + one FP16 scale and a 4-bit zero per group.
    "int4": PrecisionSpec("int4", 0.5 + 2.5 / 128, "bf16", "INT4 AWQ W4A16 (group 128)"),
}

GPU_MEMORY_UTILIZATION = 0.9  # vLLM --gpu-memory-utilization default
ACTIVATION_RESERVE_BYTES = 2 * GIB  # activations / CUDA graphs held outside the KV pool
KV_BLOCK_TOKENS = 16  # vLLM default block size
MIN_KV_TOKENS = 4096  # refuse a deployment whose KV cache cannot hold one modest context


@dataclass(frozen=True, slots=True)
class Deployment:
    """One engine: a model at a precision on `tp` GPUs of one kind."""

    gpu: GpuSpec
    model: ModelSpec
    precision: PrecisionSpec
    tp: int

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights (summed over TP ranks)."""
        m = self.model
        return m.quantizable_params * self.precision.weight_bytes + 2 * m.lm_head_params * 2.0

    @property
    def weight_bytes_read_per_step(self) -> float:
        """Bytes of weights streamed once per forward pass (no input-embedding table)."""
        m = self.model
        return m.quantizable_params * self.precision.weight_bytes + m.lm_head_params * 2.0

    @property
    def peak_flops(self) -> float:
        """Tensor-core peak of one GPU for this precision's GEMMs."""
        rate = self.precision.compute
        if rate == "fp8":
            assert self.gpu.fp8_flops is not None
            return self.gpu.fp8_flops
        if rate == "int8":
            return self.gpu.int8_ops
        return self.gpu.bf16_flops

    @property
    def kv_pool_bytes(self) -> float:
        total = self.gpu.memory_bytes * self.tp * GPU_MEMORY_UTILIZATION
        return total - self.weight_bytes - ACTIVATION_RESERVE_BYTES * self.tp

    @property
    def kv_blocks(self) -> int:
        block_bytes = self.model.kv_bytes_per_token() * KV_BLOCK_TOKENS
        return max(0, int(self.kv_pool_bytes // block_bytes))

    @property
    def kv_tokens(self) -> int:
        return self.kv_blocks * KV_BLOCK_TOKENS

    @property
    def max_model_len(self) -> int:
        return min(self.model.max_context, self.kv_tokens)


def _pick(table: dict[str, object], key: str, what: str) -> None:
    if key not in table:
        raise CatalogError(f"unknown {what} {key!r}; known: {', '.join(sorted(table))}")


def deployment(gpu: str, model: str, precision: str, tp: int = 1) -> Deployment:
    """Resolve names to a Deployment; raises CatalogError for impossible combinations."""
    gpu_key, model_key, prec_key = gpu.lower(), model.lower(), precision.lower()
    _pick(dict(GPUS), gpu_key, "gpu")
    _pick(dict(MODELS), model_key, "model")
    _pick(dict(PRECISIONS), prec_key, "precision")
    g, m, p = GPUS[gpu_key], MODELS[model_key], PRECISIONS[prec_key]
    if p.compute == "fp8" and g.fp8_flops is None:
        raise CatalogError(f"{g.name} has no FP8 tensor cores; use bf16, fp16, int8 or int4")
    if tp not in m.allowed_tp:
        raise CatalogError(
            f"tensor parallel size {tp} does not divide {m.hf_name}'s attention heads; "
            f"allowed: {', '.join(map(str, m.allowed_tp))}"
        )
    d = Deployment(g, m, p, tp)
    if d.kv_tokens < MIN_KV_TOKENS:
        need_gib = (d.weight_bytes + ACTIVATION_RESERVE_BYTES * tp) / GIB
        have_gib = g.memory_bytes * tp * GPU_MEMORY_UTILIZATION / GIB
        raise CatalogError(
            f"{m.hf_name} at {p.key} does not fit on {tp} x {g.name}: weights and reserve "
            f"need {need_gib:.1f} GiB of {have_gib:.1f} GiB usable, leaving KV cache for "
            f"{d.kv_tokens} tokens (< {MIN_KV_TOKENS}); raise --tp or lower the precision"
        )
    return d
