"""Factories for the oracle tests (like upstream's ``create_scheduler`` / ``create_requests``).

Nothing here imports vllm: test modules that need the pinned scheduler import it through their
own module-scoped fixture, so the ~10-16 s import is paid once per process and only by them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from contract.trace import StepTrace

RequestFactory = Callable[..., dict[str, Any]]
ConfigFactory = Callable[..., dict[str, Any]]


@pytest.fixture(scope="session")
def make_request() -> RequestFactory:
    """A scheduler-tier request spec (the scenario file's request keys)."""

    def factory(
        request_id: str,
        prompt_token_ids: Sequence[int],
        max_tokens: int = 16,
        *,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        stop_token_ids: Sequence[int] = (),
        priority: int = 0,
        at_step: int = 0,
    ) -> dict[str, Any]:
        return {
            "id": request_id,
            "prompt_token_ids": list(prompt_token_ids),
            "max_tokens": max_tokens,
            "min_tokens": min_tokens,
            "ignore_eos": ignore_eos,
            "stop_token_ids": list(stop_token_ids),
            "priority": priority,
            "at_step": at_step,
        }

    return factory


@pytest.fixture(scope="session")
def make_config(scripted_model_dir: Path) -> ConfigFactory:
    """Scheduler-tier engine args for the scripted model; the spec's common assumptions
    (block size 16, prefix caching on, FCFS, chunked prefill, a budget above any prompt)."""

    def factory(num_gpu_blocks_override: int, max_model_len: int | str, **overrides: Any):
        config: dict[str, Any] = {
            "model": str(scripted_model_dir),
            "block_size": 16,
            "num_gpu_blocks_override": num_gpu_blocks_override,
            "max_model_len": max_model_len,
            "max_num_seqs": 256,
            "max_num_batched_tokens": 8192,
            "enable_chunked_prefill": True,
            "enable_prefix_caching": True,
            "scheduling_policy": "fcfs",
        }
        config.update(overrides)
        return config

    return factory


def tokens_of(traces: Sequence[StepTrace], request_id: str) -> list[int]:
    """Every token the request got, in step order."""
    return [t for trace in traces for t in trace.sampled_token_ids.get(request_id, ())]


def steps_where(traces: Sequence[StepTrace], predicate: Callable[[StepTrace], bool]) -> list[int]:
    """The (1-based) step numbers whose trace satisfies ``predicate``."""
    return [trace.step for trace in traces if predicate(trace)]


@pytest.fixture(scope="session")
def trace_tools() -> Any:
    """``tokens_of`` and ``steps_where`` for tests (conftest modules are not importable)."""

    class Tools:
        tokens = staticmethod(tokens_of)
        steps = staticmethod(steps_where)

    return Tools
