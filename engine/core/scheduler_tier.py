"""Our engine at the scheduler tier: ``EngineCore`` + the scripted fake runner, built from args.

Built the way the oracle adapter builds upstream's scheduler (``oracle/scheduler_adapter.py``):
the model folder's config, ``num_gpu_blocks_override`` as the pool size (null block included),
no startup capacity check applied (``startup`` only reports what ours would say:
``plan_kv_cache``, which mirrors ``get_kv_cache_configs`` of ``v1/core/kv_cache_utils.py:2531``
at the pin), greedy requests whose EOS comes from the model's config and generation config, and
deterministic arrival times (the n-th request submitted after ``start`` arrives at
``float(n)``), so priority ties break identically.

Two drivers share it: the in-process target ``parity/targets/engine.py`` and the protocol worker
``engine/core/scheduler_worker.py`` (which passes each request's scripted ``output_token_ids``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from contract.protocol import ENGINE_ARGS, RequestLike, Startup
from contract.trace import StepTrace
from engine.config import ConfigError, EngineConfig
from engine.core.engine_core import EngineCore
from engine.core.fake_runner import ScriptedModelRunner
from engine.core.kv_sizing import plan_kv_cache
from engine.core.step_trace import build_step_trace
from engine.divergence import Deviations
from engine.model_config import (
    ModelConfig,
    ModelConfigError,
    load_model_config,
    resolve_dtype,
    resolve_max_model_len,
)
from engine.request import Request
from engine.sampling_params import SamplingParams

ENGINE_CONFIG_KEYS = ENGINE_ARGS  # the engine takes every engine arg of the protocol


class EngineRefusal(ValueError):
    """The engine will not run this config (one line, naming the engine)."""


@functools.lru_cache(maxsize=8)
def _model_config(model_dir: str) -> ModelConfig:
    return load_model_config(model_dir)


class SchedulerTierEngine:
    """``EngineCore`` + ``ScriptedModelRunner``, rebuilt on every ``start``."""

    def __init__(self, profiles: tuple[str, ...] = (), script: Any = None) -> None:
        self.profiles = profiles
        self.script = script  # None: contract.scripted.script
        self.core: EngineCore | None = None
        self.runner: ScriptedModelRunner | None = None
        self.startup = Startup()
        self.notes: list[str] = []  # notes for the run summary: none (the oracle's has some)
        self._eos_token_id: int | None = None
        self._generation_config: dict[str, object] = {}
        self._num_added = 0

    def start(self, values: Mapping[str, Any]) -> Startup:
        """A fresh core for ``values`` (``model`` plus ``ENGINE_CONFIG_KEYS``; missing keys take
        ``EngineConfig``'s defaults); ``EngineRefusal`` when it will not run them."""
        self.close()
        model_dir = str(values["model"])
        if not (Path(model_dir) / "config.json").is_file():
            raise EngineRefusal(f"no model in {model_dir} (run make model)")
        try:
            model = _model_config(model_dir)
            args = {key: values[key] for key in ENGINE_CONFIG_KEYS if key in values}
            deviations = Deviations.from_names(self.profiles)
            config = EngineConfig(model=model_dir, deviations=deviations, **args)
            max_model_len = self._max_model_len(model, config)
            config.scheduler_limits(max_model_len)
        except (ConfigError, ModelConfigError, ValueError) as exc:
            raise EngineRefusal(f"engine refuses the config: {exc}") from None
        num_blocks = config.num_gpu_blocks_override
        if num_blocks is None:
            raise EngineRefusal("the scheduler tier needs num_gpu_blocks_override")
        self.startup = self._startup_check(model, config, max_model_len)
        self.runner = ScriptedModelRunner(self.script, block_size=config.block_size)
        self.core = EngineCore(config, self.runner, num_blocks, max_model_len)
        self._eos_token_id = model.eos_token_id
        self._generation_config = dict(model.generation_config)
        self._num_added = 0
        return self.startup

    def _plan(self, model: ModelConfig, config: EngineConfig, max_model_len: Any) -> Any:
        return plan_kv_cache(
            model,
            block_size=config.block_size,
            dtype=resolve_dtype(model, config.dtype),
            available_memory=0,
            num_gpu_blocks_override=config.num_gpu_blocks_override,
            max_model_len=max_model_len,
            legacy_null_block=config.deviations.legacy_capacity,
        )

    def _max_model_len(self, model: ModelConfig, config: EngineConfig) -> int:
        """The explicit length, or auto-fit (counting the null block under legacy-capacity)."""
        if not config.auto_fit_max_model_len:
            return resolve_max_model_len(model, config.explicit_max_model_len)
        return int(self._plan(model, config, "auto").max_model_len)

    def _startup_check(
        self, model: ModelConfig, config: EngineConfig, max_model_len: int
    ) -> Startup:
        """What our startup capacity check would say (the tier runs the config anyway)."""
        requested = -1 if config.auto_fit_max_model_len else config.explicit_max_model_len
        try:
            plan = self._plan(model, config, requested)
        except ValueError as exc:  # KVCacheCapacityError: upstream's refusal text
            return Startup(True, str(exc), max_model_len)
        return Startup(False, None, int(plan.max_model_len))

    def submit(self, request: RequestLike, output_token_ids: Sequence[int] | None = None) -> None:
        """Add one greedy request; with ``output_token_ids`` the runner samples from it."""
        if self.core is None or self.runner is None:
            raise RuntimeError("submit before start")
        if request.prompt_token_ids is None or request.max_tokens is None:
            raise ValueError(
                f"request {request.id}: the scheduler tier needs prompt_token_ids and max_tokens"
            )
        params = SamplingParams(
            temperature=0.0,
            max_tokens=request.max_tokens,
            min_tokens=request.min_tokens,
            ignore_eos=request.ignore_eos,
            stop_token_ids=list(request.stop_token_ids),
        )
        params.update_from_generation_config(self._generation_config, self._eos_token_id)
        self.core.add_request(
            Request(
                request_id=request.id,
                prompt_token_ids=list(request.prompt_token_ids),
                sampling_params=params,
                arrival_time=float(self._num_added),
                priority=request.priority,
            )
        )
        if output_token_ids is not None:
            self.runner.set_outputs(request.id, output_token_ids)
        self._num_added += 1

    def step(self) -> StepTrace:
        if self.core is None:
            raise RuntimeError("step before start")
        return build_step_trace(self.core.scheduler, self.core.step())

    def close(self) -> None:
        self.core = None
        self.runner = None
