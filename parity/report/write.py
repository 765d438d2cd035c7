"""Write a report's files: ``<out>/<run-id>/{index.html,report.md,results.json,junit.xml}``
and keep ``<out>/latest`` pointing at the newest run (a relative symlink, or a copy where
symlinks are not possible). Also reads a report back (``load_report_input``) from a run folder,
a ``results.json`` or a ``parity run --json`` file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from parity._roundtrip import write_atomic
from parity.ledger import DEFAULT_LEDGER, LedgerReport, classify, load_ledger, load_scenarios_for
from parity.report.html import render_html
from parity.report.model import ReportData, ReportSchemaError, build_report, report_from_json
from parity.report.text import render_json, render_junit, render_markdown
from parity.results import RunReport, ScenarioResult, TargetRun
from parity.serve.run import ServeRun

FILES = ("index.html", "report.md", "results.json", "junit.xml")
LATEST = "latest"


def write_report(
    run_results: RunReport | Sequence[ScenarioResult],
    ledger_report: LedgerReport | str | os.PathLike[str] | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    *,
    serve_runs: Mapping[str, Iterable[ServeRun]] | None = None,
    scheduler_runs: Mapping[str, Iterable[TargetRun]] | None = None,
    meta: Mapping[str, Any] | None = None,
    ledger: str = DEFAULT_LEDGER,
) -> Path:
    """Render a finished run into a new ``<out_dir>/<run-id>/``; return that folder.

    ``ledger_report`` is the run's ``classify`` result; when None the results are classified
    here against ``ledger`` (a missing file classifies nothing). ``write_report(report, DIR)``
    is accepted as ``write_report(report, None, DIR)``. Serve-tier results carry their
    ``ServeRun``s (drawn as timelines); ``serve_runs`` / ``scheduler_runs`` map scenario id to
    runs (one per target) that the results do not carry, e.g. scheduler ``TargetRun``s with
    their step traces for the step charts. ``meta`` (free-form, e.g. ``command``, ``run_id``)
    is shown on the page and kept in ``results.json``.
    """
    if out_dir is None and isinstance(ledger_report, str | os.PathLike):
        ledger_report, out_dir = None, ledger_report
    if out_dir is None:
        raise TypeError("write_report needs out_dir")
    if ledger_report is None or isinstance(ledger_report, str | os.PathLike):
        results = run_results.results if isinstance(run_results, RunReport) else run_results
        ledger_report = classify(
            results, load_ledger(ledger, missing_ok=True), load_scenarios_for(results)
        )
    data = build_report(
        run_results,
        ledger_report,
        serve_runs=serve_runs,
        scheduler_runs=scheduler_runs,
        meta=meta,
    )
    return write_rendered(data, out_dir, fresh=True)


def write_rendered(
    data: ReportData, out_dir: str | os.PathLike[str], *, fresh: bool = False
) -> Path:
    """Write ``data``'s four files into ``<out_dir>/<run-id>/`` (with ``fresh``, a run id
    already taken gets a ``-2``, ``-3`` ... suffix) and update ``<out_dir>/latest``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / data.run_id
    n = 2
    while fresh and run_dir.exists():
        run_dir = out / f"{data.run_id}-{n}"
        n += 1
    if run_dir.name != data.run_id:
        data = dataclasses.replace(data, run_id=run_dir.name)
    run_dir.mkdir(parents=True, exist_ok=True)
    rendered = {
        "index.html": render_html(data),
        "report.md": render_markdown(data),
        "results.json": render_json(data),
        "junit.xml": render_junit(data),
    }
    for name, text in rendered.items():
        write_atomic(run_dir / name, text)
    update_latest(out)
    return run_dir


def newest_run(out_dir: Path) -> Path | None:
    """The run folder whose name sorts last (run ids are UTC timestamps)."""
    runs = [
        p
        for p in out_dir.iterdir()
        if p.name != LATEST and not p.is_symlink() and (p / "results.json").is_file()
    ]
    return max(runs, key=lambda p: p.name) if runs else None


def update_latest(out_dir: Path) -> Path | None:
    """Point ``<out_dir>/latest`` at the newest run (atomically); return the run folder."""
    newest = newest_run(out_dir)
    if newest is None:
        return None
    link = out_dir / LATEST
    tmp = out_dir / f".{LATEST}.{os.getpid()}"
    try:
        if tmp.is_symlink() or tmp.exists():
            _remove(tmp)
        os.symlink(newest.name, tmp, target_is_directory=True)
        if link.is_dir() and not link.is_symlink():
            shutil.rmtree(link)
        os.replace(tmp, link)
    except OSError:  # no symlinks here: keep a copy
        _remove(tmp)
        _remove(link)
        shutil.copytree(newest, link)
    return newest


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def load_report_input(path: str | os.PathLike[str], *, ledger: str = DEFAULT_LEDGER) -> ReportData:
    """A report from a run folder (its ``results.json``), a ``results.json``, or a ``parity run
    --json`` file (classified here against ``ledger``; a missing ledger classifies nothing)."""
    source = Path(path)
    if source.is_dir():
        source = source / "results.json"
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReportSchemaError(f"{source}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ReportSchemaError(f"{source}: not JSON: {exc}") from None
    if isinstance(data, dict) and "schema_version" in data:
        try:
            return report_from_json(data)
        except ReportSchemaError as exc:
            raise ReportSchemaError(f"{source}: {exc}") from None
    try:
        run = RunReport.from_json(data)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ReportSchemaError(
            f"{source}: neither a results.json nor a 'parity run --json' file: {exc}"
        ) from None
    ledger_data = load_ledger(ledger, missing_ok=True)
    report = classify(run.results, ledger_data, load_scenarios_for(run.results))
    return build_report(run, report, meta={"source": str(source)})
