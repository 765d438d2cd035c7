"""The engine arguments a scenario's ``config`` may set, by vLLM's names, and where each acts.

One list for every side: the scheduler-tier targets (our ``EngineConfig``, upstream's
``SchedulerConfig`` / ``CacheConfig`` through the oracle adapter, a port's worker) take
``SCHEDULER_ARGS``; a serve-tier server takes ``SERVE_ARGS`` as flags (vLLM spells key ``k``
``--k-with-dashes``; a port's project-file target says how it spells each). Names and meanings
are upstream's ``EngineArgs`` (``vllm/engine/arg_utils.py`` at the pin).

``HARNESS_ARGS`` are not scenario keys: the harness asks every server for them so two servers
are comparable (greedy float32 output, eager execution, synchronous scheduling, the served
name it sends in requests). A target that cannot take one simply does not get it; a scenario key
it cannot take makes the scenario unsupported on that target.
"""

from __future__ import annotations

from typing import Any

from contract.protocol import ENGINE_ARGS

# Keys both scheduler-tier sides take (block_size ... seed), in a stable order: the keys of a
# protocol ``start`` config (``contract.protocol.CONFIG_DEFAULTS``, which also has defaults).
SCHEDULER_ARGS: tuple[str, ...] = ENGINE_ARGS

# Keys a serve-tier scenario may set, in the order their flags are given.
SERVE_ARGS: tuple[str, ...] = (
    "block_size",
    "num_gpu_blocks_override",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "scheduling_policy",
    "long_prefill_token_threshold",
    "dtype",
    "seed",
    "reasoning_parser",
)

# What the harness asks of every server (see the module docstring), after the scenario's keys.
HARNESS_ARGS: dict[str, Any] = {
    "enforce_eager": True,
    "async_scheduling": False,
}
DEFAULT_DTYPE = "float32"  # when the scenario sets none: exact greedy comparison


def vllm_flag(key: str, value: Any) -> list[str]:
    """vLLM's spelling of ``key=value``: ``--block-size 32``, ``--enable-x`` / ``--no-enable-x``
    for booleans, ``--k=-1`` for a value that starts with a dash; nothing for None."""
    name = "--" + key.replace("_", "-")
    if value is None:
        return []
    if isinstance(value, bool):
        return [name] if value else ["--no-" + key.replace("_", "-")]
    text = str(value)
    return [f"{name}={text}"] if text.startswith("-") else [name, text]
