"""Factories for engine-core tests, modelled on upstream's tests/v1/core/utils.py.

``create_scheduler`` / ``create_core`` build our scheduler or engine core with upstream-test-like
defaults; ``create_requests`` makes requests with distinct prompts (or a shared one), greedy
params updated from the scripted model's generation config (EOS 390), and arrival times in
creation order; ``run_workload`` drives a core like the parity runner does (requests with an
``at_step`` are added after that many steps).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import pytest

from contract.scripted import script, vocab
from contract.trace import StepTrace
from engine.config import EngineConfig
from engine.core.engine_core import EngineCore
from engine.core.fake_runner import ScriptedModelRunner
from engine.core.sched.scheduler import Scheduler
from engine.core.step_trace import traced_step
from engine.request import Request
from engine.sampling_params import SamplingParams

EOS = vocab.EOS
BOS = vocab.BOS
_arrival = itertools.count()


def make_params(
    max_tokens: int = 16,
    *,
    min_tokens: int = 0,
    ignore_eos: bool = False,
    stop_token_ids: Sequence[int] = (),
    prompt_logprobs: int | None = None,
) -> SamplingParams:
    params = SamplingParams(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=ignore_eos,
        stop_token_ids=list(stop_token_ids),
        temperature=0.0,
        prompt_logprobs=prompt_logprobs,
    )
    params.update_from_generation_config({"eos_token_id": EOS}, EOS)
    return params


def prompt(base: int, num_tokens: int) -> list[int]:
    """``[BOS, base, base+1, ...]``: distinct plain tokens (ids below the special range)."""
    assert base + num_tokens < BOS
    return [BOS] + [base + i for i in range(num_tokens - 1)]


def make_request(
    request_id: str,
    prompt_token_ids: Sequence[int],
    max_tokens: int = 16,
    *,
    priority: int = 0,
    arrival_time: float | None = None,
    **params: object,
) -> Request:
    return Request(
        request_id,
        list(prompt_token_ids),
        make_params(max_tokens, **params),  # type: ignore[arg-type]
        arrival_time=float(next(_arrival)) if arrival_time is None else arrival_time,
        priority=priority,
    )


def create_requests(
    num_requests: int,
    num_tokens: int = 10,
    max_tokens: int = 16,
    *,
    same_prompt: bool = False,
    ignore_eos: bool = True,
    prefix: str = "r",
) -> list[Request]:
    """Requests ``r0, r1, ...``; distinct prompts unless ``same_prompt``."""
    return [
        make_request(
            f"{prefix}{i}",
            prompt(100 if same_prompt else 10 + 37 * i % 300, num_tokens),
            max_tokens,
            ignore_eos=ignore_eos,
        )
        for i in range(num_requests)
    ]


def create_config(**kwargs: object) -> EngineConfig:
    defaults: dict[str, object] = {
        "block_size": 16,
        "max_model_len": 2048,
        "max_num_seqs": 16,
        "max_num_batched_tokens": 8192,
    }
    defaults.update(kwargs)
    return EngineConfig(**defaults)  # type: ignore[arg-type]


def create_scheduler(num_blocks: int = 10000, **config: object) -> Scheduler:
    cfg = create_config(**config)
    assert isinstance(cfg.max_model_len, int)
    return Scheduler(cfg, num_blocks, cfg.max_model_len)


def create_core(num_blocks: int = 10000, **config: object) -> EngineCore:
    cfg = create_config(**config)
    return EngineCore(cfg, ScriptedModelRunner(script, block_size=cfg.block_size), num_blocks)


@dataclass
class Run:
    """A finished workload: traces plus each request's tokens and finish reason."""

    traces: list[StepTrace]
    tokens: dict[str, list[int]] = field(default_factory=dict)
    finish: dict[str, str] = field(default_factory=dict)

    def step(self, n: int) -> StepTrace:
        return self.traces[n - 1]


def run_workload(
    core: EngineCore, requests: Iterable[Request | tuple[int, Request]], max_steps: int = 300
) -> Run:
    """Step until every request is in and finished, or ``max_steps``; ``(s, req)`` arrives after s steps."""
    pending = sorted(
        ((item if isinstance(item, tuple) else (0, item)) for item in requests),
        key=lambda entry: entry[0],
    )
    run = Run([])
    cursor = 0
    while len(run.traces) < max_steps:
        while cursor < len(pending) and pending[cursor][0] <= len(run.traces):
            core.add_request(pending[cursor][1])
            run.tokens.setdefault(pending[cursor][1].request_id, [])
            cursor += 1
        if cursor == len(pending) and not core.has_unfinished_requests():
            break
        outputs, trace = traced_step(core)
        for out in outputs:
            run.tokens[out.request_id].extend(out.new_token_ids)
        run.finish.update(trace.finished)
        run.traces.append(trace)
    return run


class Factories:
    """The factories above, handed to tests through the ``factories`` fixture.

    Test modules here have no package, so they reach conftest helpers through this fixture
    rather than by import.
    """

    EOS = EOS
    BOS = BOS
    make_params = staticmethod(make_params)
    prompt = staticmethod(prompt)
    make_request = staticmethod(make_request)
    create_requests = staticmethod(create_requests)
    create_config = staticmethod(create_config)
    create_scheduler = staticmethod(create_scheduler)
    create_core = staticmethod(create_core)
    run_workload = staticmethod(run_workload)


@pytest.fixture
def factories() -> type[Factories]:
    return Factories
