"""``parity report``: re-render a saved run, or compare two runs (wired by
``add_report_commands``; the handlers are the only code here that writes or prints).

    parity report [--from reports/last-run.json] [--out reports] [--ledger scenarios/ledger.yaml]
    parity report --compare RUN_A RUN_B

A RUN is a run folder (``reports/<run-id>``, ``reports/latest``), its ``results.json``, or a
``parity run --json`` file. ``--compare`` prints markdown and exits 1 when RUN_B has failures
RUN_A did not (new NEW divergences, new STALE entries, new errors), else 0.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from parity.ledger import DEFAULT_LAST, DEFAULT_LEDGER

DEFAULT_OUT = "reports"


def add_report_commands(subparsers: Any) -> None:
    """Add ``parity report`` to an argparse subparsers object."""
    report = subparsers.add_parser(
        "report", help="render a saved run as HTML/Markdown/JSON/JUnit, or compare two runs"
    )
    report.add_argument(
        "--from",
        dest="source",
        default=DEFAULT_LAST,
        help=f"a run folder, results.json or 'parity run --json' file (default: {DEFAULT_LAST})",
    )
    report.add_argument(
        "--out", default=DEFAULT_OUT, help=f"reports folder (default: {DEFAULT_OUT})"
    )
    report.add_argument("--ledger", default=DEFAULT_LEDGER, help=f"default: {DEFAULT_LEDGER}")
    report.add_argument(
        "--compare", nargs=2, metavar=("RUN_A", "RUN_B"), help="what changed from RUN_A to RUN_B"
    )
    report.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from parity.report.text import compare_reports, render_compare
    from parity.report.write import load_report_input, write_rendered

    if args.compare:
        run_a, run_b = (load_report_input(p, ledger=args.ledger) for p in args.compare)
        comparison = compare_reports(run_a, run_b)
        sys.stdout.write(render_compare(comparison))
        return 1 if comparison.new else 0
    data = load_report_input(args.source, ledger=args.ledger)
    run_dir = write_rendered(data, args.out)
    sys.stdout.write(f"report: {run_dir / 'index.html'}\n")
    return 0
