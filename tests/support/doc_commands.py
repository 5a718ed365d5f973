"""The shell commands in README.md and docs/*.md: fenced blocks, split into commands the way
bash reads them, and the rule that says which of them cannot run on a machine without a GPU,
containers or a cluster.

A block holds commands when its fence names a shell (```sh, ```bash, ```shell) or names no
language and its first line that is not a comment starts with a program (PROGRAMS, or a path
ending in /wattgate or /python). Blocks fenced ```text or ```yaml, and unlabelled blocks that
start with anything else (a directory tree, a formula), hold no commands.

A command is what bash reads as one: backslash-continued lines are joined, and a line that
leaves a quote or a `for ... do` open takes the lines after it until bash can parse the whole
(`bash -n`). Blank lines and comment lines between commands are dropped.

Out of scope by rule, never run here:
- a block that runs docker, kubectl, kustomize or helm, as a whole: its other commands talk to
  what those started (the compose curl to port 8081 is one);
- a command that needs a GPU: nvidia-smi, vllm serve, trtllm-serve, trtllm-build, and
  `wattgate engines launch` without --dry-run (launch-spec only prints, and runs).
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

DOCS = ("README.md", "docs/*.md")
SHELL_LANGS = frozenset({"sh", "bash", "shell"})
PROGRAMS = frozenset({"wattgate", "make", "curl", "docker", "kubectl", "kustomize", "helm", "cd",
                      "for", "timeout", "python", "python3", "pip", "git", "kill"})
OFF_MACHINE = frozenset({"docker", "kubectl", "kustomize", "helm"})
GPU_ONLY = (re.compile(r"\bnvidia-smi\b"), re.compile(r"\bvllm\s+serve\b"),
            re.compile(r"\btrtllm-(serve|build)\b"),
            re.compile(r"\bwattgate\s+engines\s+launch(?![\w-])(?!.*--dry-run)"))
_FENCE = re.compile(r"^\s*```\s*([\w+-]*)\s*$")


@dataclass(frozen=True, slots=True)
class Command:
    doc: str  # relative to the repository root
    line: int  # 1-based, the command's first line
    text: str  # as pasted, backslash-continuations joined

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def words(self) -> list[str]:
        """The command's words without its comments (the raw split where shlex cannot)."""
        try:
            return shlex.split(self.text, comments=True)
        except ValueError:
            return self.text.split()

    @property
    def has_job(self) -> bool:
        """It starts a background job itself (a `&` that is not `&&`)."""
        lex = shlex.shlex(self.text, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        try:
            return "&" in list(lex)
        except ValueError:
            return "&" in self.text.replace("&&", "")


@dataclass(frozen=True, slots=True)
class Block:
    doc: str
    line: int  # 1-based, the fence's line
    lang: str
    lines: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def holds_commands(self) -> bool:
        if self.lang in SHELL_LANGS:
            return True
        if self.lang:
            return False
        first = next((ln.split()[0] for ln in self.lines
                      if ln.strip() and not ln.lstrip().startswith("#")), "")
        return first in PROGRAMS or first.endswith(("/wattgate", "/python"))

    @property
    def off_machine(self) -> bool:
        """Runs containers or a cluster: none of it runs here."""
        return any(OFF_MACHINE & set(c.words) for c in self.commands())

    def commands(self) -> list[Command]:
        out: list[Command] = []
        pending: list[str] = []
        start = 0
        for i, raw in enumerate(self.lines):
            if not pending and (not raw.strip() or raw.lstrip().startswith("#")):
                continue
            if not pending:
                start = self.line + 1 + i
            pending.append(raw)
            text = _joined(pending)
            if not raw.rstrip().endswith("\\") and complete(text):
                out.append(Command(self.doc, start, text))
                pending = []
        if pending:  # bash cannot parse it: kept whole, so running it fails and says where
            out.append(Command(self.doc, start, _joined(pending)))
        return out


def gpu_only(cmd: Command) -> bool:
    code = " ".join(cmd.words)
    return any(p.search(code) for p in GPU_ONLY)


def blocks(root: Path) -> list[Block]:
    """Every fenced block of README.md and docs/*.md, in order."""
    found: list[Block] = []
    for pattern in DOCS:
        for path in sorted(root.glob(pattern)):
            found.extend(blocks_of(path.relative_to(root).as_posix(), path.read_text()))
    return found


def blocks_of(doc: str, text: str) -> list[Block]:
    found: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), len(lines))
        indent = len(lines[i]) - len(lines[i].lstrip())
        body = tuple(ln[indent:] if ln[:indent].isspace() else ln for ln in lines[i + 1:end])
        found.append(Block(doc, i + 1, m.group(1).lower(), body))
        i = end + 1
    return found


def _joined(lines: list[str]) -> str:
    """Backslash-newline is a line continuation in bash: the same command on one line."""
    return re.sub(r"[ \t]*\\\n[ \t]*", " ", "\n".join(lines)).strip()


def complete(text: str) -> bool:
    """bash parses `text` whole (no open quote, no `do` without its `done`)."""
    return subprocess.run(["bash", "-n", "-c", text], capture_output=True,
                          check=False).returncode == 0
