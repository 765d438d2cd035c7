"""Chat content parts to text and developer messages (engine/entrypoints/openai/content_parts.py,
chat_utils.developer_as_system); the same cases against the pinned server are in
tests/reliability/test_bad_input_diff.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from engine.entrypoints.openai.chat_utils import developer_as_system, parse_messages
from engine.entrypoints.openai.content_parts import content_text
from engine.entrypoints.openai.errors import VLLMValidationError


def test_text_parts_join_with_newlines_and_empty_ones_drop() -> None:
    parts = [
        {"type": "text", "text": " a"},
        {"type": "text", "text": ""},
        {"type": "text"},
        " b",
        {"type": "input_text", "text": " c"},
        {"type": "refusal", "refusal": " d"},
        {"type": "thinking", "thinking": " e"},
        {"type": "tool_reference", "name": "f"},
    ]
    assert content_text("user", parts, "m") == " a\n b\n c\n d\n e\nf"
    assert content_text("user", None, "m") == ""
    assert content_text("user", "", "m") == ""


@pytest.mark.parametrize(
    ("part", "message"),
    [
        ({"type": "image_url", "image_url": {"url": "x"}}, "served is not a multimodal model"),
        ({"audio_url": "x"}, "served is not a multimodal model"),
        ({"type": "image_embeds", "image_embeds": "AA=="}, "The model is not multimodal."),
        ({"type": "input_audio", "input_audio": 5}, "'int' object has no attribute 'get'"),
    ],
)
def test_media_parts_are_refused_by_a_text_model(part: object, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        content_text("user", [part], "served")


@pytest.mark.parametrize(
    ("part", "start", "param"),
    [
        ({"type": "foo"}, "Unsupported chat content part type: 'foo'. Supported types: ", "type"),
        ({"text": "x"}, "Missing 'type' field in multimodal part.", "type"),
        ({"type": "text", "text": "x", "uuid": "u"}, "Missing 'type' field", "type"),
        ({"type": 5}, "Invalid 'type' field in multimodal part.", "type"),
        ({"type": "prompt_embeds"}, "prompt_embeds content part requires", "prompt_embeds"),
    ],
)
def test_malformed_parts_name_the_field(part: object, start: str, param: str) -> None:
    with pytest.raises(VLLMValidationError) as raised:
        content_text("user", [part], "m")
    assert str(raised.value).startswith(start)
    assert raised.value.parameter == param


def test_url_parts_are_validated_as_their_typed_dicts() -> None:
    with pytest.raises(ValidationError, match="ChatCompletionContentPartAudioParam"):
        content_text("user", [{"type": "audio_url"}], "m")
    with pytest.raises(ValidationError, match="ChatCompletionContentPartImageParam"):
        content_text("user", [{"type": "image_url", "image_url": {"url": 5}}], "m")


def test_system_messages_lose_a_leading_billing_header_line() -> None:
    header = "x-anthropic-billing-header: cch=1"
    assert content_text("system", f"{header}\n b", "m") == " b"
    assert content_text("system", [{"type": "text", "text": header}, " c"], "m") == " c"
    assert content_text("user", f"{header}\n b", "m") == f"{header}\n b"


TEMPLATE = "{% for m in messages %}{{ m['role'] }}{% endfor %}"


def test_developer_messages_become_one_leading_system_message() -> None:
    conversation = parse_messages(
        [
            {"role": "system", "content": " s"},
            {"role": "user", "content": "u"},
            {"role": "developer", "content": " a", "tools": []},
            {"role": "system", "content": ""},
        ],
        "m",
    )
    assert developer_as_system(conversation, TEMPLATE) == [
        {"role": "system", "content": " s\n\n a"},
        {"role": "user", "content": "u"},
    ]


def test_developer_messages_stay_when_the_template_knows_them_or_nothing_moves() -> None:
    conversation = [{"role": "developer", "content": "d"}, {"role": "user", "content": "u"}]
    knows = "{% if m['role'] == 'developer' %}{% endif %}"
    assert developer_as_system(conversation, knows) == conversation
    assert developer_as_system(conversation, TEMPLATE) == [
        {"role": "system", "content": "d"},
        {"role": "user", "content": "u"},
    ]
    no_developer = [{"role": "user", "content": "u"}, {"role": "system", "content": "s"}]
    assert developer_as_system(no_developer, TEMPLATE) == no_developer
