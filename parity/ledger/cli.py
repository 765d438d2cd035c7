"""``parity ledger`` and ``parity decide`` (wired into ``parity.cli`` by
``add_ledger_commands``), and reading a ``parity run --json`` file back: its results, the
scenarios they ran, and the target pair of the findings a ref names (``decide``'s default)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path as FsPath
from typing import Any

from parity.errors import ParityError
from parity.ledger.classify import classify, parse_ref
from parity.ledger.edit import decide
from parity.ledger.render import format_findings, format_ledger
from parity.ledger.schema import (
    DECISIONS,
    DEFAULT_LAST,
    DEFAULT_PAIR,
    LedgerError,
    glob_match,
    load_ledger,
)


def add_ledger_commands(subparsers: Any) -> None:
    """Add ``parity ledger`` and ``parity decide`` to an argparse subparsers object."""
    listing = subparsers.add_parser("ledger", help="list ledger entries and their last status")
    listing.add_argument("--ledger", help="the ledger (default: the project's)")
    listing.add_argument(
        "--last", help=f"a 'parity run --json' file (default: the project's {DEFAULT_LAST})"
    )
    listing.set_defaults(func=cmd_ledger)
    decide_p = subparsers.add_parser("decide", help="record a decision on a divergence")
    decide_p.add_argument("ref", metavar="DIVERGENCE_REF", help="<scenario-id>:<signature>:<path>")
    group = decide_p.add_mutually_exclusive_group(required=True)
    for name in DECISIONS:
        group.add_argument(f"--{name}", dest="decision", action="store_const", const=name)
    decide_p.add_argument("--reason", required=True, help="why (one line)")
    decide_p.add_argument("--link", help="bug or upstream link (required for --bug)")
    decide_p.add_argument("--id", dest="entry_id", help="entry id to create or update")
    decide_p.add_argument(
        "--target", help="only for target pairs matching this glob, e.g. '*legacy-capacity*'"
    )
    decide_p.add_argument(
        "--pair",
        nargs=2,
        metavar=("LEFT", "RIGHT"),
        help="the target pair decided on, named as findings print it (default: the ref's "
        "finding in --last, else engine oracle; none with --target)",
    )
    decide_p.add_argument(
        "--last", help=f"a 'parity run --json' file (default: the project's {DEFAULT_LAST})"
    )
    decide_p.add_argument(
        "--ledger", help="the ledger to edit (default: the project's; created when missing)"
    )
    decide_p.set_defaults(func=cmd_decide)


def _paths(args: argparse.Namespace) -> tuple[str, str | None]:
    """The ledger and last-run file of this invocation: the flags, else the project's
    (``parity.toml``: ``[parity] ledger``, ``reports``/last-run.json when present)."""
    from parity.project import find_project

    project = find_project(config=getattr(args, "config", None))
    ledger = args.ledger or (str(project.ledger) if project.ledger else None)
    if ledger is None:
        raise LedgerError.at(
            project.source, None, "no ledger: pass --ledger FILE or set [parity] ledger"
        )
    last = args.last or (str(project.last_run) if project.last_run.exists() else None)
    return ledger, last


def cmd_ledger(args: argparse.Namespace) -> int:
    ledger_file, last = _paths(args)
    ledger = load_ledger(ledger_file)
    report = None
    if last is not None:
        results = load_results(last)
        report = classify(results, ledger, load_scenarios_for(results))
    sys.stdout.write(format_ledger(ledger, report, color=sys.stdout.isatty()))
    if report is None:
        return 0
    sys.stdout.write(f"status from {last}\n" + format_findings(report))
    return report.exit_code


def cmd_decide(args: argparse.Namespace) -> int:
    ledger_file, last = _paths(args)
    pair = tuple(args.pair) if args.pair else None
    if pair is None and args.target is None:
        pair = finding_pair(args.ref, last, ledger_file) if last else None
        pair = pair or DEFAULT_PAIR
    entry_id, created = decide(
        ledger_file,
        args.ref,
        args.decision,
        args.reason,
        link=args.link,
        entry_id=args.entry_id,
        target=args.target,
        pair=pair,
    )
    verb = "added" if created else "updated"
    scope = f" for {' vs '.join(pair)}" if pair else ""
    sys.stdout.write(f"{verb} entry {entry_id} ({args.decision}){scope} in {ledger_file}\n")
    return 0


def finding_pair(ref: str, last: str | FsPath, ledger_file: str | FsPath) -> tuple[str, str] | None:
    """The target pair of the findings of run file ``last`` that ``ref`` names (its globs
    matched as ``decide`` records them), or None when it names none; a ``LedgerError`` when
    it names findings of more than one pair (``--pair`` must choose)."""
    wanted = parse_ref(ref)
    results = load_results(last)
    report = classify(
        results, load_ledger(ledger_file, missing_ok=True), load_scenarios_for(results)
    )
    pairs: list[tuple[str, str]] = []
    for finding in report.findings:
        divergence = finding.divergence
        if divergence is None or not glob_match(wanted.scenario_id, finding.scenario_id):
            continue
        kind_ok = wanted.signature in ("*", finding.signature, divergence.kind)
        pair = (finding.left_target, finding.right_target)
        if kind_ok and glob_match(wanted.path, divergence.path) and pair not in pairs:
            pairs.append(pair)
    if len(pairs) > 1:
        named = "; ".join(" vs ".join(p) for p in pairs)
        raise LedgerError.at(
            str(last), None, f"{ref} names findings of several pairs ({named}): pass --pair"
        )
    return pairs[0] if pairs else None


def load_results(path: str | FsPath) -> list[Any]:
    """The ``ScenarioResult``s of a ``parity run --json`` file."""
    from parity.results import RunReport

    try:
        data = json.loads(FsPath(path).read_text(encoding="utf-8"))
        return list(RunReport.from_json(data).results)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise LedgerError.at(str(path), None, f"not a 'parity run --json' file: {exc}") from None


def load_scenarios_for(results: Iterable[Any]) -> dict[str, Any]:
    """Scenario files of ``results`` that still load (signature context); others are skipped."""
    from parity.loader import load_scenario

    found: dict[str, Any] = {}
    for result in results:
        try:
            found[result.scenario_id] = load_scenario(result.file)
        except ParityError:
            continue
    return found
