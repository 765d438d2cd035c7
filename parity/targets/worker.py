"""Scheduler-tier target ``worker:<command>``: any scheduler behind the worker protocol.

``WorkerTarget(name, command, env=None, cwd=None)`` runs ``command`` (an argv, never through a
shell) as a subprocess speaking docs/scheduler-protocol.md (``contract.protocol``) and drives it
as a ``SchedulerTarget``. The process is started at the first ``start`` (``hello`` handshake, the
protocol version checked) and reused across scenarios (``close`` ends a scenario, not the
process); ``shutdown`` ends it (``exit``, then the group is reaped: SIGTERM, grace, SIGKILL), as
do the harness's exit hooks. Every exchange is bounded: ``start`` allows for a slow import
(``start_timeout_s``), the others take ``step_timeout_s``.

Failures are one line: at ``start`` a ``TargetStartError`` (the worker refused or cannot take
the config, or it crashed, hung or wrote garbage: then the process is reaped and the next
``start`` runs a new one), mid-scenario a ``WorkerError`` that the runner records as the run's
error (outcome ``crashed``). Each ``submit`` carries the request's scripted
``output_token_ids`` (``parity.targets._script.output_token_ids``), so a worker needs no copy of
the script. As a ``--target`` spec: ``worker:python -m engine.core.scheduler_worker`` (the
command is split with shlex).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from contract import protocol, protocol_checks
from contract.trace import StepTrace
from parity.errors import TargetSpecError, TargetStartError
from parity.scenario import ConfigSpec, RequestSpec
from parity.targets._pipe import WorkerError, WorkerProcess
from parity.targets._script import model_eos_ids, output_token_ids
from parity.targets.base import engine_args

__all__ = ["WorkerError", "WorkerTarget", "worker_target"]


class WorkerTarget:
    """A scheduler-tier target in a subprocess, over the worker protocol."""

    tier = "scheduler"

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        *,
        model_dir: str | Path | None = None,
        hello_timeout_s: float = 60.0,
        start_timeout_s: float = 180.0,
        step_timeout_s: float = 30.0,
        grace_s: float = 5.0,
    ) -> None:
        if not command:
            raise TargetSpecError(f"target {name!r}: empty worker command")
        self.name = name
        self.command = list(command)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.model_dir = model_dir
        self.hello_timeout_s = hello_timeout_s
        self.start_timeout_s = start_timeout_s
        self.step_timeout_s = step_timeout_s
        self.grace_s = grace_s
        self.implementation: str | None = None  # from the hello response
        self.notes: list[str] = []
        self.startup: protocol.Startup | None = None  # the worker's own startup check
        self._process: WorkerProcess | None = None
        self._in_scenario = False
        self._eos_ids: frozenset[int] = frozenset()

    # -- the SchedulerTarget protocol ---------------------------------------------------------

    def start(self, config: ConfigSpec) -> None:
        self.close()
        self.notes, self.startup = [], None
        values = engine_args(config, self.model_dir)
        try:
            self._eos_ids = model_eos_ids(values["model"])
        except (OSError, ValueError) as exc:
            raise TargetStartError(f"{self.name}: cannot read {values['model']}: {exc}") from None
        try:
            process = self._ensure_process()
            response = self._ask(process, protocol.start(values), "start", self.start_timeout_s)
        except WorkerError as exc:
            raise TargetStartError(str(exc)) from None
        if not response["ok"]:
            raise TargetStartError(self._start_failure(response))
        self.notes = list(response.get("notes", []))
        self.startup = protocol_checks.parse_startup(response.get("startup", {}))
        self._in_scenario = True

    def submit(self, request: RequestSpec) -> None:
        assert request.prompt_token_ids is not None and request.max_tokens is not None
        outputs = output_token_ids(
            request.prompt_token_ids,
            request.max_tokens,
            request.min_tokens,
            request.stop_token_ids,
            self._eos_ids,
        )
        message = protocol.submit(
            protocol.SubmitRequest(
                id=request.id,
                prompt_token_ids=tuple(request.prompt_token_ids),
                max_tokens=request.max_tokens,
                output_token_ids=tuple(outputs),
                min_tokens=request.min_tokens,
                ignore_eos=request.ignore_eos,
                stop_token_ids=tuple(request.stop_token_ids),
                priority=request.priority,
            )
        )
        self._scenario_call(message, "submit")

    def step(self) -> StepTrace:
        response = self._scenario_call(protocol.simple("step"), "step")  # trace checked
        return StepTrace.from_json(response["trace"])

    def close(self) -> None:
        """End the scenario (the process stays for the next one); never raises."""
        if not self._in_scenario:
            return
        self._in_scenario = False
        process = self._process
        if process is None or process.broken:
            return
        try:
            response = self._ask(process, protocol.simple("close"), "close", self.step_timeout_s)
        except WorkerError:
            return  # already reaped by _ask
        if not response["ok"]:
            self._reap()  # a worker that cannot close a scenario cannot be trusted with the next

    def shutdown(self) -> None:
        """End the worker process: ``exit``, then reap its group. Safe to call twice."""
        self._in_scenario = False
        process, self._process = self._process, None
        if process is None:
            return
        if not process.broken:
            try:
                process.exchange(protocol.simple("exit"), self.grace_s, "exit")
            except WorkerError:
                pass
        process.stop(self.grace_s)

    # -- internals ------------------------------------------------------------------------------

    def _ensure_process(self) -> WorkerProcess:
        if self._process is not None and not self._process.broken and self._process.alive():
            return self._process
        self._reap()
        process = WorkerProcess(self.command, env=self.env, cwd=self.cwd, label=self.name)
        self._process = process
        response = self._ask(process, protocol.hello(), "hello", self.hello_timeout_s)
        if not response["ok"] or response.get("protocol") != protocol.PROTOCOL_VERSION:
            self._reap()
            spoken = response.get("protocol", response.get("error"))
            raise WorkerError(
                f"{self.name}: the worker does not speak protocol {protocol.PROTOCOL_VERSION} "
                f"(hello answered {spoken!r})"
            )
        self.implementation = response["implementation"]
        return process

    def _ask(
        self, process: WorkerProcess, message: dict[str, Any], op: str, timeout_s: float
    ) -> dict[str, Any]:
        """One checked exchange; on any failure the process is reaped and WorkerError raised."""
        try:
            response = process.exchange(message, timeout_s, op)
            return protocol_checks.check_response(op, response)
        except protocol.ProtocolError as exc:
            self._reap()
            raise WorkerError(f"{self.name}: bad {op} response: {exc}") from None
        except WorkerError:
            self._reap()
            raise

    def _scenario_call(self, message: dict[str, Any], op: str) -> dict[str, Any]:
        process = self._process
        if not self._in_scenario or process is None:
            raise WorkerError(f"{self.name}: {op} before start")
        response = self._ask(process, message, op, self.step_timeout_s)
        if not response["ok"]:
            raise WorkerError(f"{self.name}: {response['error']}")
        return response

    def _start_failure(self, response: dict[str, Any]) -> str:
        if "refused" in response:
            return str(response["refused"])
        if "unsupported" in response:
            return f"{self.name} cannot take the config: {response['unsupported']}"
        return f"{self.name}: start failed: {response['error']}"

    def _reap(self) -> None:
        process, self._process = self._process, None
        self._in_scenario = False
        if process is not None:
            process.stop(self.grace_s)


def worker_target(argument: str) -> WorkerTarget:
    """The ``worker:<command>`` factory (``make_target``): the command split with shlex."""
    try:
        argv = shlex.split(argument)
    except ValueError as exc:
        raise TargetSpecError(f"target 'worker:{argument}': {exc}") from None
    if not argv:
        raise TargetSpecError("target 'worker:' needs a command, e.g. worker:python -m MODULE")
    return WorkerTarget(f"worker:{argument}", argv)
