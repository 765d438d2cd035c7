"""The server's batch defaults (``engine.entrypoints.cli_args.resolved_scheduler_args`` and
``engine.core.kv_sizing.check_scheduler_limits``) against the pinned vLLM's own code, in
process, over a grid of flags: ``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args``
(``engine/arg_utils.py:3097-3184``, the CPU API-server defaults) and
``SchedulerConfig.verify_max_model_len`` (``config/scheduler.py:314-364``). Same
``max_num_seqs`` and ``max_num_batched_tokens``, or the same refusal.

Found by a scenario (max_num_batched_tokens 32 without max_num_seqs): upstream lowers the
default max_num_seqs to the batch and starts; the engine kept 128 and refused.
"""

from __future__ import annotations

import argparse
import itertools
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from engine.core.kv_sizing import SchedulerConfigError, check_scheduler_limits
from engine.entrypoints.cli_args import resolved_scheduler_args

pytestmark = [pytest.mark.oracle, pytest.mark.timeout(120)]

SEQS = (None, 1, 8, 64, 300)
BATCHED = (None, 16, 32, 100, 2048, 9000)
CHUNKED = (None, True, False)
LENGTHS = (64, 96, 4096)


def upstream(
    model_dir: Path, seqs: int | None, batched: int | None, chunked: bool | None, length: int
) -> Any:
    """``(max_num_seqs, max_num_batched_tokens)`` as the pinned vLLM resolves them for the
    OpenAI server on CPU, or the text of the ValueError its scheduler config raises."""
    from vllm.config import SchedulerConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    args = EngineArgs(model=str(model_dir), max_num_seqs=seqs, max_num_batched_tokens=batched)
    args.enable_chunked_prefill = True if chunked is None else chunked  # the CPU default
    model = SimpleNamespace(max_model_len=length, is_multimodal_model=False)
    parallel = SimpleNamespace(use_batched_dp_moe=False)
    args._set_default_max_num_seqs_and_batched_tokens_args(
        UsageContext.OPENAI_API_SERVER,
        model,  # type: ignore[arg-type]
        parallel,  # type: ignore[arg-type]
    )
    try:
        config = SchedulerConfig(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_model_len=length,
            enable_chunked_prefill=args.enable_chunked_prefill,
            is_encoder_decoder=False,
        )
        config.verify_max_model_len(length)
    except ValueError as e:  # pydantic's ValidationError wraps the validator's ValueError
        found = re.search(r"Value error, (.*?)(?: \[type=|$)", str(e), re.M)
        return found.group(1) if found else str(e).split("\n")[0]
    return args.max_num_seqs, args.max_num_batched_tokens


def ours(seqs: int | None, batched: int | None, chunked: bool | None, length: int) -> Any:
    flags = argparse.Namespace(
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=None,
    )
    resolved = resolved_scheduler_args(flags, length)
    try:
        check_scheduler_limits(
            max_num_batched_tokens=resolved["max_num_batched_tokens"],
            max_num_seqs=resolved["max_num_seqs"],
            max_model_len=length,
            enable_chunked_prefill=resolved["enable_chunked_prefill"],
        )
    except SchedulerConfigError as e:
        return str(e).split("\n")[0]
    return resolved["max_num_seqs"], resolved["max_num_batched_tokens"]


def test_batch_defaults_and_refusals_match_upstream_over_a_grid(scripted_model_dir: Path) -> None:
    cases = list(itertools.product(SEQS, BATCHED, CHUNKED, LENGTHS))
    differ = [(case, ours(*case), upstream(scripted_model_dir, *case)) for case in cases]
    differ = [d for d in differ if d[1] != d[2]]
    assert not differ, differ[:5]
    # the case the scenario found: the default max_num_seqs follows a small batch
    assert ours(None, 32, True, 128) == upstream(scripted_model_dir, None, 32, True, 128)
    assert ours(None, 32, True, 128) == (32, 32)
    # an explicit max_num_seqs above the batch is refused on both sides
    refused = ours(64, 32, True, 128)
    assert isinstance(refused, str) and "must be greater than or equal to max_num_seqs" in refused
