"""Prompts of exact token lengths (`--tokenizer`): every prompt encodes to exactly the requested
number of tokens of the target's tokenizer, for fixed and sampled lengths and trace lengths,
reproducibly; without a tokenizer, words (the simulated engine's count) with a warning.

The tokenizers are trained here, in seconds and without torch or a download, as in
tests/realengine/tinymodel.py: a byte-level BPE (GPT-2/Llama-3 style) that adds a BOS token to
every sequence, and a SentencePiece-style one (Metaspace) that adds none.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from core.tokenizer import TokenizerNotFound
from loadgen import arrivals, lengths, traces
from loadgen.prompts import Draft, PromptError, TokenPrompts, WordPrompts, from_spec, one_prompt
from loadgen.workload import TenantSpec, Workload, build_plan, from_mapping

SYLLABLES = ("ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "zen", "vak")


def _corpus(seed: int, lines: int = 2000) -> list[str]:
    """Common words and made-up ones, so the vocabulary has whole words and word pieces."""
    rng = random.Random(seed)
    made_up = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4)))
               for _ in range(300)]
    words = [*lengths.WORDS, *made_up]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 14))) + rng.choice(".,!?")
            for _ in range(lines)]


def train_tokenizer(path: Path, kind: str = "bytelevel", vocab_size: int = 400) -> Path:
    """Train a tiny tokenizer and save it as `path` (a tokenizer.json); returns `path`.

    bytelevel: BPE, ByteLevel pre-tokenizer and decoder, a BOS token added to every sequence.
    metaspace: BPE, Metaspace ("▁word") pre-tokenizer and decoder, no special tokens added."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    if kind == "bytelevel":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        alphabet = []
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(_corpus(7), trainer=trainer)
    if kind == "bytelevel":
        bos = tok.token_to_id("<s>")
        tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                           special_tokens=[("<s>", bos)])
    tok.save(str(path))
    return path


@pytest.fixture(scope="module", params=["bytelevel", "metaspace"])
def tokenizer_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                   ) -> Path:
    folder = tmp_path_factory.mktemp(request.param)
    return train_tokenizer(folder / "tokenizer.json", request.param)


@pytest.fixture(scope="module")
def synth(tokenizer_path: Path) -> TokenPrompts:
    return TokenPrompts.load(str(tokenizer_path))


def engine_count(path: Path, text: str, chat: bool) -> int:
    """What an engine reports: a completion with the tokenizer's special tokens, chat content
    alone (the engine's chat template adds its own), counted by a freshly loaded tokenizer."""
    return len(Tokenizer.from_file(str(path)).encode(text, add_special_tokens=not chat).ids)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(2, 1500), chat=st.booleans(), seed=st.integers(0, 2**32))
def test_prompt_encodes_to_exactly_n_tokens(synth: TokenPrompts, tokenizer_path: Path, n: int,
                                            chat: bool, seed: int) -> None:
    """Any length from 2 to 1500, chat or completion, any seed: exactly n tokens."""
    text = one_prompt(synth, random.Random(seed), n, chat)
    assert engine_count(tokenizer_path, text, chat) == n


def test_completion_counts_the_bos_token(tokenizer_path: Path, synth: TokenPrompts) -> None:
    """The byte-level tokenizer adds BOS: a completion of 10 tokens has 9 of text; a chat
    message of 10 has 10 (the template's tokens are the engine's)."""
    tok = Tokenizer.from_file(str(tokenizer_path))
    adds = len(tok.encode("", add_special_tokens=True).ids)
    completion = one_prompt(synth, random.Random(1), 10, chat=False)
    chat = one_prompt(synth, random.Random(1), 10, chat=True)
    assert len(tok.encode(completion, add_special_tokens=False).ids) == 10 - adds
    assert len(tok.encode(chat, add_special_tokens=False).ids) == 10


def test_one_token_prompt_is_one_word_of_text(synth: TokenPrompts, tokenizer_path: Path) -> None:
    """Below the special tokens' count a completion still has one token of text."""
    text = one_prompt(synth, random.Random(3), 1, chat=False)
    tok = Tokenizer.from_file(str(tokenizer_path))
    assert len(tok.encode(text, add_special_tokens=False).ids) == 1
    assert engine_count(tokenizer_path, one_prompt(synth, random.Random(3), 1, True), True) == 1


def test_a_draft_off_its_length_is_trimmed_or_padded_to_exact(synth: TokenPrompts,
                                                              tokenizer_path: Path) -> None:
    """Drafts that would miss (extra words, a first word of many tokens, too few words) come out
    exact: the check encodes every prompt, it does not trust the word count."""
    base = synth.draft(random.Random(5), 40, chat=True)
    drafts = [Draft((*base.words, "the", "of", "and"), 40, True),
              Draft(("zqxvkwjzqxvkwj", *base.words), 40, True),
              Draft(base.words[:10], 40, True),
              Draft(("zqxvkwjzqxvkwj",), 3, False)]
    for d, text in zip(drafts, synth.finish(drafts, "s"), strict=True):
        assert engine_count(tokenizer_path, text, d.chat) == d.n_tokens


def test_same_seed_same_prompts_across_loads(tokenizer_path: Path) -> None:
    """Two loads of one tokenizer.json give identical plans for one seed, another seed differs."""
    def plan(seed: int) -> list[str]:
        w = Workload(model="m", tenants=(TenantSpec("t", prompt_tokens=lengths.LengthDist(
            "uniform", low=5, high=300)),), arrival=arrivals.Poisson(50.0), duration_s=2.0,
            seed=seed, prompts=TokenPrompts.load(str(tokenizer_path)))
        return [r.prompt for r in build_plan(w)]

    first = plan(1)
    assert len(first) > 20
    assert first == plan(1)
    assert first != plan(2)


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_plan_prompts_have_their_sampled_token_lengths(synth: TokenPrompts, tokenizer_path: Path,
                                                       api: str) -> None:
    """--prompt-tokens N (fixed) and sampled lengths: each planned prompt encodes to its length."""
    w = Workload(model="m", api=api, arrival=arrivals.Poisson(40.0), duration_s=2.0, seed=3,
                 prompts=synth, tenants=(
                     TenantSpec("fixed", prompt_tokens=lengths.fixed(64)),
                     TenantSpec("lognormal", prompt_tokens=lengths.LengthDist(
                         "lognormal", median=200, sigma=0.8, min=2, max=3000))))
    plan = build_plan(w)
    assert {r.tenant for r in plan} == {"fixed", "lognormal"}
    for r in plan:
        assert engine_count(tokenizer_path, r.prompt, api == "chat") == r.prompt_tokens
        assert r.tenant != "fixed" or r.prompt_tokens == 64


@pytest.mark.parametrize("fmt", traces.FORMATS)
def test_trace_lengths_are_honoured_in_tokens(synth: TokenPrompts, tokenizer_path: Path,
                                              tmp_path: Path, fmt: str) -> None:
    """Every trace row's input length (Azure ContextTokens, BurstGPT Request tokens, Mooncake
    input_length) becomes a prompt of exactly that many tokens."""
    path = tmp_path / f"trace.{fmt}"
    path.write_text(traces.sample_text(fmt, 30, seed=2))
    rows = traces.load(path, fmt)
    w = Workload(model="m", api="completions", tenants=(TenantSpec("t"),), arrival=None,
                 traces=(traces.TraceSpec(path, fmt, tenant="t", dequantize_s=0.0),),
                 prompts=synth)
    plan = build_plan(w)
    assert sorted(r.prompt_tokens for r in plan) == sorted(r.prompt_tokens for r in rows)
    for r in plan:
        assert engine_count(tokenizer_path, r.prompt, chat=False) == r.prompt_tokens


def test_mooncake_requests_that_share_blocks_share_a_prefix_in_tokens(synth: TokenPrompts,
                                                                      tokenizer_path: Path,
                                                                      tmp_path: Path) -> None:
    """Two rows with the same first hash id start with the same 500 tokens (of a 512-token
    block), and their lengths are still exact."""
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 700, "output_length": 5, '
                    '"hash_ids": [11, 12]}\n'
                    '{"timestamp": 10, "input_length": 900, "output_length": 5, '
                    '"hash_ids": [11, 13]}\n')
    w = Workload(model="m", api="chat", tenants=(TenantSpec("t"),), arrival=None,
                 traces=(traces.TraceSpec(path, "mooncake", tenant="t", dequantize_s=0.0),),
                 prompts=synth)
    a, b = build_plan(w)
    tok = Tokenizer.from_file(str(tokenizer_path))
    ids_a = tok.encode(a.prompt, add_special_tokens=False).ids
    ids_b = tok.encode(b.prompt, add_special_tokens=False).ids
    assert (len(ids_a), len(ids_b)) == (700, 900)
    assert ids_a[:500] == ids_b[:500]
    assert ids_a[600:] != ids_b[600:700]


def test_workload_file_names_its_tokenizer_relative_to_itself(tokenizer_path: Path) -> None:
    """`tokenizer: tokenizer.json` beside the workload file gives token-exact prompts."""
    w = from_mapping({"model": "m", "api": "completions", "tokenizer": tokenizer_path.name,
                      "arrival": {"kind": "poisson", "rate_rps": 30}, "duration_s": 1,
                      "tenants": [{"name": "t", "prompt_tokens": 33}]}, tokenizer_path.parent)
    assert w.prompts.unit == "tokens"
    plan = build_plan(w)
    assert plan and all(engine_count(tokenizer_path, r.prompt, False) == 33 for r in plan)


def test_sharegpt_prompt_lengths_are_counted_with_the_tokenizer(synth: TokenPrompts,
                                                                tokenizer_path: Path) -> None:
    """A ShareGPT prompt is sent as written; its planned length is its token count."""
    text = "the people of the world make good time"
    w = Workload(model="m", api="completions", arrival=arrivals.Poisson(20.0), duration_s=1.0,
                 tenants=(TenantSpec("t", conversations=((text, 5),)),), prompts=synth)
    plan = build_plan(w)
    assert plan and {r.prompt_tokens for r in plan} == {engine_count(tokenizer_path, text, False)}


def test_word_fallback_warns_unless_words_are_chosen() -> None:
    """Without a tokenizer the lengths are words and the synthesiser says so (the CLI prints
    it once); `--tokenizer words` (the simulator's count) chooses words without a warning."""
    fallback, chosen = WordPrompts(), from_spec("words")
    assert fallback.unit == chosen.unit == "words"
    assert "WORDS, not tokens" in fallback.warning and "--tokenizer" in fallback.warning
    assert chosen.warning == ""
    assert "simulated engine counts one token per word" in chosen.note


def test_word_prompts_match_the_simulated_engines_count() -> None:
    """Words mode: N words for a completion, N - 4 for one chat message (the simulator adds 4
    per message), so the simulator's prompt_tokens is N."""
    from engines.sim.protocol import CHAT_TOKENS_PER_MESSAGE

    words = WordPrompts(chosen=True)
    assert len(one_prompt(words, random.Random(0), 50, chat=False).split()) == 50
    chat_words = len(one_prompt(words, random.Random(0), 50, chat=True).split())
    assert chat_words + CHAT_TOKENS_PER_MESSAGE == 50


def test_missing_or_unusable_tokenizer_is_refused_with_the_reason(tmp_path: Path) -> None:
    """A path with no tokenizer.json, and a vocabulary without a single word, are refused."""
    with pytest.raises(TokenizerNotFound, match=r"no tokenizer\.json"):
        from_spec(str(tmp_path / "nowhere"))
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<unk>"])
    with pytest.raises(PromptError, match="no word"):
        TokenPrompts(tok, "empty")
