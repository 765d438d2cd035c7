"""Result types of a parity run: frozen dataclasses of plain values with a JSON round-trip.

- ``RequestOutcome``: what one request ended as on one target (finished with a reason, wedged,
  unfinished at ``max_steps``, or crashed), derived from the step traces only.
- ``Wedge``: a target made no progress for ``stall_steps`` steps.
- ``TargetRun``: one target's full run (the traces); ``RunSummary`` the same without traces.
- ``Divergence``: one difference between two targets, with its dotted path and scenario line.
- ``ExpectFailure``: one ``expect:`` entry that a target did not meet.
- ``ScenarioResult``: the verdict for one scenario on one tier. ``status`` is ``pass``,
  ``divergence``, ``expect_failed`` or ``error``; the decision ledger (``parity.ledger``)
  classifies divergences as KNOWN / NEW / STALE on top of this. Its ``runs`` are
  ``RunSummary``s at the scheduler tier and ``parity.serve.ServeRun``s (every request
  observation with its SSE frames and arrival times, startup record, facts, health samples,
  metrics before/after) at the serve tier; ``tier`` says which.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from contract.trace import StepTrace
from parity._codec import JsonMixin, plain
from parity.machine import LoadSample
from parity.serve.run import ServeRun

OUTCOMES = ("finished", "wedged", "unfinished", "crashed")


@dataclass(frozen=True, slots=True)
class RequestOutcome(JsonMixin):
    """How one request ended on one target."""

    request_id: str
    outcome: str  # one of OUTCOMES
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    finished_at_step: int | None = None
    num_output_tokens: int = 0
    output_token_ids: tuple[int, ...] = ()
    num_preemptions: int = 0
    first_token_step: int | None = None


@dataclass(frozen=True, slots=True)
class Wedge(JsonMixin):
    """No progress for ``stall_steps`` steps, starting at ``step``."""

    step: int  # first step without progress
    stall_steps: int
    stuck: tuple[str, ...]  # unfinished request ids (running first, then waiting)
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    num_free_blocks: int

    def describe(self) -> str:
        stuck = ", ".join(self.stuck) or "none"
        return (
            f"wedged at step {self.step}: no progress for {self.stall_steps} steps "
            f"(stuck: {stuck}; running: {len(self.running)}, waiting: {len(self.waiting)}; "
            f"free blocks: {self.num_free_blocks})"
        )


@dataclass(frozen=True, slots=True)
class RunSummary(JsonMixin):
    """One target's run without its traces."""

    target: str
    num_steps: int
    outcomes: dict[str, RequestOutcome]
    wedge: Wedge | None = None
    error: str | None = None  # the target failed to start or raised mid-run
    started: bool = True
    elapsed_s: float = 0.0
    notes: tuple[str, ...] = ()  # e.g. "upstream would refuse this config at startup: ..."
    unsupported: str | None = None  # why the target could not run it (a server-only target)

    def describe(self) -> str:
        if self.unsupported is not None:
            return f"unsupported: {self.unsupported}"
        if not self.started:
            return f"refused to start: {self.error}"
        if self.error is not None:
            return f"crashed after {self.num_steps} steps: {self.error}"
        if self.wedge is not None:
            return self.wedge.describe()
        if any(o.outcome == "unfinished" for o in self.outcomes.values()):
            return f"still running at max_steps ({self.num_steps} steps)"
        return f"finished in {self.num_steps} steps"


@dataclass(frozen=True, slots=True)
class TargetRun(JsonMixin):
    """One target's run of one scenario, with every step trace."""

    scenario_id: str
    summary: RunSummary
    steps: tuple[StepTrace, ...] = ()

    @property
    def target(self) -> str:
        return self.summary.target


@dataclass(frozen=True, slots=True)
class Divergence(JsonMixin):
    """One difference between two targets' runs of a scenario."""

    kind: str  # trace | length | outcome | wedge | startup | crash
    path: str  # dotted field path, e.g. "steps[46].num_scheduled_tokens.r1"
    left: Any
    right: Any
    step: int | None  # the 1-based step of a trace difference, else None
    location: str  # scenario file:line of the request or config key involved
    left_target: str = ""
    right_target: str = ""

    def describe(self) -> str:
        where = f"step {self.step}: " if self.step is not None else ""
        return (
            f"{self.location}: {where}{self.path}: "
            f"{self.left_target or 'left'}={_show(self.left)} "
            f"{self.right_target or 'right'}={_show(self.right)}"
        )


class DivergenceCollector:
    """Collects the divergences of one pair of runs of ``scenario`` (both tiers' differs build
    on it): each carries both targets' labels and JSON-friendly values (tuples as lists, dict
    keys as strings, as a report stores them)."""

    def __init__(self, scenario: Any, left_target: str, right_target: str) -> None:
        self.scenario = scenario
        self.left_target = left_target
        self.right_target = right_target
        self.found: list[Divergence] = []

    def record(
        self, kind: str, path: str, left: Any, right: Any, location: str, step: int | None = None
    ) -> None:
        self.found.append(
            Divergence(
                kind=kind,
                path=path,
                left=plain(left),
                right=plain(right),
                step=step,
                location=location,
                left_target=self.left_target,
                right_target=self.right_target,
            )
        )


def compared_verdict(
    divergences: Sequence[Divergence],
    failures: Sequence[ExpectFailure],
    targets: Sequence[str],
    described: str,
) -> tuple[Status, str]:
    """A scenario's status and one-line verdict once its ``targets`` ran (both tiers): the
    first divergence, else the first expect failure, else parity (``described``: what ran)."""
    if divergences:
        first = divergences[0]
        where = f" at step {first.step}" if first.step is not None else ""
        return Status.DIVERGENCE, f"diverged{where}: {first.path} ({len(divergences)} differences)"
    if failures:
        failure = failures[0]
        return (
            Status.EXPECT_FAILED,
            f"expect failed on {failure.target}: {failure.path} ({len(failures)} failures)",
        )
    if len(targets) == 1:
        return Status.PASS, f"{targets[0]}: {described}"
    return Status.PASS, f"parity: {'both' if len(targets) == 2 else 'all'} {described}"


@dataclass(frozen=True, slots=True)
class ExpectFailure(JsonMixin):
    """One ``expect:`` entry a target did not meet."""

    target: str
    path: str  # e.g. "expect.outcome.r1"
    expected: Any
    actual: Any
    location: str

    def describe(self) -> str:
        return (
            f"{self.location}: {self.target}: {self.path}: expected {_show(self.expected)}, "
            f"got {_show(self.actual)}"
        )


class Status(enum.StrEnum):
    """A scenario's verdict (the ledger will add known / new / stale)."""

    PASS = "pass"
    DIVERGENCE = "divergence"
    EXPECT_FAILED = "expect_failed"
    ERROR = "error"  # no target could run the scenario
    UNSUPPORTED = "unsupported"  # a target lacks what the scenario needs: nothing to compare


@dataclass(frozen=True, slots=True)
class Attempt(JsonMixin):
    """An earlier attempt at a scenario, kept as evidence: its one-sided timing differences
    (``suspects``) made the harness run it again on freshly started servers."""

    runs: tuple[ServeRun, ...]
    divergences: tuple[Divergence, ...] = ()
    expect_failures: tuple[ExpectFailure, ...] = ()
    suspects: tuple[str, ...] = ()
    load: LoadSample | None = None


@dataclass(frozen=True, slots=True)
class ScenarioResult(JsonMixin):
    """The verdict for one scenario on a set of targets."""

    scenario_id: str
    file: str
    tier: str  # scheduler | serve
    targets: tuple[str, ...]
    status: Status
    verdict: str  # one line, e.g. "parity: both wedged at step 47 ..."
    runs: tuple[RunSummary | ServeRun, ...]  # one per target, in target order
    divergences: tuple[Divergence, ...] = ()
    expect_failures: tuple[ExpectFailure, ...] = ()
    elapsed_s: float = 0.0
    # earlier attempts (evidence of a rerun on fresh servers: parity.serve.suite.confirmed)
    attempts: tuple[Attempt, ...] = ()
    flaky: bool = False  # the first attempt's timing differences did not reproduce

    @property
    def ok(self) -> bool:
        return self.status is Status.PASS


@dataclass(frozen=True, slots=True)
class RunReport(JsonMixin):
    """Every scenario result of one ``parity run`` (what ``--json`` writes)."""

    tier: str  # scheduler | serve | both
    targets: tuple[str, ...]
    results: tuple[ScenarioResult, ...] = field(default_factory=tuple)
    elapsed_s: float = 0.0
    ledger: dict[str, Any] | None = None  # LedgerReport.to_json() of this run, when classified

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=False) + "\n"


def _show(value: Any) -> str:
    if isinstance(value, tuple | list | dict) or value is None:
        return json.dumps(value, default=list)
    return repr(value) if isinstance(value, str) else str(value)
