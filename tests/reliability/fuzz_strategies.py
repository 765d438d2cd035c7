"""Hypothesis strategies for OpenAI request bodies sent to ``/v1/completions`` and
``/v1/chat/completions``: valid, edge and invalid (importable; conftest.py is not).

A ``FuzzCase`` is one HTTP request as bytes (method, path, headers, body) plus what the test may
expect of it. Three families:

- ``valid_cases``: cheap well-formed requests; the greedy completions among them carry the
  scripted model's exact output (``contract.scripted.script.expected``), so the fuzz run also
  checks that concurrent junk never changes a correct answer.
- ``mutated_cases``: a valid body with 1-4 mutations: a field set to an edge or junk value
  (wrong types, negative/zero/huge numbers, NaN/Infinity, unknown roles, bad logprobs and stop
  values, huge strings, nested junk), a required field deleted, unknown fields added.
- ``raw_cases``: bytes that are not a JSON object: invalid or truncated JSON, non-UTF-8 bytes,
  deep nesting, wrong or missing content type, wrong method or path.
- ``dropped_cases``: valid streams whose client hangs up part-way (a leak check: afterwards
  nothing may still run or hold KV blocks).

Field names and types are vLLM's request models at the pin
(``vllm/entrypoints/openai/completion/protocol.py`` and ``chat_completion/protocol.py``).
Generated sizes stay bounded: valid requests ask for at most a handful of tokens, and a huge
string is built by repetition, not drawn character by character.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from contract.scripted import vocab
from contract.scripted.script import expected

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
JSON_TYPE = "application/json"
MODEL = "scripted"
MAX_VALID_TOKENS = 4
HUGE_STRING_SIZES = (10_000, 200_000, 1_000_000)
NESTING_DEPTHS = (64, 2_000, 200_000)
# A few fixed client request ids, so concurrent requests collide on them.
SHARED_REQUEST_IDS = ("dup-1", "dup-2")


@dataclass(frozen=True)
class FuzzCase:
    """One HTTP request and what may be asserted about its answer."""

    family: str  # valid | mutated | raw
    label: str  # what was done, for the statistics and failure messages
    path: str
    content: bytes
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)
    stream: bool = False
    expected_tokens: tuple[int, ...] | None = None  # greedy completions: the exact output
    close_after_bytes: int | None = None  # the client hangs up after this many body bytes

    def describe(self) -> str:
        body = self.content[:300].decode("utf-8", "replace")
        return f"{self.family}/{self.label} {self.method} {self.path} {body!r}"


def _json_case(
    family: str,
    label: str,
    path: str,
    body: Any,
    *,
    headers: dict[str, str] | None = None,
    expected_tokens: tuple[int, ...] | None = None,
) -> FuzzCase:
    stream = isinstance(body, dict) and body.get("stream") is True
    return FuzzCase(
        family=family,
        label=label,
        path=path,
        content=json.dumps(body, allow_nan=True).encode("utf-8"),
        headers={"content-type": JSON_TYPE, **(headers or {})},
        stream=stream,
        expected_tokens=expected_tokens,
    )


# --- building blocks ------------------------------------------------------------------------

# Prompts whose greedy continuation ends within a few tokens (count-downs, letters, answers).
_SHORT_PROMPTS = st.one_of(
    st.builds(lambda m: [vocab.BOS, vocab.answer_selector(m)], st.integers(0, 5)),
    st.lists(st.integers(0, vocab.TOC), min_size=1, max_size=24),
    st.builds(lambda n: [vocab.BOS, vocab.number(n)], st.integers(0, 99)),
)
_TEXT = st.text(max_size=40)
_SMALL_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12
)
_HUGE_TEXT = st.builds(lambda n, s: (s or "x") * (n // max(len(s), 1)), st.sampled_from(
    HUGE_STRING_SIZES), st.sampled_from(["x", " 5", "🙂", "\u0000", "<|loop|>", "é"]))  # fmt: skip

_JUNK_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    _SMALL_TEXT,
)
_JUNK = st.recursive(
    _JUNK_SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(_SMALL_TEXT, children, max_size=4),
    ),
    max_leaves=12,
)


def _ints(valid: st.SearchStrategy[int]) -> st.SearchStrategy[Any]:
    """An int field: a valid value, an edge value, or junk."""
    edges = st.sampled_from([0, -1, -100, 2**31, 2**63 - 1, 2**63, 2**64 + 5, 10**40])
    typed = st.sampled_from(["5", 1.5, 2.0, True, None, [1], {"a": 1}, float("nan")])
    return st.one_of(valid, edges, typed, _JUNK)


def _floats(valid: st.SearchStrategy[float]) -> st.SearchStrategy[Any]:
    edges = st.sampled_from(
        [0.0, -0.0, -1.0, 1e-45, 1.0, 1.0000001, 2.0, 1e9, 1e308, float("inf"), -float("inf")]
    )
    typed = st.sampled_from([float("nan"), "0.5", True, None, [0.5], 10**400])
    return st.one_of(valid, edges, typed, _JUNK)


_STOP = st.one_of(
    _SMALL_TEXT,
    st.just(""),
    st.lists(_SMALL_TEXT, max_size=5),
    st.lists(st.just("a"), min_size=65, max_size=70),
    st.lists(st.integers(), max_size=3),
    st.sampled_from([5, None, [None], [""], {"stop": "x"}, ["\u0000"], [" 1"]]),
    _JUNK,
)
_TOKEN_ID_LISTS = st.one_of(
    st.lists(st.integers(0, vocab.VOCAB_SIZE - 1), max_size=5),
    st.lists(st.integers(-5, 2**40), max_size=5),
    st.sampled_from([[vocab.EOS], [vocab.VOCAB_SIZE], [-1], [2**63], [None], "5"]),
)

# Fields shared by both endpoints: name -> strategy of values (valid, edge and junk).
_COMMON_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "model": st.one_of(st.sampled_from([MODEL, "", "other", "../../etc/passwd", None]), _JUNK),
    "max_tokens": _ints(st.integers(1, MAX_VALID_TOKENS)),
    "n": _ints(st.integers(1, 3)),
    "temperature": _floats(st.floats(0.0, 2.0)),
    "top_p": _floats(st.floats(0.0, 1.0)),
    "top_k": _ints(st.integers(-1, 600)),
    "min_p": _floats(st.floats(0.0, 1.0)),
    "seed": _ints(st.integers(-(2**63), 2**63 - 1)),
    "presence_penalty": _floats(st.floats(-2.0, 2.0)),
    "frequency_penalty": _floats(st.floats(-2.0, 2.0)),
    "repetition_penalty": _floats(st.floats(0.01, 2.0)),
    "stop": _STOP,
    "stop_token_ids": _TOKEN_ID_LISTS,
    "allowed_token_ids": _TOKEN_ID_LISTS,
    "bad_words": st.one_of(st.lists(_SMALL_TEXT, max_size=3), _JUNK),
    "logit_bias": st.one_of(
        st.dictionaries(
            st.one_of(st.integers(-2, 600).map(str), _SMALL_TEXT),
            _floats(st.floats(-100, 100)),
            max_size=3,
        ),
        _JUNK,
    ),  # fmt: skip
    "min_tokens": _ints(st.integers(0, MAX_VALID_TOKENS)),
    "ignore_eos": st.one_of(st.booleans(), _JUNK),
    "skip_special_tokens": st.one_of(st.booleans(), _JUNK),
    "include_stop_str_in_output": st.one_of(st.booleans(), _JUNK),
    "stream": st.one_of(st.booleans(), _JUNK),
    "stream_options": st.one_of(
        st.fixed_dictionaries(
            {}, optional={"include_usage": _JUNK_SCALARS, "continuous_usage_stats": _JUNK_SCALARS}
        ),
        _JUNK,
    ),  # fmt: skip
    "prompt_logprobs": _ints(st.integers(-1, 5)),
    "truncate_prompt_tokens": _ints(st.integers(-1, 64)),
    "priority": _ints(st.integers(-5, 5)),
    "user": st.one_of(_SMALL_TEXT, _JUNK),
    "request_id": st.one_of(st.sampled_from(SHARED_REQUEST_IDS), _SMALL_TEXT, _JUNK),
    "return_token_ids": st.one_of(st.booleans(), _JUNK),
    "response_format": st.one_of(
        st.sampled_from(
            [
                {"type": "text"},
                {"type": "json_object"},
                {"type": "json_schema"},
                {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
            ]
        ),
        _JUNK,
    ),  # fmt: skip
    "structured_outputs": st.one_of(st.sampled_from([{"json": {}}, {"regex": "a+"}]), _JUNK),
    "cache_salt": st.one_of(st.sampled_from(["", "a/b", "x" * 200, "salt"]), _JUNK),
    "thinking_token_budget": _ints(st.integers(-1, 4)),
    "stream_interval": _ints(st.integers(1, 4)),
    "use_beam_search": st.one_of(st.booleans(), _JUNK),
    "kv_transfer_params": _JUNK,
    "vllm_xargs": _JUNK,
}
_COMPLETION_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    **_COMMON_FIELDS,
    "prompt": st.one_of(
        _SHORT_PROMPTS,
        _TEXT,
        st.just(""),
        st.just([]),
        st.just([[]]),
        st.lists(_SMALL_TEXT, max_size=3),
        st.lists(st.lists(st.integers(0, 600), max_size=4), max_size=3),
        _TOKEN_ID_LISTS,
        _HUGE_TEXT,
        st.integers(1_000, 20_000).map(lambda n: [5] * n),
        _JUNK,
    ),
    "logprobs": _ints(st.integers(0, 20)),
    "echo": st.one_of(st.booleans(), _JUNK),
    "suffix": st.one_of(_SMALL_TEXT, _JUNK),
    "prompt_embeds": st.one_of(st.sampled_from(["AAAA", ["AAAA"], []]), _JUNK),
    "add_special_tokens": st.one_of(st.booleans(), _JUNK),
}

_ROLES = st.one_of(
    st.sampled_from(["system", "user", "assistant", "developer", "tool", "function"]),
    st.sampled_from(["", "admin", "USER", "ipython", "\u0000"]),
    _JUNK,
)
_CONTENT_PARTS = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, _SMALL_TEXT),
    st.sampled_from([
        {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}},
        {"type": "image_url", "image_url": {"url": "http://127.0.0.1:1/x.png"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "video_url"}, {"type": "bogus"}, {"text": 5}, {"type": "text"},
        {"type": "refusal", "refusal": "no"},
    ]),
    _JUNK,
)  # fmt: skip
_MESSAGE = st.one_of(
    st.fixed_dictionaries(
        {"role": _ROLES},
        optional={
            "content": st.one_of(_TEXT, st.none(), st.lists(_CONTENT_PARTS, max_size=3), _JUNK),
            "name": st.one_of(_SMALL_TEXT, _JUNK),
            "tool_calls": _JUNK,
            "tool_call_id": _JUNK,
            "reasoning_content": st.one_of(_SMALL_TEXT, _JUNK),
        },
    ),
    _JUNK,
)
_CHAT_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    **_COMMON_FIELDS,
    "messages": st.one_of(
        st.lists(_MESSAGE, max_size=4),
        st.just([]),
        st.builds(lambda s: [{"role": "user", "content": s}], _HUGE_TEXT),
        st.integers(200, 3_000).map(lambda n: [{"role": "user", "content": "hi"}] * n),
        _JUNK,
    ),
    "max_completion_tokens": _ints(st.integers(1, MAX_VALID_TOKENS)),
    "logprobs": st.one_of(st.booleans(), _JUNK),
    "top_logprobs": _ints(st.integers(0, 20)),
    "tools": st.one_of(
        st.just([{"type": "function", "function": {"name": "f", "parameters": {}}}]), _JUNK
    ),
    "tool_choice": st.one_of(
        st.sampled_from(
            ["none", "auto", "required", {"type": "function", "function": {"name": "f"}}]
        ),
        _JUNK,
    ),  # fmt: skip
    "chat_template": st.one_of(st.just("{{ 7 * 7 }}"), _JUNK),
    "chat_template_kwargs": st.one_of(
        st.sampled_from([{"enable_thinking": False}, {"chat_template": "x"}, {"tokenize": True}]),
        _JUNK,
    ),
    "add_generation_prompt": st.one_of(st.booleans(), _JUNK),
    "continue_final_message": st.one_of(st.booleans(), _JUNK),
    "include_reasoning": st.one_of(st.booleans(), _JUNK),
    "reasoning_effort": st.one_of(st.sampled_from(["low", "high", "none", "max"]), _JUNK),
    "echo": st.one_of(st.booleans(), _JUNK),
    "documents": _JUNK,
}
_UNKNOWN_FIELD_NAMES = st.one_of(
    st.sampled_from(["foo", "__proto__", "constructor", "max_token", "Prompt", "", "\u0000"]),
    _SMALL_TEXT,
)


def _uniform(draw: st.DrawFn) -> random.Random:
    """A Random seeded from the draw. Hypothesis favours the first entries of ``sampled_from``
    (and its own ``randoms()``); seeding from a full-range integer picks uniformly, so every
    field gets its share of mutations (shrinking is not used here)."""
    return random.Random(draw(st.integers(0, 2**32 - 1)))


# --- the three families ---------------------------------------------------------------------


@st.composite
def valid_cases(draw: st.DrawFn) -> FuzzCase:
    """A cheap, well-formed request (greedy completions carry their exact expected output)."""
    stream = draw(st.booleans())
    max_tokens = draw(st.integers(1, MAX_VALID_TOKENS))
    extra: dict[str, Any] = {}
    if stream and draw(st.booleans()):
        extra["stream_options"] = {"include_usage": True}
    if draw(st.integers(0, 3)) == 0:  # sampled: the output is not known, only its shape
        extra["temperature"] = draw(st.floats(0.1, 2.0))
        extra["seed"] = draw(st.integers(0, 2**31))
    if draw(st.booleans()):
        prompt = draw(_SHORT_PROMPTS)
        body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}
        body |= {"return_token_ids": True, **extra}
        tokens = None
        if "temperature" not in extra:  # greedy: the script says what comes out
            body["temperature"] = 0.0
            tokens = tuple(expected(prompt, max_tokens))
        return _json_case("valid", "completion", COMPLETIONS, body, expected_tokens=tokens)
    messages = [{"role": "user", "content": draw(_TEXT)}]
    if draw(st.booleans()):
        messages.insert(0, {"role": "system", "content": draw(_SMALL_TEXT)})
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": stream}
    return _json_case("valid", "chat", CHAT, body | extra)


@st.composite
def mutated_cases(draw: st.DrawFn) -> FuzzCase:
    """A valid body with 1-4 mutations (edge/junk values, deletions, unknown fields)."""
    base = draw(valid_cases())
    body: dict[str, Any] = json.loads(base.content)
    chat = base.path == CHAT
    fields = _CHAT_FIELDS if chat else _COMPLETION_FIELDS
    labels = []
    rnd = _uniform(draw)
    for _ in range(rnd.randint(1, 4)):
        action = rnd.choice(["set", "set", "set", "set", "delete", "unknown"])
        if action == "set":
            name = rnd.choice(sorted(fields))
            body[name] = draw(fields[name])
            labels.append(name)
        elif action == "delete":
            name = rnd.choice(["messages" if chat else "prompt", "model", "max_tokens"])
            body.pop(name, None)
            labels.append(f"-{name}")
        else:
            body[draw(_UNKNOWN_FIELD_NAMES)] = draw(_JUNK)
            labels.append("+unknown")
    headers = {}
    if draw(st.integers(0, 9)) == 0:
        headers["X-Request-Id"] = draw(st.sampled_from(SHARED_REQUEST_IDS))
    return _json_case("mutated", ",".join(labels), base.path, body, headers=headers)


def _nested(depth: int, kind: str) -> bytes:
    if kind == "array":
        return b"[" * depth + b"]" * depth
    inner = b'{"a":' * depth + b"1" + b"}" * depth
    return b'{"prompt": "hi", "max_tokens": 1, "x": ' + inner + b"}"


@st.composite
def raw_cases(draw: st.DrawFn) -> FuzzCase:
    """Bytes that are not a valid JSON object, or a request with the wrong framing."""
    path = draw(st.sampled_from([COMPLETIONS, CHAT]))
    valid = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1}).encode()
    kind = _uniform(draw).choice([
        "truncated", "garbage", "empty", "non_object", "non_utf8", "nested", "content_type",
        "no_content_type", "method", "path", "nan_literal", "duplicate_keys", "bom",
    ])  # fmt: skip
    headers = {"content-type": JSON_TYPE}
    method = "POST"
    if kind == "truncated":
        content = valid[: draw(st.integers(1, len(valid) - 1))]
    elif kind == "garbage":
        content = draw(st.binary(min_size=1, max_size=200))
    elif kind == "empty":
        content = b""
    elif kind == "non_object":
        content = json.dumps(draw(_JUNK_SCALARS | st.lists(_JUNK_SCALARS, max_size=3))).encode()
    elif kind == "non_utf8":
        bad = draw(
            st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80", b"\x80"])
        )
        content = b'{"model": "scripted", "prompt": "a' + bad + b'b", "max_tokens": 1}'
        if path == CHAT:
            content = (
                b'{"messages": [{"role": "user", "content": "a' + bad + b'"}], "max_tokens": 1}'
            )
    elif kind == "nested":
        content = _nested(
            draw(st.sampled_from(NESTING_DEPTHS)), draw(st.sampled_from(["array", "object"]))
        )
    elif kind in ("content_type", "no_content_type"):
        content = valid
        if kind == "no_content_type":
            headers = {}
        else:
            headers = {"content-type": draw(st.sampled_from([
                "text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                "application/jsonx", "application/json-seq", "", "*/*",
            ]))}  # fmt: skip
    elif kind == "method":
        method = draw(st.sampled_from(["GET", "PUT", "DELETE", "PATCH"]))
        content = valid
    elif kind == "path":
        path = draw(st.sampled_from([
            "/v1/completion", "/v1/completions/x", "/v1//completions", "/v1/chat", "/v2/x",
            "/v1/completions/../models", "/%2e%2e/etc/passwd", "/v1/models/../../etc",
        ]))  # fmt: skip
        content = valid
    elif kind == "nan_literal":
        content = b'{"model": "scripted", "prompt": "hi", "max_tokens": 1, "temperature": NaN}'
    elif kind == "duplicate_keys":
        content = b'{"prompt": "hi", "prompt": [1, 2], "max_tokens": 1, "max_tokens": -3}'
    else:  # a UTF-8 byte order mark before the JSON
        content = b"\xef\xbb\xbf" + valid
    return FuzzCase(family="raw", label=kind, path=path, content=content, method=method,
                    headers=headers)  # fmt: skip


@st.composite
def dropped_cases(draw: st.DrawFn) -> FuzzCase:
    """A valid streaming request whose client hangs up after some body bytes (0: before the
    first byte, usually while the request is still queued or in prefill)."""
    prompt = draw(_SHORT_PROMPTS)
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": draw(st.integers(1, 40)),
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": draw(st.booleans()),
    }
    case = _json_case("dropped", "completion", COMPLETIONS, body)
    return dataclasses.replace(case, close_after_bytes=draw(st.integers(0, 2_000)))


FAMILIES = {
    "valid": valid_cases,
    "mutated": mutated_cases,
    "raw": raw_cases,
    "dropped": dropped_cases,
}
