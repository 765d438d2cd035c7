"""The differ on synthetic runs: paths, steps, locations, and what counts as parity."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from parity_helpers import make_trace

from parity.differ import diff_runs
from parity.loader import load_scenario
from parity.results import Divergence, RequestOutcome, RunSummary, TargetRun, Wedge
from parity.scenario import Scenario

pytestmark = pytest.mark.timeout(30)

TEXT = """\
id: pair
description: two requests
tier: scheduler
config:
  block_size: 16
  num_gpu_blocks_override: 4
requests:
  - id: r1
    prompt_token_ids: [389, 1, 2]
    max_tokens: 4
  - id: r2
    prompt_token_ids: [389, 3]
    max_tokens: 4
"""


@pytest.fixture
def scenario(write_yaml: Callable[[str, str], Path]) -> Scenario:
    return load_scenario(write_yaml("pair", TEXT))


def run(target: str, steps: list[Any], **summary: Any) -> TargetRun:
    outcomes = summary.pop("outcomes", {})
    return TargetRun("pair", RunSummary(target, len(steps), outcomes, **summary), tuple(steps))


def base_steps() -> list[Any]:
    return [
        make_trace(
            1,
            num_scheduled_tokens={"r1": 3, "r2": 2},
            scheduled_new_req_ids=("r1", "r2"),
            running=("r1", "r2"),
            block_ids={"r1": (1,), "r2": (2,)},
            num_free_blocks=1,
        ),
        make_trace(2, num_scheduled_tokens={"r1": 1, "r2": 1}, running=("r1", "r2")),
    ]


def test_identical_runs_have_no_divergences(scenario: Scenario) -> None:
    assert diff_runs(scenario, run("a", base_steps()), run("b", base_steps())) == ()


def test_dict_fields_diverge_per_request_with_the_request_line(scenario: Scenario) -> None:
    right = base_steps()
    right[1] = make_trace(2, num_scheduled_tokens={"r1": 1}, running=("r1", "r2"))
    (found,) = diff_runs(scenario, run("engine", base_steps()), run("oracle", right))
    assert found == Divergence(
        kind="trace",
        path="steps[1].num_scheduled_tokens.r2",
        left=1,
        right=None,
        step=2,
        location=f"{scenario.file}:11",
        left_target="engine",
        right_target="oracle",
    )
    assert found.describe() == (
        f"{scenario.file}:11: step 2: steps[1].num_scheduled_tokens.r2: engine=1 oracle=null"
    )


def test_only_the_first_divergent_step_is_reported(scenario: Scenario) -> None:
    right = base_steps()
    right[0] = make_trace(
        1,
        num_scheduled_tokens={"r1": 3, "r2": 2},
        scheduled_new_req_ids=("r2", "r1"),
        running=("r2", "r1"),
        block_ids={"r1": (2,), "r2": (1,)},
        num_free_blocks=0,
    )
    right[1] = make_trace(2, num_scheduled_tokens={"r1": 7})
    found = diff_runs(scenario, run("a", base_steps()), run("b", right))
    assert [d.path for d in found] == [
        "steps[0].scheduled_new_req_ids",
        "steps[0].block_ids.r1",
        "steps[0].block_ids.r2",
        "steps[0].running",
        "steps[0].num_free_blocks",
    ]
    assert {d.step for d in found} == {1}
    new_ids = found[0]
    assert (new_ids.left, new_ids.right) == (["r1", "r2"], ["r2", "r1"])
    assert new_ids.location == f"{scenario.file}:8"  # r1, the first position that differs
    free = found[-1]
    assert free.location == f"{scenario.file}:6"  # config.num_gpu_blocks_override


def test_length_and_wedge_and_outcomes(scenario: Scenario) -> None:
    wedge = Wedge(
        step=3, stall_steps=5, stuck=("r2",), running=(), waiting=("r2",), num_free_blocks=1
    )
    stuck = RequestOutcome("r2", "wedged", num_output_tokens=1)
    done = RequestOutcome("r2", "finished", finish_reason="length", num_output_tokens=4)
    left = run("a", base_steps(), wedge=wedge, outcomes={"r2": stuck})
    right = run("b", [*base_steps(), make_trace(3)], outcomes={"r2": done})
    found = diff_runs(scenario, left, right)
    kinds = [(d.kind, d.path) for d in found]
    assert kinds == [
        ("length", "num_steps"),
        ("wedge", "wedge"),
        ("outcome", "outcomes.r2.outcome"),
        ("outcome", "outcomes.r2.finish_reason"),
        ("outcome", "outcomes.r2.num_output_tokens"),
    ]
    assert found[0].step == 3 and (found[0].left, found[0].right) == (2, 3)
    assert found[1].left.startswith("wedged at step 3: no progress for 5 steps (stuck: r2")
    assert found[1].right is None
    assert found[2].location == f"{scenario.file}:11"


def test_identical_wedges_are_parity(scenario: Scenario) -> None:
    wedge = Wedge(
        step=2, stall_steps=1, stuck=("r1",), running=(), waiting=("r1",), num_free_blocks=3
    )
    outcome = {"r1": RequestOutcome("r1", "wedged")}
    left = run("a", base_steps(), wedge=wedge, outcomes=outcome)
    right = run("b", base_steps(), wedge=wedge, outcomes=outcome)
    assert diff_runs(scenario, left, right) == ()


def test_startup_and_crash(scenario: Scenario) -> None:
    refused = run("a", [], started=False, error="no")
    found = diff_runs(scenario, refused, run("b", base_steps()))
    assert [(d.kind, d.left, d.right) for d in found] == [("startup", "refused: no", "started")]
    assert diff_runs(scenario, refused, run("b", [], started=False, error="other")) == ()
    crashed = run("a", base_steps()[:1], error="step 2: RuntimeError: boom")
    found = diff_runs(scenario, crashed, run("b", base_steps()))
    assert [(d.kind, d.path) for d in found] == [("crash", "error"), ("length", "num_steps")]


def test_divergences_round_trip_through_json(scenario: Scenario) -> None:
    right = base_steps()
    right[0] = make_trace(1, num_scheduled_tokens={"r1": 3}, block_ids={"r1": (1, 2)})
    for divergence in diff_runs(scenario, run("a", base_steps()), run("b", right)):
        assert Divergence.from_json(divergence.to_json()) == divergence
