"""`POST /v1/embeddings` as vLLM speaks it: request validation and the response body.

`input` is a string, a list of strings, a list of token ids or a list of such lists; each
item is one prompt, tokenised like a completion prompt (one token per word). An
embedding is a deterministic unit vector of the model's hidden size (or `dimensions`),
seeded by its input, sent as float32 values (or base64 of little-endian float32 with
`encoding_format: base64`), as vLLM's pooling server sends them.
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
import sys
from array import array
from dataclasses import dataclass
from typing import Any

import orjson

from engines.sim.protocol import ApiError, count_words, json_object

ENCODINGS = ("float", "base64")


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    """What the engine needs from an embeddings request."""

    model: str
    prompt_tokens: tuple[int, ...]  # per input
    seeds: tuple[int, ...]  # per input: what its vector is drawn from
    dimensions: int
    encoding_format: str

    @property
    def total_tokens(self) -> int:
        return sum(self.prompt_tokens)


def _seed(item: object) -> int:
    return int.from_bytes(hashlib.blake2b(orjson.dumps(item), digest_size=8).digest(), "little")


def _item_tokens(item: object) -> int:
    if isinstance(item, str):
        return count_words(item)
    if isinstance(item, list) and all(type(t) is int for t in item):
        return len(item)
    raise ApiError(400, "input must be a string, a list of strings, a list of token ids or a "
                        "list of token-id lists", param="input")


def _inputs(raw: Any) -> list[object]:
    if isinstance(raw, str) or (isinstance(raw, list) and raw and all(type(t) is int for t in raw)):
        return [raw]
    if isinstance(raw, list) and raw:
        return list(raw)
    raise ApiError(400, "input must be a non-empty string or list", param="input")


def _dimensions(body: dict[str, Any], hidden: int) -> int:
    value = body.get("dimensions")
    if value is None:
        return hidden
    if type(value) is not int or not 1 <= value <= hidden:
        raise ApiError(400, f"dimensions must be an integer in 1..{hidden}, got {value!r}",
                       param="dimensions")
    return value


def parse_embedding_request(raw: bytes, served_model: str, max_model_len: int,
                            hidden: int) -> EmbedRequest:
    """Validate an embeddings body the way vLLM does; raises ApiError (400/404)."""
    body = json_object(raw)
    model = body.get("model", served_model)
    if model != served_model:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    encoding = body.get("encoding_format", "float")
    if encoding not in ENCODINGS:
        raise ApiError(400, f"encoding_format must be one of {', '.join(ENCODINGS)}",
                       param="encoding_format")
    items = _inputs(body.get("input"))
    tokens = tuple(_item_tokens(item) for item in items)
    for count in tokens:
        if count == 0:
            raise ApiError(400, "Prompt cannot be empty", param="input")
        if count > max_model_len:
            raise ApiError(400, f"This model's maximum context length is {max_model_len} "
                                f"tokens. However, your prompt contains {count} input tokens, "
                                f"which exceeds this limit even without any output tokens. "
                                f"Please reduce the length of the input prompt.",
                           param="input_tokens")
    return EmbedRequest(model, tokens, tuple(_seed(item) for item in items),
                        _dimensions(body, hidden), encoding)


def unit_vector(seed: int, dimensions: int) -> array[float]:
    """A deterministic float32 unit vector."""
    rng = random.Random(seed)
    values = [rng.gauss(0.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return array("f", [v / norm for v in values])


def _encode(vector: array[float], encoding: str) -> list[float] | str:
    if encoding == "float":
        return vector.tolist()
    if sys.byteorder != "little":
        vector = array("f", vector)
        vector.byteswap()
    return base64.b64encode(vector.tobytes()).decode("ascii")


def embedding_body(req: EmbedRequest, response_id: str, created: int) -> bytes:
    """vLLM's EmbeddingResponse, dumped in full (usage has completion_tokens 0 and nulls)."""
    data = [{"index": i, "object": "embedding",
             "embedding": _encode(unit_vector(seed, req.dimensions), req.encoding_format)}
            for i, seed in enumerate(req.seeds)]
    tokens = req.total_tokens
    return orjson.dumps({
        "id": response_id, "object": "list", "created": created, "model": req.model,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                  "prompt_tokens_details": None, "completion_tokens_details": None},
    })
