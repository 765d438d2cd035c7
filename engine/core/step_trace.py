"""Build a ``StepTrace`` (contract/trace.py) from our scheduler after one step.

The observation points are the ones ``contract/trace.py`` documents: scheduled ids and token counts
from this step's ``SchedulerOutput``; preempted ids in preemption order from this
``schedule()``; everything else read after ``update_from_output()``.

Conventions both sides must share (the oracle adapter builds the same fields):
- ``finished`` / ``stop_reasons``: requests finished by this step's ``update_from_output``, plus
  requests aborted (``finish_requests``) since the previous step; finish reasons as strings.
- ``sampled_token_ids``: only requests that got at least one token this step (after trimming).
- ``block_ids``: every request in ``running``, in running order.
- ``num_computed_tokens``: every unfinished request (running, then waiting).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from contract.trace import StepTrace
from engine.core.outputs import EngineCoreOutput
from engine.core.sched.output import SchedulerOutput
from engine.core.sched.scheduler import Scheduler


def build_step_trace(
    step: int,
    scheduler: Scheduler,
    scheduler_output: SchedulerOutput,
    outputs: Sequence[EngineCoreOutput],
    aborted: Mapping[str, tuple[str, int | str | None]] | None = None,
) -> StepTrace:
    """The trace of step ``step`` (1-based); call right after ``update_from_output``.

    ``aborted`` maps request ids finished outside the step to (finish reason, stop_reason).
    """
    finished: dict[str, str] = {}
    stop_reasons: dict[str, int | str | None] = {}
    for req_id, (reason, stop_reason) in (aborted or {}).items():
        finished[req_id] = reason
        stop_reasons[req_id] = stop_reason
    sampled: dict[str, tuple[int, ...]] = {}
    for out in outputs:
        if out.new_token_ids:
            sampled[out.request_id] = tuple(out.new_token_ids)
        if out.finish_reason is not None:
            finished[out.request_id] = str(out.finish_reason)
            stop_reasons[out.request_id] = out.stop_reason

    cached = scheduler_output.scheduled_cached_reqs
    resumed = cached.resumed_req_ids
    kv = scheduler.kv_cache_manager
    num_computed = {r.request_id: r.num_computed_tokens for r in scheduler.running}
    num_computed.update((r.request_id, r.num_computed_tokens) for r in scheduler.waiting)
    return StepTrace(
        step=step,
        num_scheduled_tokens=dict(scheduler_output.num_scheduled_tokens),
        scheduled_new_req_ids=tuple(r.req_id for r in scheduler_output.scheduled_new_reqs),
        scheduled_resumed_req_ids=tuple(i for i in cached.req_ids if i in resumed),
        scheduled_running_req_ids=tuple(i for i in cached.req_ids if i not in resumed),
        preempted_req_ids=tuple(scheduler.last_preempted_req_ids),
        finished=finished,
        stop_reasons=stop_reasons,
        sampled_token_ids=sampled,
        block_ids={
            r.request_id: tuple(kv.req_to_block_ids.get(r.request_id, ()))
            for r in scheduler.running
        },
        num_computed_tokens=num_computed,
        running=tuple(r.request_id for r in scheduler.running),
        waiting=tuple(r.request_id for r in scheduler.waiting),
        num_free_blocks=kv.block_pool.get_num_free_blocks(),
    )
