"""The demo report's first screen, as a browser shows it: headless Chromium renders the page
at 1400 x 900 and reports which of the answer's lines lie wholly inside that first screen
(the recommendation with its interval, the routing saving in %, the tenants' bills with the
idle energy apart), and which tables are wider than the page (none may be). Chromium is an
extra (CI installs it): absent, this skips, and fails under WATTGATE_REQUIRE_EXTRAS=1
(tests/support/extras.py). tests/unit/test_demo_report.py checks the same lines come first in
the HTML without a browser."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.support import demo_page
from tests.support.extras import missing

WIDTH, HEIGHT = 1400, 900
# what must be on the first screen: the answer-box line starting with each prefix, and text
# it must hold
WANTED = {
    "recommendation": ("Recommended: ", r"\[\d\.\d+, \d\.\d+\] J/out-tok"),
    "routing saving": ("Routing: slo_energy saves ", r"\d+\.\d % \[95 % CI -?\d+\.\d, -?\d+\.\d\]"),
    "bills, idle apart": ("Tenants' bills: ", r"idle \d+ J, kept apart"),
}
# Runs after load: marks each answer line with whether it lies wholly inside the first screen.
PROBE = """<script>window.addEventListener('load', () => {
  const out = [...document.querySelectorAll('.answer p')].map(p => {
    const r = p.getBoundingClientRect();
    return {text: p.textContent, top: r.top, bottom: r.bottom, height: innerHeight};
  });
  const wide = [...document.querySelectorAll('.wide')].filter(
    w => w.scrollWidth > w.clientWidth + 1).map(w => w.querySelector('tr').textContent);
  const pre = document.createElement('pre'); pre.id = 'first-screen-probe';
  pre.textContent = JSON.stringify({lines: out, overflowing: wide});
  document.body.appendChild(pre);
});</script>"""


def browser() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        missing("chromium is not installed (apt-get install -y chromium)")
    return found


def chromium(page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([browser(), "--headless", "--no-sandbox", "--disable-gpu",
                           "--hide-scrollbars", f"--window-size={WIDTH},{HEIGHT}", *args,
                           page.as_uri()], capture_output=True, text=True, timeout=90,
                          check=True)


def first_screen(page: Path, tmp: Path) -> dict[str, Any]:
    """The answer's lines with their box on a WIDTH x HEIGHT screen, as Chromium lays them out,
    and the header rows of tables wider than the page (the page with a probe script appended,
    in a copy)."""
    probed = tmp / "probed.html"
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    dom = chromium(probed, "--virtual-time-budget=5000", "--dump-dom").stdout
    found = re.search(r"<pre id=\"first-screen-probe\">(.*?)</pre>", dom, re.S)
    assert found, "the probe did not run: " + dom[-500:]
    import html

    return dict(json.loads(html.unescape(found.group(1))))


def check_first_screen(page: Path, tmp: Path) -> None:
    seen = first_screen(page, tmp)
    lines = seen["lines"]
    assert seen["overflowing"] == [], "tables wider than the page"
    for what, (prefix, pattern) in WANTED.items():
        line = next((x for x in lines if str(x["text"]).startswith(prefix)), None)
        assert line is not None, f"no {what} line in the answer: {[x['text'] for x in lines]}"
        assert re.search(pattern, str(line["text"])), (what, line["text"])
        assert float(line["bottom"]) <= float(line["height"]), (
            f"the {what} ends at {line['bottom']} px, below the first screen "
            f"({line['height']} px)")
    png = tmp / "first-screen.png"
    chromium(page, f"--screenshot={png}")
    assert png.stat().st_size > 20_000  # text and coloured boxes, not a blank page


def test_the_first_screen_shows_recommendation_saving_and_bills(tmp_path: Path) -> None:
    browser()
    check_first_screen(demo_page.write(tmp_path / "out"), tmp_path)
