"""Scheduler-tier target ``engine``: our ``EngineCore`` driven by the scripted fake runner.

A thin wrapper over ``engine.core.scheduler_tier.SchedulerTierEngine`` (which the protocol
worker ``engine/core/scheduler_worker.py`` wraps too): the scenario's engine args, the model
folder (default: the scripted model), and the runner sampling from the script itself.

Flags (``engine --divergence NAME``, repeatable): the engine's divergence profiles that act at
this tier (``contract.profiles.PROFILES[name].tiers``): ``abort-unservable`` and
``legacy-capacity`` (auto-fit counts the null block).
"""

from __future__ import annotations

from engine import divergence
from engine.core.scheduler_tier import EngineRefusal, SchedulerTierEngine
from parity.errors import TargetSpecError, TargetStartError
from parity.scenario import ConfigSpec
from parity.targets._script import shared_script
from parity.targets.base import SchedulerWrapper, engine_args


class EngineTarget(SchedulerWrapper[SchedulerTierEngine]):
    """``SchedulerTierEngine``, rebuilt on every ``start``."""

    def __init__(self, argument: str = "") -> None:
        self.name = "engine"
        self.model_dir = argument or None
        self.inner = SchedulerTierEngine(script=shared_script())
        self.notes: list[str] = []

    @property
    def profiles(self) -> tuple[str, ...]:
        return self.inner.profiles

    def configure_flags(self, flags: list[str]) -> None:
        """``--divergence NAME`` (repeatable, or ``--divergence=NAME``); anything else, an
        unknown profile or a serve-only one is a one-line ``TargetSpecError``."""
        try:
            self.inner.profiles = divergence.scheduler_tier_profiles(flags)
        except ValueError as e:
            raise TargetSpecError(f"scheduler-tier engine: {e}") from None

    def start(self, config: ConfigSpec) -> None:
        try:
            self.inner.start(engine_args(config, self.model_dir))
        except EngineRefusal as exc:
            raise TargetStartError(str(exc)) from None
        self.notes = []
