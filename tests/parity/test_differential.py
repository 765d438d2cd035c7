"""Differential property test: random workloads, engine vs the pinned upstream scheduler.

Each example also runs with both targets behind the worker protocol (``parity/targets/worker.py``)
and must give the in-process verdict.

Any divergence fails the example; hypothesis shrinks it and every failing example is written as
a scenario file (the last write is the shrunk one) that ``parity run`` replays. The broken-engine
test proves the loop end to end: one rule flipped (FCFS victim = ``running[0]``) is caught,
shrunk, written, and replays as a divergence (and as parity once the rule is restored).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, seed
from parity_helpers import ROOT, differential_settings, verdict
from parity_workloads import workloads

from parity.cli import EXIT_DIVERGENCE, EXIT_OK, main
from parity.format import format_details
from parity.loader import load_scenario, write_scenario
from parity.results import ScenarioResult
from parity.runner import run_scenario
from parity.scenario import Scenario

SHRUNK_DIR = Path(os.environ.get("PARITY_SHRUNK_DIR", ROOT / "reports" / "shrunk"))


def check_parity(
    scenario: Scenario, targets: list[Any], out_dir: Path, name: str
) -> ScenarioResult:
    """Fail (after writing ``out_dir/<name>.yaml``) if the targets diverge on ``scenario``."""
    result, _runs = run_scenario(scenario, targets)
    if result.divergences:
        named = scenario.model_copy(update={"id": name})
        path = write_scenario(named, out_dir)
        raise AssertionError(f"{format_details([result])}replay: parity run {path}")
    return result


@pytest.mark.oracle
@pytest.mark.timeout(1800)
def test_engine_matches_oracle_on_random_workloads(
    engine_target: Any,
    oracle_target: Any,
    engine_worker: Any,
    oracle_worker: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every example in-process, then the same example with both targets behind the worker
    protocol (docs/scheduler-protocol.md), which must give the same verdict."""
    targets = [engine_target, oracle_target]
    timings: list[float] = []
    protocol_timings: list[float] = []

    @differential_settings()
    @given(scenario=workloads(scenario_id="differential"))
    def property_(scenario: Scenario) -> None:
        began = time.perf_counter()
        reference = check_parity(scenario, targets, SHRUNK_DIR, "differential-engine-vs-oracle")
        middle = time.perf_counter()
        through, _ = run_scenario(scenario, [engine_worker, oracle_worker])
        assert verdict(through) == verdict(reference), scenario.model_dump_json()
        timings.append(middle - began)
        protocol_timings.append(time.perf_counter() - middle)

    began = time.perf_counter()
    property_()
    elapsed = time.perf_counter() - began
    with capsys.disabled():
        print(
            f"\ndifferential: {len(timings)} examples in {elapsed:.1f} s = "
            f"{len(timings) / elapsed:.1f} examples/s overall, "
            f"{len(timings) / sum(timings):.1f} examples/s in the two targets; "
            f"the protocol check {sum(protocol_timings):.1f} s"
        )
    assert len(timings) >= differential_settings().max_examples * 0.9


class _FrontPopList(list):  # type: ignore[type-arg]
    """``pop()`` takes the front: the FCFS victim becomes ``running[0]``."""

    def pop(self, index: Any = -1) -> Any:
        return super().pop(0 if index == -1 else index)


def _break_fcfs_victim(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.core.sched.scheduler import Scheduler

    def get(self: Any) -> list[Any]:
        return self.__dict__["_broken_running"]  # type: ignore[no-any-return]

    def set_(self: Any, value: list[Any]) -> None:
        self.__dict__["_broken_running"] = _FrontPopList(value)

    monkeypatch.setattr(Scheduler, "running", property(get, set_), raising=False)


@pytest.mark.oracle
@pytest.mark.timeout(900)
def test_broken_engine_is_caught_shrunk_and_replayed(
    engine_target: Any,
    oracle_target: Any,
    scripted_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _break_fcfs_victim(monkeypatch)
    out_dir = tmp_path / "reports" / "shrunk"
    targets = [engine_target, oracle_target]

    # A fixed seed keeps this meta-test deterministic (same search, same shrunk file each run).
    @seed(2)
    @differential_settings(max_examples=2000)
    @given(scenario=workloads(scenario_id="broken"))
    def property_(scenario: Scenario) -> None:
        check_parity(scenario, targets, out_dir, "broken-fcfs-victim")

    with pytest.raises(AssertionError, match="replay: parity run"):
        property_()
    written = out_dir / "broken-fcfs-victim.yaml"
    shrunk = load_scenario(written)
    assert shrunk.id == "broken-fcfs-victim"
    # Shrunk: flipping the FCFS victim needs two running requests and one preemption.
    assert 2 <= len(shrunk.requests) <= 3, written.read_text()
    assert shrunk.config.scheduling_policy == "fcfs"

    targets_args = ["--target", f"engine:{scripted_model_dir}"]
    targets_args += ["--target", f"oracle:{scripted_model_dir}", "--no-progress"]
    capsys.readouterr()
    assert main(["run", str(written), *targets_args]) == EXIT_DIVERGENCE
    assert "broken-fcfs-victim" in capsys.readouterr().out
    monkeypatch.undo()
    assert main(["run", str(written), *targets_args]) == EXIT_OK
