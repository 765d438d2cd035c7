"""The target interface: what the runner needs from anything it compares.

Modelled on sqllogictest's narrow adapter (``run(sql) -> output``, ``shutdown()``): a target is
started with a scenario's config, takes requests, is advanced, is observed, and is closed. One
object can run many scenarios in turn (``start`` ... ``close``, then ``start`` again), so a
heavy target (the oracle's one-off vllm import, a server process) pays its setup once.

Two tiers share the base protocol:
- ``SchedulerTarget`` (tier ``scheduler``): advanced one scheduler step at a time; each step
  returns the ``StepTrace`` it observed. Targets: ``engine`` (our ``EngineCore`` with the
  scripted fake runner), ``oracle`` (upstream's ``Scheduler`` through ``oracle.scheduler_adapter``).
- serve-tier targets (``engine`` / ``oracle`` servers, ``external:<command>``) will add
  their own protocol on the same base (``tier = "serve"``), registered in ``parity.targets``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from contract.protocol import ENGINE_ARGS
from contract.trace import StepTrace
from parity.scenario import ConfigSpec, RequestSpec

TIERS = ("scheduler", "serve")
PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = PROJECT_ROOT / ".cache" / "models" / "scripted"


def engine_args(config: ConfigSpec, model_dir: str | Path | None = None) -> dict[str, Any]:
    """A scenario's config as the scheduler tier's engine args (``contract.protocol``'s keys):
    ``model`` the absolute model folder (the config's, else ``model_dir``, else the scripted
    model), ``max_model_len`` auto as -1."""
    values: dict[str, Any] = {key: getattr(config, key) for key in ENGINE_ARGS}
    if values["max_model_len"] == "auto":
        values["max_model_len"] = -1
    values["model"] = str(Path(config.model or model_dir or DEFAULT_MODEL).resolve())
    return values


@runtime_checkable
class Target(Protocol):
    """Anything the runner can start with a config and close again."""

    name: str  # the --target spec it was made from, e.g. "engine"
    tier: str  # one of TIERS
    # Optional: ``notes: list[str]``, set by ``start``; the runner copies them into the run
    # summary (the oracle notes a config upstream would refuse at startup).

    def start(self, config: ConfigSpec) -> None:
        """Prepare a fresh instance for ``config``; raise ``TargetStartError`` if refused."""

    def close(self) -> None:
        """Release everything ``start`` acquired; safe to call twice."""


@runtime_checkable
class SchedulerTarget(Target, Protocol):
    """A scheduler-tier target: submit requests, advance one step, observe its trace."""

    def submit(self, request: RequestSpec) -> None:
        """Add one request (``prompt_token_ids``, ``max_tokens`` and friends; ``id`` as-is)."""

    def step(self) -> StepTrace:
        """Run one scheduler step (schedule, fake model, update) and return its trace."""


class _SchedulerCore(Protocol):
    def submit(self, request: RequestSpec) -> None: ...

    def step(self) -> StepTrace: ...

    def close(self) -> None: ...


CoreT = TypeVar("CoreT", bound=_SchedulerCore)


class SchedulerWrapper(Generic[CoreT]):
    """A scheduler-tier target around ``inner`` (a scheduler-tier engine, oracle or target),
    which takes its requests, steps and ``close`` as they are; subclasses add ``start``."""

    tier = "scheduler"
    inner: CoreT

    def submit(self, request: RequestSpec) -> None:
        self.inner.submit(request)

    def step(self) -> StepTrace:
        return self.inner.step()

    def close(self) -> None:
        self.inner.close()
