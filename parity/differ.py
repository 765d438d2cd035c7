"""Compare two targets' runs of one scenario: step traces, then request outcomes.

Traces are compared step by step, field by field, up to and including the first step that
differs (everything after it is a consequence); every difference in that step becomes a
``Divergence`` with a dotted path such as ``steps[46].num_scheduled_tokens.r1`` (``steps[i]`` is
the i-th trace of the run, 0-based, i.e. step ``i + 1``; ``Divergence.step`` is the 1-based
step). Per-request dict fields are compared key by key; id lists are compared whole. Then the
summaries: startup, crash, run length, wedge, and each request's outcome. Each divergence
carries the scenario ``file:line`` of the request (or config key) involved, else of ``id:``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from typing import Any

from contract.trace import StepTrace
from parity.results import Divergence, DivergenceCollector, RequestOutcome, TargetRun
from parity.scenario import Scenario

TRACE_FIELDS = tuple(f.name for f in fields(StepTrace))
# RequestOutcome fields compared across targets (step numbers are covered by the traces).
OUTCOME_FIELDS = (
    "outcome",
    "finish_reason",
    "stop_reason",
    "num_output_tokens",
    "output_token_ids",
    "num_preemptions",
)
# Scalar trace fields and the config key that governs each.
_FIELD_CONFIG_KEY = {"num_free_blocks": "num_gpu_blocks_override"}


class _Builder(DivergenceCollector):
    """Creates divergences for one pair of runs, with locations from the scenario."""

    def __init__(self, scenario: Scenario, left: TargetRun, right: TargetRun) -> None:
        super().__init__(scenario, left.target, right.target)

    def add(
        self,
        kind: str,
        path: str,
        left: Any,
        right: Any,
        step: int | None = None,
        request_id: str | None = None,
        config_key: str | None = None,
    ) -> None:
        if request_id is not None:
            location = self.scenario.request_location(request_id)
        elif config_key is not None:
            location = self.scenario.location(("config", config_key))
        else:
            location = self.scenario.location()
        self.record(kind, path, left, right, location, step)


def diff_runs(scenario: Scenario, left: TargetRun, right: TargetRun) -> tuple[Divergence, ...]:
    """Every difference between two runs of ``scenario`` (empty tuple: parity)."""
    out = _Builder(scenario, left, right)
    a, b = left.summary, right.summary
    if a.started != b.started:
        out.add("startup", "startup", _startup(a.started, a.error), _startup(b.started, b.error))
        return tuple(out.found)
    if not a.started:
        return ()  # both refused: nothing to compare at this tier
    if (a.error is None) != (b.error is None):
        out.add("crash", "error", a.error, b.error)
    diverged = diff_traces(out, left.steps, right.steps)
    if not diverged and len(left.steps) != len(right.steps):
        step = min(len(left.steps), len(right.steps)) + 1
        out.add("length", "num_steps", len(left.steps), len(right.steps), step=step)
    left_wedge = a.wedge.describe() if a.wedge else None
    right_wedge = b.wedge.describe() if b.wedge else None
    if left_wedge != right_wedge:
        out.add("wedge", "wedge", left_wedge, right_wedge)
    for request in scenario.requests:
        _diff_outcome(out, request.id, a.outcomes.get(request.id), b.outcomes.get(request.id))
    return tuple(out.found)


def diff_traces(out: _Builder, left: Iterable[StepTrace], right: Iterable[StepTrace]) -> bool:
    """Compare step by step; record the first differing step's differences. True if any."""
    for index, (a, b) in enumerate(zip(left, right, strict=False)):
        if a == b:
            continue
        before = len(out.found)
        for name in TRACE_FIELDS:
            _diff_field(out, index, a.step, name, getattr(a, name), getattr(b, name))
        if len(out.found) > before:
            return True
    return False


def _diff_field(out: _Builder, index: int, step: int, name: str, a: Any, b: Any) -> None:
    if a == b:
        return
    path = f"steps[{index}].{name}"
    if isinstance(a, dict) and isinstance(b, dict):
        for key in _union_keys(a, b):
            if a.get(key, _ABSENT) != b.get(key, _ABSENT):
                left = a.get(key)
                right = b.get(key)
                out.add("trace", f"{path}.{key}", left, right, step=step, request_id=key)
        return
    if isinstance(a, tuple) and isinstance(b, tuple):
        out.add("trace", path, a, b, step=step, request_id=_first_difference(a, b))
        return
    out.add("trace", path, a, b, step=step, config_key=_FIELD_CONFIG_KEY.get(name))


def _diff_outcome(
    out: _Builder, request_id: str, a: RequestOutcome | None, b: RequestOutcome | None
) -> None:
    if a == b:
        return
    for name in OUTCOME_FIELDS:
        left = getattr(a, name) if a is not None else None
        right = getattr(b, name) if b is not None else None
        if left != right:
            out.add("outcome", f"outcomes.{request_id}.{name}", left, right, request_id=request_id)


class _Absent:
    def __repr__(self) -> str:
        return "<absent>"


_ABSENT = _Absent()


def _union_keys(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return list(a) + [key for key in b if key not in a]


def _first_difference(a: tuple[Any, ...], b: tuple[Any, ...]) -> str | None:
    for x, y in zip(a, b, strict=False):
        if x != y:
            return str(x)
    longer = a if len(a) > len(b) else b
    shorter = min(len(a), len(b))
    return str(longer[shorter]) if len(longer) > shorter else None


def _startup(started: bool, error: str | None) -> str:
    return "started" if started else f"refused: {error}"
