"""Run serve-tier scenarios on several targets, one server at a time, and judge each scenario.

Scenarios are grouped by server config (``from_scenario``'s ``ServerConfig``): for each group,
each target's server starts once (``ServerPool``), runs every scenario of the group in file
order, and is stopped before the next target's server starts, so at most one server is up at a
time (2 cores; an oracle server holds ~3 GiB). Then each scenario's runs are diffed against
the first target's (``parity.serve.differ``) and checked against ``expect:``
(``parity.serve.expect``), giving one ``ScenarioResult`` (tier ``serve``, ``runs`` the
``ServeRun``s in target order) per scenario.

Verdicts: ``error`` when no target started and the scenario does not ``expect: {startup:
refused}``; ``divergence``; ``expect_failed``; else ``pass``. ``startup_failed`` says whether a
result means exit code 3 (a target failed to start when it should have).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from parity.results import Divergence, ExpectFailure, ScenarioResult, Status
from parity.scenario import Scenario
from parity.serve.differ import diff_serve_runs
from parity.serve.expect import STARTUP_PATH, check_serve_expect
from parity.serve.pool import ServerPool
from parity.serve.run import ServeRun, run_serve
from parity.serve.spec import ServerConfig, from_scenario
from parity.serve.targets import parse_target

# on_event(scenario id, target label, phase): phase is "starting" (a server is starting for
# this scenario's group), "running" or "done".
EventHook = Callable[[str, str, str], None]


def config_key(config: ServerConfig) -> str:
    """A stable key of a server config (scenarios with equal keys share a server)."""
    return json.dumps(config.to_json(), sort_keys=True, default=str)


def group_by_config(scenarios: Sequence[Scenario]) -> list[tuple[ServerConfig, list[Scenario]]]:
    """Scenarios grouped by server config, groups in order of first appearance."""
    groups: dict[str, tuple[ServerConfig, list[Scenario]]] = {}
    for scenario in scenarios:
        config = from_scenario(scenario)[0]
        groups.setdefault(config_key(config), (config, []))[1].append(scenario)
    return list(groups.values())


def run_serve_scenarios(
    scenarios: Sequence[Scenario],
    targets: Sequence[str],
    *,
    pool: ServerPool | None = None,
    log_dir: str | Path | None = None,
    on_event: EventHook | None = None,
) -> list[ScenarioResult]:
    """Run every scenario on every target (see the module docstring); results in input order.

    ``pool``: reuse a caller's pool (its servers are still stopped after each group); else a
    pool is made here (logs in ``log_dir``, or a temporary folder) and closed at the end."""
    specs = [parse_target(t) for t in targets]  # TargetSpecError before anything starts
    own = pool is None
    active = pool if pool is not None else ServerPool(log_dir)
    runs: dict[str, list[ServeRun]] = {s.id: [] for s in scenarios}
    began: dict[str, float] = {}
    elapsed: dict[str, float] = {s.id: 0.0 for s in scenarios}
    hook = on_event or (lambda _s, _t, _p: None)
    try:
        for config, group in group_by_config(scenarios):
            timeout = max(from_scenario(s)[2].startup_timeout_s for s in group)
            for spec in specs:
                handle = None
                for scenario in group:
                    hook(scenario.id, spec.label, "starting" if handle is None else "running")
                    began[scenario.id] = time.perf_counter()
                    handle = active.get(spec, config, startup_timeout_s=timeout)
                    hook(scenario.id, spec.label, "running")
                    _, requests, limits = from_scenario(scenario)
                    runs[scenario.id].append(run_serve(handle, requests, limits))
                    elapsed[scenario.id] += time.perf_counter() - began[scenario.id]
                    hook(scenario.id, spec.label, "done")
                if handle is not None:
                    active.stop(handle)
    finally:
        if own:
            active.close()
    return [judge(s, runs[s.id], round(elapsed[s.id], 3)) for s in scenarios]


def judge(scenario: Scenario, runs: Sequence[ServeRun], elapsed_s: float = 0.0) -> ScenarioResult:
    """Diff each run against the first, check ``expect:``, and give the verdict."""
    divergences: list[Divergence] = []
    for other in runs[1:]:
        divergences.extend(diff_serve_runs(scenario, runs[0], other))
    failures: list[ExpectFailure] = []
    for run in runs:
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
