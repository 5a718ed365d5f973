"""Code and docs cite only files a clone has: every repository path they name exists, and no
document outside the repository (the team's planning notes) is cited."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP = ("gateway", "engines", "loadgen", "wire", "tests", "bench", "deploy", "docs", ".ci")
# a path of ours: a top folder, then folders and a file with a known ending
_TOPS = "|".join(re.escape(t) for t in TOP)
PATH = re.compile(r"(?<![\w./-])((?:" + _TOPS + r")/[\w./-]*?\w\.(?:py|md|yaml|yml|json|sh|csv|html|toml))"
                  r"(?![\w/])")
OUTSIDE = re.compile(r"\b(?:DESIGN|REFERENCE|STYLE|DEVELOPERS)\.md\b")
TEXT_ENDINGS = (".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".json", ".html", ".cfg")
# paths that name a file a command or test writes, not one that should be in the tree
WRITTEN = re.compile(r"^(?:bench/results/.*\.(?:json|md)|.*\{.*\}.*)$")


def tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    files = [ROOT / f for f in out
             if f.endswith(TEXT_ENDINGS) or Path(f).name in ("Makefile", "run")]
    return [f for f in files if f.is_file() and f.name != Path(__file__).name]


def test_no_document_outside_the_repository_is_cited() -> None:
    cited = [f"{f.relative_to(ROOT)}:{n}" for f in tracked_text_files()
             for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1)
             if OUTSIDE.search(line)]
    assert not cited, f"cites a document a clone does not have: {cited}"


def test_every_repository_path_named_in_code_and_docs_exists() -> None:
    missing = []
    for f in tracked_text_files():
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            for path in PATH.findall(line):
                if "*" in path or WRITTEN.match(path):
                    continue
                if not (ROOT / path).exists():
                    missing.append(f"{f.relative_to(ROOT)}:{n}: {path}")
    assert not missing, "names files that are not in the repository:\n" + "\n".join(missing)
