"""No module of the distribution or the benchmarks is over 400 lines (docs/architecture.md):
a module that grows past it holds more than one idea and is split."""

from __future__ import annotations

from tests.unit.test_import_graph import ROOT, SHIPPED

MAX_LINES = 400


def test_no_module_is_over_400_lines() -> None:
    files = [p for pkg in (*SHIPPED, "bench") for p in (ROOT / pkg).rglob("*.py")]
    files.append(ROOT / "wattgate_cli.py")
    assert len(files) > 100  # the tree was found
    too_long = {str(p.relative_to(ROOT)): n for p in files
                if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines: {too_long}"

