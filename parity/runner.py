"""Run a scenario on scheduler-tier targets, bounded, and turn the runs into one verdict.

Stepping (``run_target``): before step ``s`` every request with ``at_step < s`` is submitted
(``at_step: 0`` arrives before step 1). The run ends when every submitted request finished and
none is still to arrive, after ``limits.max_steps`` steps (the rest are ``unfinished``), or when
no progress was made for ``limits.stall_steps`` consecutive steps while requests were
outstanding (``wedged at step N: no progress for K steps``). Progress is a sampled token, a
finished request, or a request's ``num_computed_tokens`` passing its previous high-water mark,
so re-prefilling after a preemption is not progress (a self-preemption livelock is a wedge) but
a long chunked prefill is.

Outcomes are derived from the traces alone, the same way for every target, so two targets with
identical traces have identical outcomes; both sides wedging identically is parity.

A target with no scheduler tier (a server only) cannot run these scenarios: each pair with it is
UNSUPPORTED (``run_with_servers_only``), said once per reason, never an error of the run.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contract.trace import StepTrace
from parity._judge import diff_and_check
from parity.differ import diff_runs
from parity.errors import TargetStartError
from parity.expect import check_expect
from parity.results import (
    Divergence,
    ExpectFailure,
    RequestOutcome,
    RunSummary,
    ScenarioResult,
    Status,
    TargetRun,
    Wedge,
    compared_verdict,
)
from parity.scenario import ConfigSpec, Scenario
from parity.targets.base import SchedulerTarget


@dataclass
class _Tally:
    """Per-request accounting built from the traces as they arrive."""

    outputs: dict[str, list[int]] = field(default_factory=dict)
    preemptions: dict[str, int] = field(default_factory=dict)
    finished: dict[str, tuple[str, int | str | None, int]] = field(default_factory=dict)
    first_token: dict[str, int] = field(default_factory=dict)
    high_water: dict[str, int] = field(default_factory=dict)

    def observe(self, trace: StepTrace) -> bool:
        """Account for one step; True when it made progress."""
        progress = bool(trace.finished)
        for request_id, tokens in trace.sampled_token_ids.items():
            if tokens:
                progress = True
                self.outputs.setdefault(request_id, []).extend(tokens)
                self.first_token.setdefault(request_id, trace.step)
        for request_id in trace.preempted_req_ids:
            self.preemptions[request_id] = self.preemptions.get(request_id, 0) + 1
        for request_id, reason in trace.finished.items():
            stop_reason = trace.stop_reasons.get(request_id)
            self.finished[request_id] = (reason, stop_reason, trace.step)
        for request_id, computed in trace.num_computed_tokens.items():
            if computed > self.high_water.get(request_id, 0):
                self.high_water[request_id] = computed
                progress = True
        return progress

    def outcome(self, request_id: str, unfinished_as: str) -> RequestOutcome:
        outputs = tuple(self.outputs.get(request_id, ()))
        done = self.finished.get(request_id)
        return RequestOutcome(
            request_id=request_id,
            outcome="finished" if done else unfinished_as,
            finish_reason=done[0] if done else None,
            stop_reason=done[1] if done else None,
            finished_at_step=done[2] if done else None,
            num_output_tokens=len(outputs),
            output_token_ids=outputs,
            num_preemptions=self.preemptions.get(request_id, 0),
            first_token_step=self.first_token.get(request_id),
        )


def resolved_config(config: ConfigSpec, project: Any = None) -> ConfigSpec:
    """``config`` with ``model`` an absolute folder (a named model built on demand), so every
    target of a run reads the same model whatever its working directory."""
    from parity.serve.spec import resolve_model

    folder = resolve_model(config.model or "scripted", project)
    return config.model_copy(update={"model": str(folder)})


def run_target(scenario: Scenario, target: SchedulerTarget, project: Any = None) -> TargetRun:
    """Run ``scenario`` on one target (started here, closed here), bounded by its limits."""
    began = time.perf_counter()
    try:
        target.start(resolved_config(scenario.config, project))
    except TargetStartError as exc:
        summary = RunSummary(target.name, 0, {}, error=str(exc), started=False)
        return TargetRun(scenario.id, summary)
    try:
        steps, tally, wedge, error = _drive(scenario, target)
    finally:
        target.close()
    unfinished_as = "crashed" if error else "wedged" if wedge else "unfinished"
    outcomes = {r.id: tally.outcome(r.id, unfinished_as) for r in scenario.requests}
    summary = RunSummary(
        target=target.name,
        num_steps=len(steps),
        outcomes=outcomes,
        wedge=wedge,
        error=error,
        elapsed_s=round(time.perf_counter() - began, 6),
        notes=tuple(getattr(target, "notes", ())),
    )
    return TargetRun(scenario.id, summary, tuple(steps))


def _drive(
    scenario: Scenario, target: SchedulerTarget
) -> tuple[list[StepTrace], _Tally, Wedge | None, str | None]:
    arrivals = sorted(scenario.requests, key=lambda r: r.at_step)  # stable: file order
    limits = scenario.limits
    steps: list[StepTrace] = []
    tally = _Tally()
    submitted: set[str] = set()
    stalled = 0
    next_arrival = 0
    for step in range(1, limits.max_steps + 1):
        while next_arrival < len(arrivals) and arrivals[next_arrival].at_step < step:
            request = arrivals[next_arrival]
            try:
                target.submit(request)
            except Exception as exc:  # the target failing is a finding, not a harness bug
                return steps, tally, None, _error_text(f"submit {request.id}", exc)
            submitted.add(request.id)
            next_arrival += 1
        outstanding = submitted - set(tally.finished)
        if not outstanding and next_arrival == len(arrivals):
            break
        try:
            trace = target.step()
        except Exception as exc:
            return steps, tally, None, _error_text(f"step {step}", exc)
        steps.append(trace)
        progress = tally.observe(trace)
        stalled = 0 if progress or not outstanding else stalled + 1
        if stalled >= limits.stall_steps:
            return steps, tally, _wedge(trace, stalled, submitted - set(tally.finished)), None
    return steps, tally, None, None


def _wedge(trace: StepTrace, stalled: int, outstanding: set[str]) -> Wedge:
    queued = [*trace.running, *trace.waiting]
    stuck = [r for r in queued if r in outstanding] + sorted(outstanding - set(queued))
    return Wedge(
        step=trace.step - stalled + 1,
        stall_steps=stalled,
        stuck=tuple(stuck),
        running=trace.running,
        waiting=trace.waiting,
        num_free_blocks=trace.num_free_blocks,
    )


def _error_text(what: str, exc: BaseException) -> str:
    return f"{what}: {type(exc).__name__}: {exc}"


def run_scenario(
    scenario: Scenario, targets: Sequence[SchedulerTarget], project: Any = None
) -> tuple[ScenarioResult, tuple[TargetRun, ...]]:
    """Run ``scenario`` on every target, diff each against the first, check ``expect:``."""
    began = time.perf_counter()
    runs = tuple(run_target(scenario, target, project) for target in targets)
    divergences, failures = diff_and_check(scenario, runs, diff_runs, check_expect)
    status, verdict = _verdict(runs, divergences, failures)
    result = ScenarioResult(
        scenario_id=scenario.id,
        file=scenario.file,
        tier="scheduler",
        targets=tuple(run.target for run in runs),
        status=status,
        verdict=verdict,
        runs=tuple(run.summary for run in runs),
        divergences=divergences,
        expect_failures=failures,
        elapsed_s=round(time.perf_counter() - began, 6),
    )
    return result, runs


def run_with_servers_only(
    scenario: Scenario,
    targets: Sequence[SchedulerTarget],
    lacking: Mapping[str, str],
    project: Any = None,
) -> tuple[ScenarioResult, tuple[TargetRun, ...]]:
    """``run_scenario`` on the ``targets`` that have a scheduler tier (when two do), plus a
    placeholder run for each of ``lacking`` (name: why it has none), compared with nothing."""
    if not lacking:
        return run_scenario(scenario, targets, project)
    placeholders = tuple(_unsupported(name, why) for name, why in lacking.items())
    if len(targets) < 2:
        why = next(iter(lacking.values()))
        reference = tuple(_unsupported(t.name, why) for t in targets)
        runs = (*reference, *placeholders)
        result = ScenarioResult(
            scenario_id=scenario.id,
            file=scenario.file,
            tier="scheduler",
            targets=tuple(run.target for run in runs),
            status=Status.UNSUPPORTED,
            verdict=f"unsupported: {why}",
            runs=runs,
        )
        return result, ()
    result, traced = run_scenario(scenario, targets, project)
    more = tuple(run.target for run in placeholders)
    result = dataclasses.replace(
        result, targets=result.targets + more, runs=result.runs + placeholders
    )
    return result, traced


def _unsupported(target: str, why: str) -> RunSummary:
    return RunSummary(target=target, num_steps=0, outcomes={}, started=False, unsupported=why)


def _verdict(
    runs: Sequence[TargetRun], divergences: Sequence[Divergence], failures: Sequence[ExpectFailure]
) -> tuple[Status, str]:
    if runs and all(not run.summary.started for run in runs):
        return Status.ERROR, f"no target started: {runs[0].summary.error}"
    described = runs[0].summary.describe() if runs else "no targets"
    return compared_verdict(divergences, failures, [run.target for run in runs], described)
