"""Counting a prompt's tokens in the gateway, for requests whose engine never reported usage.

An engine reports a request's prompt tokens in its usage object, which comes at the end of a
response. A request that ends before it (client disconnect, engine failure, timeout) still did
its prefill and is still charged for it, so the gateway has the prompt counted: by the vLLM
engine that served it (`POST /tokenize`, gateway/pipeline/record.py), else with the model's
own tokenizer (the Rust `tokenizers` library, one `tokenizer.json` loaded once per model at
startup), or, when neither can, with an estimate of 4 bytes per token. The record says which
(`prompt_source`: "engine" for the usage, "engine_tokenize", "gateway" or "estimate").

Encoding runs on a worker thread (`PromptCounter.count` is called through `asyncio.to_thread`):
a long prompt takes milliseconds, which the event loop must not spend.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from core.vocab import PromptSource

BYTES_PER_TOKEN = 4.0  # the usual English average for BPE vocabularies of 32k-128k tokens


class Encoder(Protocol):
    def encode(self, sequence: Any, pair: Any | None = None, is_pretokenized: bool = False,
               add_special_tokens: bool = True) -> Any: ...


class TokenizerNotFound(LookupError):
    """No usable tokenizer.json for a name or path (the message says where it looked)."""


def _hub_snapshots(name: str) -> Iterable[Path]:
    """tokenizer.json files of `name` in a local Hugging Face hub cache (never downloaded)."""
    home = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub")
    folder = Path(home) / ("models--" + name.replace("/", "--")) / "snapshots"
    if folder.is_dir():
        yield from sorted(folder.glob("*/tokenizer.json"))


def tokenizer_file(spec: str) -> Path:
    """The tokenizer.json that `spec` names: the file itself, a model folder holding one, or a
    hub model name already in the local hub cache."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    if (path / "tokenizer.json").is_file():
        return path / "tokenizer.json"
    for found in _hub_snapshots(spec):
        return found
    raise TokenizerNotFound(
        f"no tokenizer.json at {spec!r} (a file, a model folder, or a hub name in the local "
        "hub cache; nothing is downloaded)")


def load_tokenizer(spec: str) -> Encoder:
    """Load a `tokenizers` Tokenizer from `spec` (see `tokenizer_file`)."""
    from tokenizers import Tokenizer  # the Rust library; imported only where one is configured

    path = tokenizer_file(spec)
    try:
        tok: Encoder = Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - the library raises a bare Exception on a bad file
        raise TokenizerNotFound(f"{path} is not a tokenizer.json the tokenizers library reads: "
                                f"{exc}") from None
    return tok


def prompt_text(body: Mapping[str, Any]) -> str | list[int] | None:
    """The text a request asks the engine to read: a completion's `prompt` (a string, or token
    ids), a chat's messages joined with their roles, or an embedding's `input`. None when the
    body holds none of these."""
    prompt = body.get("prompt", body.get("input"))
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if all(isinstance(t, list) for t in prompt):  # a batch of token-id lists
            return [t for seq in prompt for t in seq if isinstance(t, int)]
        return "\n".join(p for p in prompt if isinstance(p, str))
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    parts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        parts.append(str(message.get("role", "")))
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):  # content parts: count the text ones
            parts.extend(p["text"] for p in content
                         if isinstance(p, dict) and isinstance(p.get("text"), str))
    return "\n".join(parts)


class PromptCounter:
    """Per model alias, a tokenizer (or none: the byte estimate). Thread-safe: `tokenizers`
    encodes without holding shared state."""

    def __init__(self, tokenizers: Mapping[str, Encoder]):
        self._tokenizers = dict(tokenizers)

    @classmethod
    def load(cls, specs: Mapping[str, str]) -> PromptCounter:
        """{alias: tokenizer spec}; raises TokenizerNotFound naming the spec that failed."""
        return cls({alias: load_tokenizer(spec) for alias, spec in specs.items() if spec})

    def has_tokenizer(self, model: str) -> bool:
        return model in self._tokenizers

    def count(self, model: str, body: Mapping[str, Any]) -> tuple[int, PromptSource]:
        """(prompt tokens, how they were counted) for one request body."""
        text = prompt_text(body)
        if text is None:
            return 0, "estimate"
        if isinstance(text, list):
            return len(text), "gateway"  # token ids: the engine reads exactly these
        tok = self._tokenizers.get(model)
        if tok is None:
            return math.ceil(len(text.encode("utf-8", "surrogatepass")) / BYTES_PER_TOKEN
                             ), "estimate"
        return len(tok.encode(text, add_special_tokens=True).ids), "gateway"
