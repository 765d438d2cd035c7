"""Text prompts at the scheduler tier: ``prompt: "<|answer:5|>"`` tokenized to prompt ids.

Upstream: none; vLLM's completions endpoint tokenizes a text prompt with the model's tokenizer,
special tokens added (``add_special_tokens`` defaults to true), and this module does the same in
process so a scheduler-tier request sees the ids a served one would.
The scripted models (``scripted``, ``random``) share one tokenizer, built in memory from
``contract.scripted.tokenizer.tokenizer_json()`` (no model folder needed); any other model is a
folder whose ``tokenizer.json`` is read.

A text prompt is checked, since a byte-level BPE tokenizes any text and a typo would silently
turn into byte tokens: every ``<...>`` must be a token of the vocabulary (for the scripted model:
a selector of ``contract.scripted.script`` such as ``<|think:3|>``, ``<|answer:5|>``,
``<|loop|>``, ``<|utf8|>``, or ``<s>``, ``</s>``...), and, for the scripted model, every word must
be one token (``" 5"``, ``" a"``, ``" tick"``). Raw byte tokens are written as
``prompt_token_ids``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tokenizers import Tokenizer

from contract.scripted import vocab
from contract.scripted.builder import VARIANTS
from contract.scripted.tokenizer import tokenizer_json

_MARKUP = re.compile(r"<[^<>\s]*>")
SCRIPTED_TOKENS = (
    f"<|think:0|>..<|think:{vocab.MAX_THINK}|>, <|answer:0|>..<|answer:{vocab.MAX_ANSWER}|>, "
    "<|loop|>, <|utf8|>, <s>, </s>, <|system|>, <|user|>, <|assistant|>, <think>, </think>"
)
SCRIPTED_WORDS = "0..99, a..z, tick, tock, um"


class PromptError(ValueError):
    """A text prompt the model's vocabulary cannot spell (one line)."""


@dataclass(frozen=True)
class PromptTokenizer:
    """The tokenizer of one model, with the checks of a scheduler-tier text prompt."""

    tokenizer: Tokenizer
    scripted: bool

    def encode(self, text: str) -> list[int]:
        """Prompt ids of ``text`` (special tokens added, as the server does), or ``PromptError``."""
        added = set(self.tokenizer.get_added_tokens_decoder().values())
        names = {token.content for token in added}
        unknown = [m.group() for m in _MARKUP.finditer(text) if m.group() not in names]
        if unknown:
            known = SCRIPTED_TOKENS if self.scripted else "the model's added tokens"
            raise PromptError(f"unknown selector {_listed(unknown)} (known: {known})")
        encoding = self.tokenizer.encode(text)
        if self.scripted:
            words = _multi_token_words(text, encoding.word_ids, encoding.offsets)
            if words:
                raise PromptError(
                    f"unknown word {_listed(words)}: not one token of the scripted vocabulary "
                    f"(words: {SCRIPTED_WORDS}; selectors: {SCRIPTED_TOKENS}); "
                    "write other tokens as prompt_token_ids"
                )
        return list(encoding.ids)


def _multi_token_words(
    text: str, word_ids: list[int | None], offsets: list[tuple[int, int]]
) -> list[str]:
    """The words (pre-tokenizer pieces) that take more than one token."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for word, span in zip(word_ids, offsets, strict=True):
        if word is not None:
            spans.setdefault(word, []).append(span)
    found = []
    for pieces in spans.values():
        if len(pieces) > 1:
            piece = text[min(p[0] for p in pieces) : max(p[1] for p in pieces)]
            if piece not in found:
                found.append(piece)
    return found


def _listed(items: list[str]) -> str:
    return ", ".join(repr(item) for item in items)


def tokenizer_for(model: str | None) -> PromptTokenizer:
    """The tokenizer of ``config.model`` (``None``: the scripted model); ``PromptError`` when a
    model folder has no ``tokenizer.json``."""
    name = model or "scripted"
    if name in VARIANTS:
        return _scripted()
    from parity.serve.spec import resolve_model

    path = resolve_model(name) / "tokenizer.json"
    try:
        return _from_file(str(path))
    except Exception as exc:  # tokenizers raises its own Exception subclass
        raise PromptError(f"text prompts need the model's tokenizer: {path}: {exc}") from None


@cache
def _scripted() -> PromptTokenizer:
    return PromptTokenizer(Tokenizer.from_str(json.dumps(tokenizer_json())), scripted=True)


@cache
def _from_file(path: str) -> PromptTokenizer:
    return PromptTokenizer(Tokenizer.from_file(str(Path(path))), scripted=False)
