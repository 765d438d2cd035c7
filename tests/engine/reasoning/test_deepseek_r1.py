"""engine.reasoning: the deepseek_r1 parser, streaming and not, and reasoning-token counts.

The scripted model's cases of docs/oracle-on-cpu.md ("The scripted model on the pin") are checked
directly; the ``oracle`` tests run the pinned vLLM's own composed parser (``ParserManager``,
``DelegatingParser.parse_delta``/``parse``/``count_reasoning_tokens``) in-process on the same
deltas, for hypothesis-generated token sequences, and require identical results.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from contract.scripted import script, vocab
from engine.reasoning import (
    DeltaMessage,
    ReasoningParserTokenizerError,
    RequestReasoningParser,
    UnknownReasoningParserError,
    get_reasoning_parser,
    list_registered,
)
from engine.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser

THINK, END = vocab.THINK, vocab.END_THINK
# Chat [{"role": "user", "content": "<|think:3|><|answer:2|>"}] (docs/oracle-on-cpu.md).
CHAT_PROMPT = [389, 393, 400, 426, 390, 394]

Frame = dict[str, str | None] | None
# One engine step as the serving layer sees it: (delta text, delta token ids, finished).
Delta = tuple[str, list[int], bool]
StreamDeltas = Callable[..., list[Delta]]


def final_text_and_ids(deltas: Sequence[Delta]) -> tuple[str, list[int]]:
    """The non-streaming view of the same request: all text, all kept ids."""
    return "".join(d[0] for d in deltas), [t for d in deltas for t in d[1]]


def frames(
    parser: RequestReasoningParser,
    prompt: Sequence[int],
    deltas: Sequence[Delta],
    include_reasoning: bool = True,
) -> list[Frame]:
    """What parse_delta returns per step (None: no chunk), as exclude_unset dicts."""
    out: list[Frame] = []
    for text, ids, finished in deltas:
        message = parser.parse_delta(
            text, ids, prompt, finished=finished, include_reasoning=include_reasoning
        )
        out.append(None if message is None else message.to_dict())
    return out


def one_token_steps(tokens: Sequence[int]) -> list[list[int]]:
    return [[t] for t in tokens]


# ---------------------------------------------------------------------------------------------
# The scripted model's reasoning chat (values observed on the pinned vLLM server)
# ---------------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_chat_prompt_renders_to_the_observed_ids(tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "<|think:3|><|answer:2|>"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    assert list(ids if isinstance(ids, list) else ids["input_ids"]) == CHAT_PROMPT


@pytest.mark.timeout(60)
def test_chat_full_answer(
    stream_deltas: StreamDeltas, make_request_parser: Callable[[], RequestReasoningParser]
) -> None:
    out = script.expected(CHAT_PROMPT, 200)
    assert out[-1] == vocab.EOS  # finish_reason "stop": EOS text left out
    deltas = stream_deltas(CHAT_PROMPT, one_token_steps(out), stop_terminated=True)
    text, ids = final_text_and_ids(deltas)
    parser = make_request_parser()
    assert parser.parse(text) == (" x y z", " 1 0")
    assert len(ids) == 8 and parser.count_reasoning_tokens(ids) == 3
    # Streaming: <think> and </think> give no chunk; the EOS step (the finish chunk) is empty.
    assert frames(make_request_parser(), CHAT_PROMPT, deltas) == [
        None,
        {"reasoning": " x"},
        {"reasoning": " y"},
        {"reasoning": " z"},
        None,
        {"content": " 1"},
        {"content": " 0"},
        {"content": ""},
    ]


@pytest.mark.timeout(60)
def test_chat_cut_inside_reasoning(
    stream_deltas: StreamDeltas, make_request_parser: Callable[[], RequestReasoningParser]
) -> None:
    out = script.expected(CHAT_PROMPT, 3)  # finish_reason "length"
    deltas = stream_deltas(CHAT_PROMPT, one_token_steps(out), stop_terminated=False)
    text, ids = final_text_and_ids(deltas)
    parser = make_request_parser()
    assert parser.parse(text) == (" x y", None)  # content null: reasoning never ended
    assert parser.count_reasoning_tokens(ids) == 2
    assert frames(make_request_parser(), CHAT_PROMPT, deltas) == [
        None,
        {"reasoning": " x"},
        {"reasoning": " y"},
    ]


@pytest.mark.timeout(60)
def test_include_reasoning_false(
    stream_deltas: StreamDeltas, make_request_parser: Callable[[], RequestReasoningParser]
) -> None:
    out = script.expected(CHAT_PROMPT, 200)
    deltas = stream_deltas(CHAT_PROMPT, one_token_steps(out), stop_terminated=True)
    text, _ = final_text_and_ids(deltas)
    assert make_request_parser().parse(text, include_reasoning=False) == (None, " 1 0")
    # Reasoning deltas vanish, and so does the empty final content delta. Blanking sets the
    # field, so the remaining deltas carry "reasoning": null (upstream: pydantic assignment).
    got = frames(make_request_parser(), CHAT_PROMPT, deltas, include_reasoning=False)
    content = [{"content": " 1", "reasoning": None}, {"content": " 0", "reasoning": None}]
    assert got == [None, None, None, None, None, *content, None]


@pytest.mark.timeout(60)
def test_prompt_that_closes_thinking(
    stream_deltas: StreamDeltas, make_request_parser: Callable[[], RequestReasoningParser]
) -> None:
    """enable_thinking=False pre-fills <think></think>: streaming is all content, while the
    non-streaming split (which ignores the prompt) calls the whole answer reasoning, as upstream."""
    prompt = [*CHAT_PROMPT, THINK, END]
    out = script.expected(prompt, 200)
    assert out == [vocab.number(1), vocab.number(0), vocab.EOS]
    deltas = stream_deltas(prompt, one_token_steps(out), stop_terminated=True)
    assert frames(make_request_parser(), prompt, deltas) == [
        {"content": " 1"},
        {"content": " 0"},
        {"content": ""},
    ]
    text, ids = final_text_and_ids(deltas)
    assert make_request_parser().parse(text) == (" 1 0", None)
    assert make_request_parser().count_reasoning_tokens(ids) == 0


# ---------------------------------------------------------------------------------------------
# The parser's own rules
# ---------------------------------------------------------------------------------------------


def test_registry() -> None:
    assert list_registered() == ["deepseek_r1"]
    assert get_reasoning_parser("deepseek_r1") is DeepSeekR1ReasoningParser
    with pytest.raises(UnknownReasoningParserError) as info:
        get_reasoning_parser("qwen9")
    assert str(info.value) == "invalid reasoning parser: qwen9 (chose from { deepseek_r1 })"


def test_tokenizer_without_markers_is_refused() -> None:
    class NoThink:
        def get_vocab(self) -> dict[str, int]:
            return {"<think>": 1}

    with pytest.raises(ReasoningParserTokenizerError, match="could not locate think start/end"):
        DeepSeekR1ReasoningParser(NoThink())


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think> a</think> 1", (" a", " 1")),
        (" a</think> 1", (" a", " 1")),  # no <think>: reasoning assumed from the start
        (" 1 2<think> a</think>", (" a", None)),  # text before the first <think> is dropped
        (" a b", (" a b", None)),
        ("<think></think>", ("", None)),
        (" a</think> b</think> c", (" a", " b</think> c")),
    ],
)
def test_extract_reasoning(
    r1: DeepSeekR1ReasoningParser, text: str, expected: tuple[str | None, str | None]
) -> None:
    assert r1.extract_reasoning(text) == expected


def test_is_reasoning_end_scans_backwards(r1: DeepSeekR1ReasoningParser) -> None:
    assert r1.is_reasoning_end([1, THINK, 2, END, 3])
    assert not r1.is_reasoning_end([1, END, 2, THINK, 3])
    assert not r1.is_reasoning_end([1, 2, 3])


def test_count_reasoning_tokens(r1: DeepSeekR1ReasoningParser) -> None:
    assert r1.count_reasoning_tokens([THINK, 1, 2, END, 3]) == 2
    assert r1.count_reasoning_tokens([1, 2, END, 3]) == 0  # a stray end token counts nothing
    assert r1.count_reasoning_tokens([THINK, 1, THINK, 2, END, 3, END, 4]) == 3


def test_delta_split_at_end_token(
    make_request_parser: Callable[[], RequestReasoningParser],
) -> None:
    parser = make_request_parser()
    z, one = vocab.letter("z"), vocab.number(1)
    assert parser.parse_delta(" y", [vocab.letter("y")], [THINK], finished=False) == DeltaMessage(
        reasoning=" y"
    )
    split = parser.parse_delta(" z</think> 1", [z, END, one], [THINK], finished=False)
    assert split is not None and split.to_dict() == {"reasoning": " z", "content": " 1"}
    after = parser.parse_delta(" 0", [vocab.number(0)], [THINK], finished=True)
    assert after is not None and after.to_dict() == {"content": " 0"}


# ---------------------------------------------------------------------------------------------
# Parity with the pinned vLLM's parser, in-process
# ---------------------------------------------------------------------------------------------

_WORDS = [
    vocab.letter("a"),
    vocab.letter("z"),
    vocab.number(0),
    vocab.number(42),
    vocab.TICK,
    vocab.UM,
]
_OTHER = [vocab.EOS, vocab.USER, vocab.RESERVED_BASE, vocab.think_selector(2), ord("<"), ord("/")]
token_pieces = st.one_of(
    st.sampled_from(_WORDS + _OTHER).map(lambda t: [t]),
    st.sampled_from([THINK, END]).map(lambda t: [t]),
    st.sampled_from([list("中".encode())[:2], list("中".encode())]),
)
prompt_tails = st.sampled_from(
    [[], [THINK], [END], [THINK, END], [END, THINK], [THINK, vocab.letter("a")]]
)


@st.composite
def reasoning_cases(draw: st.DrawFn) -> dict[str, Any]:
    prompt = [*CHAT_PROMPT[:-1], vocab.ASSISTANT, *draw(prompt_tails)]
    out = [t for piece in draw(st.lists(token_pieces, min_size=1, max_size=12)) for t in piece]
    cuts = sorted(draw(st.sets(st.integers(1, max(len(out) - 1, 1)), max_size=len(out))))
    steps = [out[a:b] for a, b in zip([0, *cuts], [*cuts, len(out)], strict=True) if out[a:b]]
    params = {
        "skip_special_tokens": draw(st.booleans()),
        "stop": draw(st.lists(st.sampled_from(["</think>", "k>", " z", "</", " 0"]), max_size=2)),
        "include_stop_str_in_output": draw(st.booleans()),
    }
    return {
        "prompt": prompt,
        "steps": steps,
        "stop_terminated": draw(st.booleans()),
        "params": params,
        "include_reasoning": draw(st.booleans()),
    }


@pytest.fixture(scope="module")
def upstream_parser(scripted_model_dir: Path) -> Callable[[bool], Any]:
    """Factory of (the pinned vLLM's per-request parser, a ChatCompletionRequest)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser.parser_manager import ParserManager
    from vllm.tokenizers import get_tokenizer

    vllm_tokenizer = get_tokenizer(str(scripted_model_dir))
    parser_cls = ParserManager.get_parser(
        reasoning_parser_name="deepseek_r1", tokenizer=vllm_tokenizer
    )
    assert parser_cls is not None

    def make(include_reasoning: bool) -> Any:
        request = ChatCompletionRequest(
            model="scripted",
            messages=[{"role": "user", "content": "<|think:3|><|answer:2|>"}],
            include_reasoning=include_reasoning,
        )
        # As OpenAIServingChat._make_parser builds it (chat_completion/serving.py:204-216).
        parser = parser_cls(
            vllm_tokenizer, request.tools, chat_template_kwargs=None, model_config=None
        )
        return parser, request

    return make


def upstream_frames(
    parser: Any, request: Any, prompt: Sequence[int], deltas: Sequence[Delta]
) -> list[Frame]:
    out: list[Frame] = []
    for text, ids, finished in deltas:
        message = parser.parse_delta(
            delta_text=text,
            delta_token_ids=list(ids),
            request=request,
            prompt_token_ids=list(prompt),
            finished=finished,
        )
        out.append(None if message is None else message.model_dump(exclude_unset=True))
    return out


@pytest.mark.oracle
@pytest.mark.timeout(240)
@settings(
    max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=reasoning_cases())
def test_matches_upstream_parser(
    case: dict[str, Any],
    stream_deltas: StreamDeltas,
    r1: DeepSeekR1ReasoningParser,
    upstream_parser: Callable[[bool], Any],
) -> None:
    prompt, include = case["prompt"], case["include_reasoning"]
    deltas = stream_deltas(prompt, case["steps"], case["stop_terminated"], **case["params"])

    ours = frames(RequestReasoningParser(r1), prompt, deltas, include_reasoning=include)
    parser, request = upstream_parser(include)
    assert ours == upstream_frames(parser, request, prompt, deltas)

    text, ids = final_text_and_ids(deltas)
    parser, request = upstream_parser(include)
    reasoning, content, _ = parser.parse(
        text, request, enable_auto_tools=False, model_output_token_ids=ids
    )
    assert RequestReasoningParser(r1).parse(text, include_reasoning=include) == (
        reasoning if include else None,
        content,
    )
    assert r1.count_reasoning_tokens(ids) == parser.count_reasoning_tokens(ids)
    event(
        f"</think> id without its text: {any(END in d[1] and '</think>' not in d[0] for d in deltas)}"
    )
    event(
        f"some delta split reasoning/content: {any(f and 'reasoning' in f and 'content' in f for f in ours)}"
    )
    event(f"content after reasoning: {any(f and f.get('content') for f in ours)}")


@pytest.mark.oracle
@pytest.mark.timeout(120)
@pytest.mark.parametrize("max_tokens", [1, 3, 5, 200])
@pytest.mark.parametrize("tail", [[], [THINK, END]])
def test_script_chat_matches_upstream(
    stream_deltas: StreamDeltas,
    r1: DeepSeekR1ReasoningParser,
    upstream_parser: Callable[[bool], Any],
    max_tokens: int,
    tail: list[int],
) -> None:
    prompt = [*CHAT_PROMPT, *tail]
    out = script.expected(prompt, max_tokens)
    deltas = stream_deltas(prompt, one_token_steps(out), out[-1] == vocab.EOS)
    for include in (True, False):
        parser, request = upstream_parser(include)
        assert frames(RequestReasoningParser(r1), prompt, deltas, include) == upstream_frames(
            parser, request, prompt, deltas
        )
