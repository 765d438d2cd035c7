"""Upstream's own KV cache planning, run in-process: the reference for ``engine/core/kv_sizing``.

Builds a ``VllmConfig`` for a local model folder (no tokenizer, no hub) and hands
``get_kv_cache_configs`` (``vllm/v1/core/kv_cache_utils.py:2531``) one ``FullAttentionSpec`` per
decoder layer with the model's shape, in the CPU backend's only layout (``LBHNC``,
``v1/attention/backends/cpu_attn.py:72-75``), and a chosen available KV memory: exactly what the
engine core does after the worker reports its memory (``v1/engine/core.py:292-357``). Then the
capacity line (``update_kv_cache_capacity``). Log lines are captured from upstream's logger;
``info_once`` caches are cleared between calls so every call logs.

Also ``upstream_max_model_len`` (``ModelConfig``'s derived length and its refusal) and
``upstream_dtype``, so tests prove our results and messages rather than transcribe them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracle.vllm_env import prepare_vllm_import

prepare_vllm_import()

import torch  # noqa: E402
import vllm.logger as vllm_logger  # noqa: E402
from vllm.config import CacheConfig, ModelConfig, VllmConfig  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    generate_scheduler_kv_cache_config,
    get_kv_cache_configs,
    update_kv_cache_capacity,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: E402

CPU_LAYOUT = "LBHNC"
_LOGGERS = ("vllm.v1.core.kv_cache_utils",)
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class UpstreamPlan:
    """What upstream decided: the pool and max_model_len, or its error text; its log lines."""

    num_blocks: int | None
    max_model_len: int | None
    error: str | None
    log_lines: tuple[str, ...]


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def _captured_logs() -> Iterator[list[str]]:
    for cached in ("_print_info_once", "_print_warning_once", "_print_debug_once"):
        getattr(vllm_logger, cached).cache_clear()
    handler = _Capture()
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    saved = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    try:
        yield handler.lines
    finally:
        for lg, level in zip(loggers, saved, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(level)


def _model_config(model_dir: str | Path, max_model_len: int | None, dtype: str) -> ModelConfig:
    kwargs: dict[str, Any] = {"max_model_len": max_model_len, "dtype": dtype}
    return ModelConfig(model=str(model_dir), skip_tokenizer_init=True, **kwargs)


def upstream_max_model_len(
    model_dir: str | Path, max_model_len: int | None, *, dtype: str = "float32"
) -> tuple[int | None, str | None]:
    """``(max_model_len, None)`` as ModelConfig settles it, or ``(None, error text)``."""
    try:
        config = _model_config(model_dir, max_model_len, dtype)
    except ValueError as exc:  # pydantic wraps it; keep upstream's own text
        return None, _unwrap(exc)
    return config.max_model_len, None


def upstream_dtype(model_dir: str | Path, dtype: str) -> str:
    """The torch dtype name ModelConfig resolves ``dtype`` to on this (CPU) platform."""
    return str(_model_config(model_dir, None, dtype).dtype).removeprefix("torch.")


def _unwrap(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        for err in errors():
            cause = (err.get("ctx") or {}).get("error")
            if cause is not None:
                return str(cause)
    return str(exc)


def upstream_plan(
    model_dir: str | Path,
    *,
    block_size: int,
    available_memory: int,
    num_gpu_blocks_override: int | None = None,
    max_model_len: int | None = None,
    dtype: str = "float32",
) -> UpstreamPlan:
    """Run upstream's KV planning for the model at ``model_dir`` (``max_model_len`` -1: auto)."""
    with _captured_logs() as lines:
        try:
            vllm_config = VllmConfig(
                model_config=_model_config(model_dir, max_model_len, dtype),
                cache_config=CacheConfig(
                    block_size=block_size, num_gpu_blocks_override=num_gpu_blocks_override
                ),
            )
        except ValueError as exc:
            return UpstreamPlan(None, None, _unwrap(exc), ())
        vllm_config.cache_config.kv_cache_layout = CPU_LAYOUT
        specs = _layer_specs(vllm_config, block_size, _TORCH_DTYPES[dtype])
        try:
            configs = get_kv_cache_configs(vllm_config, [specs], [available_memory])
        except ValueError as exc:
            return UpstreamPlan(None, None, str(exc), tuple(lines))
        scheduler_config = generate_scheduler_kv_cache_config(configs)
        update_kv_cache_capacity(vllm_config, scheduler_config)
        return UpstreamPlan(
            scheduler_config.num_blocks,
            vllm_config.model_config.max_model_len,
            None,
            tuple(lines),
        )


def _layer_specs(vllm_config: VllmConfig, block_size: int, dtype: torch.dtype) -> dict[str, Any]:
    model_config = vllm_config.model_config
    spec = FullAttentionSpec(
        block_size=block_size,
        num_kv_heads=model_config.get_num_kv_heads(vllm_config.parallel_config),
        head_size=model_config.get_head_size(),
        dtype=dtype,
    )
    num_layers = model_config.get_num_layers(vllm_config.parallel_config)
    return {f"model.layers.{i}.self_attn.attn": spec for i in range(num_layers)}


def upstream_model_facts(
    model_dir: str | Path, *, generation_config: str = "auto"
) -> dict[str, Any]:
    """What upstream's ``ModelConfig`` reads from the folder (dtype ``auto``, derived length)."""
    config = ModelConfig(
        model=str(model_dir), skip_tokenizer_init=True, generation_config=generation_config
    )
    parallel = VllmConfig(model_config=config).parallel_config
    derived, key = config.model_arch_config.derived_max_model_len_and_key
    return {
        "architectures": tuple(config.architectures),
        "num_hidden_layers": config.get_num_layers(parallel),
        "num_attention_heads": config.get_num_attention_heads(parallel),
        "num_key_value_heads": config.get_num_kv_heads(parallel),
        "head_dim": config.get_head_size(),
        "vocab_size": config.get_vocab_size(),
        "max_model_len": config.max_model_len,
        "max_len_key": key,
        "dtype": str(config.dtype).removeprefix("torch."),
        "generation_eos": config.try_get_generation_config().get("eos_token_id"),
        "default_sampling_params": config.get_diff_sampling_param(),
    }
