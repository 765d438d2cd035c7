"""``parity repro FILE [--target T ...] [--out reports/repro]``: run a hang repro, verdicts in
seconds, and write its record ``<out>/<id>.md``.

Exit codes: 0 every expectation met (or none given), 1 an expectation failed (or, with
``--strict``, a leg was FLAKY), 2 bad input (``file:line: message``), 3 no target could start
any leg. A timing verdict (a stall or SIGTERM outcome that fails an expectation, or a lone
survival of SIGTERM) is rerun once on a fresh server first: FLAKY when the rerun does not
repeat it, both attempts shown.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from parity.errors import ParityError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_TARGET_FAILED = 0, 1, 2, 3
DEFAULT_OUT = "reports/repro"


def add_repro_commands(subparsers: Any) -> None:
    """Add ``repro`` to ``parity``'s subparsers (``build_parser``'s ``sub``)."""
    repro = subparsers.add_parser(
        "repro",
        help="reproduce a hang: run a repro's legs, verdicts in seconds, write its record",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    repro.add_argument("file", help="a scenarios/hangs/*.repro.yaml file")
    repro.add_argument(
        "--target",
        action="append",
        help="serve-tier target spec (repeatable; default: the file's targets), e.g. "
        "'engine --divergence legacy-capacity', 'oracle[unchecked]', 'external:CMD {port}'",
    )
    repro.add_argument("--out", default=DEFAULT_OUT, help=f"record folder (default {DEFAULT_OUT})")
    repro.add_argument(
        "--leg", action="append", help="run only this leg (repeatable; default: every leg)"
    )
    repro.add_argument(
        "--ledger", default="scenarios/ledger.yaml", help="the decision ledger (KNOWN / NEW)"
    )
    repro.add_argument("--log-dir", help="keep the server logs in this folder")
    repro.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 on a FLAKY leg too (a timing verdict its rerun on a fresh server did not repeat)",
    )
    repro.add_argument(
        "--allow-external-from-file",
        action="store_true",
        help="run the file's external: targets and its targets' extra flags (refused by default)",
    )
    repro.set_defaults(func=cmd_repro)


def cmd_repro(args: argparse.Namespace) -> int:
    """Run the repro; print each verdict as it comes, then the summary; write the record."""
    try:
        return _run(args)
    except ParityError as exc:
        sys.stderr.write(f"{exc}\n")
        return EXIT_BAD_INPUT


def _run(args: argparse.Namespace) -> int:
    from parity.repro.diverge import ledger_findings, leg_divergences
    from parity.repro.format import format_markdown, format_summary, format_verdict
    from parity.repro.run import run_repro
    from parity.repro.spec import load_repro
    from parity.serve.pool import ServerPool

    repro = load_repro(args.file)
    targets = args.target or repro.targets
    if not args.target and not args.allow_external_from_file:
        _refuse_file_commands(repro)
    began = time.monotonic()

    def show(result: Any) -> None:
        sys.stdout.write(format_verdict(result))
        sys.stdout.flush()

    legs = args.leg or [leg.name for leg in repro.legs]
    sys.stdout.write(f"repro {repro.id}: legs {', '.join(legs)} on {', '.join(targets)}\n")
    with ServerPool(args.log_dir) as pool:
        run = run_repro(repro, targets, pool=pool, on_result=show, legs=args.leg)
    divergences = leg_divergences(run)
    findings = ledger_findings(run, args.ledger) if divergences else []
    sys.stdout.write(format_summary(run, divergences, findings))
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = out / f"{repro.id}.md"
    record.write_text(
        format_markdown(run, divergences, when=when, findings=findings), encoding="utf-8"
    )
    sys.stdout.write(f"record: {record} ({time.monotonic() - began:.1f} s)\n")
    if all(r.startup != "started" for r in run.results):
        return EXIT_TARGET_FAILED
    if any(r.expect_failures for r in run.results):
        return EXIT_FAILED
    return EXIT_FAILED if args.strict and any(r.flaky for r in run.results) else EXIT_OK


def _refuse_file_commands(repro: Any) -> None:
    """A repro file's ``targets:`` must not run a command of its choosing without an opt-in."""
    from parity.errors import ScenarioError
    from parity.serve.targets import file_target_problem

    for index, spec in enumerate(repro.targets):
        problem = file_target_problem(spec)
        if problem is not None:
            where = repro.location(("targets", index))
            file, _, line = where.rpartition(":")
            if not line.isdigit():
                file, line = where, ""
            raise ScenarioError.at(file, int(line) if line else None, problem)


def main(argv: list[str] | None = None) -> int:
    """``python -m parity.repro FILE ...`` (until ``parity repro`` is wired in)."""
    parser = argparse.ArgumentParser(prog="parity")
    add_repro_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["repro", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))
