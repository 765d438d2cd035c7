"""The pre-rename reasoning field: ``reasoning_content`` where upstream says ``reasoning``.

What the ``reasoning-content-field`` divergence profile does (engine/divergence.py, ledger
entry ``reasoning-content-field``); ``serving_chat.py`` applies it when its flag is on. At the pin
the field is ``ChatMessage.reasoning`` (``entrypoints/openai/chat_completion/protocol.py:79``)
and ``DeltaMessage.reasoning`` (``entrypoints/generate/base/protocol.py:359``). Nothing but the
field's name changes.
"""

from __future__ import annotations

import json
from typing import Any

from engine.entrypoints.openai.protocol import DeltaMessage


def legacy_delta(delta: DeltaMessage) -> DeltaMessage:
    """The delta with its ``reasoning`` (when set) sent as ``reasoning_content``."""
    if "reasoning" not in delta.model_fields_set:
        return delta
    fields = {k: getattr(delta, k) for k in delta.model_fields_set if k != "reasoning"}
    fields["reasoning_content"] = delta.reasoning  # an extra field (extra="allow")
    return type(delta)(**fields)


class LegacyReasoningResponse:
    """Dumps like the wrapped ``ChatCompletionResponse``, each message's ``reasoning`` renamed
    (attribute access passes through)."""

    def __init__(self, response: Any) -> None:
        self.response = response

    def __getattr__(self, name: str) -> Any:
        return getattr(self.response, name)

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        data: dict[str, Any] = self.response.model_dump(**kwargs)
        for choice in data.get("choices") or ():
            message = choice.get("message")
            if isinstance(message, dict) and "reasoning" in message:
                choice["message"] = {
                    ("reasoning_content" if key == "reasoning" else key): value
                    for key, value in message.items()
                }
        return data

    def model_dump_json(self, **kwargs: Any) -> str:
        return json.dumps(self.model_dump(mode="json", **kwargs), separators=(",", ":"))
