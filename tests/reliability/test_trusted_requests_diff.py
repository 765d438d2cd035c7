"""Differential: our engine server against the pinned oracle, both started with the pin's trust
flags and CORS opened to one origin (``--trust-request-chat-template --trust-request-mm-kwargs
--allowed-origins '["http://example.com"]' --allow-credentials``).

With the flags a request's own ``chat_template`` renders the prompt, ``mm_processor_kwargs`` and
``media_io_kwargs`` are accepted (and unused on a text-only model), and a preflight from the
allowed origin is answered. Each answer is reduced to what a client reads (status, error type
and param; for a completion its choices and usage; for ``/tokenize`` the whole body; for CORS the
status, a preflight's body and the access-control headers) and must equal the oracle's. Without
the flags the same requests are refused: ``tests/reliability/test_bad_input_diff.py``.

Upstream at the pin: ``vllm/renderers/online_renderer.py`` (``validate_chat_template``),
``vllm/entrypoints/openai/chat_completion/protocol.py`` (``build_chat_params``: the request's
template, else ``--chat-template``, else the tokenizer's), ``vllm/renderers/hf.py``
(``resolve_chat_template_kwargs``), ``vllm/entrypoints/generate/base/protocol.py``
(``validate_request_mm_kwargs``), ``vllm/entrypoints/serve/middleware/register.py`` (CORS).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from reliability_support import cors_answers, engine_and_oracle

from parity.serve import ServerHandle

pytestmark = [pytest.mark.oracle, pytest.mark.server]

STARTUP_TIMEOUT_S = 240.0
REQUEST_TIMEOUT_S = 60.0
CLOSE_WAIT_S = 2.0  # below both servers' keep-alive timeout (5 s), which closes idle ones
# One connection per request: after some errors the servers close the connection (see
# test_a_template_that_does_not_parse_closes_the_connection), which a reused one would meet.
FRESH = httpx.Limits(max_keepalive_connections=0)
ORIGIN = "http://example.com"
FLAGS = (
    "--trust-request-chat-template",
    "--trust-request-mm-kwargs",
    "--allowed-origins",
    json.dumps([ORIGIN]),
    "--allow-credentials",
)
# A template of the request's own: roles in brackets, no special tokens.
TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)
ANSWER = [{"role": "user", "content": "<|answer:3|>"}]
HI = [{"role": "user", "content": "hi"}]


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": "scripted", "messages": ANSWER, "max_tokens": 6, "temperature": 0.0,
            **fields}  # fmt: skip


def _completion(**fields: Any) -> dict[str, Any]:
    return {"model": "scripted", "prompt": [389, 65], "max_tokens": 2, **fields}


CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("chat-request-template", "/v1/chat/completions", _chat(chat_template=TEMPLATE)),
    ("chat-empty-template", "/v1/chat/completions", _chat(chat_template="")),
    (
        "chat-template-in-kwargs",
        "/v1/chat/completions",
        _chat(chat_template_kwargs={"chat_template": TEMPLATE}),
    ),
    (
        "chat-template-raises",
        "/v1/chat/completions",
        _chat(chat_template="{{ raise_exception('not this one') }}"),
    ),
    ("chat-template-syntax", "/v1/chat/completions", _chat(chat_template="{% for %}")),
    (
        "chat-template-no-generation-prompt",
        "/v1/chat/completions",
        _chat(chat_template=TEMPLATE, add_generation_prompt=False),
    ),
    ("chat-mm-kwargs", "/v1/chat/completions", _chat(mm_processor_kwargs={"a": 1})),
    ("chat-media-io", "/v1/chat/completions", _chat(media_io_kwargs={"image": {"a": 1}})),
    ("completion-mm-kwargs", "/v1/completions", _completion(mm_processor_kwargs={"a": 1})),
    ("completion-media-io", "/v1/completions", _completion(media_io_kwargs={"image": {}})),
]
# Which template wins: the request's field, else --chat-template, else the kwargs' one, else the
# tokenizer's; "" falls through as the field but renders an empty prompt from the kwargs, and
# "auto" counts as unset in both; a name ("default") is looked up among the tokenizer's.
TOKENIZE: list[dict[str, Any]] = [
    {"messages": HI, "chat_template": TEMPLATE},
    {"messages": HI, "chat_template": TEMPLATE, "add_generation_prompt": False},
    {"messages": HI, "chat_template_kwargs": {"chat_template": TEMPLATE}},
    {
        "messages": HI,
        "chat_template": "{{ 'x' }}",
        "chat_template_kwargs": {"chat_template": TEMPLATE},
    },
    {"messages": HI, "chat_template": "", "chat_template_kwargs": {"chat_template": TEMPLATE}},
    {"messages": HI, "chat_template": "auto", "chat_template_kwargs": {"chat_template": TEMPLATE}},
    {"messages": HI, "chat_template_kwargs": {"chat_template": ""}},
    {"messages": HI, "chat_template_kwargs": {"chat_template": "auto"}},
    {"messages": HI, "chat_template": "default"},
    {"messages": HI, "chat_template": "{% for %}"},
    {"messages": HI, "mm_processor_kwargs": {"a": 1}},
    {"prompt": " 5 6", "media_io_kwargs": {"image": {"a": 1}}},
]
CORS: list[tuple[str, str, dict[str, str]]] = [
    ("OPTIONS", "/v1/completions", {"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}),
    (
        "OPTIONS",
        "/v1/models",
        {"Origin": "http://other.example", "Access-Control-Request-Method": "GET"},
    ),
    ("GET", "/v1/models", {"Origin": ORIGIN}),
    ("GET", "/v1/models", {"Origin": "http://other.example"}),
]


@pytest.fixture(scope="module")
def servers(
    scripted_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, ServerHandle]]:
    args = {"block_size": 32, "max_model_len": 128, "dtype": "float32"}
    folder = tmp_path_factory.mktemp("trusted-servers")
    with engine_and_oracle(folder, scripted_model_dir, args, FLAGS) as pair:
        yield pair


def _client_view(response: httpx.Response) -> tuple[Any, ...]:
    """What a client reads: an error's status, type and param; a result's choices and usage."""
    body = response.json()
    if response.status_code != 200:
        error = body.get("error", {})
        return response.status_code, error.get("type"), error.get("param")
    choices = [
        {k: v for k, v in choice.items() if k not in ("logprobs", "token_ids")}
        for choice in body["choices"]
    ]
    return response.status_code, choices, body.get("usage")


@pytest.mark.timeout(300)
def test_trusted_requests_answer_like_the_oracle(servers: dict[str, ServerHandle]) -> None:
    answers: dict[str, list[tuple[Any, ...]]] = {}
    for target, handle in servers.items():
        with httpx.Client(base_url=handle.url, timeout=REQUEST_TIMEOUT_S, limits=FRESH) as client:
            answers[target] = [_client_view(client.post(path, json=body))
                               for _, path, body in CASES]  # fmt: skip
    mismatches = [
        f"{name}\n    engine {ours}\n    oracle {theirs}"
        for (name, _, _), ours, theirs in zip(
            CASES, answers["engine"], answers["oracle"], strict=True
        )  # fmt: skip
        if ours != theirs
    ]
    assert not mismatches, f"{len(mismatches)} mismatches:\n" + "\n".join(mismatches)
    # The flags changed something: the request's template rendered the prompt (its own
    # bracketed roles make a prompt of another length than the model's template does).
    by_name = dict(zip([name for name, _, _ in CASES], answers["oracle"], strict=True))
    assert by_name["chat-request-template"][0] == 200
    assert by_name["chat-mm-kwargs"][0] == 200
    assert by_name["chat-request-template"][2] != by_name["chat-empty-template"][2]


@pytest.mark.timeout(120)
def test_trusted_tokenize_answers_like_the_oracle(servers: dict[str, ServerHandle]) -> None:
    answers = {}
    for target, handle in servers.items():
        with httpx.Client(base_url=handle.url, timeout=REQUEST_TIMEOUT_S, limits=FRESH) as client:
            answers[target] = [
                (r.status_code, r.json())
                for r in (client.post("/tokenize", json=body) for body in TOKENIZE)
            ]
    assert answers["engine"] == answers["oracle"]
    assert answers["oracle"][0][0] == 200


@pytest.mark.timeout(120)
def test_cors_with_an_allowed_origin_answers_like_the_oracle(
    servers: dict[str, ServerHandle],
) -> None:
    answers = cors_answers(servers, CORS)
    assert answers["oracle"][0][0] == 200  # the allowed origin's preflight is answered
    assert answers["engine"] == answers["oracle"]


def _recv_more(sock: socket.socket) -> bytes:
    """The next bytes of the answer (each wait bounded by the socket's timeout); EOF before the
    answer is whole is a failure, not a loop."""
    chunk = sock.recv(65536)
    assert chunk, "the server closed the connection before its answer was complete"
    return chunk


def _closed_after_answer(url: str, body: dict[str, Any]) -> tuple[int, bool]:
    """POST ``body`` to ``/tokenize`` on one kept-alive HTTP/1.1 connection; the status, and
    whether the server then closed the connection (EOF within ``CLOSE_WAIT_S``)."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    head = (
        f"POST /tokenize HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: keep-alive\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=REQUEST_TIMEOUT_S) as sock:
        sock.sendall(head.encode() + payload)
        received = b""
        while b"\r\n\r\n" not in received:
            received += _recv_more(sock)
        header, _, rest = received.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in header.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))  # fmt: skip
        while len(rest) < length:
            rest += _recv_more(sock)
        sock.settimeout(CLOSE_WAIT_S)
        try:
            closed = sock.recv(1) == b""
        except TimeoutError:
            closed = False
        except ConnectionResetError:
            closed = True
    return int(header.split()[1]), closed


@pytest.mark.timeout(120)
def test_a_template_that_does_not_parse_closes_the_connection(
    servers: dict[str, ServerHandle],
) -> None:
    """At the pin a template that does not parse is answered (400, the parser's message) by the
    server's last-resort handler, and the connection is closed after it; a template that parses
    and fails while rendering is an ordinary 400 on a connection that stays open."""
    cases = [
        {"messages": HI, "chat_template": "{% for %}"},
        {"messages": HI, "chat_template": "{{ raise_exception('no') }}"},
        {"messages": HI, "chat_template": TEMPLATE},
    ]
    answers = {t: [_closed_after_answer(h.url, body) for body in cases] for t, h in servers.items()}
    assert answers["oracle"] == [(400, True), (400, False), (200, False)]
    assert answers["engine"] == answers["oracle"]
