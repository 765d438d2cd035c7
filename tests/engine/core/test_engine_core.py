"""The engine core loop and its step traces (engine/core/engine_core.py, step_trace.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from contract.scripted import script
from contract.trace import StepTrace
from engine.config import ConfigError, EngineConfig
from engine.core.engine_core import EngineCore
from engine.core.fake_runner import ScriptedModelRunner
from engine.core.sched.output import SchedulerOutput
from engine.core.step_trace import traced_step
from engine.outputs import ModelRunnerOutput

pytestmark = pytest.mark.timeout(120)


def test_traces_round_trip_through_json(factories: Any) -> None:
    f = factories
    run = f.run_workload(f.create_core(num_blocks=4, max_model_len=48), f.create_requests(2))
    assert run.traces, "no steps"
    for trace in run.traces:
        assert StepTrace.from_json(trace.to_json()) == trace


def test_several_preemptions_in_one_step_in_victim_order(factories: Any) -> None:
    f = factories
    core = f.create_core(num_blocks=4, max_model_len=64)
    run = f.run_workload(core, f.create_requests(3, num_tokens=16, max_tokens=4))
    step2 = run.step(2)
    assert step2.preempted_req_ids == ("r2", "r1")  # running[-1] first, then r1 preempts itself
    assert step2.num_scheduled_tokens == {"r0": 1} and step2.waiting == ("r1", "r2")
    assert step2.block_ids == {"r0": (1, 3)}
    assert all(run.finish[r] == "length" for r in ("r0", "r1", "r2"))


def test_idle_steps_still_count(factories: Any) -> None:
    f = factories
    core = f.create_core()
    _, first = traced_step(core)
    assert first.step == 1 and first.is_idle and not core.has_requests()
    run = f.run_workload(core, [(2, f.make_request("A", [1, 2, 3], 1))])
    assert [t.step for t in run.traces] == [2, 3, 4]
    assert run.traces[0].is_idle and run.traces[2].scheduled_new_req_ids == ("A",)


def test_core_needs_a_concrete_max_model_len() -> None:
    with pytest.raises(ConfigError, match="max_model_len"):
        EngineCore(EngineConfig(max_model_len="auto"), ScriptedModelRunner(script), 10)
    core = EngineCore(EngineConfig(max_model_len="auto"), ScriptedModelRunner(script), 10, 48)
    assert core.max_model_len == 48


class _ConstantRunner:
    """Samples token 7 for every request: isolates the scheduler's own cost."""

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        req_ids = list(scheduler_output.num_scheduled_tokens)
        return ModelRunnerOutput(
            req_ids, {r: i for i, r in enumerate(req_ids)}, [[7]] * len(req_ids)
        )


def test_step_cost_is_lean(factories: Any) -> None:
    """8 decoding requests: schedule + update well under a millisecond (upstream ~0.12 ms)."""
    f = factories
    cfg = f.create_config(max_model_len=4096)
    core = EngineCore(cfg, _ConstantRunner(), num_blocks=4096)
    for request in f.create_requests(8, num_tokens=100, max_tokens=3000):
        core.add_request(request)
    core.step()
    num_steps = 1000
    start = time.perf_counter()
    for _ in range(num_steps):
        core.step()
    per_step_ms = (time.perf_counter() - start) / num_steps * 1e3
    print(f"engine core step (8 decoding requests, constant runner): {per_step_ms:.3f} ms")
    assert per_step_ms < 1.5
