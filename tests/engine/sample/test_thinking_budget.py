"""The thinking budget's forced end marker (engine/sample/thinking_budget.py).

Each case runs a model that would think on (``THINK`` tokens) through the budget, one sampled
token a step, taking the forced token when there is one: the output is what a client sees.
The same requests are held to the pinned vLLM in tests/reliability/test_bad_input_diff.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from engine.sample.thinking_budget import ThinkingBudget, last_index

START, END, THINK, ANSWER = 100, 101, 7, 9


def run(
    budget: int,
    model: Sequence[int],
    prompt: Sequence[int] = (1,),
    end: Sequence[int] = (END,),
) -> list[int]:
    """Sample ``model``'s tokens in turn unless the budget forces one; a forced token replaces
    the model's choice for that step (the model then carries on with its sequence)."""
    thinking = ThinkingBudget(budget, [START], list(end), prompt)
    out: list[int] = []
    for token in model:
        forced = thinking.forced_token(out)
        out.append(token if forced is None else forced)
    return out


def test_last_index() -> None:
    assert last_index([1, 2, 1, 2], [1, 2]) == 2
    assert last_index([1, 2], [3]) == -1
    assert last_index([1], []) == -1


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        (0, [START, END, THINK, THINK]),
        (2, [START, THINK, THINK, END]),
        (3, [START, THINK, THINK, THINK]),
        (-1, [START, THINK, THINK, THINK]),
    ],
)
def test_forced_after_budget_thinking_tokens(budget: int, expected: list[int]) -> None:
    assert run(budget, [START, THINK, THINK, THINK]) == expected


def test_a_natural_end_within_budget_is_left_alone_and_reopens_with_a_full_budget() -> None:
    model = [START, THINK, END, ANSWER, START, THINK, THINK, THINK]
    assert run(2, model) == [START, THINK, END, ANSWER, START, THINK, THINK, END]


def test_a_prompt_that_is_thinking_counts_its_tokens() -> None:
    prompt = [1, START, THINK, THINK]  # two thinking tokens already
    assert run(2, [THINK, THINK], prompt) == [END, THINK]
    assert run(3, [THINK, THINK, THINK], prompt) == [THINK, END, THINK]
    ended = [1, START, THINK, END]  # closed in the prompt: nothing counts until a new start
    assert run(0, [THINK, START, THINK], ended) == [THINK, START, END]


def test_a_prompt_section_ends_at_any_end_marker() -> None:
    prompt = [1, START]
    assert run(3, [THINK, END, THINK, THINK, THINK, THINK], prompt) == [
        THINK, END, THINK, THINK, THINK, THINK,
    ]  # fmt: skip


def test_a_multi_token_end_marker_is_forced_one_token_a_step() -> None:
    model = [START, THINK, THINK, THINK, THINK, ANSWER]
    assert run(1, model, end=(END, 102)) == [START, THINK, END, 102, THINK, ANSWER]


def test_an_empty_end_marker_disables_the_budget() -> None:
    assert run(0, [START, THINK], end=()) == [START, THINK]
