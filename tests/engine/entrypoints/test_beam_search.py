"""Beam search over a fake engine (engine/entrypoints/openai/beam_search.py).

The fake engine's next-token logprobs depend on the last token only (a table), so every
beam's candidates, scores and the final ranking can be worked out by hand. The same search is
held to the pinned vLLM, whole bodies, in tests/reliability/test_bad_input_diff.py.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from engine.entrypoints.logprobs import Logprob
from engine.entrypoints.openai.beam_search import BeamSearchParams, beam_score, beam_search
from engine.request_output import CompletionOutput, RequestOutput
from engine.sampling_params import SamplingParams, SamplingParamsError

EOS = 0
# last token -> {next token: probability}
TABLE = {
    1: {2: 0.6, 3: 0.4},
    2: {EOS: 0.5, 4: 0.3, 5: 0.2},
    3: {5: 0.9, EOS: 0.1},
    4: {EOS: 1.0},
    5: {6: 1.0},
    6: {6: 1.0},
    EOS: {EOS: 1.0},
}


class Tokenizer:
    eos_token_id = EOS

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(f" t{i}" for i in ids)


def run(params: BeamSearchParams, prompt: list[int] | None = None) -> tuple[RequestOutput, list]:
    rounds: list[tuple[list[int], SamplingParams]] = []

    async def generate(tokens: list[int], sp: SamplingParams, request_id: str) -> RequestOutput:
        rounds.append((list(tokens), sp))
        row = TABLE[tokens[-1]]
        ranked = sorted(row.items(), key=lambda kv: -kv[1])[: sp.logprobs]
        position = {t: Logprob(math.log(p)) for t, p in ranked}
        out = CompletionOutput(0, "", [ranked[0][0]], [position], finish_reason="length")
        return RequestOutput(request_id, None, tokens, None, [out], True)

    async def collect() -> list[Any]:
        return [
            o async for o in beam_search(generate, Tokenizer(), prompt or [1], None, "r", params)
        ]

    outputs = asyncio.run(collect())
    assert len(outputs) == 1
    return outputs[0], rounds


def test_rounds_ask_for_one_token_with_twice_the_width_logprobs() -> None:
    _, rounds = run(BeamSearchParams(beam_width=2, max_tokens=3, temperature=0.7))
    assert [tokens for tokens, _ in rounds[:3]] == [[1], [1, 2], [1, 3]]
    assert {(sp.max_tokens, sp.logprobs, sp.temperature, sp.detokenize) for _, sp in rounds} == {
        (1, 4, 0.7, False)
    }


def test_the_best_beams_by_length_normalised_score() -> None:
    # Worked out by hand (the prompt counts in the length): live [1,3,5,6,6] log(.36)/5,
    # completed [1,2,4]+EOS log(.18)/3, [1,2]+EOS log(.3)/2, [1,3]+EOS log(.04)/2.
    out, _ = run(BeamSearchParams(beam_width=2, max_tokens=4))
    choices = [(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in out.outputs]
    assert choices == [
        ([3, 5, 6, 6], " t3 t5 t6 t6", "length", None),
        ([2, 4], " t2 t4", "stop", EOS),
    ]
    assert [c.index for c in out.outputs] == [0, 1]
    assert [len(c.logprobs or []) for c in out.outputs] == [4, 3]  # a position per round


def test_length_penalty_zero_ranks_by_cumulative_logprob_alone() -> None:
    out, _ = run(BeamSearchParams(beam_width=2, max_tokens=4, length_penalty=0.0))
    assert [c.token_ids for c in out.outputs] == [[3, 5, 6, 6], [2]]  # log .36 > log .3


def test_ignore_eos_keeps_eos_candidates_alive_and_in_the_text() -> None:
    out, _ = run(BeamSearchParams(beam_width=1, max_tokens=3, ignore_eos=True))
    choice = out.outputs[0]
    assert (choice.token_ids, choice.text, choice.finish_reason) == (
        [2, EOS, EOS],
        " t2 t0 t0",
        "length",
    )


def test_include_stop_str_keeps_the_eos_token_but_not_its_text() -> None:
    out, _ = run(BeamSearchParams(beam_width=1, max_tokens=3, include_stop_str_in_output=True))
    choice = out.outputs[0]
    assert (choice.token_ids, choice.text, choice.finish_reason) == ([2, 4, EOS], " t2 t4", "stop")


def test_beam_score_does_not_count_the_eos() -> None:
    assert beam_score(_beam([1, 2, EOS], -2.0), EOS, 1.0) == -1.0
    assert beam_score(_beam([1, 2, 3], -3.0), EOS, 1.0) == -1.0


def test_beam_width_is_checked_as_n() -> None:
    with pytest.raises(SamplingParamsError, match="beam_width must be at least 1"):
        BeamSearchParams(beam_width=0, max_tokens=1)


def _beam(tokens: list[int], cum: float) -> Any:
    from engine.entrypoints.openai.beam_search import Beam

    return Beam(tokens, cum)
