"""Request validation: vLLM's status, error type, ``param`` and message (spec B6.3).

Messages and params are the pin's (``renderers/params.py``, ``sampling_params.py``,
``completion/protocol.py``, ``chat_completion/protocol.py``); checked once against the
pinned server with the same flags (every case here answered identically). Also: the official
``openai`` client against our server.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from contract.scripted import vocab
from contract.scripted.script import expected

pytestmark = [pytest.mark.server, pytest.mark.timeout(180)]

M = 512  # the module server's --max-model-len
P = [vocab.BOS, vocab.answer_selector(2)]


def error_of(response: httpx.Response, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == status
    return body["error"]


def cmpl(client: httpx.Client, **body: object) -> httpx.Response:
    return client.post("/v1/completions", json=body)


def test_max_tokens_above_max_model_len(client: httpx.Client) -> None:
    err = error_of(cmpl(client, prompt=P, max_tokens=M + 88))
    assert err["type"] == "BadRequestError"
    assert err["param"] == "max_tokens"
    assert err["message"] == (
        f"max_tokens={M + 88} cannot be greater than max_model_len={M}. "
        f"Please request fewer output tokens. (parameter=max_tokens, value={M + 88})"
    )


def test_chat_max_completion_tokens_param(client: httpx.Client) -> None:
    messages = [{"role": "user", "content": "hi"}]
    body = {"messages": messages, "max_completion_tokens": M + 1}
    err = error_of(client.post("/v1/chat/completions", json=body))
    assert err["param"] == "max_completion_tokens"
    assert err["message"].startswith(f"max_completion_tokens={M + 1} cannot be greater than")


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_ids_too_long(client: httpx.Client, stream: bool) -> None:
    err = error_of(cmpl(client, prompt=[5] * (M + 1), max_tokens=1, stream=stream))
    assert err["param"] == "input_tokens"
    assert err["message"] == (
        f"This model's maximum context length is {M} tokens. However, your prompt contains "
        f"at least {M + 1} input tokens, which exceeds this limit even without any output "
        f"tokens. Please reduce the length of the input prompt. (parameter=input_tokens, "
        f"value={M + 1})"
    )
    err = error_of(cmpl(client, prompt=[5] * (M + 7), max_tokens=1, stream=stream))
    assert f"your prompt contains {M + 7} input tokens" in err["message"]


def test_text_prompt_too_long_reports_at_least(client: httpx.Client) -> None:
    err = error_of(cmpl(client, prompt=" 5" * (M + 40), max_tokens=1))
    assert err["param"] == "input_tokens"
    assert f"your prompt contains at least {M + 1} input tokens" in err["message"]


def test_prompt_exactly_max_model_len(client: httpx.Client) -> None:
    err = error_of(cmpl(client, prompt=[5] * M))
    assert err["param"] == "max_tokens"
    assert err["message"] == "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"


def test_clamp_to_headroom(client: httpx.Client) -> None:
    prompt = [vocab.BOS] + [vocab.LOOP] * (M - 13)
    body = cmpl(client, prompt=prompt, max_tokens=100, return_token_ids=True).json()
    assert body["choices"][0]["token_ids"] == expected(prompt, 12)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["total_tokens"] == M


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"max_tokens": 0}, "max_tokens", "max_tokens must be at least 1, got 0."),
        ({"max_tokens": -3}, "max_tokens", "max_tokens must be at least 1, got -3."),
        ({"temperature": 3}, "temperature", "temperature must be in [0, 2], got 3.0."),
        ({"top_p": 0}, "top_p", "top_p must be in (0, 1], got 0.0."),
        ({"n": 2, "temperature": 0}, None, "n must be 1 when using greedy sampling, got 2."),
        ({"logprobs": -2}, "logprobs", "`logprobs` must be a positive value or -1."),
        ({"stream_options": {"include_usage": True}}, "stream_options",
         "Stream options can only be defined when `stream=True`."),
        ({"prompt": ""}, "prompt", "Either prompt or prompt_embeds must be provided and non-empty."),
        ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs",
         "`prompt_logprobs` are not available when `stream=True`."),
        ({"min_tokens": 5, "max_tokens": 2}, None,
         "min_tokens must be less than or equal to max_tokens=2, got 5."),
        ({"logprobs": 30}, "logprobs", "Requested sample logprobs of 30, which is greater than max allowed: 20"),
        ({"prompt": [vocab.BOS, 999]}, None, "Token id 999 is out of vocabulary"),
        ({"prompt": [[]]}, None, "The decoder prompt cannot be empty"),
        ({"prompt": []}, None, "You must pass at least one prompt"),
    ],
)  # fmt: skip
def test_completion_validation(
    client: httpx.Client, body: dict, param: str | None, message: str
) -> None:
    request = {"prompt": P, "max_tokens": 4, **body}
    err = error_of(cmpl(client, **request))
    assert err["param"] == param
    assert err["type"] == "BadRequestError"
    assert err["message"].startswith(message), err["message"]


def test_engine_side_errors_stream_as_error_frame(client: httpx.Client, sse) -> None:
    """Checks upstream runs inside ``generate`` arrive after the 200 in streaming mode."""
    response = cmpl(client, prompt=P, logprobs=30, stream=True)
    assert response.status_code == 200
    frames = sse(response.text)
    assert frames[-1] == "[DONE]"
    err = json.loads(frames[0])["error"]
    assert (err["param"], err["code"], err["type"]) == ("logprobs", 400, "BadRequestError")


def test_pydantic_errors_are_400_with_location(client: httpx.Client) -> None:
    err = error_of(cmpl(client, prompt=P, max_tokens="abc"))
    assert err["type"] == "Bad Request"
    assert err["param"] == "body.max_tokens"
    assert err["message"].startswith("1 validation error:\n  {'type': 'int_parsing'")
    err = error_of(client.post("/v1/chat/completions", json={"max_tokens": 3}))
    assert err["param"] == "body.messages"


def test_bad_json_and_content_type(client: httpx.Client) -> None:
    headers = {"Content-Type": "application/json"}
    err = error_of(client.post("/v1/completions", content=b"{not json", headers=headers))
    assert err["type"] == "Bad Request"
    assert "json_invalid" in err["message"]
    err = error_of(
        client.post("/v1/completions", content=b"{}", headers={"Content-Type": "text/plain"})
    )
    assert (
        err["message"]
        == "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
    )
    assert err["param"] is None


def test_unknown_model_is_404(client: httpx.Client) -> None:
    err = error_of(cmpl(client, model="nope", prompt=P), 404)
    assert err == {
        "message": "The model `nope` does not exist. Valid aliases: scripted.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }


def test_truncate_prompt_tokens_keeps_the_tail(client: httpx.Client) -> None:
    """A generating model's tokenizer truncates on the left (tokenizers/registry.py:134-138)."""
    prompt = [vocab.BOS] + [5] * (M + 50) + [vocab.answer_selector(3)]
    body = cmpl(client, prompt=prompt, max_tokens=3, truncate_prompt_tokens=2).json()
    assert body["usage"]["prompt_tokens"] == 2
    assert body["choices"][0]["text"] == " 2 1 0"
    err = error_of(cmpl(client, prompt=P, truncate_prompt_tokens=M + 1))
    assert err["param"] == "truncate_prompt_tokens"


def test_suffix_needs_fim(client: httpx.Client) -> None:
    err = error_of(cmpl(client, prompt="a", suffix="b"))
    assert (err["param"], err["message"]) == (
        "suffix",
        "suffix is only supported for models with FIM completion rendering",
    )


def test_unknown_fields_are_ignored(client: httpx.Client) -> None:
    body = cmpl(client, prompt=P, max_tokens=3, not_a_field=1).json()
    assert body["choices"][0]["text"] == " 1 0"


def test_chat_request_template_refused(client: httpx.Client) -> None:
    messages = [{"role": "user", "content": "hi"}]
    body = {"messages": messages, "chat_template_kwargs": {"chat_template": "x"}}
    err = error_of(client.post("/v1/chat/completions", json=body))
    assert err["message"].startswith("Chat template is passed with request")


def test_unknown_route_and_method(client: httpx.Client) -> None:
    """Starlette's routing errors bypass the handlers (they are not FastAPI's HTTPException)."""
    missing = client.get("/v1/nope")
    assert (missing.status_code, missing.json()) == (404, {"detail": "Not Found"})
    wrong = client.get("/v1/completions")
    assert (wrong.status_code, wrong.json()) == (405, {"detail": "Method Not Allowed"})


def test_openai_client(scripted_server) -> None:
    api = openai.OpenAI(base_url=f"{scripted_server.url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in api.models.list().data] == ["scripted"]
    done = api.completions.create(model="scripted", prompt=P, max_tokens=5)
    assert done.choices[0].text == " 1 0"
    assert done.choices[0].finish_reason == "stop"
    streamed = api.completions.create(model="scripted", prompt=P, max_tokens=5, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == " 1 0"
    messages = [{"role": "user", "content": "<|think:3|><|answer:2|>"}]
    reply = api.chat.completions.create(model="scripted", messages=messages, max_tokens=200)
    assert reply.choices[0].message.content == " 1 0"
    assert reply.usage.completion_tokens == 8
    chunks = list(
        api.chat.completions.create(
            model="scripted", messages=messages, max_tokens=200, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == " 1 0"
    assert chunks[-1].usage.total_tokens == 14
    with pytest.raises(openai.BadRequestError) as info:
        api.completions.create(model="scripted", prompt=P, max_tokens=M + 1)
    assert info.value.status_code == 400
    assert info.value.body["param"] == "max_tokens"
    with pytest.raises(openai.NotFoundError):
        api.completions.create(model="other", prompt=P, max_tokens=1)
