"""The ``parity`` command line.

Subcommands are thin: they parse flags, call the library, print what pure ``format_*`` functions
return, and map outcomes to exit codes (0 parity or known, 1 new or stale divergences, 2 bad
input, 3 a target failed to start when it should have).

    parity run PATHS [--tier scheduler] [--target engine --target oracle] [-k EXPR] [--json FILE]
    parity trace SCENARIO --target T [--json]
    parity schema
    parity model build --variant scripted --out DIR
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from parity.errors import ParityError

if TYPE_CHECKING:
    from parity.scenario import Scenario

EXIT_OK = 0
EXIT_DIVERGENCE = 1
EXIT_BAD_INPUT = 2
EXIT_TARGET_FAILED = 3

DEFAULT_TARGETS = ("engine", "oracle")


def _cmd_model_build(args: argparse.Namespace) -> int:
    from engine.scripted.builder import build

    files = build(args.variant, args.out, seed=args.seed)
    for name, digest in sorted(files.items()):
        print(f"{digest}  {name}")
    return EXIT_OK


def _cmd_schema(args: argparse.Namespace) -> int:
    from parity.scenario import json_schema

    sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n")
    return EXIT_OK


def _select(args: argparse.Namespace) -> list[Scenario]:
    from parity.keyword import matches
    from parity.loader import load_scenarios

    scenarios = load_scenarios(args.paths)
    tiers = (args.tier, "both")
    selected = [s for s in scenarios if s.tier in tiers]
    if args.keyword:
        selected = [s for s in selected if matches(args.keyword, (s.id, Path(s.file).parent.name))]
    return selected


def _cmd_run(args: argparse.Namespace) -> int:
    from parity.format import (
        format_details,
        format_notes,
        format_result_table,
        format_summary,
    )
    from parity.results import RunReport, Status
    from parity.runner import run_scenario
    from parity.targets import make_target

    scenarios = _select(args)
    if not scenarios:
        sys.stderr.write(f"no {args.tier}-tier scenarios selected\n")
        return EXIT_BAD_INPUT
    specs = args.target or list(DEFAULT_TARGETS)
    targets = [make_target(spec, args.tier) for spec in specs]
    began = time.perf_counter()
    results = []
    with _progress(len(scenarios), enabled=not args.no_progress) as mark:
        for scenario in scenarios:
            mark(scenario.id)
            result, _runs = run_scenario(scenario, targets)  # type: ignore[arg-type]
            results.append(result)
            mark(None)
    elapsed = time.perf_counter() - began
    color = sys.stdout.isatty()
    width = shutil.get_terminal_size((120, 24)).columns if color else 120
    sys.stdout.write(format_result_table(results, color=color, width=width))
    sys.stdout.write(format_notes(results))
    sys.stdout.write(format_details(results))
    sys.stdout.write(format_summary(results, elapsed))
    if args.json:
        report = RunReport(tier=args.tier, targets=tuple(specs), results=tuple(results))
        Path(args.json).write_text(report.dumps(), encoding="utf-8")
    statuses = {result.status for result in results}
    if statuses & {Status.DIVERGENCE, Status.EXPECT_FAILED}:
        return EXIT_DIVERGENCE
    if Status.ERROR in statuses:
        return EXIT_TARGET_FAILED
    return EXIT_OK


def _cmd_trace(args: argparse.Namespace) -> int:
    from parity.format import format_trace, format_trace_json
    from parity.loader import load_scenario
    from parity.runner import run_target
    from parity.targets import make_target

    scenario = load_scenario(args.scenario)
    target = make_target(args.target, "scheduler")
    run = run_target(scenario, target)  # type: ignore[arg-type]
    if args.json:
        sys.stdout.write(format_trace_json(run))
    else:
        sys.stdout.write(format_trace(run, color=sys.stdout.isatty()))
    return EXIT_TARGET_FAILED if not run.summary.started else EXIT_OK


@contextmanager
def _progress(total: int, enabled: bool) -> Iterator[Callable[[str | None], None]]:
    """A rich progress bar on stderr; yields ``mark(scenario_id)`` (``None``: one more done).

    A no-op when disabled or when stderr is not a terminal.
    """
    if not (enabled and sys.stderr.isatty()):
        yield lambda _scenario_id: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    task = progress.add_task("scenarios", total=total)

    def mark(scenario_id: str | None) -> None:
        if scenario_id is None:
            progress.advance(task)
        else:
            progress.update(task, description=scenario_id)

    with progress:
        yield mark


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parity", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    model = sub.add_parser("model", help="build the scripted test models")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    build_p = model_sub.add_parser("build", help="build a model folder (deterministic)")
    build_p.add_argument("--variant", choices=["scripted", "random"], required=True)
    build_p.add_argument("--out", required=True, help="output folder")
    build_p.add_argument("--seed", type=int, default=0, help="random variant seed")
    build_p.set_defaults(func=_cmd_model_build)

    run = sub.add_parser("run", help="run scenarios on two targets and compare them")
    run.add_argument("paths", nargs="+", help="scenario files or folders")
    run.add_argument("--tier", choices=["scheduler", "serve"], default="scheduler")
    run.add_argument(
        "--target",
        action="append",
        help="target spec (repeatable; default: engine and oracle)",
    )
    run.add_argument("-k", dest="keyword", help="select scenarios by id substring expression")
    run.add_argument("--json", help="write every result as JSON to this file")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.set_defaults(func=_cmd_run)

    trace = sub.add_parser("trace", help="run one scenario on one target, print every step")
    trace.add_argument("scenario", help="scenario file")
    trace.add_argument("--target", required=True, help="target spec, e.g. engine or oracle")
    trace.add_argument("--json", action="store_true", help="print the full trace as JSON")
    trace.set_defaults(func=_cmd_trace)

    schema = sub.add_parser("schema", help="print the scenario JSON Schema")
    schema.set_defaults(func=_cmd_schema)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ParityError as exc:
        from parity.format import format_error

        sys.stderr.write(format_error(exc))
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
