"""Factories for driving the model runner with hand-built scheduler outputs.

``StepDriver`` is a deliberately tiny scheduler (FCFS, a token budget, exact block coverage,
manual preemption) that produces the ``SchedulerOutput`` the runner consumes and applies the
``ModelRunnerOutput`` it returns, so runner tests can script chunked prefill, preemption and
mixed batches step by step. It is not the engine's scheduler.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from contract.scripted.vocab import EOS
from engine.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from engine.outputs import ModelRunnerOutput
from engine.sampling_params import SamplingParams
from engine.worker.model_runner import ModelRunner


def greedy_params(max_tokens: int, **kwargs: object) -> SamplingParams:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, **kwargs)  # type: ignore[arg-type]
    params.eos_token_id = None if params.ignore_eos else EOS
    params.all_stop_token_ids = {EOS, *params.stop_token_ids}
    return params


@dataclass
class FakeRequest:
    req_id: str
    prompt: list[int]
    params: SamplingParams
    outputs: list[int] = field(default_factory=list)
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)
    known_to_runner: bool = False
    resumed: bool = False
    finished: bool = False
    partial_steps: int = 0  # steps in which it was scheduled but sampled nothing

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.outputs)


class StepDriver:
    """Schedule -> runner.execute_model -> apply, one step at a time."""

    def __init__(self, runner: ModelRunner, token_budget: int = 8192) -> None:
        self.runner = runner
        self.block_size = runner.block_size
        self.token_budget = token_budget
        self.free = deque(range(1, runner.num_blocks))
        self.requests: dict[str, FakeRequest] = {}
        self.queue: list[str] = []  # unfinished, in admission order
        self.finished_since_last: set[str] = set()
        self.outputs: list[ModelRunnerOutput] = []
        self.last_scheduled: SchedulerOutput | None = None

    def add(self, req_id: str, prompt: Sequence[int], params: SamplingParams) -> None:
        self.requests[req_id] = FakeRequest(req_id, list(prompt), params)
        self.queue.append(req_id)

    def preempt(self, req_id: str) -> None:
        req = self.requests[req_id]
        self.free.extend(reversed(req.blocks))
        req.blocks, req.num_computed, req.resumed = [], 0, req.known_to_runner

    def _allocate(self, req: FakeRequest, num_tokens: int) -> list[int]:
        needed = -(-num_tokens // self.block_size) - len(req.blocks)
        new = [self.free.popleft() for _ in range(max(needed, 0))]
        req.blocks.extend(new)
        return new

    def schedule(self, chunk: dict[str, int] | None = None) -> SchedulerOutput:
        """Decodes and prefill chunks under the budget; ``chunk`` caps tokens per request."""
        budget = self.token_budget
        new_reqs: list[NewRequestData] = []
        cached = CachedRequestData()
        scheduled: dict[str, int] = {}
        for req_id in self.queue:
            req = self.requests[req_id]
            n = min(req.num_tokens - req.num_computed, budget, (chunk or {}).get(req_id, budget))
            if n <= 0:
                continue
            new_blocks = self._allocate(req, req.num_computed + n)
            if not req.known_to_runner:
                new_reqs.append(
                    NewRequestData(
                        req_id, req.prompt[:], req.params, req.blocks[:], req.num_computed
                    )
                )
                req.known_to_runner = True
            else:
                cached.req_ids.append(req_id)
                if req.resumed:
                    cached.resumed_req_ids.add(req_id)
                    cached.all_token_ids[req_id] = req.prompt + req.outputs
                    cached.new_block_ids.append(req.blocks[:])
                    req.resumed = False
                else:
                    cached.new_block_ids.append(new_blocks or None)
                cached.num_computed_tokens.append(req.num_computed)
                cached.num_output_tokens.append(len(req.outputs))
            scheduled[req_id] = n
            budget -= n
        finished, self.finished_since_last = self.finished_since_last, set()
        return SchedulerOutput(new_reqs, cached, scheduled, sum(scheduled.values()), finished)

    def step(self, chunk: dict[str, int] | None = None) -> ModelRunnerOutput:
        scheduler_output = self.last_scheduled = self.schedule(chunk)
        output = self.runner.execute_model(scheduler_output)
        self.outputs.append(output)
        for req_id, n in scheduler_output.num_scheduled_tokens.items():
            req = self.requests[req_id]
            req.num_computed += n
            tokens = output.sampled_token_ids[output.req_id_to_index[req_id]]
            if not tokens:
                req.partial_steps += 1
            req.outputs.extend(tokens)
            if tokens and self._is_finished(req, tokens[-1]):
                req.finished = True
                self.queue.remove(req_id)
                self.free.extend(reversed(req.blocks))
                self.finished_since_last.add(req_id)
        return output

    def _is_finished(self, req: FakeRequest, token: int) -> bool:
        p = req.params
        if len(req.outputs) < p.min_tokens:
            return False
        return (
            (p.max_tokens is not None and len(req.outputs) >= p.max_tokens)
            or (token == EOS and not p.ignore_eos)
            or token in p.stop_token_ids
        )

    def run(self, max_steps: int = 10_000) -> dict[str, list[int]]:
        for _ in range(max_steps):
            if not self.queue:
                break
            self.step()
        else:
            raise AssertionError(f"requests still running after {max_steps} steps")
        if self.finished_since_last:  # let the runner drop them, as the next step would
            self.runner.execute_model(self.schedule())
        return {r: q.outputs for r, q in self.requests.items()}


@pytest.fixture(scope="module", autouse=True)
def single_torch_thread() -> Iterator[None]:
    """One intra-op thread while these tests run: on a small shared machine, spinning OpenMP
    threads slow a 1-token decode step down by an order of magnitude. Restored afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def runner_factory(scripted_model_dir: Path) -> Callable[..., ModelRunner]:
    """Runners on the scripted model, one per (block_size, num_blocks, dtype) per module."""
    cache: dict[tuple[int, int, torch.dtype], ModelRunner] = {}

    def make(
        block_size: int = 16, num_blocks: int = 512, dtype: torch.dtype = torch.float32
    ) -> ModelRunner:
        key = (block_size, num_blocks, dtype)
        if key not in cache:
            cache[key] = ModelRunner(
                scripted_model_dir, num_blocks=num_blocks, block_size=block_size, dtype=dtype
            )
        runner = cache[key]
        runner.requests.clear()  # a failed test may have left requests behind
        return runner

    return make


@pytest.fixture
def driver(runner_factory: Callable[..., ModelRunner]) -> Callable[..., StepDriver]:
    """``driver(block_size=16, num_blocks=512, dtype=float32, token_budget=8192)``."""

    def make(token_budget: int = 8192, **runner_kwargs: object) -> StepDriver:
        return StepDriver(runner_factory(**runner_kwargs), token_budget)

    return make


@pytest.fixture
def greedy() -> Callable[..., SamplingParams]:
    """``greedy(max_tokens, **sampling_params)``: temperature 0, EOS set as the engine sets it."""
    return greedy_params


@pytest.fixture
def driver_on() -> Callable[[ModelRunner, int], StepDriver]:
    """``driver_on(runner, token_budget)``: a driver over a runner of the test's own."""

    def make(runner: ModelRunner, token_budget: int = 8192) -> StepDriver:
        runner.requests.clear()
        return StepDriver(runner, token_budget)

    return make
