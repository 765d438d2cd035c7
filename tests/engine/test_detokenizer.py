"""engine.detokenizer: incremental text, UTF-8 hold-back, special tokens, stop strings.

The ``oracle`` tests run the pinned vLLM's own ``IncrementalDetokenizer`` in-process on the same
tokenizer and the same token sequences (hypothesis-generated) and require identical stop
results, kept token ids and text (streamed deltas and cumulative) at every step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from contract.scripted import script, vocab
from engine.detokenizer import (
    IncrementalDetokenizer,
    UnsupportedTokenizerError,
    check_stop_strings,
)
from engine.sampling_params import SamplingParams

UTF8_TEXT = "🙂中文"
CHAT_UTF8_PROMPT = [vocab.BOS, vocab.USER, vocab.UTF8, vocab.EOS, vocab.ASSISTANT]


@pytest.fixture(scope="module")
def tokenizer(scripted_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(scripted_model_dir)


@dataclass
class StepLog:
    """What a caller sees per engine step: stop string, kept ids, delta and cumulative text."""

    steps: list[tuple[str | None, list[int], str, str]] = field(default_factory=list)
    final_text: str = ""
    final_token_ids: list[int] = field(default_factory=list)


def drive(
    make: Callable[[], Any], steps: Sequence[Sequence[int]], stop_terminated: bool
) -> StepLog:
    """Feed ``steps`` to a delta- and a cumulative-mode detokenizer as the output processor does.

    The request finishes on the last step (``stop_terminated``: the engine stopped on its last
    token) or on a stop string match, whichever comes first. Works for ours and upstream's.
    """
    delta, full = make(), make()
    log = StepLog()
    for i, new_ids in enumerate(steps):
        last = i == len(steps) - 1
        num_prev = delta.num_output_tokens()
        stop = delta.update(list(new_ids), stop_terminated and last)
        assert full.update(list(new_ids), stop_terminated and last) == stop
        kept = list(new_ids)[: delta.num_output_tokens() - num_prev]
        finished = last or stop is not None
        log.steps.append(
            (
                stop,
                kept,
                delta.get_next_output_text(finished, True),
                full.get_next_output_text(finished, False),
            )
        )
        if finished:
            break
    log.final_text = delta.output_text
    log.final_token_ids = list(delta.output_token_ids)
    return log


def ours_factory(
    tokenizer: Any, prompt: Sequence[int], **params: Any
) -> Callable[[], IncrementalDetokenizer]:
    sp = SamplingParams(**params)
    return lambda: IncrementalDetokenizer.from_new_request(tokenizer, "req-0", prompt, sp)


# ---------------------------------------------------------------------------------------------
# Behaviour on the scripted model (no vLLM needed)
# ---------------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_utf8_script_streams_whole_characters(tokenizer: Any) -> None:
    out = script.expected(CHAT_UTF8_PROMPT, 20)
    assert out == [*UTF8_TEXT.encode(), vocab.EOS]
    log = drive(ours_factory(tokenizer, CHAT_UTF8_PROMPT), [[t] for t in out], True)
    deltas = [text for _, _, text, _ in log.steps]
    assert [d for d in deltas if d] == list(UTF8_TEXT)
    assert all("\ufffd" not in d for d in deltas)
    # Partial characters produce no text at all until their last byte arrives.
    assert deltas[:3] == ["", "", ""] and deltas[3] == "🙂"
    assert log.final_text == UTF8_TEXT
    assert log.final_token_ids == out  # EOS is counted, its text left out


@pytest.mark.timeout(60)
def test_utf8_all_bytes_in_one_step(tokenizer: Any) -> None:
    out = list(UTF8_TEXT.encode())
    log = drive(ours_factory(tokenizer, [vocab.BOS]), [out], False)
    assert log.steps == [(None, out, UTF8_TEXT, UTF8_TEXT)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("skip", [True, False])
def test_eos_text_left_out_when_stop_terminated(tokenizer: Any, skip: bool) -> None:
    prompt = [vocab.BOS, vocab.answer_selector(2)]
    out = script.expected(prompt, 10)
    assert out == [vocab.number(1), vocab.number(0), vocab.EOS]
    for include in (False, True):
        make = ours_factory(
            tokenizer, prompt, skip_special_tokens=skip, include_stop_str_in_output=include
        )
        log = drive(make, [[t] for t in out], True)
        eos_text = "</s>" if include and not skip else ""
        assert log.final_text == " 1 0" + eos_text
        assert log.final_token_ids == out


@pytest.mark.timeout(60)
def test_special_tokens_skipped_or_kept(tokenizer: Any) -> None:
    out = [vocab.THINK, vocab.letter("a"), vocab.USER, vocab.RESERVED_BASE, vocab.END_THINK]
    kept = drive(ours_factory(tokenizer, [vocab.BOS], skip_special_tokens=False), [out], False)
    skipped = drive(ours_factory(tokenizer, [vocab.BOS]), [out], False)
    assert kept.final_text == "<think> a<|user|><|reserved_0|></think>"
    # <think>/</think> are not special: a reasoning parser must still see them.
    assert skipped.final_text == "<think> a</think>"


@pytest.mark.timeout(60)
def test_stop_string_truncates_and_holds_back(tokenizer: Any) -> None:
    prompt = [vocab.BOS, vocab.LOOP]
    out = script.expected(prompt, 6, ignore_eos=True)
    assert out[:3] == [vocab.TICK, vocab.TOCK, vocab.TICK]
    log = drive(ours_factory(tokenizer, prompt, stop=["tock tick"]), [[t] for t in out], False)
    # " tick" is fully held back (8 characters of hold-back), then " t"; the match finishes the
    # request on the third token and cuts the text before the stop string.
    assert [s[2] for s in log.steps] == ["", " t", "ick "]
    assert log.steps[-1][0] == "tock tick"
    assert log.final_text == " tick "
    assert log.final_token_ids == out[:3]


@pytest.mark.timeout(60)
def test_stop_string_included_and_surplus_tokens_dropped(tokenizer: Any) -> None:
    out = [vocab.TICK, vocab.TOCK, vocab.TICK, vocab.TOCK]
    make = ours_factory(tokenizer, [vocab.BOS], stop=["k t"], include_stop_str_in_output=True)
    log = drive(make, [out], False)
    # One step carrying four tokens: the first match ends in the second token; the rest go.
    assert log.steps == [("k t", out[:2], " tick t", " tick t")]
    assert log.final_token_ids == out[:2]


@pytest.mark.timeout(60)
def test_stop_string_ignored_within_min_tokens(tokenizer: Any) -> None:
    out = [vocab.number(3), vocab.number(3), vocab.number(5), vocab.number(3)]
    make = ours_factory(tokenizer, [vocab.BOS], stop=["3"], min_tokens=2)
    log = drive(make, [[t] for t in out], False)
    # The "3"s of the first two tokens are within min_tokens; the fourth token's "3" matches.
    assert log.steps[-1][0] == "3"
    assert log.final_text == " 3 3 5 "
    assert len(log.steps) == 4


def test_check_stop_strings_earliest_end_wins() -> None:
    assert check_stop_strings("abcdef", 6, ["def", "bc"], False) == ("bc", 1)
    assert check_stop_strings("abcdef", 6, ["def", "bc"], True) == ("bc", 3)
    assert check_stop_strings("abcdef", 3, ["def"], True) == ("def", None)
    assert check_stop_strings("abcdef", 2, ["abc"], False) is None  # before the new text
    assert check_stop_strings("abcdef", 0, ["abc"], False) is None


@pytest.mark.timeout(60)
def test_prompt_ending_mid_character_leaks_prompt_text(tokenizer: Any) -> None:
    """Upstream quirk, mirrored: the DecodeStream is primed with the whole prompt, but when the
    prompt's text ends in an incomplete character it keeps no prefix, so the first chunk it
    emits repeats the prompt's text (special tokens skipped). Parity: the oracle tests below."""
    zero, one = vocab.number(0), vocab.number(1)
    partial = [vocab.BOS, vocab.USER, zero, *"🙂".encode()[:2]]
    log = drive(ours_factory(tokenizer, partial), [[one]], False)
    assert log.final_text == " 0\ufffd 1"
    completed = drive(ours_factory(tokenizer, partial), [list("🙂".encode()[2:]), [one]], False)
    assert [s[2] for s in completed.steps] == [" 0🙂", " 1"]
    clean = drive(ours_factory(tokenizer, [vocab.BOS, vocab.USER, zero]), [[one]], False)
    assert clean.final_text == " 1"


@pytest.mark.timeout(60)
def test_invalid_prefix_resets_stream_without_prompt(tokenizer: Any) -> None:
    """tokenizers' "Invalid prefix encountered" error: a fresh stream (no prompt priming)."""

    class BrokenStream:
        def step(self, backend: Any, token_id: int) -> str | None:
            raise Exception("Invalid prefix encountered while decoding stream. Token ID: 1")

    detok = IncrementalDetokenizer.from_new_request(tokenizer, "r", [vocab.BOS], SamplingParams())
    detok.stream = BrokenStream()  # type: ignore[assignment]
    assert detok.update([vocab.letter("a")], False) is None
    assert detok.output_text == " a"
    assert not isinstance(detok.stream, BrokenStream)

    class OtherError(BrokenStream):
        def step(self, backend: Any, token_id: int) -> str | None:
            raise Exception("something else")

    detok.stream = OtherError()  # type: ignore[assignment]
    with pytest.raises(Exception, match="something else"):
        detok.update([vocab.letter("b")], False)


def test_unsupported_tokenizer_is_typed() -> None:
    with pytest.raises(UnsupportedTokenizerError, match="no `tokenizers` backend"):
        IncrementalDetokenizer.from_new_request(object(), "r", [1], SamplingParams())


# ---------------------------------------------------------------------------------------------
# Parity with the pinned vLLM's detokenizer, in-process
# ---------------------------------------------------------------------------------------------

_WORDS = list(range(vocab.NUMBER_BASE, vocab.TOC + 1))
_SPECIAL = [vocab.BOS, vocab.EOS, vocab.PAD, vocab.SYSTEM, vocab.USER, vocab.ASSISTANT]
_SPECIAL += [vocab.RESERVED_BASE, vocab.RESERVED_BASE + 7]
_NOT_SPECIAL_ADDED = [vocab.THINK, vocab.END_THINK, vocab.think_selector(3), vocab.UTF8]
_CHARS = ["é", "ß", "中", "文", "🙂", "€", "\u0301"]


def _char_bytes(ch: str, partial: bool) -> list[int]:
    data = list(ch.encode())
    return data[:-1] if partial and len(data) > 1 else data


pieces = st.one_of(
    st.sampled_from(_WORDS).map(lambda t: [t]),
    st.integers(32, 126).map(lambda b: [b]),
    st.integers(128, 255).map(lambda b: [b]),  # a stray (invalid) UTF-8 byte
    st.builds(_char_bytes, st.sampled_from(_CHARS), st.booleans()),
    st.sampled_from(_SPECIAL + _NOT_SPECIAL_ADDED).map(lambda t: [t]),
)


def _flatten(parts: list[list[int]]) -> list[int]:
    return [t for part in parts for t in part]


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    prompt = [vocab.BOS, *_flatten(draw(st.lists(pieces, max_size=6)))]
    out = _flatten(draw(st.lists(pieces, min_size=1, max_size=14)))
    stop_terminated = draw(st.booleans())
    if stop_terminated and draw(st.booleans()):
        out.append(vocab.EOS)
    cuts = sorted(draw(st.sets(st.integers(1, max(len(out) - 1, 1)), max_size=len(out))))
    steps = [out[a:b] for a, b in zip([0, *cuts], [*cuts, len(out)], strict=True) if out[a:b]]
    # Stop strings: pieces of the text the tokens spell (so they match), plus arbitrary ones.
    spelled = b"".join(
        vocab.text_of(t).encode() if t >= vocab.NUM_BYTES else bytes([t]) for t in out
    ).decode(errors="replace")
    substrings = st.builds(
        lambda i, n: spelled[i : i + n] or " ", st.integers(0, len(spelled)), st.integers(1, 6)
    )
    stop = draw(
        st.lists(
            st.one_of(substrings, substrings, st.sampled_from([" 1", "k", "</", "中", "🙂"])),
            max_size=3,
        )
    )
    params = {
        "stop": stop,
        "include_stop_str_in_output": draw(st.booleans()),
        "min_tokens": draw(st.integers(0, 4)),
        "skip_special_tokens": draw(st.booleans()),
        "spaces_between_special_tokens": draw(st.booleans()),
    }
    return {"prompt": prompt, "steps": steps, "stop_terminated": stop_terminated, "params": params}


@pytest.fixture(scope="module")
def upstream(scripted_model_dir: Path) -> Callable[..., Callable[[], Any]]:
    """A factory of the pinned vLLM's per-request detokenizer (as its OutputProcessor builds it)."""
    from vllm.sampling_params import SamplingParams as VllmSamplingParams
    from vllm.tokenizers import get_tokenizer
    from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer
    from vllm.v1.engine.detokenizer import IncrementalDetokenizer as VllmDetokenizer

    vllm_tokenizer = get_tokenizer(str(scripted_model_dir))

    def factory(prompt: Sequence[int], **params: Any) -> Callable[[], Any]:
        request = SimpleNamespace(
            request_id="req-0",
            prompt_token_ids=list(prompt),
            prompt_embeds=None,
            sampling_params=VllmSamplingParams(**params),
        )

        def make() -> Any:
            detokenizer = VllmDetokenizer.from_new_request(vllm_tokenizer, request)
            assert isinstance(detokenizer, FastIncrementalDetokenizer)
            return detokenizer

        return make

    return factory


@pytest.mark.oracle
@pytest.mark.timeout(240)
@settings(
    max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=scenarios())
def test_matches_upstream_detokenizer(
    case: dict[str, Any], tokenizer: Any, upstream: Callable[..., Callable[[], Any]]
) -> None:
    prompt, steps, params = case["prompt"], case["steps"], case["params"]
    ours = drive(ours_factory(tokenizer, prompt, **params), steps, case["stop_terminated"])
    theirs = drive(upstream(prompt, **params), steps, case["stop_terminated"])
    assert ours == theirs
    event(f"stop string matched: {ours.steps[-1][0] is not None}")
    event(f"text held back on some step: {any(not s[2] for s in ours.steps)}")
    event(f"replacement char in text: {chr(0xFFFD) in ours.final_text}")


@pytest.mark.oracle
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "prompt, max_tokens",
    [
        (CHAT_UTF8_PROMPT, 20),
        (
            [
                vocab.BOS,
                vocab.USER,
                vocab.think_selector(3),
                vocab.answer_selector(2),
                vocab.EOS,
                vocab.ASSISTANT,
            ],
            200,
        ),
        ([vocab.BOS, vocab.LOOP], 12),
        ([vocab.BOS, vocab.number(7), *"🙂".encode()[:2]], 5),  # a prompt ending inside a character
    ],
)
@pytest.mark.parametrize("skip", [True, False])
def test_script_outputs_match_upstream(
    tokenizer: Any,
    upstream: Callable[..., Callable[[], Any]],
    prompt: list[int],
    max_tokens: int,
    skip: bool,
) -> None:
    out = script.expected(prompt, max_tokens, ignore_eos=False)
    stop_terminated = out[-1] == vocab.EOS
    for stop in ([], [" 0", "文"], ["tock"]):
        params = {"skip_special_tokens": skip, "stop": stop}
        ours = drive(ours_factory(tokenizer, prompt, **params), [[t] for t in out], stop_terminated)
        theirs = drive(upstream(prompt, **params), [[t] for t in out], stop_terminated)
        assert ours == theirs


# ---------------------------------------------------------------------------------------------
# The serving-side contract: ``process`` against the pinned vLLM's OutputProcessor
# ---------------------------------------------------------------------------------------------

# What the client sees per step: (text delta, token ids, finish_reason, stop_reason, abort).
ClientStep = tuple[str, list[int], str | None, int | str | None, bool]


def ours_client_steps(
    tokenizer: Any,
    prompt: Sequence[int],
    steps: Sequence[Sequence[int]],
    finish: str | None,
    stop_reason: int | None,
    params: dict[str, Any],
) -> list[ClientStep]:
    """The output-processor logic the serving layer builds on ``IncrementalDetokenizer.process``."""
    detok = IncrementalDetokenizer.from_new_request(
        tokenizer, "req-0", prompt, SamplingParams(**params)
    )
    seen: list[ClientStep] = []
    for i, new_ids in enumerate(steps):
        engine_finish = finish if i == len(steps) - 1 else None
        out = detok.process(new_ids, engine_finish == "stop", finished=engine_finish is not None)
        reason: int | str | None = stop_reason if engine_finish else None
        if out.stop_string is not None:
            # A stop string finishes the request; the engine must abort it if it had not.
            seen.append(
                (out.text, list(out.token_ids), "stop", out.stop_string, engine_finish is None)
            )
            break
        seen.append((out.text, list(out.token_ids), engine_finish, reason, False))
    return seen


@pytest.fixture(scope="module")
def upstream_client_steps(scripted_model_dir: Path) -> Callable[..., list[ClientStep]]:
    from vllm.sampling_params import RequestOutputKind
    from vllm.sampling_params import SamplingParams as VllmSamplingParams
    from vllm.tokenizers import get_tokenizer
    from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
    from vllm.v1.engine.output_processor import OutputProcessor

    vllm_tokenizer = get_tokenizer(str(scripted_model_dir))
    reasons = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}

    def run(
        prompt: Sequence[int],
        steps: Sequence[Sequence[int]],
        finish: str | None,
        stop_reason: int | None,
        params: dict[str, Any],
    ) -> list[ClientStep]:
        processor = OutputProcessor(vllm_tokenizer, log_stats=False)
        sampling = VllmSamplingParams(**params, output_kind=RequestOutputKind.DELTA)
        request = EngineCoreRequest(
            request_id="req-0",
            prompt_token_ids=list(prompt),
            mm_features=None,
            sampling_params=sampling,
            pooling_params=None,
            arrival_time=0.0,
            lora_request=None,
            cache_salt=None,
            data_parallel_rank=None,
            external_req_id="req-0",
        )
        processor.add_request(request, prompt=None)
        seen: list[ClientStep] = []
        for i, new_ids in enumerate(steps):
            engine_finish = finish if i == len(steps) - 1 else None
            core_output = EngineCoreOutput(
                request_id="req-0",
                new_token_ids=list(new_ids),
                finish_reason=reasons[engine_finish] if engine_finish else None,
                stop_reason=stop_reason if engine_finish else None,
            )
            result = processor.process_outputs([core_output])
            (request_output,) = result.request_outputs
            (completion,) = request_output.outputs
            aborted = "req-0" in result.reqs_to_abort
            seen.append(
                (
                    completion.text,
                    list(completion.token_ids),
                    completion.finish_reason,
                    completion.stop_reason,
                    aborted,
                )
            )
            if completion.finish_reason is not None:
                break
        return seen

    return run


@st.composite
def engine_runs(draw: st.DrawFn) -> dict[str, Any]:
    case = draw(scenarios())
    finish = draw(st.sampled_from([None, "length", "stop"]))
    if finish == "stop":
        # The engine stopped on EOS (no stop_reason) or on a stop token id (its id).
        stop_reason = draw(st.sampled_from([None, case["steps"][-1][-1]]))
    else:
        stop_reason = None
    return {**case, "finish": finish, "stop_reason": stop_reason}


@pytest.mark.oracle
@pytest.mark.timeout(240)
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(run=engine_runs())
def test_process_matches_upstream_output_processor(
    run: dict[str, Any], tokenizer: Any, upstream_client_steps: Callable[..., list[ClientStep]]
) -> None:
    args = (run["prompt"], run["steps"], run["finish"], run["stop_reason"], run["params"])
    assert ours_client_steps(tokenizer, *args) == upstream_client_steps(*args)
