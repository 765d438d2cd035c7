"""Per-step scheduler traces: the unit both tiers compare.

A ``StepTrace`` is what one engine step did, as plain values. Our engine core and the oracle's
scheduler adapter (``oracle/scheduler_adapter.py``) both emit it, field for field, so the differ
(``parity/``) can report a dotted path such as ``step 46: num_scheduled_tokens.r1``.

Observation points (both sides must follow them exactly):
- ``num_scheduled_tokens`` and ``scheduled_*_req_ids`` come from the ``SchedulerOutput`` of this
  step's ``schedule()`` (upstream: ``vllm/v1/core/sched/output.py``).
- ``preempted_req_ids`` are the requests preempted inside this step's ``schedule()``, in
  preemption order.
- Everything else is read after this step's ``update_from_output()``: ``finished`` maps each
  request that finished in this step to its finish reason string (``stop``, ``length``,
  ``abort``, ``error``, ``repetition``), ``stop_reasons`` the matching ``stop_reason`` (token id,
  string or None); ``sampled_token_ids`` the tokens appended to each request in this step;
  ``block_ids`` the KV block ids held by each request in ``running`` order; ``num_computed_tokens``
  for every unfinished request; ``running`` and ``waiting`` the queue orders; ``num_free_blocks``
  the block pool's free count (null block excluded).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class StepTrace:
    """One scheduler step, as plain values (see the module docstring for when each is read)."""

    step: int  # 1-based scheduler iteration
    num_scheduled_tokens: dict[str, int]  # request_id -> tokens scheduled this step
    scheduled_new_req_ids: tuple[str, ...]  # admitted from WAITING this step, in order
    scheduled_resumed_req_ids: tuple[str, ...]  # admitted from PREEMPTED this step, in order
    scheduled_running_req_ids: tuple[str, ...]  # already running and scheduled, in order
    preempted_req_ids: tuple[str, ...]  # preempted during this schedule(), in order
    finished: dict[str, str]  # request_id -> finish reason, finished in this step
    stop_reasons: dict[str, int | str | None]  # request_id -> stop_reason, for `finished`
    sampled_token_ids: dict[str, tuple[int, ...]]  # tokens appended this step
    block_ids: dict[str, tuple[int, ...]]  # running requests -> KV block ids held
    num_computed_tokens: dict[str, int]  # every unfinished request, after the step
    running: tuple[str, ...]  # scheduler.running order after the step
    waiting: tuple[str, ...]  # waiting queue order after the step (front first)
    num_free_blocks: int  # free blocks in the pool after the step (null block excluded)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples become lists)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepTrace:
        """Inverse of ``to_json``."""
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown StepTrace fields: {sorted(unknown)}")
        values = dict(data)
        for key in (
            "scheduled_new_req_ids",
            "scheduled_resumed_req_ids",
            "scheduled_running_req_ids",
            "preempted_req_ids",
            "running",
            "waiting",
        ):
            values[key] = tuple(values[key])
        for key in ("sampled_token_ids", "block_ids"):
            values[key] = {k: tuple(v) for k, v in values[key].items()}
        return cls(**values)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    @property
    def is_idle(self) -> bool:
        """True when this step scheduled nothing."""
        return not self.num_scheduled_tokens


class CoreOutputLike(Protocol):
    """What a trace reads of one request's output of a step (our ``EngineCoreOutput``,
    upstream's ``vllm/v1/engine/__init__.py`` ``EngineCoreOutput``)."""

    @property
    def request_id(self) -> str: ...
    @property
    def new_token_ids(self) -> Sequence[int]: ...
    @property
    def finish_reason(self) -> object: ...  # None, or an enum whose str() is the reason name
    @property
    def stop_reason(self) -> int | str | None: ...


@dataclass(slots=True)
class StepOutcomes:
    """``finished``, ``stop_reasons`` and ``sampled_token_ids`` of one step, collected the same
    way by both sides (see the module docstring): an output with new tokens is sampled, one with
    a finish reason is finished; a later entry for a request replaces an earlier one."""

    finished: dict[str, str] = field(default_factory=dict)
    stop_reasons: dict[str, int | str | None] = field(default_factory=dict)
    sampled_token_ids: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def finish(self, request_id: str, reason: str, stop_reason: int | str | None) -> None:
        self.finished[request_id] = reason
        self.stop_reasons[request_id] = stop_reason

    def add(self, output: CoreOutputLike) -> None:
        if output.new_token_ids:
            self.sampled_token_ids[output.request_id] = tuple(output.new_token_ids)
        if output.finish_reason is not None:
            self.finish(output.request_id, str(output.finish_reason), output.stop_reason)
