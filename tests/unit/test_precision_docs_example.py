"""bench/precision_docs.py runs the docs' `loadgen compare ... --search` example as printed:
it reads the command from docs/loadgen.md (its target and --out replaced), and refuses docs
with no such example or with two."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.precision_docs import DOC, documented_example


def test_the_example_is_read_from_the_docs() -> None:
    """The options are the docs' own, less --target and --out, with the search on."""
    words = documented_example()
    assert "--search" in words and "--target" not in words and "--out" not in words
    text = DOC.read_text().replace("\\\n", " ")
    assert " ".join(words) in " ".join(text.split())


def test_one_example_or_a_clear_refusal(tmp_path: Path) -> None:
    doc = tmp_path / "loadgen.md"
    line = ("wattgate loadgen compare --target http://127.0.0.1:8080 --api-key k \\\n"
            "    --search --rate 4 --out out/x\n")
    doc.write_text("```\n" + line + "```\n")
    assert documented_example(doc) == ["--api-key", "k", "--search", "--rate", "4"]
    doc.write_text("```\n" + line + line + "```\n")
    with pytest.raises(SystemExit, match="2 'loadgen compare"):
        documented_example(doc)
    doc.write_text("no example here\n")
    with pytest.raises(SystemExit, match="0 'loadgen compare"):
        documented_example(doc)
