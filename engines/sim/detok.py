"""Token texts as vLLM's incremental detokenizer hands them out: some tokens carry no text.

A byte-level BPE token can end inside a multi-byte UTF-8 character; the detokenizer then
emits "" for it and the whole character with the token that completes it. Special tokens
decode to "" too. vLLM still sends an SSE event for such a token (`"content":""` or
`"text":""`) and counts it in `usage.completion_tokens`, so clients and the gateway must
treat an event with empty text as a token event. Replies to CJK or emoji prompts split
characters far more often than English ones, so the share of empty tokens grows with the
prompt's non-ASCII text.
"""

from __future__ import annotations

import random

TOKEN_TEXT = " tok"  # the text of every token that decodes to something


def non_ascii_fraction(texts: list[str]) -> float:
    """Fraction (0..1) of the non-whitespace characters of `texts` that are not ASCII."""
    total = non_ascii = 0
    for text in texts:
        for char in text:
            if char.isspace():
                continue
            total += 1
            non_ascii += ord(char) > 0x7F
    return non_ascii / total if total else 0.0


def empty_share(ascii_share: float, non_ascii_share: float, fraction: float) -> float:
    """Probability that one token decodes to "": `ascii_share` for an all-ASCII prompt,
    rising linearly to `non_ascii_share` for a prompt with no ASCII text at all."""
    return ascii_share + (non_ascii_share - ascii_share) * fraction


class TokenTexts:
    """The texts of one request's tokens, in order; deterministic for a given seed."""

    __slots__ = ("_rng", "_share")

    def __init__(self, seed: int, share: float) -> None:
        self._rng = random.Random(seed)
        self._share = share

    def take(self, tokens: int) -> str:
        """The text of the next `tokens` tokens (possibly "")."""
        if self._share <= 0.0:
            return TOKEN_TEXT * tokens
        rng, share = self._rng, self._share
        return "".join("" if rng.random() < share else TOKEN_TEXT for _ in range(tokens))
