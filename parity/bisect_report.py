"""``parity bisect`` end to end: bisect scenarios over pins, then say each change.

``run_bisect`` bisects every scenario at one tier (``parity.bisect``) with the observations of
``parity.bisect_observe``; each change found carries its classified divergences and the upstream
files that changed between the two releases (``parity.upstream_diff``). ``format_bisect`` is the
terminal text, ``format_markdown`` the ``reports/bisect/<scenario>.md`` page.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parity.bisect import Bisection, bisect_all
from parity.bisect_observe import Classified, ObservationStore, compare
from parity.scenario import Scenario
from parity.upstream_diff import SUBTREES, FileChange

SHOWN_FILES = 12  # files per change on the terminal (the report lists all)
VALUE_WIDTH = 90


@dataclass(frozen=True)
class Change:
    """One adjacent pair of pins whose observations differ: ``after`` is the first release
    with the new behaviour."""

    before: str
    after: str
    divergences: tuple[Classified, ...]
    files: tuple[FileChange, ...] = ()


@dataclass
class ScenarioBisect:
    scenario: Scenario
    tier: str
    bisection: Bisection
    changes: list[Change] = field(default_factory=list)

    @property
    def observed(self) -> list[str]:
        """The pins this bisection compared, oldest first."""
        seen = {pin for pair in self.bisection.compared for pin in pair}
        return [pin for pin in self.bisection.pins if pin in seen]


def run_bisect(
    scenarios: Sequence[Scenario],
    pins: Sequence[str],
    tier: str,
    store: ObservationStore,
    *,
    project: Any = None,
    log_dir: Path | None = None,
    file_diffs: Callable[[str, str], Sequence[FileChange]] | None = None,
) -> list[ScenarioBisect]:
    """Bisect every scenario at ``tier`` over ``pins``; ``file_diffs(before, after)`` gives
    the upstream file changes of a change (None: none listed)."""
    by_id = {s.id: s for s in scenarios}
    bisections = {s.id: Bisection(tuple(pins)) for s in scenarios}
    found: dict[tuple[str, str, str], list[Classified]] = {}

    def observe(wanted: dict[str, list[str]]) -> None:
        store.observe(
            {p: [by_id[k] for k in keys] for p, keys in wanted.items()}, tier, project, log_dir
        )

    def differ(key: str, before: str, after: str) -> bool:
        scenario = by_id[key]
        left, right = store.get(scenario, before, tier), store.get(scenario, after, tier)
        assert left is not None and right is not None, (key, before, after)
        found[(key, before, after)] = compare(scenario, tier, left, right)
        return bool(found[(key, before, after)])

    bisect_all(bisections, observe, differ)
    out = []
    for scenario in scenarios:
        bisection = bisections[scenario.id]
        changes = [
            Change(
                before,
                after,
                tuple(found[(scenario.id, before, after)]),
                tuple(file_diffs(before, after)) if file_diffs is not None else (),
            )
            for before, after in bisection.changes
        ]
        out.append(ScenarioBisect(scenario, tier, bisection, changes))
    return out


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=list)
    text = " ".join(str(text).split())
    return text if len(text) <= VALUE_WIDTH else text[: VALUE_WIDTH - 3] + "..."


def _divergence_line(item: Classified) -> str:
    d = item.divergence
    return (
        f"{item.signature:<22} {d.path}: {d.left_target}={_value(d.left)} "
        f"{d.right_target}={_value(d.right)}"
    )


def _headline(result: ScenarioBisect) -> str:
    pins = result.bisection.pins
    b = result.bisection
    count = len(result.changes)
    what = "no change" if not count else f"{count} change{'s' * (count != 1)}"
    return (
        f"{result.scenario.id} [{result.tier}]: {what} over {pins[0]}..{pins[-1]} "
        f"({len(result.observed)} of {len(pins)} pins observed, {len(b.compared)} comparisons)"
    )


def format_bisect(results: Sequence[ScenarioBisect]) -> str:
    lines: list[str] = []
    for result in results:
        lines.append(_headline(result))
        if not result.changes:
            ends = f"{result.bisection.pins[0]} and {result.bisection.pins[-1]}"
            lines.append(f"  {ends} behave the same (assumed: no change between them)")
        for change in result.changes:
            lines.append(
                f"  {change.after} is the first release with the new behaviour "
                f"({change.before} -> {change.after}):"
            )
            lines += [f"    {_divergence_line(item)}" for item in change.divergences]
            lines += _file_lines(change.files, limit=SHOWN_FILES, indent="    ")
    return "\n".join(lines) + "\n"


def _file_lines(files: Sequence[FileChange], *, limit: int, indent: str) -> list[str]:
    if not files:
        return [f"{indent}upstream files: none changed under v1/core, v1/engine, entrypoints"]
    ranked = sorted(files, key=lambda f: (-(f.added + f.removed), f.path))
    lines = [f"{indent}upstream files changed (vllm/, {len(files)}, most changed first):"]
    for change in ranked[:limit]:
        state = "" if change.state == "changed" else f" ({change.state})"
        lines.append(f"{indent}  {change.path}  +{change.added} -{change.removed}{state}")
    if len(ranked) > limit:
        lines.append(f"{indent}  ... and {len(ranked) - limit} more (see the report)")
    return lines


def format_markdown(results: Sequence[ScenarioBisect], command: str) -> str:
    """The report of one scenario (its results at each tier bisected)."""
    scenario = results[0].scenario
    out = [f"# Bisect: {scenario.id}", "", f"`{command}`", "", f"Scenario: `{scenario.file}`", ""]
    for result in results:
        out += [f"## {result.tier} tier", "", _headline(result), ""]
        out.append("Comparisons: " + ", ".join(f"{a}..{b}" for a, b in result.bisection.compared))
        out.append("")
        if not result.changes:
            out += ["The two ends behave the same: no change is assumed between them.", ""]
        for change in result.changes:
            out += [f"### {change.after}: first release with the new behaviour", ""]
            out += [f"Between {change.before} and {change.after}:", ""]
            out += ["| signature | path | " + f"{change.before} | {change.after} | rule |"]
            out += ["|---|---|---|---|---|"]
            for item in change.divergences:
                d = item.divergence
                cells = [item.signature, d.path, _value(d.left), _value(d.right), item.rule]
                out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
            out += ["", "Upstream files changed (`vllm/`):", ""]
            if not change.files:
                out += ["none under v1/core, v1/engine, entrypoints", ""]
                continue
            out += ["| file | added | removed | state |", "|---|---|---|---|"]
            for f in sorted(change.files, key=_subtree_order):
                out.append(f"| `{f.path}` | {f.added} | {f.removed} | {f.state} |")
            out.append("")
    return "\n".join(out)


def _subtree_order(change: FileChange) -> tuple[int, str]:
    index = next((i for i, t in enumerate(SUBTREES) if change.path.startswith(t)), len(SUBTREES))
    return index, change.path


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
