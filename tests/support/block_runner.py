"""Run one documented shell block as pasted, in one bash (so `kill %1` finds its job), in a copy
of the repository, and say which command failed.

- Each command must exit 0 within COMMAND_S (the `timeout 60` of the rule); the first that does
  not ends the block.
- A server written in the foreground (`wattgate serve`, `sim`, `sim fleet`, `demo --serve`,
  `loadgen selftest-engine`) runs until someone presses Ctrl-C: it must be up within
  COMMAND_S, is then stopped (SIGTERM), and the block goes on, as a reader would.
- A command the caller names brief (it runs for minutes) must run BRIEF_S without failing, and
  is then stopped (SIGTERM); the block goes on.
- A command that ends with `&` starts a background job. Every job must be up once the block's
  commands have run, but one the block stopped itself (`kill %1`). Then each gets SIGTERM, and
  it and everything it started must be gone within STOP_S.

Up: alive, and it or a process it started listens on a TCP port that answers HTTP.
"""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import proc_tree
from tests.support.doc_commands import Command, complete

COMMAND_S = 60.0
BRIEF_S = 10.0
STOP_S = 30.0
SERVES = re.compile(r"\bwattgate\s+(serve|sim|demo\b.*\s--serve|loadgen\s+selftest-engine)\b")
_MARKS_VAR = "WG_DOC_MARKS"
_PRELUDE = f'__wg_mark() {{ printf "%s\\n" "$*" >> "${_MARKS_VAR}"; }}\n'


@dataclass
class Marks:
    """What the script wrote about itself: commands started and ended, the jobs it left."""
    started: dict[int, float] = field(default_factory=dict)
    ended: dict[int, int] = field(default_factory=dict)
    held: dict[int, int] = field(default_factory=dict)  # command -> the job it runs as
    owner: dict[int, int] = field(default_factory=dict)  # job -> the command that started it
    killed: set[int] = field(default_factory=set)  # jobs the block's own `kill` stopped
    jobs: list[int] | None = None  # set once the block's commands have all run


def serves_in_foreground(cmd: Command) -> bool:
    return bool(SERVES.search(" ".join(cmd.words))) and not cmd.has_job


def script(commands: list[Command], held: set[int]) -> str:
    """The block, each command between marks; a `held` one as a job the block waits for, so
    that the runner can stop it, and whose end status the runner judges."""
    parts = [_PRELUDE]
    for i, cmd in enumerate(commands):
        text = cmd.text
        if i in held:
            text = f"{{ {cmd.text}\n}} &\n__wg_mark held {i} $!\nwait $!"
        parts.append(f"__wg_mark start {i}\n{_note_kills(cmd)}{text}\n"
                     f"__wg_rc=$?; __wg_mark end {i} $__wg_rc\n"
                     f"__wg_mark after {i} $(jobs -p)\n")
        if i not in held:
            parts.append('[ "$__wg_rc" = 0 ] || { __wg_mark jobs $(jobs -p); exit "$__wg_rc"; }\n')
    parts.append("__wg_mark jobs $(jobs -p)\nwait\n")
    return "".join(parts)


def _note_kills(cmd: Command) -> str:
    """Before a `kill %1` (or `kill PID`): mark the jobs it stops, which the block then need
    not find up at its end, only gone."""
    if cmd.words[:1] != ["kill"]:
        return ""
    targets = [f"$(jobs -p {w})" if w.startswith("%") else w
               for w in cmd.words[1:] if not w.startswith("-")]
    return f"__wg_mark killed {' '.join(targets)}\n"


def run_block(commands: list[Command], cwd: Path, env: dict[str, str], log: Path,
              brief: frozenset[Command] = frozenset()) -> None:
    """Run the commands; AssertionError naming the command (and the log's tail) if one fails."""
    for cmd in commands:
        if not complete(cmd.text):
            _fail(f"{cmd.where}: bash cannot parse it", cmd, log)
    servers = {i for i, c in enumerate(commands) if serves_in_foreground(c)}
    briefs = {i for i, c in enumerate(commands) if c in brief}
    marks_path = cwd / ".doc-marks"
    marks_path.unlink(missing_ok=True)  # another block's marks are not this one's
    (cwd / ".doc-block.sh").write_text(script(commands, servers | briefs))
    with open(log, "wb") as sink:
        shell = subprocess.Popen(["bash", ".doc-block.sh"], cwd=cwd, stdin=subprocess.DEVNULL,
                                 stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                                 env={**env, _MARKS_VAR: str(marks_path)})
    seen: dict[int, int] = {}  # every process the block started: pid -> start time
    try:
        marks, stopped = _follow(shell, marks_path, commands, servers, log, seen)
        for i, cmd in enumerate(commands):
            if i in servers and i in marks.ended and i not in stopped:
                _fail(f"{cmd.where} exited {marks.ended[i]} before it was up", cmd, log)
            if marks.ended.get(i, 0) != 0 and i not in stopped:
                _fail(f"{cmd.where} exited {marks.ended[i]}", cmd, log)
        for pid in marks.jobs or []:
            seen.update(proc_tree.tree(pid) if pid in marks.killed
                        else _ready(pid, commands[marks.owner[pid]], log))
        for pid in marks.jobs or []:
            if pid not in marks.killed:
                proc_tree.terminate(pid)
        _stopped(shell, seen, log)
    finally:
        proc_tree.kill_all({**seen, **proc_tree.tree(shell.pid)})
        shell.kill()
        shell.wait()


def _follow(shell: subprocess.Popen[bytes], marks_path: Path, commands: list[Command],
            servers: set[int], log: Path, seen: dict[int, int]) -> tuple[Marks, set[int]]:
    """Wait for the block's commands, each within COMMAND_S; stop a foreground server once it
    is up and a brief command after BRIEF_S. Return once all have run, with those stopped."""
    marks, stopped = Marks(), set()
    while True:
        exited = shell.poll() is not None  # before the read: then the marks are all there
        seen.update(proc_tree.tree(shell.pid))
        marks = _read_marks(marks_path, marks.started)
        if marks.jobs is not None:
            break
        if exited:
            _fail(f"the block's shell exited {shell.returncode} before its end", None, log)
        for i in [i for i in marks.started if i not in marks.ended]:
            ran_s = time.monotonic() - marks.started[i]
            job = marks.held.get(i)
            if job is not None and i not in stopped and (
                    _up(job) if i in servers else ran_s > BRIEF_S):
                proc_tree.terminate(job)
                stopped.add(i)
            if ran_s > COMMAND_S:
                _fail(f"{commands[i].where} still running after {COMMAND_S:.0f} s",
                      commands[i], log)
        time.sleep(0.1)
    return marks, stopped


def _read_marks(path: Path, started: dict[int, float]) -> Marks:
    """The marks so far; a command's start time is when it was first seen started."""
    marks = Marks(started=dict(started))
    if not path.exists():
        return marks
    text = path.read_text()
    for line in text[:text.rfind("\n") + 1].splitlines():  # a line still being written waits
        kind, *rest = line.split()
        if kind == "start":
            marks.started.setdefault(int(rest[0]), time.monotonic())
        elif kind == "end":
            marks.ended[int(rest[0])] = int(rest[1])
        elif kind == "held":
            marks.held[int(rest[0])] = int(rest[1])
        elif kind == "after":
            for pid in rest[1:]:
                marks.owner.setdefault(int(pid), int(rest[0]))
        elif kind == "killed":
            marks.killed.update(int(p) for p in rest if p.isdigit())
        elif kind == "jobs":
            marks.jobs = [int(p) for p in rest]
    return marks


def _up(pid: int) -> bool:
    pids = proc_tree.descendants(pid)
    return proc_tree.alive(pid) and any(_answers_http(port)
                                        for port in proc_tree.listening_ports(pids))


def _ready(pid: int, cmd: Command, log: Path) -> dict[int, int]:
    """Wait until job `pid` (started by `cmd`) is up; its processes."""
    deadline = time.monotonic() + COMMAND_S
    while time.monotonic() < deadline:
        if not proc_tree.alive(pid):
            _fail(f"{cmd.where}: its background job exited before it was up", cmd, log)
        if _up(pid):
            return proc_tree.tree(pid)
        time.sleep(0.2)
    _fail(f"{cmd.where}: its background job not up after {COMMAND_S:.0f} s", cmd, log)
    return {}


def _answers_http(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/health")
        conn.getresponse().read()
    except OSError:
        return False
    finally:
        conn.close()
    return True


def _stopped(shell: subprocess.Popen[bytes], procs: dict[int, int], log: Path) -> None:
    """Every process the block started (but its shell) gone within STOP_S; then the shell."""
    deadline = time.monotonic() + STOP_S
    while (left := sorted(p for p, t in procs.items()
                          if p != shell.pid and proc_tree.alive(p, t))) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        _fail(f"processes {left} still running {STOP_S:.0f} s after SIGTERM", None, log)
    shell.wait(STOP_S)


def _fail(what: str, cmd: Command | None, log: Path) -> None:
    shown = f"\n$ {cmd.text}" if cmd else ""
    tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
    raise AssertionError(f"{what}{shown}\n--- output (last 4000 chars) ---\n{tail}")


def environment(copy: Path) -> dict[str, str]:
    """The copy's `.venv/bin` first on PATH (its `wattgate` is this interpreter's), and the
    copy's code first on the import path."""
    return {**os.environ, "PATH": f"{copy / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(copy), "PYTHONUNBUFFERED": "1"}
