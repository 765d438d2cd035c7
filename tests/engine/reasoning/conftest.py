"""Fixtures for the reasoning-parser tests: the scripted tokenizer, parsers, streamed deltas."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from engine.detokenizer import IncrementalDetokenizer
from engine.reasoning import DeepSeekR1ReasoningParser, RequestReasoningParser, get_reasoning_parser
from engine.sampling_params import SamplingParams

# One engine step as the serving layer sees it: (delta text, delta token ids, finished).
Delta = tuple[str, list[int], bool]


@pytest.fixture(scope="session")
def tokenizer(scripted_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(scripted_model_dir)


@pytest.fixture(scope="session")
def r1(tokenizer: Any) -> DeepSeekR1ReasoningParser:
    parser = get_reasoning_parser("deepseek_r1")(tokenizer)
    assert isinstance(parser, DeepSeekR1ReasoningParser)
    return parser


@pytest.fixture
def make_request_parser(r1: DeepSeekR1ReasoningParser) -> Callable[[], RequestReasoningParser]:
    return lambda: RequestReasoningParser(r1)


@pytest.fixture(scope="session")
def stream_deltas(tokenizer: Any) -> Callable[..., list[Delta]]:
    """``stream_deltas(prompt, steps, stop_terminated, **params)``: the (text, ids, finished)
    deltas our detokenizer produces step by step until the request finishes."""

    def run(
        prompt: Sequence[int],
        steps: Sequence[Sequence[int]],
        stop_terminated: bool,
        **params: Any,
    ) -> list[Delta]:
        detok = IncrementalDetokenizer.from_new_request(
            tokenizer, "req-0", prompt, SamplingParams(**params)
        )
        deltas: list[Delta] = []
        for i, step in enumerate(steps):
            last = i == len(steps) - 1
            out = detok.process(list(step), stop_terminated and last, finished=last)
            finished = last or out.stop_string is not None
            deltas.append((out.text, list(out.token_ids), finished))
            if finished:
                break
        return deltas

    return run
