"""The harness that runs `async def` tests (tests/conftest.py) ends a test that leaves a
connection open, with warnings as errors, instead of waiting on it in the loop's close.

Each case runs in a child Python with `-W error` (pyproject's `filterwarnings`), so a close
that waits forever costs this test its subprocess timeout, not the run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CASE = """
import asyncio, socket
from tests.conftest import run_on_uvloop
server = socket.create_server(("127.0.0.1", 0))
async def main():
    global kept
    kept = await asyncio.open_connection(*server.getsockname())  # never closed
    {end}
try:
    run_on_uvloop(main())
except BaseException as exc:
    print(type(exc).__name__, exc, *getattr(exc, "__notes__", ()), sep="|")
else:
    print("passed")
"""


def _run(end: str) -> str:
    done = subprocess.run([sys.executable, "-W", "error", "-c", CASE.format(end=end)],
                          cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_failing_test_that_leaves_a_connection_open_ends_with_its_error_and_a_note() -> None:
    out = _run('raise LookupError("statement failed")')
    name, message, note = out.split("|")
    assert (name, message) == ("LookupError", "statement failed")
    assert note.startswith("and left open: unclosed resource <TCPTransport")


def test_a_passing_test_that_leaves_a_connection_open_fails_with_a_resource_warning() -> None:
    out = _run("return None")
    assert out.startswith("ResourceWarning|unclosed resource <TCPTransport")


@pytest.mark.parametrize("end", ['raise LookupError("x")', "return None"])
def test_a_test_that_closes_its_connection_leaves_nothing_to_report(end: str) -> None:
    closing = f'kept[1].close(); await kept[1].wait_closed(); {end}'
    out = _run(closing)
    assert out == ("passed" if end == "return None" else "LookupError|x")


HUNG = """
import signal, time
import pytest

@pytest.mark.timeout(1)
def test_hung_where_no_signal_reaches():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # as a wait in C code would
    time.sleep(60)
"""


@pytest.mark.timeout(60)
def test_a_test_that_no_timeout_signal_can_end_ends_the_run_with_its_stack(tmp_path: Path) -> None:
    """The backstop (tests/conftest.py): past 3x its timeout the run ends, stacks dumped."""
    (tmp_path / "test_hung.py").write_text(HUNG)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=45)
    assert done.returncode != 0
    assert "test_hung_where_no_signal_reaches still running after 3 s" in done.stderr
    assert "in test_hung_where_no_signal_reaches" in done.stderr  # its stack
