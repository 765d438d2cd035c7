"""Build a ``StepTrace`` (contract/trace.py) from our engine core after one step.

``EngineCore.step`` returns a ``StepResult``; whoever wants a trace (the scheduler-tier target
``parity/targets/engine.py``, the benchmarks, tests) builds it here, right after the step, before
anything else changes the scheduler. The observation points are the ones ``contract/trace.py``
documents: scheduled ids and token counts from this step's ``SchedulerOutput``; preempted ids in
preemption order from this ``schedule()``; everything else read after ``update_from_output()``.

Conventions both sides must share (the oracle adapter builds the same fields; the finished and
sampled ones are collected by ``contract.trace.StepOutcomes`` on both sides):
- ``finished`` / ``stop_reasons``: requests finished by this step's ``update_from_output``, plus
  requests aborted (``finish_requests``) since the previous step; finish reasons as strings.
- ``sampled_token_ids``: only requests that got at least one token this step (after trimming).
- ``block_ids``: every request in ``running``, in running order.
- ``num_computed_tokens``: every unfinished request (running, then waiting).
"""

from __future__ import annotations

from contract.trace import StepOutcomes, StepTrace
from engine.core.engine_core import EngineCore, StepResult
from engine.core.outputs import EngineCoreOutput
from engine.core.sched.scheduler import Scheduler


def build_step_trace(scheduler: Scheduler, result: StepResult) -> StepTrace:
    """The trace of ``result``'s step; call right after the step that returned it."""
    outcomes = StepOutcomes()
    for req_id, (reason, stop_reason) in result.aborted.items():
        outcomes.finish(req_id, reason, stop_reason)
    for out in result.outputs:
        outcomes.add(out)

    scheduler_output = result.scheduler_output
    cached = scheduler_output.scheduled_cached_reqs
    resumed = cached.resumed_req_ids
    kv = scheduler.kv_cache_manager
    num_computed = {r.request_id: r.num_computed_tokens for r in scheduler.running}
    num_computed.update((r.request_id, r.num_computed_tokens) for r in scheduler.waiting)
    return StepTrace(
        step=result.step,
        num_scheduled_tokens=dict(scheduler_output.num_scheduled_tokens),
        scheduled_new_req_ids=result.scheduled_new_req_ids,
        scheduled_resumed_req_ids=tuple(i for i in cached.req_ids if i in resumed),
        scheduled_running_req_ids=tuple(i for i in cached.req_ids if i not in resumed),
        preempted_req_ids=result.preempted_req_ids,
        finished=outcomes.finished,
        stop_reasons=outcomes.stop_reasons,
        sampled_token_ids=outcomes.sampled_token_ids,
        block_ids={
            r.request_id: tuple(kv.req_to_block_ids.get(r.request_id, ()))
            for r in scheduler.running
        },
        num_computed_tokens=num_computed,
        running=tuple(r.request_id for r in scheduler.running),
        waiting=tuple(r.request_id for r in scheduler.waiting),
        num_free_blocks=kv.block_pool.get_num_free_blocks(),
    )


def traced_step(core: EngineCore) -> tuple[list[EngineCoreOutput], StepTrace]:
    """One ``core.step()``: its outputs and its trace."""
    result = core.step()
    return result.outputs, build_step_trace(core.scheduler, result)
