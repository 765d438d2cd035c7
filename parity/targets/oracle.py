"""Scheduler-tier target ``oracle``: the pinned upstream ``Scheduler`` (in-process).

A thin wrapper over ``oracle.scheduler_tier.SchedulerTierOracle`` (which the protocol worker
``oracle/scheduler_worker.py`` wraps too); importing it pays vllm's one-off import cost (~16 s),
so this module is imported only when the target is made. Like upstream's own scheduler tests,
no startup capacity check is applied; when upstream's check would refuse the config at
startup, the run carries a note saying so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from parity.errors import TargetStartError
from parity.scenario import ConfigSpec
from parity.targets._script import shared_script
from parity.targets.base import SchedulerWrapper, engine_args

if TYPE_CHECKING:
    from oracle.scheduler_tier import SchedulerTierOracle


class OracleTarget(SchedulerWrapper[Any]):  # Any: the class is imported when made (vllm)
    """``SchedulerTierOracle``: a fresh upstream scheduler per ``start``."""

    inner: SchedulerTierOracle

    def __init__(self, argument: str = "") -> None:
        from oracle.scheduler_tier import OracleRefusal, SchedulerTierOracle  # imports vllm

        self._refusal = OracleRefusal
        self.inner = SchedulerTierOracle(script=shared_script())  # type: ignore[arg-type]
        self.name = "oracle"
        self.model_dir = argument or None
        self.notes: list[str] = []

    def start(self, config: ConfigSpec) -> None:
        self.notes = []
        try:
            self.inner.start(engine_args(config, self.model_dir))
        except self._refusal as exc:
            raise TargetStartError(str(exc)) from None
        self.notes = list(self.inner.notes)
