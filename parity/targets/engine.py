"""Scheduler-tier target ``engine``: our ``EngineCore`` driven by the scripted fake runner.

Built the way the oracle adapter builds upstream's scheduler (``oracle/scheduler_adapter.py``):
the model folder's config (default: the scripted model), ``num_gpu_blocks_override`` as the pool
size (null block included), no startup capacity check, greedy requests whose EOS comes from the
model's config and generation config, and deterministic arrival times (the n-th request
submitted after ``start`` arrives at ``float(n)``), so priority ties break identically.

Flags (``engine --divergence NAME``, repeatable): the engine's divergence profiles that act at
this tier (``contract.profiles.PROFILES[name].tiers``): ``abort-unservable`` and
``legacy-capacity`` (auto-fit counts the null block).
"""

from __future__ import annotations

import functools
from pathlib import Path

from contract.engine_args import SCHEDULER_ARGS
from contract.trace import StepTrace
from engine import divergence
from engine.config import ConfigError, EngineConfig
from engine.core.engine_core import EngineCore
from engine.core.fake_runner import ScriptedModelRunner
from engine.core.kv_sizing import plan_kv_cache
from engine.model_config import (
    ModelConfig,
    ModelConfigError,
    load_model_config,
    resolve_dtype,
    resolve_max_model_len,
)
from engine.request import Request
from engine.sampling_params import SamplingParams
from parity.errors import TargetSpecError, TargetStartError
from parity.scenario import ConfigSpec, RequestSpec
from parity.targets._script import shared_script

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = PROJECT_ROOT / ".cache" / "models" / "scripted"
ENGINE_CONFIG_KEYS = SCHEDULER_ARGS


@functools.lru_cache(maxsize=8)
def _model_config(model_dir: str) -> ModelConfig:
    return load_model_config(model_dir)


class EngineTarget:
    """``EngineCore`` + ``ScriptedModelRunner``, rebuilt on every ``start``."""

    tier = "scheduler"

    def __init__(self, argument: str = "") -> None:
        self.name = "engine"
        self.model_dir = argument or str(DEFAULT_MODEL)
        self.core: EngineCore | None = None
        self.notes: list[str] = []
        self._eos_token_id: int | None = None
        self._generation_config: dict[str, object] = {}
        self._num_added = 0
        self.profiles: tuple[str, ...] = ()

    def configure_flags(self, flags: list[str]) -> None:
        """``--divergence NAME`` (repeatable, or ``--divergence=NAME``); anything else, an
        unknown profile or a serve-only one is a one-line ``TargetSpecError``."""
        names: list[str] = []
        words = iter(flags)
        for word in words:
            if word.startswith("--divergence="):
                names.append(word.split("=", 1)[1])
            elif word == "--divergence":
                names.append(next(words, ""))
            else:
                raise TargetSpecError(
                    f"scheduler-tier engine: unknown flag {word!r} (only --divergence NAME)"
                )
        try:
            profiles = divergence.parse_profiles(names)
        except divergence.UnknownDivergenceError as e:
            raise TargetSpecError(f"scheduler-tier engine: {e}") from None
        serve_only = [p for p in profiles if "scheduler" not in divergence.PROFILES[p].tiers]
        if serve_only:
            raise TargetSpecError(
                f"scheduler-tier engine: profile {serve_only[0]!r} acts at the serve tier only "
                f"(scheduler tier: {', '.join(_scheduler_profiles())})"
            )
        self.profiles = profiles

    def start(self, config: ConfigSpec) -> None:
        self.close()
        model_dir = config.model or self.model_dir
        if not (Path(model_dir) / "config.json").is_file():
            raise TargetStartError(f"no model in {model_dir} (run make model)")
        try:
            model = _model_config(str(model_dir))
            values = {key: getattr(config, key) for key in ENGINE_CONFIG_KEYS}
            engine_config = EngineConfig(model=str(model_dir), divergence=self.profiles, **values)
            max_model_len = self._max_model_len(model, engine_config)
            engine_config.scheduler_limits(max_model_len)
        except (ConfigError, ModelConfigError, ValueError) as exc:
            raise TargetStartError(f"engine refuses the config: {exc}") from None
        num_blocks = engine_config.num_gpu_blocks_override
        if num_blocks is None:
            raise TargetStartError("the scheduler tier needs num_gpu_blocks_override")
        runner = ScriptedModelRunner(shared_script(), block_size=engine_config.block_size)
        self.core = EngineCore(engine_config, runner, num_blocks, max_model_len)
        self._eos_token_id = model.eos_token_id
        self._generation_config = dict(model.generation_config)
        self._num_added = 0
        self.notes = []

    @staticmethod
    def _max_model_len(model: ModelConfig, config: EngineConfig) -> int:
        """The explicit length, or auto-fit (counting the null block under legacy-capacity)."""
        if not config.auto_fit_max_model_len:
            return resolve_max_model_len(model, config.explicit_max_model_len)
        plan = plan_kv_cache(
            model,
            block_size=config.block_size,
            dtype=resolve_dtype(model, config.dtype),
            available_memory=0,
            num_gpu_blocks_override=config.num_gpu_blocks_override,
            max_model_len="auto",
            legacy_null_block=divergence.legacy_null_block(config.divergence),
        )
        return plan.max_model_len

    def submit(self, request: RequestSpec) -> None:
        if self.core is None:
            raise RuntimeError("submit before start")
        assert request.prompt_token_ids is not None and request.max_tokens is not None
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
        self._num_added += 1

    def step(self) -> StepTrace:
        if self.core is None:
            raise RuntimeError("step before start")
        _outputs, trace = self.core.step()
        return trace

    def close(self) -> None:
        self.core = None


def _scheduler_profiles() -> list[str]:
    return [name for name, p in divergence.PROFILES.items() if "scheduler" in p.tiers]
