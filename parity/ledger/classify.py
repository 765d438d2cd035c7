"""Classifying a run against the ledger: divergence refs, verdicts per finding (PASS, KNOWN,
NEW) and states per entry (known, stale, held, violated, not run), and the exit code.

Each divergence takes the signature ``parity.causes.classify_all`` gives (consequences folded
into their root's); the first entry in file order that is in scope for the (scenario, pair)
and covers the divergence decides it (``Match.in_scope``, ``Match.covers``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from parity.causes import classify_all
from parity.errors import brief
from parity.ledger.schema import Ledger, LedgerEntry, LedgerError
from parity.results import Divergence
from parity.signatures import DIVERGENCE_KINDS, SIGNATURES, Classification, SignatureContext


@dataclass(frozen=True, slots=True)
class DivergenceRef:
    """``<scenario-id>:<signature>:<path>``: how runs name a divergence."""

    scenario_id: str
    signature: str
    path: str

    def __str__(self) -> str:
        return f"{self.scenario_id}:{self.signature}:{self.path}"


def divergence_ref(scenario_id: str, divergence: Divergence, signature: str) -> str:
    """The stable short id of a divergence (the path keeps its step index, e.g. steps[46])."""
    return str(DivergenceRef(scenario_id, str(signature), divergence.path))


def parse_ref(ref: str) -> DivergenceRef:
    parts = ref.split(":", 2)
    if len(parts) != 3 or not all(p.strip() for p in parts):
        raise LedgerError.at(
            "DIVERGENCE_REF", None, f"expected <scenario-id>:<signature>:<path>, got {brief(ref)}"
        )
    scenario_id, signature, path = (p.strip() for p in parts)
    if signature not in ("*", *SIGNATURES, *DIVERGENCE_KINDS):
        raise LedgerError.at(
            "DIVERGENCE_REF",
            None,
            f"unknown signature {brief(signature)} in {brief(ref)} ({', '.join(SIGNATURES)})",
        )
    return DivergenceRef(scenario_id, signature, path)


class Verdict(StrEnum):
    PASS = "PASS"
    KNOWN = "KNOWN"
    NEW = "NEW"
    STALE = "STALE"
    UNSUPPORTED = "UNSUPPORTED"  # a target of the pair cannot run the scenario: not compared
    FLAKY = "FLAKY"  # a timing difference that did not reproduce on fresh servers


class EntryState(StrEnum):
    KNOWN = "known"  # decided at least one divergence (diverge / bug)
    STALE = "stale"  # in scope, decided nothing (diverge / bug): a failure
    HELD = "held"  # mirror, in scope, nothing diverged
    VIOLATED = "violated"  # mirror, a divergence matched it (reported NEW)
    NOT_RUN = "not run"  # none of its scenarios ran


@dataclass(frozen=True, slots=True)
class Finding:
    """One (scenario, target pair[, divergence]) and its verdict."""

    scenario_id: str
    file: str
    left_target: str
    right_target: str
    verdict: Verdict
    divergence: Divergence | None = None
    signature: str | None = None
    rule: str | None = None
    ref: str | None = None
    entry_id: str | None = None
    decision: str | None = None

    def describe(self) -> str:
        pair = f"{self.left_target} vs {self.right_target}"
        if self.verdict in (Verdict.UNSUPPORTED, Verdict.FLAKY):
            return f"{self.verdict.value} {self.scenario_id} ({pair}): {self.rule}"
        if self.divergence is None:
            return f"{self.verdict.value:5} {self.scenario_id} ({pair})"
        by = f" [{self.decision} {self.entry_id}]" if self.entry_id else ""
        return f"{self.verdict.value:5} {self.ref} ({pair}){by}: {self.divergence.describe()}"


@dataclass(frozen=True, slots=True)
class EntryResult:
    entry: LedgerEntry
    state: EntryState
    matched: int
    line: int | None


@dataclass(frozen=True, slots=True)
class LedgerReport:
    """Every finding of a run and the state of every ledger entry."""

    ledger_file: str
    findings: tuple[Finding, ...]
    entries: tuple[EntryResult, ...]

    def count(self, verdict: Verdict) -> int:
        if verdict is Verdict.STALE:
            return sum(e.state is EntryState.STALE for e in self.entries)
        return sum(f.verdict is verdict for f in self.findings)

    @property
    def exit_code(self) -> int:
        """1 on any NEW finding or STALE entry, else 0."""
        return 1 if self.count(Verdict.NEW) or self.count(Verdict.STALE) else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "ledger": self.ledger_file,
            "counts": {v.value: self.count(v) for v in Verdict},
            "findings": [
                {
                    "scenario_id": f.scenario_id,
                    "targets": [f.left_target, f.right_target],
                    "verdict": f.verdict.value,
                    "ref": f.ref,
                    "signature": f.signature,
                    "rule": f.rule,
                    "entry": f.entry_id,
                    "decision": f.decision,
                    "divergence": f.divergence.to_json() if f.divergence else None,
                }
                for f in self.findings
            ],
            "entries": [
                {"id": e.entry.id, "state": e.state.value, "matched": e.matched, "line": e.line}
                for e in self.entries
            ],
        }


def exit_code(report: LedgerReport) -> int:
    return report.exit_code


def unexplained_expect_failures(result: Any, report: LedgerReport) -> list[Any]:
    """The result's ``expect:`` failures that fail the run. A failure of a target other than
    the reference (the first), where the reference met that expectation, is explained when the
    pair's divergences in that scenario are all KNOWN: the expectation says the reference's
    behaviour, and the ledger decided this target's difference from it. A FLAKY finding is
    about the first attempt (the verdict stands on the rerun's divergences), so it neither
    decides a pair nor leaves it undecided."""
    reference = result.targets[0] if result.targets else None
    met = {f.path for f in result.expect_failures if f.target == reference}
    decided: dict[str, bool] = {}
    for f in report.findings:
        if f.verdict is Verdict.FLAKY:
            continue
        if f.scenario_id == result.scenario_id and f.left_target == reference:
            known = f.verdict is Verdict.KNOWN
            decided[f.right_target] = decided.get(f.right_target, True) and known
    return [
        f
        for f in result.expect_failures
        if f.target == reference or f.path in met or not decided.get(f.target, False)
    ]


def classify(
    results: Sequence[Any], ledger: Ledger, scenarios: Mapping[str, Any] | None = None
) -> LedgerReport:
    """Classify every result of a run against ``ledger``.

    ``results`` are ``ScenarioResult``s (anything with ``scenario_id``, ``file``, ``targets``,
    ``runs`` and ``divergences``); ``scenarios`` maps scenario id to the loaded scenario, used
    as signature context (config and requests) together with the runs' summaries.
    """
    findings: list[Finding] = []
    matched = [0] * len(ledger.entries)
    in_scope = [False] * len(ledger.entries)
    for result in results:
        pairs = _pairs(result)  # none for a single-target run: no entry decided, none stale
        lacking = {p: _unsupported(result, p[0]) or _unsupported(result, p[1]) for p in pairs}
        for left, right in (p for p in pairs if lacking[p] is not None):
            findings.append(
                Finding(
                    result.scenario_id,
                    result.file,
                    left,
                    right,
                    Verdict.UNSUPPORTED,
                    rule=lacking[(left, right)],
                )
            )
        pairs = [p for p in pairs if lacking[p] is None]  # nothing compared: nothing in scope
        if getattr(result, "flaky", False):
            first = result.attempts[0]
            why = f"{first.suspects[0]} (first attempt, {_load(first)}); not on fresh servers"
            for left, right in pairs[:1]:
                findings.append(
                    Finding(result.scenario_id, result.file, left, right, Verdict.FLAKY, rule=why)
                )
        for index, entry in enumerate(ledger.entries):
            if any(entry.match.in_scope(result.scenario_id, result.file, p) for p in pairs):
                in_scope[index] = True
        for left, right in pairs:
            found = [
                d
                for d in result.divergences
                if (d.left_target or left, d.right_target or right) == (left, right)
            ]
            if not found:
                findings.append(Finding(result.scenario_id, result.file, left, right, Verdict.PASS))
                continue
            scenario = (scenarios or {}).get(result.scenario_id)
            context = SignatureContext.build(scenario, _run(result, left), _run(result, right))
            classified = classify_all(found, context)
            for divergence, classification in zip(found, classified, strict=True):
                findings.append(
                    _finding(result, (left, right), divergence, classification, ledger, matched)
                )
    states = [
        _entry_state(entry, count, scope)
        for entry, count, scope in zip(ledger.entries, matched, in_scope, strict=True)
    ]
    entries = tuple(
        EntryResult(entry, state, count, line)
        for entry, state, count, line in zip(
            ledger.entries, states, matched, ledger.lines, strict=True
        )
    )
    return LedgerReport(ledger.file, tuple(findings), entries)


def _finding(
    result: Any,
    pair: tuple[str, str],
    divergence: Divergence,
    classification: Classification,
    ledger: Ledger,
    matched: list[int],
) -> Finding:
    signature = classification.signature.value
    left, right = pair
    for index, entry in enumerate(ledger.entries):
        if entry.match.in_scope(result.scenario_id, result.file, pair) and entry.match.covers(
            divergence, signature
        ):
            matched[index] += 1
            verdict = Verdict.NEW if entry.decision == "mirror" else Verdict.KNOWN
            break
    else:
        entry, verdict = None, Verdict.NEW
    return Finding(
        scenario_id=result.scenario_id,
        file=result.file,
        left_target=left,
        right_target=right,
        verdict=verdict,
        divergence=divergence,
        signature=signature,
        rule=classification.rule,
        ref=divergence_ref(result.scenario_id, divergence, signature),
        entry_id=entry.id if entry else None,
        decision=entry.decision if entry else None,
    )


def _entry_state(entry: LedgerEntry, matched: int, in_scope: bool) -> EntryState:
    if entry.decision == "mirror":
        return (
            EntryState.VIOLATED if matched else EntryState.HELD if in_scope else EntryState.NOT_RUN
        )
    if matched:
        return EntryState.KNOWN
    return EntryState.STALE if in_scope else EntryState.NOT_RUN


def _pairs(result: Any) -> list[tuple[str, str]]:
    targets = list(result.targets)
    pairs = [(targets[0], other) for other in targets[1:]]
    for d in result.divergences:  # a differ may compare other pairs; keep them too
        pair = (d.left_target, d.right_target)
        if all(pair) and pair not in pairs:
            pairs.append(pair)
    return pairs


def _load(attempt: Any) -> str:
    load = getattr(attempt, "load", None)
    return load.describe() if load is not None else "load not recorded"


def _unsupported(result: Any, target: str) -> str | None:
    """Why ``target`` could not run the result's scenario (a serve-tier placeholder run)."""
    return getattr(_run(result, target), "unsupported", None)


def _run(result: Any, target: str) -> Any:
    for run in getattr(result, "runs", ()):
        if getattr(run, "target", None) == target:
            return run
    return None
