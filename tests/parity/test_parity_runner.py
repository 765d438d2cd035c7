"""The runner: arrivals, bounded stepping, wedge and crash verdicts, and the engine target."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from parity_helpers import SCENARIOS, make_trace

from parity.expect import check_expect
from parity.loader import load_scenario, load_scenarios
from parity.results import ScenarioResult, Status, TargetRun
from parity.runner import run_scenario, run_target
from parity.targets.replay import ReplayTarget

pytestmark = pytest.mark.timeout(60)

TEXT = """\
id: {id}
description: replayed
tier: scheduler
config: {{block_size: 16, num_gpu_blocks_override: 4}}
requests:
  - {{id: a, prompt_token_ids: [389, 1], max_tokens: 2}}
  - {{id: b, prompt_token_ids: [389, 2], max_tokens: 2, at_step: 2}}
limits: {{max_steps: {max_steps}, stall_steps: 3}}
"""


@pytest.fixture
def scenario(write_yaml: Callable[[str, str], Path]) -> Callable[..., Any]:
    def make(max_steps: int = 20, expect: str = "") -> Any:
        return load_scenario(
            write_yaml("replay", TEXT.format(id="replay", max_steps=max_steps) + expect)
        )

    return make


def finishing_steps() -> list[Any]:
    return [
        make_trace(
            1,
            num_scheduled_tokens={"a": 2},
            sampled_token_ids={"a": (5,)},
            num_computed_tokens={"a": 2},
            running=("a",),
        ),
        make_trace(
            2,
            num_scheduled_tokens={"a": 1},
            sampled_token_ids={"a": (6,)},
            finished={"a": "length"},
            stop_reasons={"a": None},
        ),
        make_trace(
            3,
            num_scheduled_tokens={"b": 2},
            sampled_token_ids={"b": (7,)},
            preempted_req_ids=(),
            num_computed_tokens={"b": 2},
            running=("b",),
        ),
        make_trace(
            4,
            num_scheduled_tokens={"b": 1},
            sampled_token_ids={"b": (8,)},
            finished={"b": "stop"},
            stop_reasons={"b": 8},
        ),
    ]


def test_arrivals_outcomes_and_the_end_of_a_run(scenario: Callable[..., Any]) -> None:
    target = ReplayTarget(finishing_steps())
    run = run_target(scenario(), target)
    assert target.submitted == [(0, "a"), (2, "b")]  # at_step 2: added before step 3
    assert target.closed and len(run.steps) == 4 and run.summary.wedge is None
    a, b = run.summary.outcomes["a"], run.summary.outcomes["b"]
    assert (a.outcome, a.finish_reason, a.output_token_ids, a.finished_at_step) == (
        "finished",
        "length",
        (5, 6),
        2,
    )
    assert (b.stop_reason, b.first_token_step, b.num_preemptions) == (8, 3, 0)
    assert run.summary.describe() == "finished in 4 steps"


def test_no_progress_becomes_a_wedge(scenario: Callable[..., Any]) -> None:
    steps = finishing_steps()[:2]  # a finishes; b arrives and nothing ever schedules it
    steps.append(make_trace(3, waiting=("b",), num_computed_tokens={"b": 0}, num_free_blocks=3))
    run = run_target(scenario(), ReplayTarget(steps))
    wedge = run.summary.wedge
    assert wedge is not None and len(run.steps) == 5
    assert (wedge.step, wedge.stall_steps, wedge.stuck, wedge.num_free_blocks) == (3, 3, ("b",), 3)
    assert wedge.describe() == (
        "wedged at step 3: no progress for 3 steps (stuck: b; running: 0, waiting: 1; "
        "free blocks: 3)"
    )
    assert run.summary.outcomes["b"].outcome == "wedged"
    assert run.summary.outcomes["a"].outcome == "finished"


def test_recomputation_below_the_high_water_mark_is_not_progress(
    scenario: Callable[..., Any],
) -> None:
    first = make_trace(
        1,
        num_scheduled_tokens={"a": 2},
        num_computed_tokens={"a": 2},
        sampled_token_ids={"a": (5,)},
    )
    preempt = make_trace(2, preempted_req_ids=("a",), num_computed_tokens={"a": 0})
    redo = make_trace(3, num_scheduled_tokens={"a": 1}, num_computed_tokens={"a": 1})
    again = make_trace(4, num_scheduled_tokens={"a": 1}, num_computed_tokens={"a": 2})
    run = run_target(scenario(), ReplayTarget([first, preempt, redo, again, preempt, redo]))
    assert run.summary.wedge is not None and run.summary.wedge.step == 2
    assert run.summary.outcomes["a"].num_preemptions == 1


def test_max_steps_leaves_requests_unfinished(scenario: Callable[..., Any]) -> None:
    run = run_target(scenario(max_steps=1), ReplayTarget(finishing_steps()))
    assert len(run.steps) == 1
    assert {o.outcome for o in run.summary.outcomes.values()} == {"unfinished"}


def test_refusal_and_crash(scenario: Callable[..., Any]) -> None:
    refused = run_target(scenario(), ReplayTarget([], refuse="too small"))
    assert not refused.summary.started and refused.summary.error == "too small"

    class Crashing(ReplayTarget):
        def step(self) -> Any:
            if self.num_steps == 1:
                raise RuntimeError("boom")
            return super().step()

    crashed = run_target(scenario(), Crashing(finishing_steps()))
    assert crashed.summary.error == "step 2: RuntimeError: boom"
    assert crashed.summary.outcomes["a"].outcome == "crashed"


def test_result_status_and_json_round_trip(scenario: Callable[..., Any]) -> None:
    expect = "expect:\n  outcome: {a: finished, b: finished}\n  finished_at_step: {b: 4}\n"
    same, _runs = run_scenario(
        scenario(expect=expect),
        [ReplayTarget(finishing_steps(), "x"), ReplayTarget(finishing_steps(), "y")],
    )
    assert same.status is Status.PASS and same.verdict == "parity: both finished in 4 steps"
    other = finishing_steps()
    other[3] = make_trace(
        4,
        num_scheduled_tokens={"b": 1},
        sampled_token_ids={"b": (9,)},
        finished={"b": "stop"},
        stop_reasons={"b": 9},
    )
    result, runs = run_scenario(
        scenario(expect=expect), [ReplayTarget(finishing_steps(), "x"), ReplayTarget(other, "y")]
    )
    assert result.status is Status.DIVERGENCE
    assert result.verdict.startswith("diverged at step 4: steps[3].stop_reasons.b")
    assert ScenarioResult.from_json(result.to_json()) == result
    assert TargetRun.from_json(runs[1].to_json()) == runs[1]
    late = finishing_steps()[:2]
    failing, _ = run_scenario(scenario(expect=expect), [ReplayTarget(late, "x")])
    assert failing.status is Status.EXPECT_FAILED
    assert [f.path for f in failing.expect_failures] == [
        "expect.outcome.b",
        "expect.finished_at_step.b",
    ]


def test_engine_target_meets_every_expect_block(engine_target: Any) -> None:
    for scenario in load_scenarios([SCENARIOS]):
        run = run_target(scenario, engine_target)
        assert run.summary.started, run.summary.error
        assert check_expect(scenario, run) == [], scenario.id
