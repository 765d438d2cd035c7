"""Scheduler-tier target ``oracle``: the pinned upstream ``Scheduler`` (in-process).

A thin wrapper over ``oracle.scheduler_tier.SchedulerTierOracle`` (which the protocol worker
``oracle/scheduler_worker.py`` wraps too); importing it pays vllm's one-off import cost (~16 s),
so this module is imported only when the target is made. Like upstream's own scheduler tests,
no startup capacity check is applied; when upstream's check would refuse the config at
startup, the run carries a note saying so.
"""

from __future__ import annotations

from contract.trace import StepTrace
from parity.errors import TargetStartError
from parity.scenario import ConfigSpec, RequestSpec
from parity.targets._script import shared_script
from parity.targets.base import engine_args


class OracleTarget:
    """``SchedulerTierOracle``: a fresh upstream scheduler per ``start``."""

    tier = "scheduler"

    def __init__(self, argument: str = "") -> None:
        from oracle.scheduler_tier import OracleRefusal, SchedulerTierOracle  # imports vllm

        self._refusal = OracleRefusal
        self.oracle = SchedulerTierOracle(script=shared_script())  # type: ignore[arg-type]
        self.name = "oracle"
        self.model_dir = argument or None
        self.notes: list[str] = []

    def start(self, config: ConfigSpec) -> None:
        self.notes = []
        try:
            self.oracle.start(engine_args(config, self.model_dir))
        except self._refusal as exc:
            raise TargetStartError(str(exc)) from None
        self.notes = list(self.oracle.notes)

    def submit(self, request: RequestSpec) -> None:
        self.oracle.submit(request)

    def step(self) -> StepTrace:
        return self.oracle.step()

    def close(self) -> None:
        self.oracle.close()
