"""Differential bad-input suite: our engine server against the pinned oracle.

Both servers serve the scripted model with the same flags (``--block-size 32 --max-model-len
128 --served-model-name scripted --enforce-eager --no-async-scheduling --dtype float32``), one
each for the module. A deterministic list of >= 200 invalid or edge requests (bad max_tokens,
unknown fields, wrong types, empty prompts and messages, unknown roles, prompts too long as text
and as ids, bad logprobs / top_logprobs / stop / n / model / sampling values, stream_options
without stream, malformed bodies, ...) goes to both, a few at a time; each answer is reduced to
(status, error.type, error.param) and must equal the oracle's, unless ``KNOWN_DIFFERENCES``
names the case with the reason. The counts are printed. Beside them: ``/tokenize`` and
``/detokenize`` answers (whole bodies), and CORS preflights (status, body, headers).

Upstream at the pin: ``vllm/entrypoints/openai/completion/protocol.py``,
``chat_completion/protocol.py``, ``vllm/sampling_params.py`` (``_verify_args``),
``vllm/renderers/params.py`` and ``serve/exception_handling/error_response.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from reliability_support import cors_answers, engine_and_oracle

from parity.serve import ServerHandle

pytestmark = [pytest.mark.oracle, pytest.mark.server]

MAX_MODEL_LEN = 128
STARTUP_TIMEOUT_S = 240.0
REQUEST_TIMEOUT_S = 60.0
WORKERS = 4
MIN_CASES = 200
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"

# case name -> why our answer may differ from the oracle's (a ledger in miniature).
_NULL_MESSAGES = (
    "the pin lets messages=null through validation and fails later on iterating it (400 "
    "BadRequestError, param null, \"'NoneType' object is not iterable\"); the engine refuses it "
    "at validation (400 'Bad Request', param body.messages): same status, clearer error"
)
KNOWN_DIFFERENCES: dict[str, str] = {
    "chat:messages=null": _NULL_MESSAGES,
    "chat:messages=null-stream": _NULL_MESSAGES,
}


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    body: Any  # a JSON value, or raw bytes sent as they are
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Answer:
    status: int
    type: str | None
    param: str | None
    detail: str  # the message (or the start of the body), for the mismatch report

    @property
    def key(self) -> tuple[int, str | None, str | None]:
        return (self.status, self.type, self.param)


def _completion(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "scripted", "prompt": [389, 65], "max_tokens": 2}
    body.update(fields)
    return {k: v for k, v in body.items() if v is not _DROP}


def _chat(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "scripted",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    }
    body.update(fields)
    return {k: v for k, v in body.items() if v is not _DROP}


_DROP = object()  # a field value meaning "leave the key out"

# (field, values) applied to both endpoints (each case also sent with stream: true).
SHARED_FIELDS: list[tuple[str, list[Any]]] = [
    ("max_tokens", [-1, 0, 1, MAX_MODEL_LEN, MAX_MODEL_LEN + 1, 10**9, 2**63, 1.5, "5", None]),
    ("temperature", [-1, -0.001, 0.0, 2.5, 1e10, "hot", None]),
    ("top_p", [0, -0.1, 1.0, 1.1, "x"]),
    ("top_k", [-2, -1, 0, 1, 1.5, 10**6]),
    ("min_p", [-0.1, 0.5, 1.1]),
    ("presence_penalty", [-2.5, 2.5, "x"]),
    ("frequency_penalty", [-2.5, 2.5]),
    ("repetition_penalty", [0, -1, 3.0]),
    ("seed", ["s", 1.5, 2**64, -1]),
    ("stop", [5, [1, 2], [""], "", ["a"] * 5, None]),
    ("stop_token_ids", [[-1], "x", [390]]),
    ("n", [0, -1, 2, "2"]),
    ("model", ["nope", "", None, 5, "../../etc/passwd"]),
    ("min_tokens", [-1, 5, 3.5]),
    ("ignore_eos", ["x", True]),
    ("stream_options", [{"include_usage": True}, 5, {"include_usage": "x"}]),
    ("logit_bias", [{"abc": 1}, {"65": 200}, "x"]),
    ("prompt_logprobs", [-1, 21, 1]),
    ("truncate_prompt_tokens", [-2, 0, 5, MAX_MODEL_LEN + 1]),
    ("unknown_field", [1]),
    ("user", [5]),
    ("skip_special_tokens", [5]),
    ("response_format", [{"type": "bogus"}, {"type": "text"}]),
    # refused without --trust-request-mm-kwargs, on completions too (an unknown field there)
    ("mm_processor_kwargs", [{"a": 1}, {}, "x", 0]),
    ("media_io_kwargs", [{"image": {"a": 1}}, {}]),
]
COMPLETION_FIELDS: list[tuple[str, list[Any]]] = [
    ("prompt", ["", [], [[]], [""], ["a", "b"], None, _DROP, 5, [-1], [10**6], [1.5]]),
    ("prompt", ["hello " * 200, [65] * (MAX_MODEL_LEN + 1), [65] * MAX_MODEL_LEN]),
    ("prompt", [[65] * (MAX_MODEL_LEN - 1), [[389, 65], [389, 66]]]),
    ("logprobs", [-1, 0, 5, 21, 100, "x", True]),
    ("echo", ["x", True]),
    ("suffix", ["x"]),
    ("best_of", [2, 0]),
    ("max_completion_tokens", [5]),
    ("top_logprobs", [2]),
]
CHAT_FIELDS: list[tuple[str, list[Any]]] = [
    ("messages", [[], None, _DROP, "hi", [{"role": "alien", "content": "x"}]]),
    ("messages", [[{"content": "x"}], [{"role": "user"}], [{"role": "user", "content": 5}]]),
    ("messages", [[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]]),
    ("messages", [[{"role": "user", "content": [{"type": "bogus"}]}]]),
    ("messages", [[{"role": "user", "content": "hello " * 200}], [{"role": "system"}]]),
    ("messages", [[{"role": "assistant", "content": "x"}], [5]]),
    ("max_completion_tokens", [-1, 0, MAX_MODEL_LEN + 1, "x", 4]),
    ("logprobs", [True, False, 1, "x"]),
    ("top_logprobs", [-1, 0, 5, 21, 100, "x"]),
    ("echo", [True]),
    ("tools", [5, [{"type": "function"}]]),
    ("tool_choice", ["bogus", "required"]),
    ("add_generation_prompt", ["x"]),
    ("chat_template_kwargs", [5, {"enable_thinking": False}, {"chat_template": None}]),
    ("chat_template_kwargs", [{"tokenize": True}, {"tokenize": False}, {"return_dict": True}]),
    ("chat_template_kwargs", [{"return_dict": False}, {"add_generation_prompt": False}]),
]
COMBOS: list[tuple[str, str, dict[str, Any]]] = [
    ("completions", "top_logprobs-without-logprobs", {"top_logprobs": 3}),
    ("chat", "top_logprobs-without-logprobs", {"top_logprobs": 3, "logprobs": False}),
    ("chat", "logprobs-with-top_logprobs-21", {"logprobs": True, "top_logprobs": 21}),
    ("chat", "both-max-tokens", {"max_tokens": 3, "max_completion_tokens": MAX_MODEL_LEN + 1}),
    ("completions", "min_tokens-over-max", {"min_tokens": 5, "max_tokens": 2}),
    ("chat", "min_tokens-over-max", {"min_tokens": 5, "max_tokens": 2}),
    ("completions", "prompt-fills-context", {"prompt": [65] * 127, "max_tokens": 5}),
    ("completions", "echo-max-tokens-0", {"echo": True, "max_tokens": 0}),
    ("completions", "stream-false-options", {"stream": False, "stream_options": {}}),
    ("chat", "stream-false-options", {"stream": False, "stream_options": {}}),
    # two invalid fields, one from the OpenAI head of the request and one from vLLM's sampling
    # extensions: the 400 lists them in field-declaration order, so it pins that order
    ("completions", "two-type-errors", {"top_k": 1.5, "temperature": "hot", "priority": "x"}),
    ("chat", "two-type-errors", {"top_k": 1.5, "temperature": "hot", "priority": "x"}),
    # the multimodal-kwargs check comes before the max_tokens and conversation checks
    ("chat", "mm-kwargs-and-max-tokens", {"mm_processor_kwargs": {"a": 1}, "max_tokens": 999}),
    ("chat", "mm-kwargs-no-messages", {"media_io_kwargs": {"a": {}}, "messages": []}),
    ("completions", "mm-kwargs-and-no-prompt", {"mm_processor_kwargs": {"a": 1}, "prompt": []}),
]
RAW_BODIES: list[tuple[str, bytes]] = [
    ("not-json", b"{not json"),
    ("empty-body", b""),
    ("json-list", b"[1, 2]"),
    ("json-null", b"null"),
    ("json-string", b'"prompt"'),
    (
        "nan-temperature",
        b'{"model": "scripted", "prompt": "x", "max_tokens": 2, "temperature": NaN}',
    ),
    ("utf8-junk", b'{"model": "scripted", "prompt": "\xff\xfe", "max_tokens": 2}'),
]


def _label(value: Any) -> str:
    if value is _DROP:
        return "absent"
    text = json.dumps(value)
    return text if len(text) <= 24 else f"{text[:16]}..len{len(text)}"


def build_cases() -> list[Case]:
    """Every case, deterministic and uniquely named."""
    cases: list[Case] = []
    groups = [
        ("completions", COMPLETIONS, _completion, SHARED_FIELDS + COMPLETION_FIELDS),
        ("chat", CHAT, _chat, SHARED_FIELDS + CHAT_FIELDS),
    ]
    for endpoint, path, make, fields in groups:
        for name, values in fields:
            for value in values:
                for stream in (False, True):
                    body = make(**{name: value})
                    if stream:
                        body["stream"] = True
                    suffix = "-stream" if stream else ""
                    cases.append(Case(f"{endpoint}:{name}={_label(value)}{suffix}", path, body))
    for endpoint, name, fields in COMBOS:
        make, path = (_completion, COMPLETIONS) if endpoint == "completions" else (_chat, CHAT)
        cases.append(Case(f"{endpoint}:{name}", path, make(**fields)))
    for name, raw in RAW_BODIES:
        for path in (COMPLETIONS, CHAT):
            headers = {"content-type": "application/json"}
            cases.append(Case(f"{path.rsplit('/', 1)[-1]}:raw:{name}", path, raw, headers))
    seen: dict[str, int] = {}
    unique = []
    for case in cases:  # truncated labels may collide: number the repeats
        count = seen[case.name] = seen.get(case.name, 0) + 1
        unique.append(case if count == 1 else Case(f"{case.name}#{count}", *_rest(case)))
    return unique


def _rest(case: Case) -> tuple[str, Any, dict[str, str]]:
    return case.path, case.body, case.headers


def _answer(response: httpx.Response) -> Answer:
    text = response.text
    if response.status_code == 200:
        return Answer(200, None, None, text[:120])
    try:
        error = json.loads(text)["error"]
        return Answer(response.status_code, error.get("type"), error.get("param"), error["message"])
    except (ValueError, KeyError, TypeError):
        return Answer(response.status_code, "<not vLLM's error shape>", None, text[:200])


def send(client: httpx.Client, url: str, case: Case) -> Answer:
    if isinstance(case.body, bytes):
        response = client.post(url + case.path, content=case.body, headers=case.headers)
    else:
        response = client.post(url + case.path, json=case.body)
    return _answer(response)


@pytest.fixture(scope="module")
def servers(
    scripted_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, ServerHandle]]:
    args = {"block_size": 32, "max_model_len": MAX_MODEL_LEN, "dtype": "float32"}
    with engine_and_oracle(
        tmp_path_factory.mktemp("bad-input-servers"),
        scripted_model_dir,
        args,
        engine_only_flags=("--disable-uvicorn-access-log",),
        startup_timeout_s=STARTUP_TIMEOUT_S,
    ) as pair:
        yield pair


def _sweep(servers: dict[str, ServerHandle], cases: list[Case]) -> dict[str, list[Answer]]:
    answers: dict[str, list[Answer]] = {}
    limits = httpx.Limits(max_connections=WORKERS)
    for target, handle in servers.items():
        with (
            httpx.Client(timeout=REQUEST_TIMEOUT_S, limits=limits) as client,
            ThreadPoolExecutor(WORKERS) as workers,
        ):
            answers[target] = list(workers.map(partial(send, client, handle.url), cases))
    return answers


@pytest.mark.timeout(600)
def test_bad_inputs_answer_like_the_oracle(servers: dict[str, ServerHandle]) -> None:
    cases = build_cases()
    assert len(cases) >= MIN_CASES
    answers = _sweep(servers, cases)
    mismatches: list[str] = []
    known_seen: set[str] = set()
    for case, ours, theirs in zip(cases, answers["engine"], answers["oracle"], strict=True):
        if ours.key == theirs.key:
            continue
        if case.name in KNOWN_DIFFERENCES:
            known_seen.add(case.name)
            continue
        mismatches.append(
            f"{case.name}: engine {ours.key} {ours.detail[:150]!r}\n"
            f"    oracle {theirs.key} {theirs.detail[:150]!r}"
        )
    errors = sum(1 for a in answers["oracle"] if a.status != 200)
    print(
        f"\nbad-input diff: {len(cases)} cases ({errors} errors at the oracle), "
        f"{len(mismatches)} mismatches, {len(known_seen)} known differences"
    )
    stale = sorted(set(KNOWN_DIFFERENCES) - known_seen)
    pids = {h.process.pid for h in servers.values() if h.process is not None}
    assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids), pids
    for target, handle in servers.items():
        assert httpx.get(handle.url + "/health", timeout=10.0).status_code == 200, target
        assert handle.alive(), f"{target} died during the sweep"
    assert not [a for a in answers["engine"] if a.status >= 500], "engine answered 5xx"
    assert not mismatches, f"{len(mismatches)} mismatches:\n" + "\n".join(mismatches)
    assert not stale, f"known differences that no longer differ (remove them): {stale}"


# Chat content, prompts and logits processors the oracle handles one way: each answer's whole
# error message and param, or the prompt's token ids, texts and logprobs, must equal the
# oracle's (vllm/renderers/chat_utils.py content parts, renderers/hf.py developer messages,
# tokenizers/registry.py truncation side, sampling_params.py update_from_tokenizer and the
# sampler's logit_bias / allowed_token_ids / bad_words).
_USER = {"type": "text", "text": "<|answer:2|>"}
CONTENT_PARTS: list[Any] = [
    {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/x.png"}},
    {"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}},
    {"type": "video_url", "video_url": {"url": "http://127.0.0.1:9/x.mp4"}},
    {"type": "image_pil", "image_pil": "x"},
    {"type": "image_embeds", "image_embeds": "AA=="},
    {"type": "audio_embeds", "audio_embeds": "AA=="},
    {"image_url": {"url": "x"}},
    {"audio_url": "x"},
    {"image_embeds": "AA=="},
    {"type": "image_url"},
    {"type": "image_url", "image_url": {"url": 5}},
    {"type": "audio_url"},
    {"type": "video_url", "video_url": {}},
    {"type": "prompt_embeds"},
    {"type": "prompt_embeds", "data": "AA=="},
    {"type": "foo"},
    {"type": "file", "file": {"file_id": "x"}},
    {"text": " hi"},
    {"type": 5},
    {"type": "text", "text": " b", "uuid": "u"},
    {"type": "text"},
    {"type": "text", "text": None},
    {"type": "text", "text": ""},
    {"type": "input_text", "text": " d"},
    {"type": "output_text", "text": " d"},
    {"type": "refusal", "refusal": " c"},
    {"type": "thinking", "thinking": " a"},
    {"type": "thinking"},
    {"type": "tool_reference", "name": "f"},
    " e",
]
CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "developer", "content": " a"}, {"role": "user", "content": "<|answer:2|>"}],
    [
        {"role": "system", "content": " s"},
        {"role": "developer", "content": " a"},
        {"role": "user", "content": "<|answer:2|>"},
    ],
    [{"role": "user", "content": "<|answer:2|>"}, {"role": "developer", "content": " a"}],
    [
        {"role": "system", "content": ""},
        {"role": "developer", "content": [{"type": "text", "text": " a"}, " b"]},
        {"role": "developer", "content": " c", "name": "x"},
        {"role": "user", "content": "<|answer:2|>"},
    ],
    [
        {"role": "system", "content": " s"},
        {"role": "user", "content": "<|answer:2|>"},
        {"role": "system", "content": " t"},
    ],
    [
        {"role": "system", "content": "x-anthropic-billing-header: cch=1\n b"},
        {"role": "user", "content": "<|answer:2|>"},
    ],
    [
        {"role": "system", "content": [{"type": "text", "text": "x-anthropic-billing-header: 1"}]},
        {"role": "user", "content": "<|answer:2|>"},
    ],
]
TRUNCATED: list[tuple[str, dict[str, Any]]] = [
    (COMPLETIONS, {"prompt": " 5 6 7", "truncate_prompt_tokens": 2}),
    (COMPLETIONS, {"prompt": [389, 261, 262, 263], "truncate_prompt_tokens": 3}),
    (COMPLETIONS, {"prompt": " 5 6 7", "truncate_prompt_tokens": 2, "truncation_side": "right"}),
    (CHAT, {"messages": [{"role": "user", "content": " 5" * 40}], "truncate_prompt_tokens": 20}),
]
# Logits processors whose outcome the scripted model decides without ties (banning a token
# leaves its runner-up " um"; two allowed tokens the count-down visits in order: after the
# second, the top token and " um" are both banned and the rest tie, so max_tokens stops there).
PROCESSORS: list[dict[str, Any]] = [
    {"logit_bias": {"259": 100}},
    {"logit_bias": {"260": -100}, "logprobs": 2},
    {"logit_bias": {"9999": 1}},
    {"allowed_token_ids": [260, 259], "max_tokens": 2},
    {"allowed_token_ids": [600]},
    {"bad_words": [" 4"]},
    {"bad_words": ["4"]},
    {"bad_words": ["3 2"]},
    {"bad_words": [" 4 3", " 1"], "logprobs": 1},
    {"bad_words": [" 4"], "n": 2},
    {"bad_words": [" "]},
    {"bad_words": ["\u00e9\u00e9"]},
]
CHAT_PROCESSORS: list[dict[str, Any]] = [
    {"logit_bias": {"259": 100}},
    {"allowed_token_ids": [259, 258], "max_tokens": 2},  # the count-down's own two tokens
    {"bad_words": [" 2"]},
    {"bad_words": ["1 0"], "n": 2},
]

# repetition_detection on the " tick tock" loop: stops, misses, min_tokens, and every refusal
# (upstream's dataclass checks; pydantic's type errors).
REPETITION: list[dict[str, Any]] = [
    {"max_pattern_size": 2, "min_count": 2},
    {"max_pattern_size": 4, "min_pattern_size": 3, "min_count": 2},
    {"max_pattern_size": 1, "min_count": 5},
    {"max_pattern_size": 3, "min_count": 2, "unknown": 1},
    {"max_pattern_size": 0},
    {"max_pattern_size": 2},
    {"max_pattern_size": 2, "min_pattern_size": 3, "min_count": 2},
    {"max_pattern_size": -1},
    {"max_pattern_size": "x"},
    {"min_count": 1.5},
]


# logprob_token_ids: the sampled token's logprob, then the named ids' (duplicates kept once),
# in place of the top-k; and its refusals.
LOGPROB_TOKEN_IDS: list[tuple[str, dict[str, Any]]] = [
    (COMPLETIONS, {"logprobs": 1, "logprob_token_ids": [259, 260]}),
    (COMPLETIONS, {"logprobs": 0, "logprob_token_ids": [259, 259, 1]}),
    (COMPLETIONS, {"logprobs": 3, "logprob_token_ids": []}),
    (COMPLETIONS, {"logprob_token_ids": [259]}),
    (COMPLETIONS, {"logprobs": 1, "logprob_token_ids": [259, 600]}),
    (COMPLETIONS, {"logprobs": 1, "logprob_token_ids": list(range(129))}),
    (COMPLETIONS, {"logprobs": 1, "logprob_token_ids": [1, 2], "echo": True}),
    (COMPLETIONS, {"logprobs": 1, "logprob_token_ids": [1], "echo": True, "max_tokens": 0}),
    (COMPLETIONS, {"logprobs": 1, "logprob_token_ids": [1], "use_beam_search": True}),
    (COMPLETIONS, {"logprobs": 1, "logprob_token_ids": [258, 7], "n": 2, "temperature": 0.7,
                   "seed": 5}),
    (CHAT, {"logprobs": True, "logprob_token_ids": [259, 260]}),
    (CHAT, {"logprobs": True, "top_logprobs": 5, "logprob_token_ids": [259]}),
    (CHAT, {"logprobs": False, "logprob_token_ids": [259]}),
]  # fmt: skip


def logprob_token_ids_cases() -> list[tuple[str, dict[str, Any]]]:
    prompts = {
        COMPLETIONS: {"prompt": "<|answer:3|>"},
        CHAT: {"messages": [{"role": "user", "content": "<|think:1|><|answer:3|>"}]},
    }
    return [(path, {**prompts[path], **fields}) for path, fields in LOGPROB_TOKEN_IDS]


# thinking_token_budget: the forced </think> at every budget around the script's own length,
# prompts already thinking (or done), sampling rows, logprobs of a forced token, and refusals.
THINKING: list[tuple[str, dict[str, Any]]] = [
    *((CHAT, {"messages": [{"role": "user", "content": "<|think:5|><|answer:3|>"}],
              "thinking_token_budget": b}) for b in (0, 1, 4, 5, 6, -1, -2, 1.5, "x")),
    *((COMPLETIONS, {"prompt": p, "thinking_token_budget": b})
      for p in ("<think><|think:5|><|answer:3|>", "<think> a b </think><|think:4|><|answer:2|>",
                "<think> a", "<|think:6|><|answer:2|>")
      for b in (0, 2, 4)),
    (COMPLETIONS, {"prompt": "<|think:6|><|answer:2|>", "thinking_token_budget": 2,
                   "logprobs": 2}),
    (COMPLETIONS, {"prompt": "<|think:6|><|answer:2|>", "thinking_token_budget": 1, "n": 2,
                   "temperature": 0.9, "seed": 7}),
    (COMPLETIONS, {"prompt": "<|think:6|><|answer:2|>", "thinking_token_budget": 2,
                   "bad_words": ["</think>"]}),
    (COMPLETIONS, {"prompt": "<|think:6|><|answer:2|>", "thinking_token_budget": 3,
                   "min_tokens": 12}),
]  # fmt: skip


# use_beam_search: widths, length penalty, EOS handling, logprobs of the chosen beams, the
# refusals (stream, echo with logprobs, a width whose 2 * width logprobs pass the limit).
_BEAM = {"use_beam_search": True, "max_tokens": 8}
BEAM_SEARCH: list[tuple[str, dict[str, Any]]] = [
    *((COMPLETIONS, {"prompt": "<|answer:5|>", "n": n, **_BEAM}) for n in (1, 2, 3, 5)),
    (COMPLETIONS, {"prompt": "<|answer:5|>", "n": 2, "length_penalty": 0.3, **_BEAM}),
    (COMPLETIONS, {"prompt": "<|answer:5|>", "n": 2, "ignore_eos": True, **_BEAM}),
    (COMPLETIONS, {"prompt": "<|answer:5|>", "n": 2, "include_stop_str_in_output": True,
                   **_BEAM}),
    (COMPLETIONS, {"prompt": "<|answer:5|>", "n": 2, "logprobs": 2, "temperature": 0, **_BEAM}),
    (COMPLETIONS, {"prompt": "<|think:3|><|answer:1|>", "n": 3, **_BEAM}),
    (COMPLETIONS, {"prompt": "<|answer:5|>", "n": 2, "stream": True, **_BEAM}),
    (COMPLETIONS, {"prompt": "<|answer:5|>", "n": 2, "echo": True, "logprobs": 1, **_BEAM}),
    (COMPLETIONS, {"prompt": "<|answer:5|>", "n": 11, **_BEAM}),
    (CHAT, {"messages": [{"role": "user", "content": "<|think:2|><|answer:3|>"}], "n": 3,
            "logprobs": True, "top_logprobs": 2, **_BEAM}),
]  # fmt: skip


def repetition_cases() -> list[tuple[str, dict[str, Any]]]:
    loop = {"prompt": "<|loop|>", "max_tokens": 12}
    cases = [(COMPLETIONS, {**loop, "repetition_detection": r}) for r in REPETITION]
    cases += [
        (COMPLETIONS, {**loop, "repetition_detection": [1]}),
        (COMPLETIONS, {**loop, "min_tokens": 9, "repetition_detection": REPETITION[0]}),
        (COMPLETIONS, {**loop, "n": 2, "temperature": 0.5, "seed": 3,
                       "repetition_detection": REPETITION[0]}),
        (CHAT, {"messages": [{"role": "user", "content": "<|loop|>"}], "max_tokens": 12,
                "repetition_detection": REPETITION[2]}),
    ]  # fmt: skip
    return cases


def content_cases() -> list[tuple[str, dict[str, Any]]]:
    cases = [
        (CHAT, {"messages": [{"role": "user", "content": [_USER, part]}]}) for part in CONTENT_PARTS
    ]
    cases += [(CHAT, {"messages": messages}) for messages in CONVERSATIONS]
    cases += TRUNCATED
    cases += [(COMPLETIONS, {"prompt": " 5", **fields}) for fields in PROCESSORS]
    messages = [{"role": "user", "content": "<|answer:4|>"}]  # " 3 2 1 0"
    cases += [(CHAT, {"messages": messages, **fields}) for fields in CHAT_PROCESSORS]
    cases += repetition_cases()
    cases += logprob_token_ids_cases()
    cases += [(path, {**body, "max_tokens": 16}) for path, body in THINKING]
    cases += BEAM_SEARCH
    return [
        (path, {"model": "scripted", "max_tokens": 4, "return_token_ids": True, **body})
        for path, body in cases
    ]


def _rendered(response: httpx.Response) -> tuple[Any, ...]:
    body = response.json()
    if response.status_code != 200:
        return (response.status_code, body["error"]["message"], body["error"]["param"])
    prompt = body.get("prompt_token_ids") or body["choices"][0].get("prompt_token_ids")
    texts = [c.get("text", c.get("message")) for c in body["choices"]]
    logprobs = [c.get("logprobs") for c in body["choices"]]
    finished = [(c["finish_reason"], c["stop_reason"]) for c in body["choices"]]
    return (200, prompt, texts, logprobs, finished, body["usage"])


@pytest.mark.timeout(300)
def test_content_truncation_and_processors_answer_like_the_oracle(
    servers: dict[str, ServerHandle],
) -> None:
    cases = content_cases()
    answers: dict[str, list[tuple[Any, ...]]] = {}
    for target, handle in servers.items():
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
            answers[target] = [
                _rendered(client.post(handle.url + path, json=body)) for path, body in cases
            ]
    mismatches = [
        f"{json.dumps(body)[:200]}\n    engine {ours}\n    oracle {theirs}"
        for (_, body), ours, theirs in zip(cases, answers["engine"], answers["oracle"], strict=True)
        if ours != theirs
    ]
    statuses = {answer[0] for answer in answers["oracle"]}
    assert statuses == {200, 400}, statuses  # both kinds of answer are exercised
    assert not mismatches, f"{len(mismatches)} mismatches:\n" + "\n".join(mismatches)


# /tokenize and /detokenize (vllm/entrypoints/serve/tokenize/ at the pin): the whole answer
# (status and JSON body) must equal the oracle's.
_HI = [{"role": "user", "content": "hi"}]
TOKENIZATION: list[tuple[str, dict[str, Any]]] = [
    ("/tokenize", {"prompt": " 5 6"}),
    ("/tokenize", {"prompt": " 5 6", "add_special_tokens": False, "return_token_strs": True}),
    ("/tokenize", {"prompt": ""}),
    ("/tokenize", {"prompt": " 5" * (MAX_MODEL_LEN + 20)}),  # no length limit
    ("/tokenize", {"model": "nope", "prompt": "x"}),
    ("/tokenize", {"model": "scripted", "prompt": "x", "extra_field": 1}),
    ("/tokenize", {}),
    ("/tokenize", {"prompt": 5}),
    ("/tokenize", {"messages": [{"role": "user", "content": "<|answer:2|>"}]}),
    ("/tokenize", {"messages": _HI, "add_generation_prompt": False, "return_token_strs": True}),
    ("/tokenize", {"messages": _HI, "continue_final_message": True}),
    (
        "/tokenize",
        {
            "messages": [*_HI, {"role": "assistant", "content": " x"}],
            "continue_final_message": True,
            "add_generation_prompt": False,
        },
    ),
    ("/tokenize", {"messages": _HI, "add_special_tokens": True}),
    ("/tokenize", {"messages": _HI, "chat_template": "x"}),
    ("/tokenize", {"messages": _HI, "chat_template_kwargs": {"enable_thinking": False}}),
    ("/tokenize", {"messages": _HI, "chat_template_kwargs": {"tokenize": True}}),
    ("/tokenize", {"messages": _HI, "chat_template_kwargs": {"return_dict": True}}),
    ("/tokenize", {"messages": _HI, "chat_template_kwargs": {"add_generation_prompt": False}}),
    ("/tokenize", {"messages": []}),
    ("/tokenize", {"prompt": "x", "messages": _HI}),
    ("/tokenize", {"messages": [{"role": "developer", "content": " a"}]}),
    ("/tokenize", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
    ("/tokenize", {"messages": _HI, "mm_processor_kwargs": {"a": 1}}),
    ("/tokenize", {"prompt": "x", "media_io_kwargs": {"image": {"a": 1}}}),
    ("/tokenize", {"messages": _HI, "mm_processor_kwargs": {}}),
    ("/detokenize", {"tokens": [389, 261, 262]}),
    ("/detokenize", {"tokens": []}),
    ("/detokenize", {"tokens": [389, 390, 395, 392]}),
    ("/detokenize", {"tokens": [600]}),
    ("/detokenize", {"tokens": [240, 159]}),
    ("/detokenize", {"tokens": [-1]}),
    ("/detokenize", {"tokens": [9999999999]}),
    ("/detokenize", {"tokens": "x"}),
    ("/detokenize", {}),
    ("/detokenize", {"model": "nope", "tokens": [1]}),
]


@pytest.mark.timeout(300)
def test_tokenize_and_detokenize_answer_like_the_oracle(servers: dict[str, ServerHandle]) -> None:
    answers: dict[str, list[tuple[int, Any]]] = {}
    for target, handle in servers.items():
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
            answers[target] = [
                (r.status_code, r.json())
                for r in (client.post(handle.url + path, json=body) for path, body in TOKENIZATION)
            ]
    mismatches = [
        f"{path} {json.dumps(body)[:160]}\n    engine {ours}\n    oracle {theirs}"
        for (path, body), ours, theirs in zip(
            TOKENIZATION, answers["engine"], answers["oracle"], strict=True
        )
        if ours != theirs
    ]
    assert {status for status, _ in answers["oracle"]} == {200, 400, 404}
    assert not mismatches, f"{len(mismatches)} mismatches:\n" + "\n".join(mismatches)


# CORS (serve/middleware/register.py and launchers/cli_args.py:316-324 at the pin): no origin is
# allowed by default. Status, body and the access-control headers must equal the oracle's.
_ORIGIN = {"Origin": "http://example.com"}
CORS: list[tuple[str, str, dict[str, str]]] = [
    ("OPTIONS", COMPLETIONS, {**_ORIGIN, "Access-Control-Request-Method": "POST"}),
    (
        "OPTIONS",
        "/v1/models",
        {
            **_ORIGIN,
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "authorization",
        },
    ),  # fmt: skip
    ("OPTIONS", COMPLETIONS, {}),  # not a preflight: no Origin
    ("GET", "/v1/models", _ORIGIN),  # a simple request: served, without an allow-origin header
    ("GET", "/health", {"Origin": "null"}),
]


@pytest.mark.timeout(120)
def test_cors_answers_like_the_oracle(servers: dict[str, ServerHandle]) -> None:
    answers = cors_answers(servers, CORS)
    assert answers["oracle"][0][:2] == (400, "Disallowed CORS origin")  # the pin's default
    assert answers["engine"] == answers["oracle"]


# /metrics as an operator's scraper sees it (serve/instrumentator/metrics.py at the pin): the
# HTTP request metrics beside vLLM's, and the route answering any method and path under it.
HTTP_TRAFFIC: list[tuple[str, str, Any]] = [
    ("GET", "/v1/models", None),
    ("POST", COMPLETIONS, {"model": "scripted", "prompt": [389, 65], "max_tokens": 2}),
    ("POST", COMPLETIONS, {"model": "scripted", "prompt": [389, 65], "max_tokens": -1}),
    ("DELETE", "/v1/models", None),  # 405: the pin counts it under handler "none"
    ("GET", "/no-such-route", None),
    ("POST", COMPLETIONS + "/", {}),  # 307 to the route without the slash
    ("GET", "/health", None),  # excluded from the HTTP metrics
]
SCRAPES: list[tuple[str, str, dict[str, str]]] = [
    ("GET", "/metrics", {}),
    ("HEAD", "/metrics", {}),
    ("POST", "/metrics", {}),
    ("GET", "/metrics/", {}),
    ("GET", "/metrics/", {"Accept-Encoding": "gzip"}),
]


def _http_requests_total(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=REQUEST_TIMEOUT_S).text
    return {
        line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("http_requests_total{")
    }


def _metric_families(url: str) -> set[str]:
    text = httpx.get(url + "/metrics", timeout=REQUEST_TIMEOUT_S).text
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


@pytest.mark.timeout(120)
def test_metrics_route_and_http_metrics_like_the_oracle(servers: dict[str, ServerHandle]) -> None:
    deltas: dict[str, dict[str, float]] = {}
    scrapes: dict[str, list[tuple[int, str | None, str | None]]] = {}
    for target, handle in servers.items():
        before = _http_requests_total(handle.url)
        with httpx.Client(base_url=handle.url, timeout=REQUEST_TIMEOUT_S) as client:
            for method, path, body in HTTP_TRAFFIC:
                client.request(method, path, json=body)
        after = _http_requests_total(handle.url)
        deltas[target] = {k: v - before.get(k, 0.0) for k, v in after.items()
                          if v != before.get(k, 0.0)}  # fmt: skip
        scrapes[target] = []
        for method, path, headers in SCRAPES:
            r = httpx.request(method, handle.url + path, headers=headers,
                              timeout=REQUEST_TIMEOUT_S)  # fmt: skip
            scrapes[target].append(
                (r.status_code, r.headers.get("content-type"), r.headers.get("content-encoding"))
            )
    none_405 = 'http_requests_total{handler="none",method="DELETE",status="4xx"}'
    assert deltas["oracle"].get(none_405) == 1.0
    assert deltas["engine"] == deltas["oracle"]
    assert {status for status, _, _ in scrapes["oracle"]} == {200}
    assert scrapes["engine"] == scrapes["oracle"]
    assert _metric_families(servers["engine"].url) == _metric_families(servers["oracle"].url)
