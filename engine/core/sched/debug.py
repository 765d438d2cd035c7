"""A scheduler-state dump for diagnosing wedges: queues, blocks held, and why the head waits.

Not upstream (vLLM has no such dump; its closest evidence is the periodic "Running: 0 reqs,
Waiting: 1 reqs" log line and ``vllm:num_requests_waiting``). The explanation of the head waiting
request replays the admission checks of our ``Scheduler._schedule_waiting``, which mirrors the
pinned ``v1/core/sched/scheduler.py:899-1396`` (max_num_seqs, the token budget without chunked
prefill, the full-sequence KV gate ``scheduler_reserve_full_isl``, the watermark), without
changing any state: the prefix lookup only reads the cache.

``scheduler_state`` must run where the scheduler cannot change underneath it: on the engine
thread between steps (``AsyncLLM.debug_state`` does that), or in the caller's thread at the
scheduler tier. The result is plain JSON-able data; ``format_state`` renders it for a log.
"""

from __future__ import annotations

import json
import math
from typing import Any

from engine.core.sched.scheduler import Scheduler
from engine.request import Request


def scheduler_state(scheduler: Scheduler) -> dict[str, Any]:
    """Queues, pool, limits and the head waiting request's admission verdict."""
    kv = scheduler.kv_cache_manager
    pool = kv.block_pool
    num_free = pool.get_num_free_blocks()
    free_cached = sum(1 for block in pool.free_block_queue if block.block_hash is not None)
    head = explain_head(scheduler)
    return {
        "limits": {
            "block_size": scheduler.block_size,
            "max_model_len": scheduler.max_model_len,
            "max_num_seqs": scheduler.max_num_running_reqs,
            "max_num_batched_tokens": scheduler.max_num_scheduled_tokens,
            "enable_chunked_prefill": scheduler.enable_chunked_prefill,
            "enable_prefix_caching": kv.enable_caching,
            "scheduler_reserve_full_isl": scheduler.scheduler_reserve_full_isl,
            "watermark_blocks": kv.watermark_blocks,
            "policy": scheduler.policy.value,
            "divergence": list(scheduler.deviations.names),
        },
        "pool": {
            "num_blocks": pool.num_gpu_blocks,  # the null block included
            "num_usable_blocks": pool.num_gpu_blocks - 1,
            "num_free_blocks": num_free,  # evictable cached blocks included
            "num_free_cached_blocks": free_cached,
            "num_held_blocks": pool.num_gpu_blocks - 1 - num_free,
            "usage": pool.get_usage(),
        },
        "num_running": len(scheduler.running),
        "num_waiting": len(scheduler.waiting),
        "num_preemptions": scheduler.num_preemptions,
        "running": [_request(scheduler, r) for r in scheduler.running],
        "waiting": [_request(scheduler, r) for r in scheduler.waiting],
        "head_waiting": head,
        "wedged": bool(head and not scheduler.running and not head["schedulable"]),
    }


def _request(scheduler: Scheduler, request: Request) -> dict[str, Any]:
    block_ids = scheduler.kv_cache_manager.get_block_ids(request.request_id)
    return {
        "request_id": request.request_id,
        "status": str(request.status),
        "num_computed_tokens": request.num_computed_tokens,
        "num_tokens": request.num_tokens,
        "num_prompt_tokens": request.num_prompt_tokens,
        "num_output_tokens": request.num_output_tokens,
        "max_tokens": request.max_tokens,
        "num_blocks_held": len(block_ids),
        "block_ids": block_ids,
        "num_preemptions": request.num_preemptions,
        "priority": request.priority,
    }


def explain_head(scheduler: Scheduler) -> dict[str, Any] | None:
    """Why the head waiting request is (not) admitted at the next step; None if none waits."""
    if not scheduler.waiting:
        return None
    request = scheduler.waiting.peek_request()
    kv = scheduler.kv_cache_manager
    bs = scheduler.block_size
    usable = kv.block_pool.num_gpu_blocks - 1
    num_free = kv.block_pool.get_num_free_blocks()
    hits, num_hit_tokens = kv.get_computed_blocks(request)
    num_new_tokens = request.num_tokens - num_hit_tokens
    budget = scheduler.max_num_scheduled_tokens
    if scheduler.scheduler_reserve_full_isl:  # the whole sequence must fit (the default)
        gate_tokens = min(request.num_tokens, scheduler.max_model_len)
    else:
        gate_tokens = min(num_hit_tokens + min(num_new_tokens, budget), scheduler.max_model_len)
    blocks_total = math.ceil(gate_tokens / bs)
    blocks_needed = kv._num_blocks_to_allocate(request.request_id, gate_tokens, hits)
    watermark = kv.watermark_blocks if scheduler.running else 0
    reasons: list[str] = []
    if len(scheduler.running) >= scheduler.max_num_running_reqs:
        reasons.append(
            f"max_num_seqs: {len(scheduler.running)} running of {scheduler.max_num_running_reqs}"
        )
    if not scheduler.enable_chunked_prefill and num_new_tokens > budget:
        reasons.append(
            f"token budget: {num_new_tokens} new tokens exceed max_num_batched_tokens {budget} "
            "with chunked prefill off"
        )
    kv_short = blocks_needed + watermark > num_free
    if kv_short:
        reasons.append(
            f"KV cache: needs {blocks_needed} blocks from the free queue ({blocks_total} for "
            f"{gate_tokens} "
            f"tokens at block size {bs}"
            + (f", plus a watermark of {watermark}" if watermark else "")
            + f"), {num_free} free of {usable} usable"
        )
    can_ever_fit = blocks_total <= usable
    return {
        "request_id": request.request_id,
        "status": str(request.status),
        "schedulable": not reasons,
        "reasons": reasons,
        "num_tokens": request.num_tokens,
        "num_prefix_hit_tokens": num_hit_tokens,
        "num_new_tokens": num_new_tokens,
        "token_budget": budget,
        "gate_tokens": gate_tokens,
        "blocks_total": blocks_total,
        "blocks_needed": blocks_needed,
        "blocks_free": num_free,
        "blocks_usable": usable,
        "watermark_blocks": watermark,
        "num_running": len(scheduler.running),
        "max_num_seqs": scheduler.max_num_running_reqs,
        "can_ever_fit": can_ever_fit,
        "explanation": _explain(scheduler, request, reasons, blocks_total, usable, can_ever_fit),
    }


def _explain(
    scheduler: Scheduler,
    request: Request,
    reasons: list[str],
    blocks_total: int,
    usable: int,
    can_ever_fit: bool,
) -> str:
    who = f"{request.request_id} ({request.status}"
    if request.num_preemptions:
        who += f", preempted {request.num_preemptions}x"
    who += ")"
    if not reasons:
        return f"{who} is schedulable at the next step"
    text = f"{who} cannot be scheduled: " + "; ".join(reasons)
    if not scheduler.running:
        if not can_ever_fit:
            text += (
                f". Nothing is running and it needs {blocks_total} blocks, more than the "
                f"{usable} usable in the pool ({usable + 1} blocks, one is the null block): it "
                "can never be scheduled (wedged)"
            )
        else:
            text += ". Nothing is running: it is admitted once blocks are freed"
    else:
        text += f". {len(scheduler.running)} running request(s) hold blocks: it waits for them"
    return text


def format_state(state: dict[str, Any]) -> list[str]:
    """Log lines for a dump (``scheduler_state``, optionally wrapped by ``AsyncLLM``)."""
    sched = state.get("scheduler", state)
    pool = sched["pool"]
    lines = [
        f"scheduler state: running {sched['num_running']}, waiting {sched['num_waiting']}, "
        f"KV {pool['num_free_blocks']}/{pool['num_usable_blocks']} usable blocks free "
        f"({pool['num_blocks']} with the null block, usage {pool['usage']:.1%}), "
        f"preemptions {sched['num_preemptions']}, wedged {sched['wedged']}"
    ]
    for queue in ("running", "waiting"):
        for item in sched[queue]:
            lines.append(
                f"  {queue} {item['request_id']}: {item['status']}, computed "
                f"{item['num_computed_tokens']}/{item['num_tokens']} tokens, "
                f"{item['num_blocks_held']} blocks {item['block_ids']}, "
                f"{item['num_preemptions']} preemptions"
            )
    head = sched.get("head_waiting")
    if head is not None:
        lines.append(f"  head: {head['explanation']}")
    lines.append("scheduler state JSON: " + json.dumps(state, separators=(",", ":")))
    return lines
