"""Rendering (pure): the ledger as a table with each entry's last status, a run's causes (one
line per signature and rule, UNSUPPORTED reasons), and its findings (NEW with a ``parity
decide`` hint, STALE entries with ``file:line``, a summary line)."""

from __future__ import annotations

from parity.ledger.classify import EntryState, Finding, LedgerReport, Verdict
from parity.ledger.schema import Ledger, current_pin


def format_ledger(
    ledger: Ledger, report: LedgerReport | None = None, color: bool = False, width: int = 160
) -> str:
    """One row per entry: id, decision, match, last status (when a run is given), reason."""
    from rich.table import Table

    from parity.format import render

    states = {e.entry.id: e for e in report.entries} if report else {}
    table = Table(expand=False)
    for name in ("id", "decision", "match", "status", "recorded", "reason"):
        table.add_column(name, overflow="fold", no_wrap=name in ("id", "decision", "status"))
    pin = current_pin()
    for entry in ledger.entries:
        match = entry.match.describe()
        found = states.get(entry.id)
        status = "-" if found is None else found.state.value
        if found is not None and found.matched:
            status += f" ({found.matched})"
        style = {"stale": "red", "violated": "red", "known": "yellow", "held": "green"}.get(
            found.state.value if found else "", ""
        )
        recorded = f"{entry.recorded.isoformat()} {entry.pin}" + (
            " (old pin)" if entry.pin != pin else ""
        )
        reason = entry.reason + (f" {entry.link}" if entry.link else "")
        table.add_row(
            entry.id,
            entry.decision,
            match,
            f"[{style}]{status}[/{style}]" if style else status,
            recorded,
            reason,
        )
    head = f"{ledger.file}: {len(ledger.entries)} entries\n"
    return head + (render(table, color=color, width=width) if ledger.entries else "")


def rule_id(rule: str | None) -> str:
    """The short name of a signature rule (``M3``, ``C1``, ``F2``...; ``-`` when none)."""
    if not rule:
        return "-"
    head = rule.split(":", 1)[0].strip()
    return head if len(head) <= 4 and head.replace(" ", "").isalnum() else "-"


def format_causes(report: LedgerReport) -> str:
    """What a run found, one line per cause and target pair: verdict, signature, rule, how
    many divergences in which scenarios, and the first location; then one line per reason a
    target could not run scenarios (UNSUPPORTED). A run against an independent server reads
    as a short list of behaviours; ``-v`` (``format_findings(verbose=True)``) lists every
    divergence path."""
    causes: dict[tuple[str, str, str, str, str], list[Finding]] = {}
    unsupported: dict[tuple[str, str, str], list[str]] = {}
    for f in report.findings:
        pair = f"{f.left_target} vs {f.right_target}"
        if f.verdict is Verdict.UNSUPPORTED:
            unsupported.setdefault((pair, f.right_target, f.rule or ""), []).append(f.scenario_id)
        elif f.divergence is not None:
            key = (pair, f.verdict.value, f.signature or "other", rule_id(f.rule), f.entry_id or "")
            causes.setdefault(key, []).append(f)
    lines: list[str] = []
    for (pair, verdict, signature, rule, entry), found in sorted(
        causes.items(), key=lambda kv: (kv[0][0], kv[0][1] != "NEW", kv[0][2], kv[0][3])
    ):
        scenarios = sorted({f.scenario_id for f in found})
        first = found[0].divergence
        named = ", ".join(scenarios[:4]) + (f" +{len(scenarios) - 4}" if len(scenarios) > 4 else "")
        by = f" [{entry}]" if entry else ""
        where = first.location if first is not None else ""
        lines.append(
            f"{verdict:5} {signature} ({rule}){by}: {len(found)} in {len(scenarios)} "
            f"scenario(s) {named}; first {found[0].ref} at {where} ({pair})"
        )
    for (pair, _target, reason), scenarios in sorted(unsupported.items()):
        named = ", ".join(scenarios[:4]) + (f" +{len(scenarios) - 4}" if len(scenarios) > 4 else "")
        lines.append(f"UNSUPPORTED {len(scenarios)} scenario(s) {named}: {reason} ({pair})")
    return "\n".join(lines) + ("\n" if lines else "")


def format_findings(
    report: LedgerReport, limit: int = 50, verbose: bool = False, paths: bool = True
) -> str:
    """NEW findings (with a ``parity decide`` hint; only their count unless ``paths``), STALE
    entries, a summary line; with ``verbose`` the KNOWN findings first."""
    lines: list[str] = []
    if verbose:
        lines += [f.describe() for f in report.findings if f.verdict is Verdict.KNOWN]
    new = [f for f in report.findings if f.verdict is Verdict.NEW]
    for finding in new[:limit] if paths else ():
        lines.append(finding.describe())
        if finding.decision == "mirror":
            lines.append(f"      entry {finding.entry_id} says mirror: this must match upstream")
    if paths and len(new) > limit:
        lines.append(f"... and {len(new) - limit} more NEW")
    if new and not paths:
        refs = sorted({f.ref for f in new if f.ref})
        lines.append(f"{len(new)} NEW divergences ({len(refs)} refs; -v lists each path)")
    if any(f.decision is None for f in new):
        lines.append(
            "record a decision: parity decide '<ref>' --diverge|--mirror|--bug --reason TEXT"
        )
    for item in report.entries:
        if item.state is EntryState.STALE:
            where = f"{report.ledger_file}:{item.line}" if item.line else report.ledger_file
            lines.append(
                f"STALE {where}: entry {item.entry.id} ({item.entry.decision}) matched no "
                "divergence in this run: remove it or find what changed"
            )
    counts = ", ".join(f"{report.count(v)} {v.value.lower()}" for v in Verdict)
    lines.append(f"ledger: {counts}")
    return "\n".join(lines) + "\n"
