"""Reasoning parsers by name (``--reasoning-parser``).

Mirrors the registry of ``vllm/reasoning/__init__.py`` / ``abs_reasoning_parsers.py:216-364``
at the pin, reduced to the parsers this engine implements. Build the (stateless) parser once
per server, ``get_reasoning_parser(name)(tokenizer)``, and wrap it per request and choice in a
``RequestReasoningParser`` (stateful). An unknown name raises
``UnknownReasoningParserError`` with the text of the pin's startup check
(``entrypoints/launchers/launcher.py:367-373``); upstream lists its own (much longer) registry.
"""

from __future__ import annotations

from engine.reasoning.base import (
    DeltaMessage,
    ReasoningParserTokenizerError,
    ThinkingReasoningParser,
)
from engine.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from engine.reasoning.stream import RequestReasoningParser

__all__ = [
    "DeepSeekR1ReasoningParser",
    "DeltaMessage",
    "ReasoningParserTokenizerError",
    "RequestReasoningParser",
    "ThinkingReasoningParser",
    "UnknownReasoningParserError",
    "get_reasoning_parser",
    "list_registered",
]

_REGISTRY: dict[str, type[ThinkingReasoningParser]] = {
    "deepseek_r1": DeepSeekR1ReasoningParser,
}


class UnknownReasoningParserError(KeyError):
    """``--reasoning-parser`` names no registered parser."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def list_registered() -> list[str]:
    return sorted(_REGISTRY)


def get_reasoning_parser(name: str) -> type[ThinkingReasoningParser]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownReasoningParserError(
            f"invalid reasoning parser: {name} (chose from {{ {','.join(list_registered())} }})"
        ) from None
