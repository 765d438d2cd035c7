"""``parity drift``: every behaviour change between two releases, grouped by signature.

The scenarios (the default suite, or the given paths) are observed on ``oracle@A`` and
``oracle@B`` at each tier they run at, exactly as ``parity bisect`` observes them (and from the
same cache, ``parity.bisect_observe``), and compared with the tier's differ. Each divergence
takes the signature ``parity run`` gives it; the report groups them by signature: the checklist
a port that mirrors release A works through to mirror B. Divergences no signature explains
(``other``) are listed apart, as gaps in the signatures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity.bisect_observe import Classified, ObservationStore, compare
from parity.scenario import Scenario

GAP = "other"
VALUE_WIDTH = 80


@dataclass(frozen=True)
class DriftFinding:
    scenario_id: str
    tier: str
    item: Classified


def scenarios_at(scenarios: Sequence[Scenario], tier: str) -> list[Scenario]:
    """The scenarios that run at ``tier`` (as ``parity run`` selects them)."""
    if tier == "scheduler":
        return [s for s in scenarios if s.runs_at_scheduler_tier]
    return [s for s in scenarios if s.tier in ("serve", "both")]


def run_drift(
    scenarios: Sequence[Scenario],
    before: str,
    after: str,
    tiers: Sequence[str],
    store: ObservationStore,
    *,
    project: Any = None,
    log_dir: Path | None = None,
) -> tuple[list[DriftFinding], dict[str, int]]:
    """Every divergence between the two pins, and how many scenarios ran per tier."""
    findings: list[DriftFinding] = []
    counts: dict[str, int] = {}
    for tier in tiers:
        selected = scenarios_at(scenarios, tier)
        counts[tier] = len(selected)
        if not selected:
            continue
        store.observe({before: selected, after: selected}, tier, project, log_dir)
        for scenario in selected:
            left, right = store.get(scenario, before, tier), store.get(scenario, after, tier)
            assert left is not None and right is not None
            for item in compare(scenario, tier, left, right):
                findings.append(DriftFinding(scenario.id, tier, item))
    return findings, counts


def group(findings: Sequence[DriftFinding]) -> dict[str, list[DriftFinding]]:
    """Findings by signature, largest group first (``other`` last)."""
    groups: dict[str, list[DriftFinding]] = {}
    for finding in findings:
        groups.setdefault(finding.item.signature, []).append(finding)
    return dict(sorted(groups.items(), key=lambda kv: (kv[0] == GAP, -len(kv[1]), kv[0])))


def _short(value: Any) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= VALUE_WIDTH else text[: VALUE_WIDTH - 3] + "..."


def _line(finding: DriftFinding) -> str:
    d = finding.item.divergence
    return f"{finding.scenario_id} [{finding.tier}] {d.path}: {_short(d.left)} -> {_short(d.right)}"


def format_drift(
    findings: Sequence[DriftFinding], counts: dict[str, int], before: str, after: str
) -> str:
    groups = group(findings)
    changed = {(f.scenario_id, f.tier) for f in findings}
    ran = ", ".join(f"{n} at the {tier} tier" for tier, n in counts.items())
    lines = [
        f"drift oracle@{before} -> oracle@{after}: {ran}; {len(changed)} changed, "
        f"{len(findings)} divergences",
        "",
        "by signature:",
    ]
    for signature, items in groups.items():
        scenarios = len({(f.scenario_id, f.tier) for f in items})
        lines.append(f"  {signature:<24} {len(items):>4} divergences in {scenarios} scenarios")
    for signature, items in groups.items():
        if signature == GAP:
            continue
        lines += ["", f"## {signature} ({len(items)})"]
        lines += [f"  {_line(f)}" for f in items]
    gaps = groups.get(GAP, [])
    lines += ["", f"## gaps: no signature explains these ({len(gaps)})"]
    lines += [f"  {_line(f)}  [{f.item.divergence.kind}]" for f in gaps] or ["  none"]
    return "\n".join(lines) + "\n"


def format_markdown(text: str, command: str, before: str, after: str) -> str:
    return f"# Drift: oracle@{before} -> oracle@{after}\n\n`{command}`\n\n```\n{text}```\n"
