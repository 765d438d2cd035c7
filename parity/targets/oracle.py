"""Scheduler-tier target ``oracle``: the pinned upstream ``Scheduler`` (in-process).

A thin wrapper over ``oracle.scheduler_adapter.OracleScheduler``; importing it pays vllm's
one-off import cost (~16 s), so this module is imported only when the target is made. Like
upstream's own scheduler tests, no startup capacity check is applied; when upstream's check
would refuse the config at startup, the run carries a note saying so.
"""

from __future__ import annotations

import logging
from typing import Any

from contract.engine_args import SCHEDULER_ARGS
from contract.trace import StepTrace
from parity.errors import TargetStartError
from parity.scenario import ConfigSpec, RequestSpec
from parity.targets._script import shared_script

# every scheduler-tier key but the two the scheduler itself never reads
ORACLE_CONFIG_KEYS = tuple(k for k in SCHEDULER_ARGS if k not in ("dtype", "seed"))


class OracleTarget:
    """A fresh ``OracleScheduler`` per ``start``."""

    tier = "scheduler"

    def __init__(self, argument: str = "") -> None:
        from oracle import scheduler_adapter  # the one-off vllm import

        # Upstream warns on every scheduler built with a block size that is not a multiple of
        # 32 (platforms/cpu.py:295-299); keep the harness output readable unless configured.
        vllm_logger = logging.getLogger("vllm")
        if vllm_logger.level == logging.NOTSET:
            vllm_logger.setLevel(logging.ERROR)

        self._adapter = scheduler_adapter
        self.name = "oracle"
        self.model_dir = argument or None
        self.scheduler: Any = None
        self.notes: list[str] = []

    def start(self, config: ConfigSpec) -> None:
        self.close()
        values: dict[str, Any] = {
            key: getattr(config, key)
            for key in ORACLE_CONFIG_KEYS
            if getattr(config, key) is not None
        }
        model = config.model or self.model_dir
        if model is not None:
            values["model"] = model
        try:
            self.scheduler = self._adapter.OracleScheduler(values, script=shared_script())
        except (self._adapter.OracleConfigError, ValueError) as exc:
            raise TargetStartError(f"oracle refuses the config: {exc}") from None
        startup = self.scheduler.startup
        self.notes = (
            [f"upstream would refuse this config at startup: {startup.error}"]
            if startup.refused
            else []
        )

    def submit(self, request: RequestSpec) -> None:
        if self.scheduler is None:
            raise RuntimeError("submit before start")
        assert request.prompt_token_ids is not None and request.max_tokens is not None
        self.scheduler.add_request(
            request_id=request.id,
            prompt_token_ids=list(request.prompt_token_ids),
            max_tokens=request.max_tokens,
            min_tokens=request.min_tokens,
            ignore_eos=request.ignore_eos,
            stop_token_ids=tuple(request.stop_token_ids),
            priority=request.priority,
        )

    def step(self) -> StepTrace:
        if self.scheduler is None:
            raise RuntimeError("step before start")
        trace: StepTrace = self.scheduler.step()
        return trace

    def close(self) -> None:
        if self.scheduler is not None:
            scheduler, self.scheduler = self.scheduler, None
            scheduler.close()
