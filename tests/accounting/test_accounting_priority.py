"""The accounting child's scheduling class (priority.py), in a process of its own: the idle
class while it keeps up, the normal one while behind, and the normal one throughout where
it could not leave the idle class again (no CAP_SYS_NICE, no RLIMIT_NICE)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from accounting import priority

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling classes")

# Run where priority.py is importable alone: nice +10 as the child, a second thread, then the
# classes of every thread after start, after 5 s behind and after catching up.
PROBE = """
import json, os, sys, threading
sys.path.insert(0, sys.argv[1])
from priority import Background
os.nice(10)
threading.Thread(target=lambda: threading.Event().wait(5), daemon=True).start()
b = Background(True, behind_s=2.0)
b.start()
def classes():
    return sorted({os.sched_getscheduler(int(t)) for t in os.listdir("/proc/self/task")})
out = [b.enabled, classes()]
b.lag(5.0)
out.append(classes())
b.lag(0.0)
out.append(classes())
print(json.dumps(out))
"""


def probe(tmp_path: Path, python: str, uid: int | None = None) -> list[object]:
    shutil.copy(priority.__file__, tmp_path / "priority.py")
    (tmp_path / "probe.py").write_text(PROBE)
    tmp_path.chmod(0o755)
    for f in tmp_path.iterdir():
        f.chmod(0o644)
    setuid = None if uid is None else (lambda: os.setuid(uid))
    done = subprocess.run([python, str(tmp_path / "probe.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=30, preexec_fn=setuid,
                          check=True)
    out: list[object] = json.loads(done.stdout)
    return out


def test_idle_while_keeping_up_normal_while_behind(tmp_path: Path) -> None:
    if not priority.may_leave_idle():
        pytest.skip("this process may not leave the idle class (see the unprivileged test)")
    enabled, started, behind, caught_up = probe(tmp_path, sys.executable)
    assert enabled is True
    assert started == [os.SCHED_IDLE]  # every thread, the later one too
    assert behind == [os.SCHED_OTHER]
    assert caught_up == [os.SCHED_IDLE]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start an unprivileged process")
def test_a_child_that_could_not_leave_the_idle_class_never_enters_it(tmp_path: Path) -> None:
    python = "/usr/bin/python3"  # one an unprivileged user may run (the venv's may be private)
    if not os.access(python, os.X_OK):
        pytest.skip("no system python3 to run as an unprivileged user")
    # a directory of its own that the user can read (pytest's tmp_path is private to root)
    where = Path(tempfile.mkdtemp(prefix="wattgate-priority-"))
    try:
        enabled, started, behind, caught_up = probe(where, python, uid=65534)
    except (subprocess.CalledProcessError, PermissionError) as exc:
        pytest.skip(f"cannot run a probe as uid 65534 here: {exc}")
    finally:
        shutil.rmtree(where, ignore_errors=True)
    assert enabled is False
    assert started == behind == caught_up == [os.SCHED_OTHER]


class Recorded(priority.Background):
    """Its class switches recorded instead of made."""

    def __init__(self, behind_s: float):
        super().__init__(True, behind_s=behind_s)
        self.idle = True
        self.policies: list[int] = []

    def _set_all(self, policy: int) -> bool:  # type: ignore[override]
        self.policies.append(policy)
        return True


@pytest.mark.parametrize(("behind_s", "leaves"), [(1.0, True), (3.0, False)])
def test_the_idle_class_is_left_past_behind_s(behind_s: float, leaves: bool) -> None:
    b = Recorded(behind_s)
    b.lag(0.4)
    b.lag(2.0)
    assert b.policies == ([os.SCHED_OTHER] if leaves else [])
    b.lag(0.1)  # caught up
    assert b.idle
    assert b.policies == ([os.SCHED_OTHER, os.SCHED_IDLE] if leaves else [])


def test_a_short_behind_s_does_not_switch_at_every_report() -> None:
    """With behind_s under the caught-up mark, a steady lag between the two leaves the idle
    class once and stays out until the records are written within half of behind_s."""
    b = Recorded(0.1)
    for _ in range(5):
        b.lag(0.3)
    assert b.policies == [os.SCHED_OTHER]
    b.lag(0.04)
    assert b.policies == [os.SCHED_OTHER, os.SCHED_IDLE]
