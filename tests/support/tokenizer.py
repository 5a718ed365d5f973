"""A tiny byte-level BPE tokenizer trained here (no hub, no download), saved as tokenizer.json."""

from __future__ import annotations

import random
from pathlib import Path

_WORDS = ("energy", "joule", "watt", "token", "prefill", "decode", "batch", "gateway", "route",
          "latency", "carbon", "tenant", "the", "a", "of", "to", "and", "per", "GPU", "model")


def train_tiny_tokenizer(folder: Path, vocab_size: int = 400, seed: int = 7) -> Path:
    """Train and save `folder/tokenizer.json`; returns its path."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(seed)
    corpus = [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12))) + "."
              for _ in range(800)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return path
