"""The request models declare upstream's fields in upstream's order, with its defaults.

Field order is the order of a 400's error list, and ``request_fields.py`` builds both requests
from shared field groups listed as bases in reverse; this compares the result with the pinned
vLLM's own request models, field by field.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from engine.entrypoints.openai.chat_protocol import ChatCompletionRequest
from engine.entrypoints.openai.completion_protocol import CompletionRequest
from oracle.vllm_env import prepare_vllm_import

UPSTREAM = {
    ChatCompletionRequest: "vllm.entrypoints.openai.chat_completion.protocol",
    CompletionRequest: "vllm.entrypoints.openai.completion.protocol",
}


def _defaults(model: type[BaseModel]) -> list[tuple[str, Any]]:
    return [
        (name, "<factory>" if info.default_factory else info.default)
        for name, info in model.model_fields.items()
    ]


@pytest.mark.parametrize("ours", list(UPSTREAM), ids=lambda m: m.__name__)
def test_fields_defaults_and_order_are_upstreams(ours: type[BaseModel]) -> None:
    prepare_vllm_import()
    theirs = getattr(importlib.import_module(UPSTREAM[ours]), ours.__name__)
    assert list(ours.model_fields) == list(theirs.model_fields)
    assert _defaults(ours) == _defaults(theirs)


def test_two_bad_fields_in_different_groups_report_in_field_order() -> None:
    body = {
        "prompt": "x",
        "temperature": "hot",
        "top_k": 1.5,
        "priority": "x",
        "stream_interval": 0,
    }
    with pytest.raises(ValidationError) as caught:
        CompletionRequest.model_validate(body)
    locations = [error["loc"][0] for error in caught.value.errors()]
    assert locations == ["temperature", "top_k", "priority", "stream_interval"]
