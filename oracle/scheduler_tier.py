"""Upstream's ``Scheduler`` at the scheduler tier, one scenario at a time.

``SchedulerTierOracle`` holds the current ``OracleScheduler`` (``oracle.scheduler_adapter``):
``start`` builds a fresh one from engine args (``OracleRefusal`` when upstream rejects them) and
reports upstream's startup check (not applied at this tier; ``notes`` says when it would
refuse), then ``submit`` / ``step`` / ``close``. Two drivers share it: the in-process target
``parity/targets/oracle.py`` and the protocol worker ``oracle/scheduler_worker.py``. Importing
this module imports vllm (~16 s).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from contract.protocol import RequestLike, Startup
from contract.trace import StepTrace
from oracle import scheduler_adapter
from oracle.scheduler_adapter import OracleRefusal, OracleScheduler, Script

__all__ = ["OracleRefusal", "SchedulerTierOracle"]


class SchedulerTierOracle:
    """A fresh ``OracleScheduler`` per ``start``."""

    def __init__(self, script: Script | None = None) -> None:
        scheduler_adapter.quiet_logging()
        self.script = script
        self.scheduler: OracleScheduler | None = None
        self.notes: list[str] = []
        self.startup = Startup()

    def start(self, values: Mapping[str, Any]) -> Startup:
        self.close()
        self.scheduler = scheduler_adapter.start_scheduler(dict(values), script=self.script)
        check = self.scheduler.startup
        self.notes = scheduler_adapter.startup_notes(check)
        self.startup = Startup(check.refused, check.error, check.max_model_len)
        return self.startup

    def submit(self, request: RequestLike, output_token_ids: Sequence[int] | None = None) -> None:
        if self.scheduler is None:
            raise RuntimeError("submit before start")
        self.scheduler.submit(request, output_token_ids)

    def step(self) -> StepTrace:
        if self.scheduler is None:
            raise RuntimeError("step before start")
        return self.scheduler.step()

    def close(self) -> None:
        if self.scheduler is not None:
            scheduler, self.scheduler = self.scheduler, None
            scheduler.close()
