"""engine/sampling_params.py: normalisation, validation, EOS merging and the max_tokens clamp.

The oracle tests run the pinned vLLM's own ``SamplingParams`` / ``get_max_tokens`` on the same
inputs (through ``oracle.sampling``) and require the same message, parameter and value, so the
texts are proven rather than transcribed.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine.entrypoints.api_utils import get_max_tokens
from engine.sampling_params import (
    SamplingParams,
    SamplingParamsError,
    SamplingType,
    coerce_logit_bias,
)

pytestmark = pytest.mark.timeout(60)

INVALID: list[dict[str, Any]] = [
    {"n": 0},
    {"n": 1.5},
    {"n": 16385},
    {"n": 2, "temperature": 0.0},
    {"presence_penalty": 3.0},
    {"presence_penalty": -2.5},
    {"frequency_penalty": 2.1},
    {"repetition_penalty": 0.0},
    {"repetition_penalty": -1.0},
    {"repetition_penalty": math.inf},
    {"repetition_penalty": math.nan},
    {"temperature": -0.1},
    {"temperature": 2.5},
    {"temperature": math.inf},
    {"temperature": math.nan},
    {"top_p": 0.0},
    {"top_p": 1.1},
    {"top_k": -2},
    {"top_k": 1.5},
    {"min_p": -0.1},
    {"min_p": 1.5},
    {"max_tokens": 0},
    {"max_tokens": -3},
    {"min_tokens": -1},
    {"min_tokens": 5, "max_tokens": 4},
    {"stream_interval": 0},
    {"logprobs": -2},
    {"prompt_logprobs": -5},
    {"stop_token_ids": [1, "a"]},
    {"stop": [""]},
    {"stop": ""},
    {"stop": ["x"], "detokenize": False},
    {"bad_words": ["ok", ""]},
    {"extra_args": {"a": [1, 2**64]}},
    {"temperature": 0.0, "n": 3, "top_p": 0.5},
]
VALID: list[dict[str, Any]] = [
    {},
    {"temperature": 0.001},
    {"temperature": 0.0, "top_p": 0.5, "top_k": 5, "min_p": 0.2},
    {"seed": -1},
    {"stop": "abc"},
    {"stop": ["ab", "abcd"], "stop_token_ids": [5, 3, 5]},
    {"stop": ["ab"], "include_stop_str_in_output": True},
    {"logprobs": True, "prompt_logprobs": 0},
    {"top_k": -1, "max_tokens": None, "min_tokens": 100},
    {"bad_words": ["x", "x", "y"]},
]


def _ours(kwargs: dict[str, Any]) -> tuple[str, str | None, Any] | None:
    try:
        SamplingParams(**kwargs)
    except SamplingParamsError as exc:
        return exc.message, exc.param, exc.value
    return None


def test_error_renders_like_vllm_validation_error() -> None:
    with pytest.raises(SamplingParamsError) as err:
        SamplingParams(max_tokens=0)
    assert str(err.value) == "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"
    assert (err.value.param, err.value.value) == ("max_tokens", 0)
    with pytest.raises(SamplingParamsError) as err:
        SamplingParams(min_p=2.0)
    assert str(err.value) == "min_p must be in [0, 1], got 2.0."
    assert err.value.param is None
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize("kwargs", INVALID, ids=repr)
def test_invalid_inputs_raise(kwargs: dict[str, Any]) -> None:
    assert _ours(kwargs) is not None


def test_normalisation() -> None:
    params = SamplingParams(
        temperature=0.001, seed=-1, stop="abc", stop_token_ids=[5, 3, 5], logprobs=True
    )
    assert (params.temperature, params.seed, params.stop) == (0.01, None, ["abc"])
    assert params.stop_token_ids == [5, 3] and params.all_stop_token_ids == {3, 5}
    assert params.logprobs == 1 and params.output_text_buffer_length == 2
    assert params.sampling_type is SamplingType.RANDOM
    greedy = SamplingParams(temperature=0.0, top_p=0.5, top_k=5, min_p=0.2)
    assert (greedy.top_p, greedy.top_k, greedy.min_p) == (1.0, 0, 0.0)
    assert greedy.sampling_type is SamplingType.GREEDY
    assert SamplingParams(seed=3).sampling_type is SamplingType.RANDOM_SEED


def test_update_from_generation_config() -> None:
    params = SamplingParams(stop_token_ids=[7])
    params.update_from_generation_config({"eos_token_id": [390, 391]}, 390)
    assert params.eos_token_id == 390
    assert sorted(params.stop_token_ids) == [7, 391]
    assert params.all_stop_token_ids == {7, 390, 391}
    ignoring = SamplingParams(ignore_eos=True)
    ignoring.update_from_generation_config({"eos_token_id": [390, 391]}, 390)
    assert ignoring.eos_token_id is None and ignoring.stop_token_ids == []
    assert ignoring.all_stop_token_ids == {390, 391}  # still masked under min_tokens


def test_resolve_max_tokens() -> None:
    params = SamplingParams(max_tokens=None, min_tokens=10)
    params.resolve_max_tokens(prompt_len=20, max_model_len=64)
    assert params.max_tokens == 44
    short = SamplingParams(max_tokens=None, min_tokens=10)
    with pytest.raises(SamplingParamsError) as err:
        short.resolve_max_tokens(prompt_len=60, max_model_len=64)
    assert str(err.value) == "min_tokens must be less than or equal to max_tokens=4, got 10."
    fixed = SamplingParams(max_tokens=5)
    fixed.resolve_max_tokens(prompt_len=60, max_model_len=64)
    assert fixed.max_tokens == 5


def test_verify_against_the_model() -> None:
    SamplingParams(logprobs=20, stop_token_ids=[511]).verify(vocab_size=512)
    with pytest.raises(SamplingParamsError) as err:
        SamplingParams(logprobs=-1).verify(vocab_size=512)
    assert (err.value.param, err.value.value) == ("logprobs", 512)
    SamplingParams(logprobs=-1).verify(vocab_size=512, max_logprobs=-1)
    with pytest.raises(SamplingParamsError, match=r"token_id\(s\) \[512\] in stop_token_ids"):
        SamplingParams(stop_token_ids=[512]).verify(vocab_size=512)


def test_coerce_logit_bias() -> None:
    assert coerce_logit_bias({"5": 150.0, 6: -0.5}) == {5: 100.0, 6: -0.5}
    with pytest.raises(SamplingParamsError) as err:
        coerce_logit_bias({"5": 1.0, "x": 1.0})
    assert err.value.param == "logit_bias" and err.value.value == ["x"]


def test_get_max_tokens() -> None:
    assert get_max_tokens(64, 10, None) == 54  # chat with nothing set: M - P
    assert get_max_tokens(64, 10, 16) == 16
    assert get_max_tokens(64, 10, None, default_max_tokens=32) == 32
    assert get_max_tokens(64, 10, 100, override_max_tokens=20) == 20
    assert get_max_tokens(64, 64, 16) == 0  # then max_tokens=0 fails validation
    assert get_max_tokens(64, 10, 50, platform_max=sys.maxsize) == 50
    with pytest.raises(SamplingParamsError) as err:
        get_max_tokens(64, 70, 16)
    assert str(err.value) == "Input length (70) exceeds model's maximum context length (64)."


# ---- against the pinned vLLM ------------------------------------------------------------------


@pytest.fixture(scope="module")
def upstream() -> Any:
    import oracle.sampling

    return oracle.sampling


@pytest.mark.oracle
@pytest.mark.timeout(240)
def test_errors_match_upstream(upstream: Any) -> None:
    for kwargs in INVALID + VALID:
        assert _ours(dict(kwargs)) == upstream.upstream_sampling_error(**kwargs), kwargs


@pytest.mark.oracle
@pytest.mark.timeout(240)
def test_normalisation_matches_upstream(upstream: Any) -> None:
    for kwargs in VALID:
        params = SamplingParams(**kwargs)
        ours = {name: getattr(params, name) for name in upstream.upstream_normalised(**kwargs)}
        ours["all_stop_token_ids"] = set(params.all_stop_token_ids)
        assert ours == upstream.upstream_normalised(**kwargs), kwargs


@pytest.mark.oracle
@pytest.mark.timeout(240)
def test_verify_matches_upstream(upstream: Any, tmp_path: Path) -> None:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 512,
        "hidden_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "max_position_embeddings": 8192,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    cases: list[dict[str, Any]] = [
        {"logprobs": 20},
        {"logprobs": 21},
        {"logprobs": -1},
        {"logprobs": 0},
        {"prompt_logprobs": 25},
        {"prompt_logprobs": -1},
        {"stop_token_ids": [511, 512]},
        {"stop_token_ids": [-1, 5]},
        {"logit_bias": {600: 1.0, 3: 2.0}},
        {"logit_bias": {600: 1.0}, "stop_token_ids": [700]},
        {"allowed_token_ids": []},
        {"allowed_token_ids": [1, 1000]},
        {"allowed_token_ids": [1, 2]},
    ]
    for max_logprobs in (20, -1, 5):
        for kwargs in cases:
            try:
                SamplingParams(**kwargs).verify(vocab_size=512, max_logprobs=max_logprobs)
                ours = None
            except SamplingParamsError as exc:
                ours = (exc.message, exc.param, exc.value)
            want = upstream.upstream_verify_error(tmp_path, max_logprobs, **kwargs)
            assert ours == want, (max_logprobs, kwargs)


@pytest.mark.oracle
@pytest.mark.timeout(240)
def test_eos_merge_matches_upstream(upstream: Any) -> None:
    generation_configs: list[dict[str, Any]] = [
        {},
        {"eos_token_id": 390},
        {"eos_token_id": [390, 391, 392]},
        {"eos_token_id": [391]},
    ]
    for generation in generation_configs:
        for eos in (390, None):
            for kwargs in ({}, {"ignore_eos": True}, {"stop_token_ids": [5, 391]}):
                params = SamplingParams(**kwargs)
                params.update_from_generation_config(generation, eos)
                ours = (params.eos_token_id, params.stop_token_ids, params.all_stop_token_ids)
                assert ours == upstream.upstream_eos_merge(generation, eos, **kwargs), (
                    generation,
                    eos,
                    kwargs,
                )


@pytest.mark.oracle
@pytest.mark.timeout(240)
def test_get_max_tokens_matches_upstream(upstream: Any) -> None:
    cases = [
        (64, 10, None, None, None, None),
        (64, 10, 16, None, None, None),
        (64, 10, None, 32, None, None),
        (64, 10, 100, None, 20, None),
        (64, 10, None, 100, None, None),
        (64, 64, 16, None, None, None),
        (64, 70, 16, None, None, None),
        (64, 70, 16, None, None, -1),
        (64, 70, 16, None, None, 30),
        (2048, 3, 56, None, None, None),
    ]
    for max_len, length, request, default, override, truncate in cases:
        try:
            ours: int | str = get_max_tokens(
                max_len, length, request, default, override, truncate_prompt_tokens=truncate
            )
        except SamplingParamsError as exc:
            ours = str(exc)
        want = upstream.upstream_get_max_tokens(
            max_len, length, request, default, override, truncate
        )
        assert ours == want, (max_len, length, request, default, override, truncate)


def _words_encoder(vocab: dict[str, int]) -> Callable[[str], list[int]]:
    """A toy tokenizer: whitespace-split words, a leading space kept on each but the first."""

    def encode(text: str) -> list[int]:
        pieces = text.replace(" ", "\0 ").split("\0")
        return [vocab[piece] for piece in pieces if piece]

    return encode


def test_update_from_tokenizer_tokenizes_each_bad_word_with_and_without_a_space() -> None:
    encode = _words_encoder({"a": 1, " a": 2, "b": 3, " b": 4})
    params = SamplingParams(bad_words=["a b", " a"], max_tokens=4)
    params.update_from_tokenizer(encode, max_token_id=10)
    # "a b" -> [1, 4]; " a b" -> [2, 4] (new first token, same length): kept. " a" is
    # stripped to "a": [1] and [2] again.
    assert params.bad_words_token_ids == [[1, 4], [2, 4], [1], [2]]


def test_update_from_tokenizer_refuses_empty_too_many_and_out_of_vocab_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    encode = _words_encoder({"a": 1, " a": 2, "z": 99, " z": 98})
    with pytest.raises(SamplingParamsError, match="must tokenize to at least one token") as err:
        SamplingParams(bad_words=[" "], max_tokens=4).update_from_tokenizer(encode, 10)
    assert err.value.param == "bad_words"
    with pytest.raises(SamplingParamsError, match=r"following tokens were specified as bad: \[99"):
        SamplingParams(bad_words=["z"], max_tokens=4).update_from_tokenizer(encode, 10)
    monkeypatch.setenv("VLLM_MAX_NUM_BAD_WORDS", "1")
    with pytest.raises(SamplingParamsError, match="Too many bad words after tokenization: 2"):
        SamplingParams(bad_words=["a"], max_tokens=4).update_from_tokenizer(encode, 10)
    plain = SamplingParams(max_tokens=4)
    plain.update_from_tokenizer(encode, 10)
    assert plain.bad_words_token_ids is None
