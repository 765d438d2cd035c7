"""``parity bisect`` and ``parity drift``: behaviour changes across upstream releases.

    parity bisect PATHS --pins A..B|A,B,... [--tier scheduler|serve|both] [--fresh]
    parity drift --from A --to B [PATHS] [--tier scheduler|serve|both] [--fresh]

Exit codes: 0 done (changes or not), 2 bad input (a range naming no two locked pins, no
scenarios), 3 a pin of the range is not installed (``parity pins install V``).
docs/bisect-and-drift.md says how they work.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from parity._cli import guarded

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_PIN_MISSING = 3
TIERS = ("scheduler", "serve")


class PinMissing(Exception):
    """A pin of the range is not installed (exit 3)."""


def require_installed(pins: list[str]) -> None:
    from parity.pins import status

    for pin in pins:
        if not status(pin, sizes=False).installed:
            raise PinMissing(f"pin {pin} is not installed: run parity pins install {pin}")


def _project(args: argparse.Namespace) -> Any:
    from parity.project import find_project

    return find_project(config=getattr(args, "config", None))


def _store(project: Any, fresh: bool) -> Any:
    from parity.bisect_observe import ObservationStore

    return ObservationStore(Path(project.root) / ".cache" / "bisect", fresh=fresh)


def _tiers(tier: str) -> tuple[str, ...]:
    return TIERS if tier == "both" else (tier,)


def _scenarios(paths: list[str], project: Any) -> list[Any]:
    from parity.errors import ParityError
    from parity.loader import load_scenarios

    paths = paths or [str(p) for p in project.scenarios]
    if not paths:
        raise ParityError(f"no scenarios given, and {project.source} names none")
    return load_scenarios(paths)


def _command() -> str:
    return " ".join(["parity", *sys.argv[1:]])


def cmd_bisect(args: argparse.Namespace) -> int:
    from parity.bisect import parse_pins
    from parity.bisect_report import format_bisect, format_markdown, run_bisect
    from parity.drift import scenarios_at
    from parity.pins import available
    from parity.upstream_diff import release_diff

    project = _project(args)
    pins = parse_pins(args.pins, available())  # RangeError: exit 2
    require_installed(pins)
    scenarios = _scenarios(args.paths, project)
    store = _store(project, args.fresh)
    began = time.perf_counter()
    by_scenario: dict[str, list[Any]] = {}
    for tier in _tiers(args.tier):
        selected = scenarios_at(scenarios, tier)
        if not selected:
            continue
        tier_began, made_before = time.perf_counter(), len(store.made)
        results = run_bisect(
            selected,
            pins,
            tier,
            store,
            project=project,
            file_diffs=lambda a, b: release_diff(a, b, store.root / "files"),
        )
        sys.stdout.write(format_bisect(results))
        sys.stdout.write(
            f"{tier} tier: {time.perf_counter() - tier_began:.1f} s, "
            f"{len(store.made) - made_before} observations made\n"
        )
        for result in results:
            by_scenario.setdefault(result.scenario.id, []).append(result)
    if not by_scenario:
        sys.stderr.write(f"no scenario runs at the {args.tier} tier\n")
        return EXIT_BAD_INPUT
    folder = Path(project.reports) / "bisect"
    folder.mkdir(parents=True, exist_ok=True)
    for scenario_id, results in by_scenario.items():
        (folder / f"{scenario_id}.md").write_text(
            format_markdown(results, _command()), encoding="utf-8"
        )
    made = len(store.made)
    sys.stdout.write(
        f"{len(by_scenario)} scenarios bisected in {time.perf_counter() - began:.1f} s; "
        f"{made} observations made, the others cached; reports in {folder}\n"
    )
    return EXIT_OK


def cmd_drift(args: argparse.Namespace) -> int:
    from parity.bisect import parse_pins
    from parity.drift import format_drift, format_markdown, run_drift
    from parity.pins import available

    project = _project(args)
    before, after = parse_pins(f"{args.source},{args.dest}", available())
    if (before, after) != (args.source, args.dest):
        sys.stderr.write(
            f"parity drift: --from {args.source} must be older than --to {args.dest}\n"
        )
        return EXIT_BAD_INPUT
    require_installed([before, after])
    scenarios = _scenarios(args.paths, project)
    store = _store(project, args.fresh)
    began = time.perf_counter()
    findings, counts = run_drift(
        scenarios, before, after, _tiers(args.tier), store, project=project
    )
    text = format_drift(findings, counts, before, after)
    sys.stdout.write(text)
    out = Path(project.reports) / f"drift-{before}-{after}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(format_markdown(text, _command(), before, after), encoding="utf-8")
    sys.stdout.write(
        f"drift took {time.perf_counter() - began:.1f} s ({len(store.made)} observations made); "
        f"report: {out}\n"
    )
    return EXIT_OK


def _guarded(func: Any) -> Any:
    return guarded(func, PinMissing, EXIT_PIN_MISSING)


def add_bisect_commands(subparsers: Any) -> None:
    """Register ``parity bisect`` and ``parity drift``."""
    tier_help = "which tier (default both: each scenario at the tiers it runs at)"
    fresh_help = "observe again, ignoring the cache in .cache/bisect"
    bisect = subparsers.add_parser(
        "bisect", help="find the releases where a scenario's behaviour changes"
    )
    bisect.add_argument("paths", nargs="*", help="scenario files, folders or @suites")
    bisect.add_argument(
        "--pins", required=True, help="A..B (every locked pin between, inclusive) or A,B,..."
    )
    bisect.add_argument("--tier", choices=[*TIERS, "both"], default="both", help=tier_help)
    bisect.add_argument("--fresh", action="store_true", help=fresh_help)
    bisect.set_defaults(func=_guarded(cmd_bisect))
    drift = subparsers.add_parser(
        "drift", help="every behaviour change between two releases, grouped by signature"
    )
    drift.add_argument("paths", nargs="*", help="scenarios (default: the project's)")
    drift.add_argument("--from", dest="source", required=True, metavar="A", help="older pin")
    drift.add_argument("--to", dest="dest", required=True, metavar="B", help="newer pin")
    drift.add_argument("--tier", choices=[*TIERS, "both"], default="both", help=tier_help)
    drift.add_argument("--fresh", action="store_true", help=fresh_help)
    drift.set_defaults(func=_guarded(cmd_drift))
