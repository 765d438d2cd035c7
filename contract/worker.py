"""The serving loop of a Python scheduler-tier worker (docs/scheduler-protocol.md).

``serve(backend_factory)`` claims the process's stdout for the protocol first (the real fd 1 is
duplicated for the protocol and fd 1 then points at stderr, so stray prints, warnings and
library logging cannot corrupt the stream), then answers one JSON line per request line on
stdin until EOF or ``exit``; it returns the process exit code (0). The backend is built lazily,
at the first ``start``, so ``hello`` answers at once even when the backend's imports are slow
(``import vllm`` takes ~16 s).

Workers: ``engine/core/scheduler_worker.py`` (our engine) and ``oracle/scheduler_worker.py``
(upstream's ``Scheduler``), each an in-process scheduler-tier target behind ``TierBackend``.
Standard library only. Upstream: none.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, BinaryIO, Protocol

from contract import protocol, protocol_checks
from contract.protocol import (
    ProtocolError,
    Refused,
    RequestLike,
    Started,
    Startup,
    SubmitRequest,
    Unsupported,
)
from contract.trace import StepTrace


class Backend(Protocol):
    """One scheduler-tier target behind the protocol (one scenario at a time)."""

    def start(self, config: dict[str, Any]) -> Started:
        """Build a fresh scheduler for ``config`` (every key of ``protocol.CONFIG_DEFAULTS``);
        raise ``Refused`` or ``Unsupported``, or anything else for an error."""

    def submit(self, request: SubmitRequest) -> None: ...

    def step(self) -> StepTrace: ...

    def close(self) -> None:
        """Release the scenario's scheduler; safe to call twice."""


class Tier(Protocol):
    """A scheduler-tier target in process (``engine.core.scheduler_tier.SchedulerTierEngine``,
    ``oracle.scheduler_tier.SchedulerTierOracle``)."""

    @property
    def notes(self) -> Sequence[str]:
        """Free-text notes for the run, set by ``start``."""

    def start(self, values: Mapping[str, Any]) -> Startup: ...

    def submit(
        self, request: RequestLike, output_token_ids: Sequence[int] | None = None
    ) -> None: ...

    def step(self) -> StepTrace: ...

    def close(self) -> None: ...


class TierBackend:
    """A ``Tier`` behind the protocol: its ``refusal`` exception becomes ``Refused``, and each
    request's ``output_token_ids`` are what its fake runner samples."""

    def __init__(self, tier: Tier, refusal: type[Exception]) -> None:
        self.tier = tier
        self.refusal = refusal

    def start(self, config: dict[str, Any]) -> Started:
        try:
            startup = self.tier.start(config)
        except self.refusal as exc:
            raise Refused(str(exc)) from None
        return Started(tuple(self.tier.notes), startup)

    def submit(self, request: SubmitRequest) -> None:
        self.tier.submit(request, request.output_token_ids)

    def step(self) -> StepTrace:
        return self.tier.step()

    def close(self) -> None:
        self.tier.close()


def claim_stdout() -> BinaryIO:
    """The protocol's stream: a duplicate of fd 1; fd 1 (and ``sys.stdout``) become stderr."""
    sys.stdout.flush()
    stream = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return stream


class _Session:
    """Dispatches requests to the backend and turns every outcome into one response."""

    def __init__(self, implementation: str, factory: Callable[[], Backend]) -> None:
        self.implementation = implementation
        self.factory = factory
        self.backend: Backend | None = None
        self.started = False

    def answer(self, line: bytes) -> tuple[dict[str, Any], bool]:
        """The response to one request line, and whether the process should exit after it."""
        try:
            op, payload = protocol_checks.parse_request(protocol.decode(line))
            return self._dispatch(op, payload), op == "exit"
        except Refused as exc:
            return protocol.failure("refused", str(exc)), False
        except Unsupported as exc:
            return protocol.failure("unsupported", str(exc)), False
        except ProtocolError as exc:
            return protocol.failure("error", str(exc)), False
        except Exception as exc:  # the backend failing is a reply, never a dead worker
            return protocol.failure("error", f"{type(exc).__name__}: {exc}"), False

    def _dispatch(self, op: str, payload: Any) -> dict[str, Any]:
        if op == "hello":
            if payload != protocol.PROTOCOL_VERSION:
                raise ProtocolError(
                    f"protocol {payload} requested, this worker speaks {protocol.PROTOCOL_VERSION}"
                )
            return protocol.hello_response(self.implementation)
        if op in ("start", "close", "exit"):
            self._close()
        if op == "start":
            if self.backend is None:
                self.backend = self.factory()
            started = self.backend.start(payload)
            self.started = True
            return protocol.start_response(started)
        if op in ("submit", "step"):
            if not self.started or self.backend is None:
                raise ProtocolError(f"{op}: {protocol.NO_SCENARIO}")
            if op == "submit":
                self.backend.submit(payload)
                return protocol.ok()
            return protocol.step_response(self.backend.step())
        return protocol.ok()  # close, exit

    def _close(self) -> None:
        if self.started and self.backend is not None:
            self.started = False
            self.backend.close()


def serve(
    implementation: str,
    factory: Callable[[], Backend],
    stdin: BinaryIO | None = None,
    stdout: BinaryIO | None = None,
) -> int:
    """Answer requests until EOF or ``exit``; the exit code (0). Claims stdout unless given."""
    out = stdout if stdout is not None else claim_stdout()
    source = stdin if stdin is not None else sys.stdin.buffer
    session = _Session(implementation, factory)
    try:
        for line in source:
            if not line.strip():
                continue  # blank lines are not requests
            response, done = session.answer(line)
            out.write(protocol.encode(response))
            out.flush()
            if done:
                break
    finally:
        session._close()
    return 0
