"""Prompt synthesis in the unit the target counts: a tokenizer's tokens, or words.

`TokenPrompts` builds text that the target model's tokenizer (a `tokenizers` tokenizer.json,
found by `core.tokenizer`) encodes to exactly N tokens. Its text is words taken from the
tokenizer's own vocabulary: only words that add exactly one token after another word (" w"
is one token) are kept, and the first word is one the tokenizer encodes alone as one token,
so a draft of N words is N tokens; every prompt is still encoded (in one batch) and trimmed
or padded by whole words until the count is exact (a word boundary never merges in a
pre-tokenized vocabulary, so trimming a word removes its tokens and no others).
- completions: the count includes the special tokens the tokenizer adds (e.g. BOS), as the
  engine reports them in `usage.prompt_tokens`.
- chat: the message content encodes to N tokens; the engine adds its chat template's.

`WordPrompts` is the fallback without a tokenizer: N common English words. It is exact for
wattgate's simulated engine, which counts one prompt token per word plus 4 per chat message
(engines/sim/protocol.py), so a chat prompt has N - 4 words; a real tokenizer counts more or
fewer tokens than words.

Both are seeded by the caller's `random.Random`: the same seed gives the same prompts.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from core.tokenizer import load_tokenizer
from loadgen import lengths

WORDS_SPEC = "words"  # --tokenizer words: the simulated engine's rule, chosen on purpose
BLOCK_TOKENS = 512  # Mooncake hash ids name 512-token prefix blocks
_WORD = re.compile(r"[A-Za-z]{2,16}")
_ANY_WORD = re.compile(r"[A-Za-z]{1,16}")
_FIT_ROUNDS = 12  # additive pools fit in two rounds; the rest is headroom for odd vocabularies


class PromptError(ValueError):
    """A tokenizer that prompts of an exact token count cannot be built from."""


class TokenizerLike(Protocol):
    """The part of `tokenizers.Tokenizer` used here."""

    def encode(self, sequence: Any, pair: Any | None = None, is_pretokenized: bool = False,
               add_special_tokens: bool = True) -> Any: ...

    def encode_batch(self, input: Sequence[Any], is_pretokenized: bool = False,
                     add_special_tokens: bool = True) -> list[Any]: ...

    def decode_batch(self, sequences: Sequence[Sequence[int]],
                     skip_special_tokens: bool = True) -> list[str]: ...

    def get_vocab_size(self, with_added_tokens: bool = True) -> int: ...

    def get_added_tokens_decoder(self) -> dict[int, Any]: ...


@dataclass(frozen=True, slots=True)
class Draft:
    """One request's prompt before it is checked: its words and the length it must have."""

    words: tuple[str, ...]
    n_tokens: int
    chat: bool


class PromptSynth(Protocol):
    """Builds prompt text of a requested length; `unit` says what the length counts.

    A plan drafts every prompt in request order (drawing words from the caller's seeded rng),
    then `finish` turns the drafts into text in one batch."""

    @property
    def unit(self) -> str: ...

    @property
    def note(self) -> str: ...

    @property
    def warning(self) -> str: ...

    def draft(self, rng: random.Random, n_tokens: int, chat: bool) -> Draft: ...

    def block_draft(self, hash_ids: Sequence[int], n_tokens: int, chat: bool) -> Draft: ...

    def finish(self, drafts: Sequence[Draft], seed: str) -> list[str]: ...

    def count(self, text: str, chat: bool) -> int: ...


def one_prompt(synth: PromptSynth, rng: random.Random, n_tokens: int, chat: bool) -> str:
    """One prompt of `n_tokens` (a plan drafts many and finishes them together)."""
    return synth.finish([synth.draft(rng, n_tokens, chat)], "one")[0]


class WordPrompts:
    """N common words per N tokens: the simulated engine's own count (see the module doc).

    `chosen`: the user asked for words (`--tokenizer words`, or the demo against its simulated
    fleet), so there is nothing to warn about."""

    __slots__ = ("chosen",)
    unit = "words"

    def __init__(self, chosen: bool = False) -> None:
        self.chosen = chosen

    @property
    def note(self) -> str:
        return ("prompt lengths in words, not tokens (wattgate's simulated engine counts one "
                "token per word, plus 4 per chat message; a real tokenizer does not)")

    @property
    def warning(self) -> str:
        if self.chosen:
            return ""
        return ("warning: no --tokenizer: prompt lengths (--prompt-tokens, workload and trace "
                "lengths) are counted in WORDS, not tokens. That is exact only for wattgate's "
                "simulated engine (one token per word); a real model's tokenizer can give "
                "several times more. Pass --tokenizer MODEL_DIR|tokenizer.json|HUB_NAME for "
                "exact token counts, or --tokenizer words to keep words without this warning.")

    def draft(self, rng: random.Random, n_tokens: int, chat: bool) -> Draft:
        text = lengths.synth_prompt(rng, lengths.words_for_tokens(n_tokens, chat))
        return Draft(tuple(text.split(" ")), n_tokens, chat)

    def block_draft(self, hash_ids: Sequence[int], n_tokens: int, chat: bool) -> Draft:
        text = lengths.prompt_from_blocks(hash_ids, lengths.words_for_tokens(n_tokens, chat))
        return Draft(tuple(text.split(" ")), n_tokens, chat)

    def finish(self, drafts: Sequence[Draft], seed: str) -> list[str]:
        return [" ".join(d.words) for d in drafts]

    def count(self, text: str, chat: bool) -> int:
        return len(text.split())


class TokenPrompts:
    """Prompts that `tokenizer` encodes to exactly the requested number of tokens."""

    __slots__ = ("_pool", "_specials", "_starters", "_tok", "name")
    unit = "tokens"

    def __init__(self, tokenizer: TokenizerLike, name: str = "tokenizer") -> None:
        self._tok = tokenizer
        self.name = name
        self._pool, self._starters = word_pool(tokenizer)
        if not self._pool:
            raise PromptError(f"{name}: its vocabulary has no word that encodes to one token "
                              "after a space, so prompts of exact lengths cannot be built")
        # Tokens the tokenizer adds to one sequence (BOS, EOS): part of a completion's count.
        self._specials = len(tokenizer.encode("", add_special_tokens=True).ids)

    @classmethod
    def load(cls, spec: str) -> TokenPrompts:
        """From a tokenizer.json, a model folder, or a hub name in the local hub cache
        (`core.tokenizer.tokenizer_file`; nothing is downloaded)."""
        from tokenizers import Tokenizer  # imported only when a tokenizer is asked for

        tok = load_tokenizer(spec)
        if not isinstance(tok, Tokenizer):  # load_tokenizer promises only an encoder
            raise PromptError(f"{spec}: not a tokenizers.Tokenizer")
        return cls(tok, spec)

    @property
    def note(self) -> str:
        return (f"prompt lengths in tokens of {self.name} (exact; chat: the message content, "
                "before the engine's chat template)")

    @property
    def warning(self) -> str:
        return ""

    def count(self, text: str, chat: bool) -> int:
        """Tokens the engine counts for `text`: with the tokenizer's special tokens for a
        completion, the content alone for chat."""
        return len(self._tok.encode(text, add_special_tokens=not chat).ids)

    def draft(self, rng: random.Random, n_tokens: int, chat: bool) -> Draft:
        n = self._least(n_tokens, chat)
        words = [self._starters[rng.randrange(len(self._starters))]]
        words += self._draw(rng, n - self._fixed(chat) - 1)
        return Draft(tuple(words), n, chat)

    def block_draft(self, hash_ids: Sequence[int], n_tokens: int, chat: bool) -> Draft:
        """Words of the request's 512-token prefix blocks first, so requests that share hash
        ids share a prompt prefix (the last block may be cut to fit); the rest seeded by the
        blocks and the length."""
        n = self._least(n_tokens, chat)
        want = n - self._fixed(chat)
        words: list[str] = []
        for h in hash_ids:
            if len(words) >= want:
                break
            words += self._draw(random.Random(f"block:{h}"), BLOCK_TOKENS)
        words = words[:want]
        words += self._draw(random.Random(f"tail:{list(hash_ids)}:{n}"), want - len(words))
        return Draft(tuple(words), n, chat)

    def finish(self, drafts: Sequence[Draft], seed: str) -> list[str]:
        """The drafts' text, each checked by encoding it (one batch, which the library spreads
        over cores); a draft off its length is trimmed or padded, seeded by `seed` and its
        position, so the result does not depend on batching."""
        texts = [" ".join(d.words) for d in drafts]
        # Without offsets (tokenizers >= 0.21) encoding takes about 40% less time.
        encode_batch = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        for chat in (False, True):
            idx = [i for i, d in enumerate(drafts) if d.chat is chat]
            encs = encode_batch([texts[i] for i in idx], add_special_tokens=not chat)
            for i, enc in zip(idx, encs, strict=True):
                if len(enc.ids) != drafts[i].n_tokens:
                    texts[i] = self._fit(list(drafts[i].words), drafts[i].n_tokens, chat,
                                         random.Random(f"{seed}:fit:{i}"))
        return texts

    def _fixed(self, chat: bool) -> int:
        return 0 if chat else self._specials

    def _least(self, n_tokens: int, chat: bool) -> int:
        """At least one token of text besides the special tokens."""
        return max(n_tokens, self._fixed(chat) + 1)

    def _draw(self, rng: random.Random, n: int) -> list[str]:
        # choices() draws k words in one call, ~4x faster than k randrange() calls
        return rng.choices(self._pool, k=n) if n > 0 else []

    def _fit(self, words: list[str], n: int, chat: bool, rng: random.Random) -> str:
        """Trim or pad `words` at the end until the text encodes to exactly n tokens."""
        for _ in range(_FIT_ROUNDS):
            text = " ".join(words)
            count = self.count(text, chat)
            if count == n:
                return text
            if count < n:
                words += self._draw(rng, n - count)
            elif len(words) > 1:
                del words[max(1, len(words) - (count - n)):]
            else:  # one word alone is too long: start over from a one-token word
                words[0] = self._starters[rng.randrange(len(self._starters))]
        raise PromptError(f"{self.name}: no prompt of exactly {n} tokens after {_FIT_ROUNDS} "
                          "rounds (its words do not add one token each)")


def word_pool(tok: TokenizerLike) -> tuple[list[str], list[str]]:
    """(words, starters) from the vocabulary, sorted so a seed picks the same words anywhere.

    words: letter-only tokens whose marginal cost after another word is one token (the text
    "w w w" has one token more than "w w"). starters: those of them that are one token at the
    start of a text too. Whole ASCII words of 2-16 letters are preferred; single letters only
    when a vocabulary has no such words."""
    added = set(tok.get_added_tokens_decoder())
    ids = [[i] for i in range(tok.get_vocab_size(with_added_tokens=False)) if i not in added]
    texts = {t.strip() for t in tok.decode_batch(ids, skip_special_tokens=True)}
    for pattern in (_WORD, _ANY_WORD):
        candidates = sorted(t for t in texts if pattern.fullmatch(t))
        words, starters = _one_token_words(tok, candidates)
        if words:
            return words, starters or words
    return [], []


def _one_token_words(tok: TokenizerLike, candidates: list[str]) -> tuple[list[str], list[str]]:
    if not candidates:
        return [], []
    probes = [f"{w} {w}" for w in candidates] + [f"{w} {w} {w}" for w in candidates]
    probes += candidates
    enc = tok.encode_batch(probes, add_special_tokens=False)
    k = len(candidates)
    words = [w for i, w in enumerate(candidates) if len(enc[k + i].ids) - len(enc[i].ids) == 1]
    one = {w for i, w in enumerate(candidates) if len(enc[2 * k + i].ids) == 1}
    return words, [w for w in words if w in one]


def from_spec(spec: str) -> PromptSynth:
    """`--tokenizer SPEC`: "words" for the simulated engine's word count, else a tokenizer
    (raises core.tokenizer.TokenizerNotFound or PromptError with the reason)."""
    if spec == WORDS_SPEC:
        return WordPrompts(chosen=True)
    return TokenPrompts.load(spec)
