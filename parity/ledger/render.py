"""Rendering (pure): the ledger as a table with each entry's last status, and a run's findings
(NEW with a ``parity decide`` hint, STALE entries with ``file:line``, a summary line)."""

from __future__ import annotations

from parity.ledger.classify import EntryState, LedgerReport, Verdict
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


def format_findings(report: LedgerReport, limit: int = 50, verbose: bool = False) -> str:
    """NEW findings (with a ``parity decide`` hint), STALE entries, a summary line; with
    ``verbose`` the KNOWN findings first."""
    lines: list[str] = []
    if verbose:
        lines += [f.describe() for f in report.findings if f.verdict is Verdict.KNOWN]
    new = [f for f in report.findings if f.verdict is Verdict.NEW]
    for finding in new[:limit]:
        lines.append(finding.describe())
        if finding.decision == "mirror":
            lines.append(f"      entry {finding.entry_id} says mirror: this must match upstream")
    if len(new) > limit:
        lines.append(f"... and {len(new) - limit} more NEW")
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
