"""Reports of a parity run: ``index.html`` (self-contained, with stream timelines
and step charts), ``report.md``, ``results.json`` (schema: ``SCHEMA.md`` beside this file) and
``junit.xml``, plus ``parity report`` (re-render, ``--compare``).

``write_report`` is what ``parity run --report DIR`` calls; every ``render_*`` is pure and
returns a string.
"""

from parity.report.cli import add_report_commands, cmd_report
from parity.report.html import render_html
from parity.report.model import (
    SCHEMA_VERSION,
    EntryView,
    FindingView,
    PairReport,
    ReportData,
    ReportSchemaError,
    ScenarioReport,
    build_report,
    collect_versions,
    report_from_json,
)
from parity.report.svg import render_step_chart, render_timeline
from parity.report.text import (
    RunComparison,
    compare_reports,
    render_compare,
    render_json,
    render_junit,
    render_markdown,
)
from parity.report.write import load_report_input, update_latest, write_rendered, write_report

__all__ = [
    "SCHEMA_VERSION",
    "EntryView",
    "FindingView",
    "PairReport",
    "ReportData",
    "ReportSchemaError",
    "RunComparison",
    "ScenarioReport",
    "add_report_commands",
    "build_report",
    "cmd_report",
    "collect_versions",
    "compare_reports",
    "load_report_input",
    "render_compare",
    "render_html",
    "render_json",
    "render_junit",
    "render_markdown",
    "render_step_chart",
    "render_timeline",
    "report_from_json",
    "update_latest",
    "write_rendered",
    "write_report",
]
