"""A test double: a scheduler-tier target that replays given step traces.

Like httpx's ``MockTransport``, it ships with the package so the runner and differ can be
exercised without an engine: ``ReplayTarget(traces)`` returns the traces in order, then idle
steps that keep the last queues (a wedged scheduler), renumbered consecutively.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from contract.trace import StepTrace
from parity.errors import TargetStartError
from parity.scenario import ConfigSpec, RequestSpec


class ReplayTarget:
    """Returns ``traces`` one per ``step()``; records what was submitted."""

    tier = "scheduler"

    def __init__(
        self, traces: Sequence[StepTrace], name: str = "replay", refuse: str | None = None
    ) -> None:
        self.name = name
        self.traces = list(traces)
        self.refuse = refuse
        self.submitted: list[tuple[int, str]] = []  # (steps taken so far, request id)
        self.num_steps = 0
        self.closed = False

    def start(self, config: ConfigSpec) -> None:
        if self.refuse is not None:
            raise TargetStartError(self.refuse)
        self.num_steps = 0
        self.submitted.clear()
        self.closed = False

    def submit(self, request: RequestSpec) -> None:
        self.submitted.append((self.num_steps, request.id))

    def step(self) -> StepTrace:
        self.num_steps += 1
        if self.num_steps <= len(self.traces):
            return self.traces[self.num_steps - 1]
        last = self.traces[-1] if self.traces else None
        return idle_step(self.num_steps, last)

    def close(self) -> None:
        self.closed = True


def idle_step(step: int, previous: StepTrace | None) -> StepTrace:
    """A step that scheduled nothing and changed nothing since ``previous``."""
    if previous is None:
        return StepTrace(step, {}, (), (), (), (), {}, {}, {}, {}, {}, (), (), 0)
    return replace(
        previous,
        step=step,
        num_scheduled_tokens={},
        scheduled_new_req_ids=(),
        scheduled_resumed_req_ids=(),
        scheduled_running_req_ids=(),
        preempted_req_ids=(),
        finished={},
        stop_reasons={},
        sampled_token_ids={},
    )
