"""Check a scenario's ``expect:`` block against one target's run.

Each entry is checked independently of the other target (an ``expect:`` that holds on both is
what the acceptance asks for). ``expect.steps.N.<field>`` compares the whole field of the N-th
step's trace (1-based), lists and dicts as JSON values.
"""

from __future__ import annotations

from typing import Any

from parity._codec import plain
from parity.results import ExpectFailure, TargetRun
from parity.scenario import Scenario

# expect key -> RequestOutcome attribute
PER_REQUEST = {
    "outcome": "outcome",
    "finish_reason": "finish_reason",
    "stop_reason": "stop_reason",
    "num_output_tokens": "num_output_tokens",
    "output_token_ids": "output_token_ids",
    "num_preemptions": "num_preemptions",
    "finished_at_step": "finished_at_step",
}


def check_expect(scenario: Scenario, run: TargetRun) -> list[ExpectFailure]:
    """Every ``expect:`` entry ``run`` does not meet (empty: all hold, or no ``expect:``)."""
    expect = scenario.expect
    if expect is None:
        return []
    target = run.target
    summary = run.summary
    if not summary.started:
        return [
            ExpectFailure(target, "expect", "a started target", summary.error, scenario.location())
        ]
    failures: list[ExpectFailure] = []

    def check(path: tuple[Any, ...], expected: Any, actual: Any) -> None:
        if plain(expected) != plain(actual):
            dotted = ".".join(str(p) for p in path)
            failures.append(
                ExpectFailure(
                    target, dotted, plain(expected), plain(actual), scenario.location(path)
                )
            )

    for key, attribute in PER_REQUEST.items():
        for request_id, expected in getattr(expect, key).items():
            outcome = summary.outcomes.get(request_id)
            actual = getattr(outcome, attribute) if outcome is not None else None
            check(("expect", key, request_id), expected, actual)
    if expect.wedged_at_step is not None or "wedged_at_step" in expect.model_fields_set:
        actual_step = summary.wedge.step if summary.wedge is not None else None
        check(("expect", "wedged_at_step"), expect.wedged_at_step, actual_step)
    for step, fields in expect.steps.items():
        trace = run.steps[step - 1] if 0 < step <= len(run.steps) else None
        for name in fields.model_fields_set:
            expected = getattr(fields, name)
            actual = getattr(trace, name) if trace is not None else None
            check(("expect", "steps", step, name), expected, actual)
    return failures
