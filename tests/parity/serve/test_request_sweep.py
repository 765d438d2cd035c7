"""A sweep of request shapes, each sent to the pinned vLLM server and to the engine started with
the same flags: every status and body must be equal but for ids and timestamps.

The bodies cover what clients other than the harness send: batched text and token prompts,
``n``, ``echo``, logprobs, stop strings and ids, penalties, ``logit_bias``, token filters,
seeded sampling, streams with usage options, chat with content parts and other roles,
reasoning, chat template options, ``/tokenize`` and ``/detokenize``, and malformed bodies. A
stream is compared by what a client assembles from it (each choice's text, tokens, finish and
stop reasons, the last usage), not frame by frame: how many tokens one frame carries depends on
how far the client is behind (upstream merges the outputs a slow consumer has not taken yet).

The structured-output requests (``response_format`` json_object, ``structured_outputs``) are
the engine's known difference (README, "Still refused"): the pin answers them, the engine
refuses them with 400, and the sweep holds both sides to exactly that.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from serve_support import SCRIPTED_ARGS

from parity.serve import ServerPool

pytestmark = [pytest.mark.oracle, pytest.mark.server, pytest.mark.timeout(900)]

MODEL = "scripted"
VOLATILE = {"id", "created", "system_fingerprint"}
PROMPT = [389, 430]  # BOS, <|answer:6|>
MESSAGES = [{"role": "user", "content": "hi <|answer:5|>"}]
THINK = [{"role": "user", "content": "q <|think:4|>"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
JSON = {"content-type": "application/json"}


def comp(**body: Any) -> dict[str, Any]:
    return {"path": "/v1/completions", "body": {"model": MODEL, **body}}


def chat(**body: Any) -> dict[str, Any]:
    return {"path": "/v1/chat/completions", "body": {"model": MODEL, **body}}


def raw(path: str, content: bytes, headers: dict[str, str] | None = None) -> dict[str, Any]:
    return {"path": path, "content": content, "headers": headers or {}}


CASES: dict[str, dict[str, Any]] = {
    # completions
    "tokens": comp(prompt=PROMPT, max_tokens=8, temperature=0),
    "text": comp(prompt="hello <|answer:3|>", max_tokens=8, temperature=0),
    "batch-text": comp(prompt=["a <|answer:2|>", "b <|answer:4|>"], max_tokens=6, temperature=0),
    "batch-tokens": comp(prompt=[[389, 426], [389, 428]], max_tokens=6, temperature=0),
    "n2": comp(prompt=PROMPT, max_tokens=4, n=2, temperature=0),
    "echo": comp(prompt=PROMPT, max_tokens=4, echo=True, temperature=0),
    "echo-logprobs": comp(prompt=PROMPT, max_tokens=4, echo=True, logprobs=2, temperature=0),
    "echo-max0": comp(prompt=PROMPT, max_tokens=0, echo=True),
    "echo-text-max0-logprobs": comp(prompt="ab", max_tokens=0, echo=True, logprobs=1),
    "logprobs0": comp(prompt=PROMPT, max_tokens=3, logprobs=0, temperature=0),
    "logprobs5": comp(prompt=PROMPT, max_tokens=3, logprobs=5, temperature=0),
    "logprobs21": comp(prompt=PROMPT, max_tokens=3, logprobs=21, temperature=0),
    "logprobs-true": comp(prompt=PROMPT, max_tokens=3, logprobs=True),
    "prompt-logprobs": comp(prompt=PROMPT, max_tokens=2, prompt_logprobs=1, temperature=0),
    "prompt-logprobs-minus1": comp(prompt=PROMPT, max_tokens=1, prompt_logprobs=-1),
    "stop": comp(prompt="x <|answer:9|>", max_tokens=20, stop=[" 3"], temperature=0),
    "stop-included": comp(prompt="x <|answer:9|>", max_tokens=20, stop=[" 3"],
                          include_stop_str_in_output=True, temperature=0),
    "stop-empty": comp(prompt=PROMPT, max_tokens=4, stop=[""], temperature=0),
    "stop-ids": comp(prompt=PROMPT, max_tokens=20, stop_token_ids=[258], temperature=0),
    "ignore-eos": comp(prompt=PROMPT, max_tokens=12, ignore_eos=True, temperature=0),
    "min-tokens": comp(prompt=PROMPT, max_tokens=12, min_tokens=9, temperature=0),
    "min-over-max": comp(prompt=PROMPT, max_tokens=3, min_tokens=5),
    "no-max-tokens": comp(prompt=PROMPT, temperature=0),
    "max-tokens-0": comp(prompt=PROMPT, max_tokens=0),
    "max-tokens-big": comp(prompt=PROMPT, max_tokens=100000),
    "max-tokens-negative": comp(prompt=PROMPT, max_tokens=-1),
    "max-tokens-float": comp(prompt=PROMPT, max_tokens=3.0, temperature=0),
    "max-tokens-fraction": comp(prompt=PROMPT, max_tokens=2.5),
    "at-the-length-limit": comp(prompt=[389] * 500, max_tokens=12, temperature=0,
                                ignore_eos=True),
    "over-the-length-limit": comp(prompt=[389] * 500, max_tokens=30),
    "prompt-too-long": comp(prompt=[389] * 600, max_tokens=3),
    "empty-prompt": comp(prompt="", max_tokens=3),
    "empty-token-list": comp(prompt=[], max_tokens=3),
    "token-out-of-vocab": comp(prompt=[389, 600], max_tokens=3),
    "prompt-int": comp(prompt=5, max_tokens=2),
    "prompt-mixed": comp(prompt=["a", 5], max_tokens=2),
    "wrong-model": {"path": "/v1/completions", "body": {"model": "x", "prompt": PROMPT}},
    "no-model": {"path": "/v1/completions",
                 "body": {"prompt": PROMPT, "max_tokens": 2, "temperature": 0}},
    "temperature-negative": comp(prompt=PROMPT, max_tokens=2, temperature=-1),
    "top-p-0": comp(prompt=PROMPT, max_tokens=2, top_p=0),
    "top-k-0": comp(prompt=PROMPT, max_tokens=2, top_k=0, temperature=0),
    "top-k-minus2": comp(prompt=PROMPT, max_tokens=2, top_k=-2),
    "min-p-2": comp(prompt=PROMPT, max_tokens=2, min_p=2),
    "greedy-with-filters": comp(prompt=PROMPT, max_tokens=3, temperature=0, top_p=0.5, top_k=3),
    "seeded": comp(prompt=PROMPT, max_tokens=6, temperature=1.0, seed=7),
    "seeded-n3": comp(prompt=PROMPT, max_tokens=5, n=3, temperature=1, seed=3),
    "seed-negative": comp(prompt=PROMPT, max_tokens=2, seed=-5, temperature=1),
    "seed-huge": comp(prompt=PROMPT, max_tokens=2, seed=2**70, temperature=1),
    "penalties": comp(prompt=PROMPT, max_tokens=6, temperature=0, presence_penalty=1.5,
                      frequency_penalty=0.5, repetition_penalty=1.3),
    "presence-penalty-3": comp(prompt=PROMPT, max_tokens=2, presence_penalty=3),
    "repetition-penalty-0": comp(prompt=PROMPT, max_tokens=2, repetition_penalty=0),
    "logit-bias": comp(prompt=PROMPT, max_tokens=4, temperature=0, logit_bias={"300": 100}),
    "logit-bias-bad-id": comp(prompt=PROMPT, max_tokens=4, logit_bias={"9999": 1}),
    "bad-words": comp(prompt=PROMPT, max_tokens=8, temperature=0, bad_words=[" 1"]),
    "allowed-token-ids": comp(prompt=PROMPT, max_tokens=4, temperature=0,
                              allowed_token_ids=[256, 257, 390]),
    "allowed-token-ids-bad": comp(prompt=PROMPT, max_tokens=4, allowed_token_ids=[9999]),
    "n0": comp(prompt=PROMPT, max_tokens=3, n=0),
    "best-of-2": comp(prompt=PROMPT, max_tokens=2, best_of=2),
    "suffix": comp(prompt=PROMPT, max_tokens=2, suffix="zz"),
    "priority": comp(prompt=PROMPT, max_tokens=3, priority=5),
    "cache-salt": comp(prompt=PROMPT, max_tokens=3, temperature=0, cache_salt="abc"),
    "cache-salt-empty": comp(prompt=PROMPT, max_tokens=3, cache_salt=""),
    "user-and-unknown-field": comp(prompt=PROMPT, max_tokens=2, temperature=0, user="u",
                                   foo_bar=1),
    "vllm-xargs": comp(prompt=PROMPT, max_tokens=3, temperature=0, vllm_xargs={"k": 1}),
    "special-tokens-kept": comp(prompt=PROMPT, max_tokens=12, temperature=0,
                                skip_special_tokens=False),
    "special-tokens-unspaced": comp(prompt=PROMPT, max_tokens=10, temperature=0,
                                    skip_special_tokens=False,
                                    spaces_between_special_tokens=False),
    "tokens-as-ids": comp(prompt=PROMPT, max_tokens=3, logprobs=1, temperature=0,
                          return_tokens_as_token_ids=True),
    "truncate-prompt": comp(prompt=[389, 65, 66, 67, 430], max_tokens=3, temperature=0,
                            truncate_prompt_tokens=2),
    "utf8": comp(prompt=[389, 489], max_tokens=20, temperature=0),
    "loop": comp(prompt=[389, 488], max_tokens=10, temperature=0),
    "stream-options-without-stream": comp(prompt=PROMPT, max_tokens=3,
                                          stream_options={"include_usage": True}),
    "stream-as-string": comp(prompt=PROMPT, max_tokens=3, stream="yes", temperature=0),
    # completion streams
    "stream": comp(prompt=PROMPT, max_tokens=4, temperature=0, stream=True),
    "stream-usage": comp(prompt=PROMPT, max_tokens=4, temperature=0, stream=True,
                         stream_options={"include_usage": True, "continuous_usage_stats": True}),
    "stream-n2-logprobs": comp(prompt=PROMPT, max_tokens=3, n=2, temperature=0, logprobs=1,
                               stream=True),
    "stream-echo": comp(prompt=PROMPT, max_tokens=3, temperature=0, echo=True, stream=True),
    "stream-utf8": comp(prompt=[389, 489], max_tokens=20, temperature=0, stream=True),
    "stream-stop": comp(prompt="x <|answer:20|>", max_tokens=30, stop=[" 1 2", "zz"],
                        temperature=0, stream=True),
    "stream-prompt-logprobs": comp(prompt=PROMPT, max_tokens=2, prompt_logprobs=0,
                                   temperature=0, stream=True),
    # chat
    "chat": chat(messages=MESSAGES, max_tokens=12, temperature=0),
    "chat-parts": chat(messages=[{"role": "user", "content": [
        {"type": "text", "text": "a <|answer:3|>"}]}], max_tokens=10, temperature=0),
    "chat-system": chat(messages=[{"role": "system", "content": "s"}, *MESSAGES],
                        max_tokens=10, temperature=0),
    "chat-name": chat(messages=[{"role": "user", "content": "x <|answer:2|>", "name": "bob"}],
                      max_tokens=4, temperature=0),
    "chat-tool-role": chat(messages=[*MESSAGES, {"role": "tool", "content": "42",
                                                 "tool_call_id": "c1"}],
                           max_tokens=4, temperature=0),
    "chat-history-reasoning": chat(messages=[
        *MESSAGES, {"role": "assistant", "content": "ok", "reasoning_content": "r"},
        {"role": "user", "content": "again <|answer:2|>"}], max_tokens=8, temperature=0),
    "chat-assistant-null": chat(messages=[*MESSAGES, {"role": "assistant", "content": None}],
                                max_tokens=4, temperature=0),
    "chat-think": chat(messages=THINK, max_tokens=30, temperature=0),
    "chat-think-cut": chat(messages=THINK, max_tokens=3, temperature=0),
    "chat-no-thinking": chat(messages=THINK, max_tokens=30, temperature=0,
                             chat_template_kwargs={"enable_thinking": False}),
    "chat-logprobs": chat(messages=MESSAGES, max_tokens=3, temperature=0, logprobs=True,
                          top_logprobs=2),
    "chat-top-logprobs-alone": chat(messages=MESSAGES, max_tokens=3, top_logprobs=2),
    "chat-top-logprobs-25": chat(messages=MESSAGES, max_tokens=3, logprobs=True, top_logprobs=25),
    "chat-logprobs-false": chat(messages=MESSAGES, max_tokens=3, logprobs=False, top_logprobs=0,
                                temperature=0),
    "chat-max-completion-tokens": chat(messages=MESSAGES, max_completion_tokens=3,
                                       temperature=0),
    "chat-n2": chat(messages=MESSAGES, max_tokens=3, n=2, temperature=0),
    "chat-continue": chat(messages=[*MESSAGES, {"role": "assistant", "content": "x"}],
                          max_tokens=3, temperature=0, echo=True, add_generation_prompt=False,
                          continue_final_message=True),
    "chat-continue-and-generation-prompt": chat(messages=MESSAGES, max_tokens=3,
                                                add_generation_prompt=True,
                                                continue_final_message=True),
    "chat-template-in-request": chat(messages=MESSAGES, max_tokens=4, temperature=0,
                                     chat_template="{{ 'z' }}"),
    "chat-tools-auto": chat(messages=MESSAGES, max_tokens=3, tools=TOOLS, tool_choice="auto"),
    "chat-tools-none": chat(messages=MESSAGES, max_tokens=3, temperature=0, tools=TOOLS,
                            tool_choice="none"),
    "chat-stop": chat(messages=[{"role": "user", "content": "x <|answer:9|>"}], max_tokens=20,
                      stop=" 4", temperature=0),
    "chat-image-part": chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}], max_tokens=4),
    "chat-no-messages": chat(messages=[], max_tokens=3),
    "chat-bad-role": chat(messages=[{"role": "wizard", "content": "x"}], max_tokens=3),
    "chat-no-content": chat(messages=[{"role": "user"}], max_tokens=3, temperature=0),
    # chat streams
    "chat-stream": chat(messages=MESSAGES, max_tokens=5, temperature=0, stream=True),
    "chat-stream-think": chat(messages=[{"role": "user", "content": "q <|think:2|>"}],
                              max_tokens=20, temperature=0, stream=True,
                              stream_options={"include_usage": True}),
    "chat-stream-think-cut": chat(messages=THINK, max_tokens=3, temperature=0, stream=True),
    "chat-stream-think-n2": chat(messages=THINK, max_tokens=12, n=2, temperature=0, stream=True),
    "chat-stream-logprobs": chat(messages=MESSAGES, max_tokens=3, temperature=0, stream=True,
                                 logprobs=True, top_logprobs=1),
    "chat-stream-usage": chat(messages=MESSAGES, max_tokens=4, temperature=0, stream=True,
                              stream_options={"include_usage": True,
                                              "continuous_usage_stats": True}),
    "chat-stream-stop": chat(messages=[{"role": "user", "content": "x <|answer:9|>"}],
                             max_tokens=20, stop=[" 4"], temperature=0, stream=True),
    # other routes
    "models": {"path": "/v1/models", "method": "GET"},
    "version": {"path": "/version", "method": "GET"},
    "health": {"path": "/health", "method": "GET"},
    "tokenize": {"path": "/tokenize", "body": {"model": MODEL, "prompt": "hi <|answer:3|>"}},
    "tokenize-chat": {"path": "/tokenize", "body": {"model": MODEL, "messages": MESSAGES}},
    "tokenize-chat-no-generation-prompt": {"path": "/tokenize", "body": {
        "model": MODEL, "messages": MESSAGES, "add_generation_prompt": False}},
    "tokenize-strings": {"path": "/tokenize",
                         "body": {"model": MODEL, "prompt": "hi", "return_token_strs": True}},
    "tokenize-no-special": {"path": "/tokenize",
                            "body": {"model": MODEL, "prompt": "hi", "add_special_tokens": False}},
    "tokenize-empty": {"path": "/tokenize", "body": {"model": MODEL, "prompt": ""}},
    "tokenize-wrong-model": {"path": "/tokenize", "body": {"model": "x", "prompt": "a"}},
    "detokenize": {"path": "/detokenize", "body": {"model": MODEL, "tokens": [389, 104, 430]}},
    "detokenize-out-of-vocab": {"path": "/detokenize", "body": {"model": MODEL, "tokens": [99999]}},
    "detokenize-empty": {"path": "/detokenize", "body": {"model": MODEL, "tokens": []}},
    "get-on-post-route": {"path": "/v1/completions", "method": "GET"},
    "unknown-route": {"path": "/v1/nothing", "method": "GET"},
    # malformed bodies
    "bad-json": raw("/v1/completions", b"{nope", JSON),
    "array-body": raw("/v1/completions", b"[1,2]", JSON),
    "empty-body": raw("/v1/completions", b"", JSON),
    "form-body": raw("/v1/completions", b"a=b",
                     {"content-type": "application/x-www-form-urlencoded"}),
    "no-content-type": raw("/v1/completions", json.dumps(
        {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "temperature": 0}).encode()),
}  # fmt: skip

# The engine's known difference: the pin applies structured outputs, the engine refuses them.
REFUSED_BY_THE_ENGINE: dict[str, tuple[dict[str, Any], str]] = {
    "chat-json-object": (
        chat(messages=MESSAGES, max_tokens=3, response_format={"type": "json_object"}),
        "response_format",
    ),
    "structured-outputs": (
        comp(prompt=PROMPT, max_tokens=3, structured_outputs={"choice": ["a", "b"]}),
        "structured_outputs",
    ),
}


def _masked(value: Any) -> Any:
    """``value`` with ids, timestamps and fingerprints masked."""
    if isinstance(value, dict):
        return {k: "<masked>" if k in VOLATILE else _masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    if isinstance(value, str):
        return re.sub(r"\b(chatcmpl|cmpl)-[0-9a-f-]+", r"\1-<masked>", value)
    return value


def _assembled(frames: list[dict[str, Any]]) -> dict[str, Any]:
    """What a client assembles from a stream's JSON frames: per choice its text (content and
    reasoning apart), tokens with logprobs, finish and stop reasons; the last usage; the keys
    of the first and the last frame. Not ``parity.serve.observe.parse_frames``: that keeps one
    finish per choice and no logprobs, and counts token frames, which merging changes."""
    choices: dict[int, dict[str, Any]] = {}
    for frame in frames:
        for choice in frame.get("choices") or []:
            got = choices.setdefault(choice["index"], {"text": "", "reasoning": "",
                                                       "logprobs": [], "ends": []})  # fmt: skip
            delta = choice.get("delta") or {}
            got["text"] += choice.get("text") or delta.get("content") or ""
            got["reasoning"] += delta.get("reasoning") or delta.get("reasoning_content") or ""
            logprobs = choice.get("logprobs") or {}
            got["logprobs"] += logprobs.get("content") or logprobs.get("tokens") or []
            if choice.get("finish_reason") is not None:
                got["ends"].append((choice["finish_reason"], choice.get("stop_reason")))
    usage = [frame["usage"] for frame in frames if frame.get("usage")]
    keys = [sorted(frames[0]), sorted(frames[-1])] if frames else []  # frames between may merge
    return {"choices": choices, "last_usage": usage[-1] if usage else None, "keys": keys}


def _answer(base: str, case: dict[str, Any]) -> tuple[int, Any]:
    """Status and body (a stream: what a client assembles from it, and how it ended)."""
    method = case.get("method", "POST")
    url = base + case["path"]
    kwargs: dict[str, Any] = {"headers": case.get("headers")}
    if "content" in case:
        kwargs["content"] = case["content"]
    elif "body" in case:
        kwargs["json"] = case["body"]
    with httpx.Client(timeout=120.0) as client:
        response = client.request(method, url, **kwargs)
    content_type = response.headers.get("content-type", "")
    if content_type.startswith("text/event-stream"):
        data = [line[6:] for line in response.text.split("\n") if line.startswith("data: ")]
        frames = [json.loads(d) for d in data if d != "[DONE]"]
        return response.status_code, {"stream": _masked(_assembled(frames)),
                                      "done": data[-1:] == ["[DONE]"]}  # fmt: skip
    try:
        return response.status_code, _masked(response.json())
    except ValueError:
        return response.status_code, _masked(response.text)


@pytest.fixture(scope="module")
def bases(serve_pool: ServerPool, scripted_config) -> dict[str, str]:
    """The URLs of the oracle and the engine, started with the same flags."""
    config = scripted_config(**SCRIPTED_ARGS)
    found = {}
    for target in ("oracle", "engine"):
        handle = serve_pool.get(target, config, startup_timeout_s=600)
        assert handle.startup.started, handle.startup.describe()
        found[target] = handle.url
    return found


@pytest.mark.parametrize("name", list(CASES))
def test_the_engine_answers_as_the_pin_does(name: str, bases: dict[str, str]) -> None:
    oracle = _answer(bases["oracle"], CASES[name])
    engine = _answer(bases["engine"], CASES[name])
    assert engine == oracle


@pytest.mark.parametrize("name", list(REFUSED_BY_THE_ENGINE))
def test_structured_outputs_are_the_known_difference(name: str, bases: dict[str, str]) -> None:
    case, field = REFUSED_BY_THE_ENGINE[name]
    status, body = _answer(bases["oracle"], case)
    assert status == 200, body
    status, body = _answer(bases["engine"], case)
    assert status == 400
    message = f"`{field}` is not supported by this engine. (parameter={field})"
    assert body["error"]["message"] == message
