"""The HTML report in a real browser: Debian's headless chromium (``make chromium`` installs
it) opens ``index.html`` from disk, with no console error, exception or blocked load (the page's
CSP turns any network fetch into one), the page's script runs, every timeline is drawn with
exactly one series per request per target, and a full-page screenshot is written to
``reports/browser/report.png`` for inspection.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from chromium_cdp import chromium_path, load_page
from report_support import SyntheticRun

from parity.report import write_report

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[3]
SHOTS = ROOT / "reports" / "browser"

PROBE = """JSON.stringify({
  series: Array.from(document.querySelectorAll('svg.timeline g.series')).map(
    g => [g.closest('section').id, g.dataset.request, g.dataset.target,
          g.getBoundingClientRect().height > 0]),
  timelines: Array.from(document.querySelectorAll('svg.timeline')).map(
    s => [s.closest('section').id, s.getBoundingClientRect().width]),
  stepCharts: document.querySelectorAll('svg.steps').length,
  scripts: document.scripts.length,
  images: document.images.length,
  stalls: document.querySelectorAll('svg.timeline rect.stall').length,
  refused: document.querySelectorAll('.banner.refused').length,
  scriptRan: document.body.getAttribute('data-series'),
  filterHides: (function () {
    document.querySelector('.filters button[data-filter="STALE"]').click();
    var shown = document.querySelectorAll('#summary tbody tr:not(.hidden)').length;
    document.querySelector('.filters button[data-filter=""]').click();
    return shown;
  })(),
})"""


def _need_chromium() -> None:
    assert chromium_path() is not None, (
        "chromium is not installed; the project's setup installs it: make chromium"
    )


def test_report_opens_clean_in_chromium(tmp_path: Path, synthetic_run: SyntheticRun) -> None:
    _need_chromium()
    run_dir = write_report(
        synthetic_run.results,
        synthetic_run.ledger_report,
        tmp_path / "reports",
        scheduler_runs=synthetic_run.scheduler_runs,
        meta={"command": "tests/parity/report/test_report_browser.py"},
    )
    shot = tmp_path / "report.png"
    page = load_page((run_dir / "index.html").as_uri(), expression=PROBE, screenshot=shot)
    assert page.errors == [], page.errors
    found = json.loads(page.value)
    seen = Counter((request, target) for _s, request, target, _drawn in found["series"])
    expected = Counter(
        (obs.request_id, run.target)
        for runs in synthetic_run.serve_runs.values()
        for run in runs
        for obs in run.observations
    )
    assert seen == expected  # one series per request per target, nothing more
    assert all(drawn for *_rest, drawn in found["series"])
    assert len(found["timelines"]) == len(synthetic_run.serve_runs)
    assert all(width > 500 for _section, width in found["timelines"])
    assert found["stepCharts"] == 2 and found["stalls"] == 1 and found["refused"] == 1
    assert (found["scripts"], found["images"]) == (1, 0)  # the hostile markup stayed text
    assert found["scriptRan"] == str(len(found["series"]))
    assert found["filterHides"] == 1  # the STALE filter leaves one summary row
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    SHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, SHOTS / "report.png")


def test_the_error_check_catches_errors(tmp_path: Path) -> None:
    """The check above is not vacuous: a throw, console.error and a blocked fetch all show."""
    _need_chromium()
    page_file = tmp_path / "broken.html"
    page_file.write_text(
        '<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'; script-src 'unsafe-inline'\"></head><body>"
        '<img src="https://example.invalid/x.png"><script>console.error("boom");'
        'throw new Error("broken page");</script></body></html>',
        encoding="utf-8",
    )
    before = set(Path(tempfile.gettempdir()).glob("org.chromium.Chromium.*"))
    page = load_page(page_file.as_uri(), expression="document.title")
    text = "\n".join(page.errors)
    assert "broken page" in text and "boom" in text and "Content Security Policy" in text
    # the browser is stopped by signal; its singleton-socket folder must not stay behind
    after = set(Path(tempfile.gettempdir()).glob("org.chromium.Chromium.*"))
    assert after <= before, sorted(after - before)
