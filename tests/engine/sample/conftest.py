"""Factories for sampler tests: sampling rows and their metadata."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from engine.sample.metadata import SamplingMetadata, SamplingRequest
from engine.sample.sampler import Sampler
from engine.sampling_params import SamplingParams

VOCAB = 64
EOS = 2


def make_request(
    output: Sequence[int] = (), prompt: Sequence[int] = (1,), **params: Any
) -> SamplingRequest:
    """A row with ``SamplingParams(**params)``, EOS set as the engine sets it, seeded if asked."""
    p = SamplingParams(**params)
    if p.eos_token_id is None and not p.ignore_eos:
        p.eos_token_id = EOS
    p.all_stop_token_ids = {EOS, *p.stop_token_ids}
    generator = None
    if p.seed is not None and p.temperature >= 1e-5:
        generator = torch.Generator()
        generator.manual_seed(p.seed)
    return SamplingRequest(p, list(prompt), list(output), generator)


@pytest.fixture
def row() -> Callable[..., SamplingRequest]:
    """``row(output=(), prompt=(1,), **sampling_params)``."""
    return make_request


@pytest.fixture
def sample() -> Callable[..., Any]:
    """``sample(logits, rows, sampler=None)`` -> SamplerOutput."""

    def run(logits: torch.Tensor, rows: Sequence[SamplingRequest], sampler: Sampler | None = None):  # type: ignore[no-untyped-def]
        meta = SamplingMetadata.build(rows, logits.shape[1])
        return (sampler or Sampler()).__call__(logits, meta)

    return run
