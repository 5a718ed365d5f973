"""A tiny random-weight Llama with a locally trained byte-level BPE tokenizer, for a real vLLM.

No hub and no download: the tokenizer is trained with `tokenizers` on generated text and the
weights are random (seeded), so the model talks nonsense but exercises vLLM's real serving path
(tokenization, scheduling, sampling, streaming, usage, metrics). Shapes follow what vLLM's CPU
attention kernels accept: head dim 64 (16 is rejected), 2 heads, 1 KV head (GQA).

Built once into `.cache/tiny-llama` (git-ignored) and reused while RECIPE is unchanged:
    python -m tests.realengine.tinymodel [DIR]
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DIR = REPO / ".cache" / "tiny-llama"
STAMP = "wattgate-tiny-model.json"
# Bump when anything below changes, so cached copies are rebuilt.
RECIPE = {
    "version": 1, "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256,
    "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
    "max_position_embeddings": 1024, "seed": 1234,
}
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
# Minimal chat template so /v1/chat/completions works (vLLM needs one on the tokenizer).
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_WORDS = ("energy", "joule", "watt", "token", "prefill", "decode", "batch", "gateway", "route",
          "latency", "carbon", "tenant", "precision", "kernel", "cache", "stream", "request",
          "the", "a", "of", "to", "and", "is", "per", "with", "on", "GPU", "model", "serve")


def _corpus(seed: int, lines: int = 3000) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 14))]
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 10_000)))
        out.append(" ".join(words) + rng.choice((".", "?", "!", ",")))
    return out


def _build(target: Path) -> None:
    # Heavy imports stay inside: importing this module must not need torch.
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=RECIPE["vocab_size"], special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(RECIPE["seed"]), trainer=trainer)
    # transformers' tokenizer and model constructors carry no annotations
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        pad_token="</s>", model_max_length=RECIPE["max_position_embeddings"])
    fast.chat_template = CHAT_TEMPLATE

    torch.manual_seed(RECIPE["seed"])
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=RECIPE["hidden_size"],
        intermediate_size=RECIPE["intermediate_size"],
        num_hidden_layers=RECIPE["num_hidden_layers"],
        num_attention_heads=RECIPE["num_attention_heads"],
        num_key_value_heads=RECIPE["num_key_value_heads"], head_dim=RECIPE["head_dim"],
        max_position_embeddings=RECIPE["max_position_embeddings"],
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(torch.bfloat16)  # type: ignore[no-untyped-call, arg-type]
    model.save_pretrained(target)
    fast.save_pretrained(target)
    (target / STAMP).write_text(json.dumps(RECIPE, sort_keys=True))


def ensure_tiny_model(target: Path = DEFAULT_DIR) -> Path:
    """The tiny model's directory, built first if missing or made by another recipe."""
    stamp = target / STAMP
    if stamp.is_file() and json.loads(stamp.read_text()) == RECIPE:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename, so a reader never sees half a model.
    staging = Path(tempfile.mkdtemp(prefix=".tiny-llama-", dir=target.parent))
    try:
        _build(staging)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


if __name__ == "__main__":
    print(ensure_tiny_model(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR))
