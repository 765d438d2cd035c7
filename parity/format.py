"""Pure rendering: every function returns a string; only ``parity.cli`` prints.

Tables are built with rich and rendered to text (ANSI colours only when ``color=True``).
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from parity.errors import ParityError
from parity.results import RunReport, ScenarioResult, Status, TargetRun

_STATUS_STYLE = {
    Status.PASS: "green",
    Status.DIVERGENCE: "red",
    Status.EXPECT_FAILED: "red",
    Status.ERROR: "yellow",
    Status.UNSUPPORTED: "blue",
}


def render(renderable: Any, color: bool = False, width: int = 120) -> str:
    """Render a rich object to text."""
    console = Console(
        file=io.StringIO(),
        width=width,
        color_system="standard" if color else None,
        force_terminal=color,
        highlight=False,
        soft_wrap=False,
    )
    console.print(renderable)
    output = console.file.getvalue()  # type: ignore[attr-defined]
    return str(output)


def format_error(error: ParityError) -> str:
    """A user error: one line per problem (``file:line: message``)."""
    return f"{error}\n"


def format_result_table(
    results: Sequence[ScenarioResult], color: bool = False, width: int = 120
) -> str:
    """One row per scenario: id, status, what each target did, the verdict."""
    table = Table(title=None, show_lines=False, expand=False)
    table.add_column("scenario", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("steps", justify="right")
    table.add_column("verdict", overflow="fold")
    for result in results:
        style = _STATUS_STYLE[result.status]
        steps = "/".join(str(getattr(run, "num_steps", "-")) for run in result.runs)
        table.add_row(
            result.scenario_id,
            f"[{style}]{result.status.value}[/{style}]",
            steps,
            result.verdict,
        )
    return render(table, color=color, width=width)


def format_run_table(
    results: Sequence[ScenarioResult], ledger: Any = None, color: bool = False, width: int = 120
) -> str:
    """One row per scenario and tier: id, tier, ledger status (PASS / KNOWN / NEW, or FAILED
    for an ``expect:`` failure, ERROR when no target could run it), steps of each target
    (scheduler tier), seconds, the verdict. ``ledger`` is a ``parity.ledger.LedgerReport`` of
    the same results (optional)."""
    table = Table(title=None, show_lines=False, expand=False)
    for name in ("scenario", "tier", "status", "steps", "time"):
        justify = "right" if name in ("steps", "time") else "left"
        table.add_column(name, no_wrap=True, justify=justify)  # type: ignore[arg-type]
    table.add_column("verdict", overflow="fold")
    for result in results:
        status = _ledger_status(result, ledger)
        style = _VERDICT_STYLE.get(status, "yellow")
        steps = [getattr(run, "num_steps", None) for run in result.runs]
        table.add_row(
            result.scenario_id,
            result.tier,
            f"[{style}]{status}[/{style}]",
            "/".join(str(n) for n in steps) if None not in steps else "-",
            f"{result.elapsed_s:.1f}s",
            result.verdict,
        )
    return render(table, color=color, width=width)


_VERDICT_STYLE = {
    "PASS": "green",
    "KNOWN": "yellow",
    "NEW": "red",
    "FAILED": "red",
    "FLAKY": "magenta",
    "UNSUPPORTED": "blue",
}


def _ledger_status(result: ScenarioResult, ledger: Any) -> str:
    status = _worst_status(result, ledger)
    if result.flaky and status in ("PASS", "KNOWN"):
        return "FLAKY"
    return status


def _worst_status(result: ScenarioResult, ledger: Any) -> str:
    if result.status is Status.ERROR:
        return "ERROR"
    if result.expect_failures:
        return "FAILED"
    if ledger is None:
        return result.status.value.upper()
    verdicts = {
        f.verdict.value
        for f in ledger.findings
        if f.scenario_id == result.scenario_id
        and f.file == result.file
        and (f.divergence is None or f.divergence in result.divergences)
    }
    for verdict in ("NEW", "KNOWN", "PASS"):
        if verdict in verdicts:
            return verdict
    return result.status.value.upper()


def format_details(
    results: Sequence[ScenarioResult], limit: int = 20, divergences: bool = True
) -> str:
    """Every divergence (unless ``divergences`` is false: the grouped causes say them) and
    expect failure of the failing scenarios (``file:line`` first)."""
    lines: list[str] = []
    for result in results:
        if result.ok and not result.attempts:
            continue
        lines.append(f"{result.scenario_id} ({result.file}): {result.verdict}")
        for attempt in getattr(result, "attempts", ()):
            load = attempt.load.describe() if attempt.load is not None else "load not recorded"
            lines.append(f"  first attempt ({load}):")
            lines += [f"    {text}" for text in attempt.suspects]
            lines += [f"    {run.target}: {run.describe()}" for run in attempt.runs]
            lines.append("  again on fresh servers:")
        for run in result.runs:
            lines.append(f"  {run.target}: {run.describe()}")
        shown = [d.describe() for d in result.divergences] if divergences else []
        shown += [f.describe() for f in result.expect_failures]
        for text in shown[:limit]:
            lines.append(f"  {text}")
        if len(shown) > limit:
            lines.append(f"  ... and {len(shown) - limit} more")
    return "\n".join(lines) + ("\n" if lines else "")


def format_notes(results: Sequence[ScenarioResult]) -> str:
    """Every target note (e.g. upstream would refuse the config at startup), one per line."""
    lines = [
        f"note: {result.scenario_id}: {run.target}: {_sentences(note, 2)}"
        for result in results
        for run in result.runs
        for note in getattr(run, "notes", ())
    ]
    return "\n".join(lines) + ("\n" if lines else "")


def _sentences(text: str, count: int) -> str:
    """The first ``count`` sentences of ``text`` (the JSON report keeps all of it)."""
    parts = text.split(". ")
    return text if len(parts) <= count else ". ".join(parts[:count]) + "."


def format_summary(results: Sequence[ScenarioResult], elapsed_s: float) -> str:
    """``17 scenarios: 16 pass, 1 divergence in 3.2 s (engine vs oracle)``: the targets
    compared are named even when nothing diverged."""
    counts: dict[str, int] = {}
    for result in results:
        counts[result.status.value] = counts.get(result.status.value, 0) + 1
    parts = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "nothing run"
    noun = "scenario" if len(results) == 1 else "scenarios"
    labels = dict.fromkeys(label for result in results for label in result.targets)
    compared = f" ({' vs '.join(labels)})" if labels else ""
    return f"{len(results)} {noun}: {parts} in {elapsed_s:.1f} s{compared}\n"


def format_report_json(report: RunReport) -> str:
    return report.dumps()


def format_trace_json(run: TargetRun) -> str:
    """The full run of one target as JSON (every step trace, outcomes, wedge)."""
    return json.dumps(run.to_json(), indent=2) + "\n"


def format_trace(run: TargetRun, color: bool = False, width: int = 160) -> str:
    """A step-by-step table of one run, then its outcome line."""
    table = Table(expand=False)
    for name in ("step", "scheduled", "new", "resumed", "preempted", "finished", "free"):
        table.add_column(name, justify="right" if name in ("step", "free") else "left")
    table.add_column("running / waiting", overflow="fold")
    for trace in run.steps:
        table.add_row(
            str(trace.step),
            _compact(trace.num_scheduled_tokens),
            ",".join(trace.scheduled_new_req_ids),
            ",".join(trace.scheduled_resumed_req_ids),
            ",".join(trace.preempted_req_ids),
            _compact(trace.finished),
            str(trace.num_free_blocks),
            f"{','.join(trace.running)} / {','.join(trace.waiting)}",
        )
    text = render(table, color=color, width=width)
    return text + f"{run.target}: {run.summary.describe()}\n"


def _compact(mapping: dict[str, Any]) -> str:
    return " ".join(f"{k}:{v}" for k, v in mapping.items())
