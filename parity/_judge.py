"""What both tiers do with a scenario's runs before the verdict: diff and check them.

Upstream: none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from parity.results import Divergence, ExpectFailure
from parity.scenario import Scenario

R = TypeVar("R")


def diff_and_check(
    scenario: Scenario,
    runs: Sequence[R],
    diff: Callable[[Scenario, R, R], Iterable[Divergence]],
    check: Callable[[Scenario, R], Iterable[ExpectFailure]],
) -> tuple[tuple[Divergence, ...], tuple[ExpectFailure, ...]]:
    """Each run diffed against the first (``diff``), and each checked against ``expect:``
    (``check``, independently of the others)."""
    divergences = tuple(d for other in runs[1:] for d in diff(scenario, runs[0], other))
    failures = tuple(f for run in runs for f in check(scenario, run))
    return divergences, failures
