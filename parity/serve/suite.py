"""Run serve-tier scenarios on several targets, one server at a time, and judge each scenario.

Each scenario is made into a ``ServePlan`` once (server config with its model folder resolved,
requests, limits). Plans are grouped by server config: for each group,
each target's server starts once (``ServerPool``), runs every scenario of the group in file
order, and is stopped before the next target's server starts, so at most one server is up at a
time (2 cores; an oracle server holds ~3 GiB). Then each scenario's runs are diffed against
the first target's (``parity.serve.differ``) and checked against ``expect:``
(``parity.serve.expect``), giving one ``ScenarioResult`` (tier ``serve``, ``runs`` the
``ServeRun``s in target order) per scenario.

A target that cannot run a scenario (a config key it cannot spell, checked before its server
starts; a vLLM request extension or ``/metrics`` the scenario needs and the started server does
not accept) gets a placeholder run saying why (``ServeRun.unsupported``): it is not compared
and not checked, and is said once, never as divergences.

Verdicts: ``unsupported`` when fewer than two targets could run it; ``error`` when no target
started and the scenario does not ``expect: {startup: refused}``; ``divergence``;
``expect_failed``; else ``pass``. ``startup_failed`` says whether a
result means exit code 3 (a target failed to start when it should have).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity.results import Divergence, ExpectFailure, ScenarioResult, Status
from parity.scenario import Scenario
from parity.serve.differ import diff_serve_runs
from parity.serve.expect import STARTUP_PATH, check_serve_expect
from parity.serve.pool import ServerPool
from parity.serve.probe import missing
from parity.serve.run import ServeRun, run_serve
from parity.serve.spec import ServeLimits, ServerConfig, ServeRequestSpec, from_scenario
from parity.serve.targets import TargetSpec, parse_targets, unsupported_reason

# on_event(scenario id, target label, phase): phase is "starting" (a server is starting for
# this scenario's group), "running" or "done".
EventHook = Callable[[str, str, str], None]


def config_key(config: ServerConfig) -> str:
    """A stable key of a server config (scenarios with equal keys share a server)."""
    return json.dumps(config.to_json(), sort_keys=True, default=str)


@dataclass(frozen=True)
class ServePlan:
    """A scenario made into what the serve tier runs, once: its server config (model folder
    resolved), requests and limits. The plan travels; nothing converts the scenario again."""

    scenario: Scenario
    config: ServerConfig
    requests: tuple[ServeRequestSpec, ...]
    limits: ServeLimits

    @classmethod
    def of(cls, scenario: Scenario, project: Any = None) -> ServePlan:
        config, requests, limits = from_scenario(scenario, project=project)
        return cls(scenario, config, tuple(requests), limits)

    @property
    def key(self) -> str:
        return config_key(self.config)


def group_plans(plans: Sequence[ServePlan]) -> list[list[ServePlan]]:
    """Plans grouped by server config, groups in order of first appearance."""
    groups: dict[str, list[ServePlan]] = {}
    for plan in plans:
        groups.setdefault(plan.key, []).append(plan)
    return list(groups.values())


def group_by_config(scenarios: Sequence[Scenario]) -> list[tuple[ServerConfig, list[Scenario]]]:
    """Scenarios grouped by server config, groups in order of first appearance."""
    return [
        (group[0].config, [plan.scenario for plan in group])
        for group in group_plans([ServePlan.of(s) for s in scenarios])
    ]


def run_plan(
    pool: ServerPool, target: TargetSpec, plan: ServePlan, *, startup_timeout_s: float | None = None
) -> ServeRun:
    """Run one plan on one target (its server from ``pool``), or the placeholder run that says
    why the target cannot run it: a config key it cannot take (before anything starts), or a
    vLLM extension the scenario needs that the started server does not accept."""
    reason = unsupported_reason(target, plan.config)
    if reason is not None:
        return ServeRun.not_supported(target.label, reason, plan.limits)
    timeout = startup_timeout_s or plan.limits.startup_timeout_s
    handle = pool.get(target, plan.config, startup_timeout_s=timeout)
    if handle.startup.started:
        reason = missing(plan.requests, plan.scenario.expect, handle.capabilities)
        if reason is not None:
            return ServeRun.not_supported(target.label, reason, plan.limits)
    return run_serve(handle, plan.requests, plan.limits)


def run_serve_scenarios(
    scenarios: Sequence[Scenario],
    targets: Sequence[str],
    *,
    pool: ServerPool | None = None,
    log_dir: str | Path | None = None,
    on_event: EventHook | None = None,
    project: Any = None,
) -> list[ScenarioResult]:
    """Run every scenario on every target (see the module docstring); results in input order.

    ``pool``: reuse a caller's pool (its servers are still stopped after each group); else a
    pool is made here (logs in ``log_dir``, or a temporary folder) and closed at the end."""
    specs = parse_targets(targets, project)  # TargetSpecError before anything starts
    plans = [ServePlan.of(s, project) for s in scenarios]
    own = pool is None
    active = pool if pool is not None else ServerPool(log_dir)
    runs: dict[str, list[ServeRun]] = {s.id: [] for s in scenarios}
    elapsed: dict[str, float] = {s.id: 0.0 for s in scenarios}
    hook = on_event or (lambda _s, _t, _p: None)
    try:
        for group in group_plans(plans):
            timeout = max(plan.limits.startup_timeout_s for plan in group)
            for spec in specs:
                started = False
                for plan in group:
                    scenario_id = plan.scenario.id
                    hook(scenario_id, spec.label, "running" if started else "starting")
                    began = time.perf_counter()
                    run = run_plan(active, spec, plan, startup_timeout_s=timeout)
                    started = started or run.unsupported is None
                    runs[scenario_id].append(run)
                    elapsed[scenario_id] += time.perf_counter() - began
                    hook(scenario_id, spec.label, "done")
                for handle in active.handles:
                    if handle.target.label == spec.label and handle.config == group[0].config:
                        active.stop(handle)
    finally:
        if own:
            active.close()
    return [judge(p.scenario, runs[p.scenario.id], round(elapsed[p.scenario.id], 3)) for p in plans]


def judge(scenario: Scenario, runs: Sequence[ServeRun], elapsed_s: float = 0.0) -> ScenarioResult:
    """Diff each run against the first that ran, check ``expect:``, and give the verdict.
    Runs of targets that could not run the scenario (``ServeRun.unsupported``) are neither
    compared nor checked."""
    supported = [run for run in runs if run.unsupported is None]
    divergences: list[Divergence] = []
    for other in supported[1:]:
        divergences.extend(diff_serve_runs(scenario, supported[0], other))
    failures: list[ExpectFailure] = []
    for run in supported:
        failures.extend(check_serve_expect(scenario, run))
    status, verdict = _verdict(scenario, runs, divergences, failures)
    return ScenarioResult(
        scenario_id=scenario.id,
        file=scenario.file,
        tier="serve",
        targets=tuple(run.target for run in runs),
        status=status,
        verdict=verdict,
        runs=tuple(runs),
        divergences=tuple(divergences),
        expect_failures=tuple(failures),
        elapsed_s=elapsed_s,
    )


def _verdict(
    scenario: Scenario,
    runs: Sequence[ServeRun],
    divergences: Sequence[Divergence],
    failures: Sequence[ExpectFailure],
) -> tuple[Status, str]:
    expected_refusal = scenario.expect is not None and scenario.expect.startup == "refused"
    unsupported = [run for run in runs if run.unsupported is not None]
    runs = [run for run in runs if run.unsupported is None]
    if unsupported and len(runs) < 2:
        lacking = unsupported[0]
        return Status.UNSUPPORTED, f"unsupported on {lacking.target}: {lacking.unsupported}"
    if runs and not any(run.startup.started for run in runs) and not expected_refusal:
        return Status.ERROR, f"no target started: {runs[0].startup.error}"
    if divergences:
        first = divergences[0]
        return Status.DIVERGENCE, f"diverged: {first.path} ({len(divergences)} differences)"
    if failures:
        first_failure = failures[0]
        return (
            Status.EXPECT_FAILED,
            f"expect failed on {first_failure.target}: {first_failure.path} "
            f"({len(failures)} failures)",
        )
    described = runs[0].describe() if runs else "no targets"
    if len(runs) == 1:
        return Status.PASS, f"{runs[0].target}: {described}"
    return Status.PASS, f"parity: {'both' if len(runs) == 2 else 'all'} {described}"


def startup_failed(result: ScenarioResult) -> bool:
    """True when a target failed to start when it should have (exit code 3): no target
    started and the scenario did not expect a refusal, or a startup ``expect`` failed."""
    if result.status is Status.ERROR:
        return True
    return any(f.path == STARTUP_PATH for f in result.expect_failures)
