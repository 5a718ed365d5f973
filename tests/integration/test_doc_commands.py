"""Every shell command in README.md and docs/*.md that can run on this machine runs as pasted
(tests/support/doc_commands.py says which blocks hold commands and which are out of scope by
rule; SKIPPED_BLOCKS and SKIPPED below name the rest, each with its reason; LONG names the
commands that run for minutes, which run BRIEF_S and are stopped). tests/support/block_runner.py
says how a block runs: each command exits 0 within a minute, background jobs and servers come
up and stop on SIGTERM.

Each block runs in its own fresh copy of the working tree (tracked and untracked files that git
does not ignore), cwd = the copy's root, whose `.venv/bin/wattgate` (and `wattgate` on PATH) is
this interpreter's. Whatever the commands write (out/...) stays in the copy.

The docs name fixed example ports: the gateway on 8080, the simulated engines on 8101-8105.
Other tests (and people) hold those ports, so each block gets free ports in their place,
rewritten in its command text and in the copy's deploy/examples/*.yaml, the configs the commands
read. A block that talks to the engines or the gateway without starting them gets them started
first, with the README's own commands (`wattgate sim fleet deploy/examples/fleet.yaml`,
`wattgate serve --config deploy/examples/local.yaml`), and stopped after it.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadgen.procs import stop
from tests.support.block_runner import environment, run_block
from tests.support.doc_commands import Block, Command, blocks, blocks_of, gpu_only
from tests.support.procs import REPO, free_port, wait_http

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the runner follows the commands' processes in /proc")

EXAMPLE_PORTS = (8080, 8101, 8102, 8103, 8104, 8105)
GATEWAY_PORT, ENGINE_PORTS = EXAMPLE_PORTS[0], EXAMPLE_PORTS[1:]

# (doc, text in its first command): why the whole block does not run here
SKIPPED_BLOCKS = {
    ("README.md", "make install"):
        "the Quick start: tests/integration/test_quickstart.py runs it as written",
}
# (doc, text in the command): why it does not run here
SKIPPED = {
    ("README.md", "make demo"):
        "60 s of load (demo --duration defaults to 60) plus two fleets to start and stop; "
        "tests/integration/test_loadgen_demo.py runs the demo",
    ("README.md", "make test"): "the whole suite with lint and types: CI (.ci/run) runs it first",
    ("docs/loadgen.md", "--target http://127.0.0.1:8000"):
        "a real engine on :8000 and its tokenizer under /models (docs/real-engines.md)",
}
# (doc, text in the command): why it runs past the minute. Each runs BRIEF_S (its options
# parsed, its targets checked, its load under way) without failing, and is then stopped.
LONG = {
    ("docs/loadgen.md", "--duration 30 --quality"): "four 30 s arms one after another: 2 minutes",
    ("docs/loadgen.md", "--arm-target int4="): "four 20 s arms one after another: 80 s",
    ("docs/loadgen.md", "--rates 2,4,8,16 --duration 20"): "16 runs of 20 s: over 5 minutes",
    ("docs/loadgen.md", "loadgen sweep"): "8 runs of 20 s: over 2 minutes",
    ("docs/loadgen.md", "--search --rate 8 --trials 3"):
        "a capacity search per arm, 3 trials of 8 s at each rate: 20-25 minutes",
}


def _skipped_block(block: Block) -> bool:
    cmds = block.commands()
    return bool(cmds) and any(doc == block.doc and text in cmds[0].text
                              for doc, text in SKIPPED_BLOCKS)


def _named(cmd: Command, table: dict[tuple[str, str], str]) -> bool:
    return any(doc == cmd.doc and text in cmd.text for doc, text in table)


def _skipped(cmd: Command) -> bool:
    return gpu_only(cmd) or _named(cmd, SKIPPED)


def runnable_blocks() -> list[tuple[str, list[Command]]]:
    out = []
    for block in blocks(REPO):
        if not block.holds_commands or block.off_machine or _skipped_block(block):
            continue
        cmds = [c for c in block.commands() if not _skipped(c)]
        if cmds:
            out.append((block.where, cmds))
    return out


def with_ports(text: str, ports: dict[int, int]) -> str:
    return re.sub(r"\b(8080|810[1-5])\b", lambda m: str(ports[int(m.group(1))]), text)


def fresh_copy(dest: Path, ports: dict[int, int]) -> Path:
    """The working tree's files, the example configs on `ports`, a `.venv/bin` of shims."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    for config in (dest / "deploy" / "examples").glob("*.yaml"):
        config.write_text(with_ports(config.read_text(), ports))
    bin_dir = dest / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, run in (("wattgate", "-m wattgate_cli"), ("python", "")):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {run} "$@"\n')
        (bin_dir / name).chmod(0o755)
    return dest


def _starts(cmds: list[Command], program: str) -> bool:
    return any(re.search(rf"\bwattgate\s+{program}\b", " ".join(c.words)) for c in cmds)


@contextlib.contextmanager
def services(cmds: list[Command], copy: Path, ports: dict[int, int],
             env: dict[str, str]) -> Iterator[None]:
    """The engines when the block talks to them (or runs a gateway) without starting them; the
    gateway when it names the gateway's port without starting one. `cmds` as documented."""
    code = " ".join(" ".join(c.words) for c in cmds)
    names = {int(p) for p in re.findall(r"\b(\d{4})\b", code)}
    fleet = not _starts(cmds, "sim fleet") and (
        _starts(cmds, "serve") or bool(names & set(ENGINE_PORTS)))
    gateway = not _starts(cmds, "serve") and GATEWAY_PORT in names
    with contextlib.ExitStack() as stack:
        if fleet or gateway:
            stack.enter_context(_service(["sim", "fleet", "deploy/examples/fleet.yaml"],
                                         [f"http://127.0.0.1:{ports[p]}/health"
                                          for p in ENGINE_PORTS], copy, env))
        if gateway:
            stack.enter_context(_service(["serve", "--config", "deploy/examples/local.yaml"],
                                         [f"http://127.0.0.1:{ports[GATEWAY_PORT]}/readyz"],
                                         copy, env))
        yield


@contextlib.contextmanager
def _service(args: list[str], ready: list[str], copy: Path,
             env: dict[str, str]) -> Iterator[None]:
    log = open(copy / f"service-{args[0]}.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(["wattgate", *args], cwd=copy, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for url in ready:
            wait_http(url, 60, proc)
        yield
    finally:
        stop(proc)
        log.close()


RUNNABLE = runnable_blocks()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("cmds", [cmds for _, cmds in RUNNABLE], ids=[w for w, _ in RUNNABLE])
def test_the_documented_commands_run_as_pasted(cmds: list[Command], tmp_path: Path) -> None:
    ports = {p: free_port() for p in EXAMPLE_PORTS}
    copy = fresh_copy(tmp_path / "repo", ports)
    env = environment(copy)
    here = [Command(c.doc, c.line, with_ports(c.text, ports)) for c in cmds]
    brief = frozenset(h for h, c in zip(here, cmds, strict=True) if _named(c, LONG))
    with services(cmds, copy, ports, env):
        run_block(here, copy, env, tmp_path / "block.log", brief)


def test_every_exception_names_one_documented_command() -> None:
    """An exception whose command left the docs (or whose text matches two) is stale."""
    all_blocks = [b for b in blocks(REPO) if b.holds_commands]
    for doc, text in SKIPPED_BLOCKS:
        blocks_hit = [b.where for b in all_blocks if b.doc == doc and b.commands()
                      and text in b.commands()[0].text]
        assert len(blocks_hit) == 1, (doc, text, blocks_hit)
    commands = [c for b in all_blocks for c in b.commands()]
    for doc, text in [*SKIPPED, *LONG]:
        hits = [c.where for c in commands if c.doc == doc and text in c.text]
        assert len(hits) == 1, (doc, text, hits)


def test_the_docs_hold_commands_that_run_here() -> None:
    """The extraction finds the blocks it should: a guard against a rule that skips them all."""
    where = {w.split(":")[0] for w, _ in RUNNABLE}
    assert {"README.md", "docs/loadgen.md", "docs/operations.md", "docs/real-engines.md",
            "docs/simulator.md"} <= where
    texts = [c.text for _, cmds in RUNNABLE for c in cmds]
    assert not any(t.endswith("\\") for t in texts)  # continuations joined


def test_a_loop_over_several_lines_is_one_command() -> None:
    """bash runs a `for ... done` block as one command: so does the extraction."""
    doc = "```\nfor i in 1 2; do\n  echo $i &\ndone\nwait\n```\n"
    (block,) = blocks_of("a document", doc)
    assert [c.text for c in block.commands()] == ["for i in 1 2; do\n  echo $i &\ndone",
                                                  "wait"]


BROKEN = {
    "a command that exits non-zero": (
        ["wattgate loadgen run --target http://127.0.0.1:9 --rate 1 --duration 1"],
        "doc.md:1 exited 1"),
    "a server that exits at start": (
        ["wattgate serve --config no-such-config.yaml &"],
        "doc.md:1: its background job exited before it was up"),
    "a server written in the foreground that exits at start": (
        ["wattgate sim fleet no-such-config.yaml"], "doc.md:1 exited 2 before it was up"),
    "a `for` whose `done` is missing": (["for i in 1 2; do", "  wattgate --help"],
                                        "doc.md:1: bash cannot parse it"),
    "a command that runs past the minute": (["sleep 5"], "doc.md:1 still running after 1 s"),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_documented_command_fails_its_block(case: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner the docs go through fails on each way a command can be broken."""
    lines, expected = BROKEN[case]
    monkeypatch.setattr("tests.support.block_runner.COMMAND_S", 1.0)
    copy = fresh_copy(tmp_path / "repo", {p: free_port() for p in EXAMPLE_PORTS})
    block = Block("doc.md", 0, "sh", tuple(lines))
    with pytest.raises(AssertionError, match=re.escape(expected)):
        run_block(block.commands(), copy, environment(copy), tmp_path / "block.log")


@pytest.mark.timeout(60)
def test_a_long_command_is_stopped_after_its_brief_run_and_one_that_fails_early_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tests.support.block_runner.BRIEF_S", 1.0)
    copy = fresh_copy(tmp_path / "repo", {p: free_port() for p in EXAMPLE_PORTS})
    long_one, early = Block("doc.md", 0, "sh", ("sleep 30", "sh -c 'exit 3'")).commands()
    started = time.monotonic()
    run_block([long_one], copy, environment(copy), tmp_path / "a.log", frozenset({long_one}))
    assert time.monotonic() - started < 25  # stopped, not waited for
    with pytest.raises(AssertionError, match=re.escape("doc.md:2 exited 3")):
        run_block([long_one, early], copy, environment(copy), tmp_path / "b.log",
                  frozenset({long_one, early}))


@pytest.mark.timeout(120)
def test_a_job_the_block_kills_itself_need_not_be_up_but_must_be_gone(tmp_path: Path) -> None:
    """`kill %1` as the README writes it: the first server is stopped by the block, the second
    must still be up at the block's end; both are gone after it."""
    copy = fresh_copy(tmp_path / "repo", {p: free_port() for p in EXAMPLE_PORTS})
    sim = "wattgate sim --gpu h100 --model llama-3.1-8b --precision fp8 --port 0 &"
    cmds = Block("doc.md", 0, "sh", (sim, sim, "kill %1   # stops the first")).commands()
    run_block(cmds, copy, environment(copy), tmp_path / "block.log")
    marks = (copy / ".doc-marks").read_text()
    killed = next(ln.split()[1] for ln in marks.splitlines() if ln.startswith("killed "))
    jobs = next(ln.split()[2:] for ln in marks.splitlines() if ln.startswith("after 1 "))
    assert killed == jobs[0] and len(jobs) == 2  # the first job, by its job number
