"""The ``parity`` command line.

Subcommands are thin: they parse flags, call the library, print what pure ``format_*`` functions
return, and map outcomes to exit codes (0 parity or known, 1 new or stale divergences, 2 bad
input, 3 a target failed to start when it should have).

    parity run PATHS [--tier both|scheduler|serve] [--target A --target B] [-k EXPR]
               [--json FILE] [--junit FILE] [--report DIR] [--ledger FILE]
               [--record [--record-target T]]
    parity trace SCENARIO --target T [--json]
    parity ledger [--last RESULTS.json]
    parity decide DIVERGENCE_REF --diverge|--mirror|--bug --reason TEXT [--link URL]
                  [--target GLOB] [--pair LEFT RIGHT] [--last RESULTS.json]
    parity schema
    parity model build --variant scripted --out DIR
    parity model export --format gguf --variant scripted --out FILE [--dtype f32|bf16]
    parity pins [install VERSION|all | prune [VERSION ...] | check [VERSION ...]]
    parity bisect PATHS --pins A..B|A,B,... [--tier scheduler|serve|both] [--fresh]
    parity drift --from A --to B [PATHS] [--tier scheduler|serve|both] [--fresh]
    parity broker --socket PATH [--max-idle N] [--wait-s S]

Every ``parity run`` classifies its divergences against the decision ledger
(``scenarios/ledger.yaml``: PASS / KNOWN / NEW / STALE) and writes ``reports/last-run.json``.
Serve-tier targets: ``engine``, ``oracle``, ``oracle[unchecked]``, ``external:<command with
{port} and {model}>``, optionally followed by extra server flags (``engine --divergence X``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity.errors import ParityError

if TYPE_CHECKING:
    from parity.scenario import Scenario

EXIT_OK = 0
EXIT_DIVERGENCE = 1
EXIT_BAD_INPUT = 2
EXIT_TARGET_FAILED = 3
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports a command SIGINT ended

DEFAULT_TARGETS = ("engine", "oracle")


def _cmd_model_build(args: argparse.Namespace) -> int:
    from contract.scripted.builder import VARIANTS, build

    variants = [args.variant] if args.variant else list(VARIANTS)
    if args.out and len(variants) > 1:
        sys.stderr.write("parity model build: --out needs --variant (one folder per model)\n")
        return EXIT_BAD_INPUT
    models = project_of(args).models
    for variant in variants:
        out = Path(args.out) if args.out else models / variant
        files = build(variant, out, seed=args.seed)
        print(f"{variant}: {out}", file=sys.stderr)
        for name, digest in sorted(files.items()):
            print(f"{digest}  {name}")
    return EXIT_OK


def project_of(args: argparse.Namespace) -> Any:
    """The project of this invocation: ``--config FILE``, else the nearest ``parity.toml``."""
    from parity.project import find_project

    return find_project(config=getattr(args, "config", None))


def _ledger_of(args: argparse.Namespace, project: Any) -> Any:
    """The run's ledger: ``--ledger FILE`` or the project's (a named one must exist); none
    configured: an empty ledger."""
    from parity.ledger import Ledger, load_ledger

    if args.ledger is not None:
        return load_ledger(args.ledger)
    if project.ledger is not None:
        return load_ledger(project.ledger)
    return Ledger("(no ledger)", (), ())


def _cmd_model_export(args: argparse.Namespace) -> int:
    from contract.scripted.gguf import ExportError, export

    try:
        digest = export(args.out, variant=args.variant, dtype=args.dtype)
    except (ExportError, OSError) as exc:
        raise ParityError(f"parity model export: {exc}") from None
    print(f"{digest}  {args.out}")
    return EXIT_OK


def _cmd_schema(args: argparse.Namespace) -> int:
    from parity.scenario import json_schema

    sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n")
    return EXIT_OK


def _select(args: argparse.Namespace, paths: Sequence[str]) -> list[Scenario]:
    from parity.keyword import matches
    from parity.loader import load_scenarios

    scenarios = load_scenarios(paths)
    tiers = ("scheduler", "serve", "both") if args.tier == "both" else (args.tier, "both")
    selected = [s for s in scenarios if s.tier in tiers]
    if args.keyword:
        selected = [s for s in selected if matches(args.keyword, (s.id, Path(s.file).parent.name))]
    return selected


def _tier_split(args: argparse.Namespace, scenarios: list[Scenario]) -> tuple[list, list]:
    scheduler = [s for s in scenarios if args.tier != "serve" and s.runs_at_scheduler_tier]
    serve = [s for s in scenarios if args.tier != "scheduler" and s.tier in ("serve", "both")]
    return scheduler, serve


def _cmd_run(args: argparse.Namespace) -> int:
    from parity.format import format_details, format_notes, format_run_table, format_summary
    from parity.ledger import classify, format_causes, format_findings
    from parity.results import RunReport
    from parity.serve.suite import ServeSession, startup_failed
    from parity.serve.targets import parse_target

    project = project_of(args)
    paths = args.paths or list(project.scenarios)
    if not paths:
        sys.stderr.write(
            f"no scenarios given, and {project.source} names none ([parity] scenarios)\n"
        )
        return EXIT_BAD_INPUT
    scenarios = _select(args, paths)
    if not scenarios:
        tier = "" if args.tier == "both" else f"{args.tier}-tier "
        sys.stderr.write(f"no {tier}scenarios selected\n")
        return EXIT_BAD_INPUT
    scheduler, serve = _tier_split(args, scenarios)
    specs = args.target or list(DEFAULT_TARGETS)
    ledger = _ledger_of(args, project)  # a missing named ledger is exit 2 before anything runs
    if args.record:
        from parity.record import reference_index

        reference_index(specs, args.record_target)  # a bad --record-target is exit 2 up front
    for spec in specs if serve else ():
        parse_target(spec, project)  # a bad spec is exit 2 before anything starts
    began = time.perf_counter()
    results = []
    total = len(scheduler) + len(serve) * len(specs)
    traces: dict[str, tuple] = {}  # scheduler tier: scenario id -> TargetRuns (step charts)
    session = ServeSession(serve, specs, log_dir=args.log_dir, project=project) if serve else None
    try:
        if session is not None:
            # The first servers start while the scheduler tier's targets are made (an
            # in-process oracle imports vllm, ~6 s of one core) and its scenarios run.
            session.begin()
        targets, servers_only = _scheduler_targets(specs, project) if scheduler else ([], {})
        _distinct_names(targets)
        with _progress(total, enabled=not args.no_progress) as mark:
            results += _run_scheduler(scheduler, targets, mark, traces, project, servers_only)
            if session is not None:
                results += session.run(mark)
    finally:
        if session is not None:
            session.close()
    elapsed = time.perf_counter() - began
    if args.record:
        from parity.record import record_run

        results = record_run(scenarios, results, traces, specs, args.record_target)
    ledger_report = classify(results, ledger, {s.id: s for s in scenarios})
    color = sys.stdout.isatty()
    width = shutil.get_terminal_size((120, 24)).columns if color else 120
    failing = [
        r for r in results if startup_failed(r) or _needs_details(r, ledger_report, args.verbose)
    ]
    sys.stdout.write(format_run_table(results, ledger_report, color=color, width=width))
    sys.stdout.write(format_notes(results))
    sys.stdout.write(format_causes(ledger_report))
    sys.stdout.write(format_details(failing, divergences=args.verbose))
    sys.stdout.write(format_findings(ledger_report, verbose=args.verbose, paths=args.verbose))
    sys.stdout.write(format_summary(results, elapsed))
    if session is not None and session.machine is not None:
        ahead = session.configs_ahead
        sys.stdout.write(
            f"servers started {ahead} config(s) ahead at a time ({session.machine.describe()})\n"
        )
    report = RunReport(
        tier=args.tier,
        targets=tuple(specs),
        results=tuple(results),
        elapsed_s=round(elapsed, 3),
        ledger=ledger_report.to_json(),
    )
    text = report.dumps()
    for out in [project.last_run, *([args.json] if args.json else [])]:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text, encoding="utf-8")
    if args.junit:
        Path(args.junit).parent.mkdir(parents=True, exist_ok=True)
        Path(args.junit).write_text(_junit(report, ledger_report), encoding="utf-8")
    if args.report:
        folder = _write_report(report, ledger_report, args.report, traces)
        sys.stdout.write(f"report: {folder / 'index.html'}\n")
    code = _exit_code(results, ledger_report, startup_failed)
    if code == EXIT_OK and args.strict and any(getattr(r, "flaky", False) for r in results):
        return EXIT_DIVERGENCE  # --strict: a timing difference that did not reproduce fails too
    return code


def _distinct_names(targets: list) -> None:
    """Equal target names made distinct (``oracle #2``), as at the serve tier."""
    for index, target in enumerate(targets):
        same = sum(1 for t in targets[:index] if t.name.split(" #", 1)[0] == target.name)
        if same:
            target.name = f"{target.name} #{same + 1}"


def _scheduler_targets(specs: list[str], project: Any) -> tuple[list, dict[str, str]]:
    """The scheduler-tier targets of ``specs``, and the ones not run there (name: why not):
    the server-only ones, and, when two or more targets are named and fewer than two have a
    scheduler tier, every one (nothing would be compared; none is made, so no oracle pays
    vllm's import for it), in the order named."""
    from parity.targets import lacks_scheduler_tier, make_target

    why_not = {spec.strip(): lacks_scheduler_tier(spec, project) for spec in specs}
    lacking = [why for why in why_not.values() if why is not None]
    if len(specs) >= 2 and len(specs) - len(lacking) < 2:
        return [], {name: why or lacking[0] for name, why in why_not.items()}
    targets = [
        make_target(spec, "scheduler", project) for spec in specs if not why_not[spec.strip()]
    ]
    return targets, {name: why for name, why in why_not.items() if why is not None}


def _run_scheduler(
    scenarios: list,
    targets: list,
    mark: Callable[..., None],
    traces: dict[str, tuple],
    project: Any = None,
    servers_only: dict[str, str] | None = None,
) -> list:
    from parity.runner import run_with_servers_only
    from parity.targets import shutdown_targets

    results = []
    try:
        for scenario in scenarios:
            label = " vs ".join([*(t.name for t in targets), *(servers_only or {})])
            mark(scenario.id, label, "running")
            result, runs = run_with_servers_only(scenario, targets, servers_only or {}, project)
            if runs:
                traces[scenario.id] = runs
            results.append(result)
            mark(scenario.id, label, "done")
    finally:
        shutdown_targets(targets)
    return results


def _needs_details(result: object, ledger_report: object, verbose: bool) -> bool:
    """Expect failures and errors always; scenarios with NEW divergences with ``-v`` (the
    grouped causes say them otherwise)."""
    from parity.ledger import Verdict
    from parity.ledger.classify import unexplained_expect_failures

    unexplained = unexplained_expect_failures(result, ledger_report)  # type: ignore[arg-type]
    if unexplained or getattr(result, "status", None) == "error":
        return True
    if getattr(result, "attempts", ()):
        return True  # a rerun: both observations are shown
    if not verbose:
        return False
    return any(
        f.scenario_id == result.scenario_id and f.verdict is Verdict.NEW  # type: ignore[attr-defined]
        for f in ledger_report.findings  # type: ignore[attr-defined]
    )


def _exit_code(results: list, ledger_report: object, startup_failed: Callable) -> int:
    """3 a target failed to start when it should have; 1 NEW or STALE divergences or an
    ``expect:`` failure the ledger does not explain; else 0 (parity, or every divergence
    KNOWN)."""
    from parity.ledger.classify import unexplained_expect_failures

    results = [
        dataclasses.replace(r, expect_failures=tuple(unexplained_expect_failures(r, ledger_report)))  # type: ignore[arg-type]
        for r in results
    ]
    if any(startup_failed(result) for result in results):
        return EXIT_TARGET_FAILED
    if ledger_report.exit_code or any(r.expect_failures for r in results):  # type: ignore[attr-defined]
        return EXIT_DIVERGENCE
    return EXIT_OK


def _junit(report: Any, ledger_report: Any) -> str:
    """JUnit XML of the run (``parity.report``'s rendering)."""
    from parity.report import build_report, render_junit

    return str(render_junit(build_report(report, ledger_report)))


def _write_report(
    report: Any, ledger_report: Any, directory: str, traces: dict[str, tuple]
) -> Path:
    """``--report DIR``: ``parity.report.write_report`` (HTML, Markdown, JSON, JUnit in
    ``DIR/<run-id>/``, ``DIR/latest`` updated)."""
    from parity.report import write_report

    meta = {"command": " ".join(["parity", *sys.argv[1:]])}
    folder = write_report(report, ledger_report, directory, scheduler_runs=traces, meta=meta)
    return Path(folder)


def _cmd_suites(args: argparse.Namespace) -> int:
    from parity.catalog import format_suites

    sys.stdout.write(format_suites())
    return EXIT_OK


def _cmd_init(args: argparse.Namespace) -> int:
    from parity.starter import write_starter

    for path, created in write_starter(Path(args.dir), force=args.force):
        sys.stdout.write(f"{'wrote' if created else 'kept '} {path}\n")
    sys.stdout.write(
        "next: add your server as a target in parity.toml, then\n"
        "  parity model build\n"
        "  parity run @default --target oracle --target <your target>\n"
    )
    return EXIT_OK


def _cmd_trace(args: argparse.Namespace) -> int:
    from parity.format import format_trace, format_trace_json
    from parity.loader import load_scenario
    from parity.runner import run_target
    from parity.targets import make_target, shutdown_targets

    project = project_of(args)
    scenario = load_scenario(args.scenario)
    target = make_target(args.target, "scheduler", project)
    try:
        run = run_target(scenario, target, project)  # type: ignore[arg-type]
    finally:
        shutdown_targets([target])
    if args.json:
        sys.stdout.write(format_trace_json(run))
    else:
        sys.stdout.write(format_trace(run, color=sys.stdout.isatty()))
    return EXIT_TARGET_FAILED if not run.summary.started else EXIT_OK


@contextmanager
def _progress(total: int, enabled: bool) -> Iterator[Callable[[str, str, str], None]]:
    """A rich live progress display on stderr: the overall bar (done / total, elapsed) and the
    current scenario, target and phase with its own elapsed time. Yields ``mark(scenario_id,
    target, phase)``; phase ``done`` advances the bar. A no-op when disabled or when stderr is
    not a terminal."""
    if not (enabled and sys.stderr.isatty()):
        yield lambda _scenario_id, _target, _phase: None
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    overall = progress.add_task("scenarios", total=total)
    current = progress.add_task("", total=None)

    def mark(scenario_id: str, target: str, phase: str) -> None:
        if phase == "done":
            progress.advance(overall)
            return
        description = escape(f"{scenario_id} [{target}] {phase}")
        if progress.tasks[current].description != description:
            progress.reset(current, description=description, total=None)

    with progress:
        yield mark


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parity", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="the project file (default: the nearest parity.toml at or above the folder)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    model = sub.add_parser("model", help="build the scripted test models")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    build_p = model_sub.add_parser("build", help="build a model folder (deterministic)")
    build_p.add_argument(
        "--variant", choices=["scripted", "random"], help="one model (default: both)"
    )
    build_p.add_argument(
        "--out", help="output folder (default: the project's models folder / VARIANT)"
    )
    build_p.add_argument("--seed", type=int, default=0, help="random variant seed")
    build_p.set_defaults(func=_cmd_model_build)
    export_p = model_sub.add_parser(
        "export", help="export a model as one file for another runtime (deterministic)"
    )
    export_p.add_argument("--format", choices=["gguf"], required=True, help="llama.cpp's GGUF v3")
    export_p.add_argument("--variant", choices=["scripted"], required=True)
    export_p.add_argument("--out", required=True, help="output file")
    export_p.add_argument(
        "--dtype", choices=["f32", "bf16"], default="f32", help="matrix type (norms stay f32)"
    )
    export_p.set_defaults(func=_cmd_model_export)

    run = sub.add_parser("run", help="run scenarios on two targets and compare them")
    run.add_argument(
        "paths",
        nargs="*",
        help="scenario files, folders or @suites (default: the project's [parity] scenarios)",
    )
    run.add_argument(
        "--tier",
        choices=["scheduler", "serve", "both"],
        default="both",
        help="which tier to run (default both: each scenario at the tiers it declares)",
    )
    run.add_argument(
        "--target",
        action="append",
        help="target spec (repeatable; default: engine and oracle)",
    )
    run.add_argument("-k", dest="keyword", help="select scenarios by id substring expression")
    run.add_argument("--json", help="write every result as JSON to this file")
    run.add_argument("--junit", help="write a JUnit XML file (one test case per scenario)")
    run.add_argument("--report", help="write the HTML/Markdown/JSON/JUnit report to this folder")
    run.add_argument(
        "--ledger", help="the decision ledger (default: the project's; must exist when named)"
    )
    run.add_argument("--log-dir", help="keep the serve-tier server logs in this folder")
    run.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also list every divergence by path (the summary groups them by cause)",
    )
    run.add_argument("--no-progress", action="store_true", help="no progress display")
    run.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 on FLAKY results too (a one-sided stall or timing difference that did "
        "not reproduce when the scenario ran again on fresh servers)",
    )
    run.add_argument(
        "--record",
        action="store_true",
        help="write what the reference target showed as each scenario's expect: block",
    )
    run.add_argument(
        "--record-target",
        help="the target --record reads (default: the second --target, the oracle)",
    )
    run.set_defaults(func=_cmd_run)

    trace = sub.add_parser("trace", help="run one scenario on one target, print every step")
    trace.add_argument("scenario", help="scenario file")
    trace.add_argument("--target", required=True, help="target spec, e.g. engine or oracle")
    trace.add_argument("--json", action="store_true", help="print the full trace as JSON")
    trace.set_defaults(func=_cmd_trace)

    schema = sub.add_parser("schema", help="print the scenario JSON Schema")
    schema.set_defaults(func=_cmd_schema)

    suites = sub.add_parser("suites", help="list the scenario suites bundled with the package")
    suites.set_defaults(func=_cmd_suites)

    init = sub.add_parser("init", help="start a project: parity.toml, ledger, scenarios, CI job")
    init.add_argument("dir", nargs="?", default=".", help="the project folder (default: .)")
    init.add_argument("--force", action="store_true", help="overwrite files that exist")
    init.set_defaults(func=_cmd_init)
    from parity.ledger import add_ledger_commands

    add_ledger_commands(sub)
    from parity.report import add_report_commands

    add_report_commands(sub)
    from parity.repro.cli import add_repro_commands

    add_repro_commands(sub)
    from parity.pins_cli import add_pins_commands

    add_pins_commands(sub)
    from parity.bisect_cli import add_bisect_commands

    add_bisect_commands(sub)
    from parity.serve.broker import add_broker_commands

    add_broker_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:  # e.g. `parity run ... | head`: the reader left, not a bug
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except ParityError as exc:
        from parity.format import format_error

        sys.stderr.write(format_error(exc))
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # Ctrl-C: the with blocks and finally clauses stopped the servers
        sys.stderr.write(
            f"parity {args.command}: interrupted; every server it started is stopped\n"
        )
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
