"""Run one serve-tier scenario's requests against one started target: a ``ServeRun``.

Per target: ``/v1/models`` (served name, ``max_model_len``), ``/metrics`` before and after,
``/health`` sampled throughout (``TargetMonitor``). Per request: ``repeat`` copies, at most
``concurrency`` outstanding at once, the first sent ``at_ms`` after the run starts; each copy
observed by ``parity.serve.client.observe_request``. Every copy is bounded by
``request_timeout_s`` from its send (a stall ends it after ``stall_s``), and the run by the last
arrival plus that bound.

A target that did not start gives every copy its startup outcome (``startup_refused`` /
``startup_timeout``) and no server facts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx

from parity._codec import JsonMixin
from parity.serve.client import observe_request
from parity.serve.derive import with_text_ids
from parity.serve.monitor import TargetMonitor
from parity.serve.observe import (
    HealthSample,
    MetricsSnapshot,
    RequestObservation,
)
from parity.serve.pool import ServerHandle, ServerPool, StartupRecord
from parity.serve.spec import ServeLimits, ServerConfig, ServeRequestSpec, from_scenario

CANCEL_S = 5.0
RUN_SLACK_S = 15.0  # beyond the last arrival + request_timeout_s: evidence sampling, cancels
LOG_TAIL_BYTES = 6000
M = TypeVar("M", bound=TargetMonitor)


@dataclass(frozen=True, slots=True)
class TargetFacts(JsonMixin):
    """What the server says about itself (``/v1/models``)."""

    model_id: str | None = None
    max_model_len: int | None = None
    models: dict[str, Any] | None = None  # the raw /v1/models body
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ServeRun(JsonMixin):
    """One target's run of one scenario's requests."""

    target: str  # the target's label (``oracle[unchecked]`` marked as such)
    startup: StartupRecord
    observations: tuple[RequestObservation, ...] = ()
    facts: TargetFacts | None = None
    health: tuple[HealthSample, ...] = ()
    metrics_before: MetricsSnapshot | None = None
    metrics_after: MetricsSnapshot | None = None
    limits: ServeLimits = ServeLimits()
    elapsed_s: float = 0.0
    server_alive_after: bool = False
    log_tail: str = ""  # kept when something went wrong (a stall, a crash, a refusal)
    # SIGTERM sent while requests were outstanding (a repro's ``sigterm`` leg): ``exited``
    # within the grace period, ``survived`` (SIGKILL needed) or ``gone``; None: not sent
    sigterm: str | None = None
    # why this target cannot run the scenario (a config key or vLLM extension it lacks): the
    # run was not made, and nothing of it is compared (UNSUPPORTED, not a divergence)
    unsupported: str | None = None
    # what the server accepts (declared, or probed once: parity.serve.probe)
    capabilities: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def not_supported(cls, target: str, reason: str, limits: ServeLimits) -> ServeRun:
        """The placeholder run of a target that cannot run the scenario."""
        record = StartupRecord(target=target, outcome="unsupported", error=reason)
        return cls(target=target, startup=record, limits=limits, unsupported=reason)

    @property
    def outcomes(self) -> dict[str, str]:
        return {o.request_id: o.outcome for o in self.observations}

    @property
    def started(self) -> bool:
        return self.startup.started

    def describe(self) -> str:
        """One line: the startup outcome, or how many requests ended how."""
        if self.unsupported is not None:
            return f"unsupported: {self.unsupported}"
        if not self.startup.started:
            return self.startup.describe()
        counts: dict[str, int] = {}
        for observation in self.observations:
            counts[observation.outcome] = counts.get(observation.outcome, 0) + 1
        parts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
        return f"{parts or 'no requests'} in {self.elapsed_s:.1f} s"

    def observation(self, request_id: str) -> RequestObservation:
        for observation in self.observations:
            if observation.request_id == request_id:
                return observation
        raise KeyError(request_id)


def run_serve(
    handle: ServerHandle,
    requests: Sequence[ServeRequestSpec],
    limits: ServeLimits | None = None,
    *,
    poll_s: float = 0.25,
) -> ServeRun:
    """Run ``requests`` against a pool's server (blocking; bounded by ``limits``)."""
    return asyncio.run(arun_serve(handle, requests, limits, poll_s=poll_s))


def run_scenario(
    pool: ServerPool,
    target: str,
    scenario: Any,
    *,
    model: str | None = None,
    poll_s: float = 0.25,
) -> ServeRun:
    """Run a loaded ``parity.scenario.Scenario`` on ``target`` (server from ``pool``)."""
    config, requests, limits = from_scenario(scenario, model=model)
    return run_requests(pool, target, config, requests, limits, poll_s=poll_s)


def run_requests(
    pool: ServerPool,
    target: str,
    config: ServerConfig,
    requests: Sequence[ServeRequestSpec],
    limits: ServeLimits | None = None,
    *,
    poll_s: float = 0.25,
) -> ServeRun:
    """Start (or reuse) ``target`` with ``config`` and run ``requests`` on it."""
    limits = limits or ServeLimits()
    handle = pool.get(target, config, startup_timeout_s=limits.startup_timeout_s)
    return run_serve(handle, requests, limits, poll_s=poll_s)


async def arun_serve(
    handle: ServerHandle,
    requests: Sequence[ServeRequestSpec],
    limits: ServeLimits | None = None,
    *,
    poll_s: float = 0.25,
) -> ServeRun:
    """The async form of ``run_serve``."""
    limits = limits or ServeLimits()
    if not handle.startup.started:
        return not_started(handle, requests, limits)
    watch = Watch(handle, limits, poll_s, TargetMonitor)
    try:
        await watch.start()
        observations = await send_all(handle, requests, limits, watch.monitor, watch.facts)
        observations = [with_text_ids(o, handle.config.model_dir) for o in observations]
        await watch.finish()
    finally:
        await watch.aclose()
    troubled = any(o.outcome not in ("completed", "http_error") for o in observations)
    return watch.result(
        observations,
        log_tail=handle.log_tail(LOG_TAIL_BYTES) if troubled else "",
        capabilities=dict(handle.capabilities),
    )


class Watch(Generic[M]):
    """The server-side half of one run on ``handle``: ``/v1/models`` facts and a ``/metrics``
    sample before, the monitor polling while the requests run, ``/metrics`` and readiness
    after (``start``, ``finish``, ``aclose``); ``result`` is the run's ``ServeRun``."""

    def __init__(
        self, handle: ServerHandle, limits: ServeLimits, poll_s: float, kind: type[M]
    ) -> None:
        self.handle = handle
        self.limits = limits
        self.began = time.monotonic()
        # the readiness path the target declares; /metrics only if it has them
        self.monitor = kind(
            handle.url,
            alive=handle.alive,
            t0=self.began,
            poll_s=poll_s,
            health_path=handle.target.serve.health,
            metrics=handle.capabilities.get("metrics", True),
        )
        self.facts = TargetFacts()
        self.before: MetricsSnapshot | None = None
        self.after: MetricsSnapshot | None = None
        self._stop = asyncio.Event()
        self._poller: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.facts = await fetch_facts(self.handle.url)
        self.before = await self.monitor.sample_metrics()
        await self.monitor.sample_health()
        self._poller = asyncio.create_task(self.monitor.poll(self._stop))

    async def finish(self) -> None:
        self._stop.set()
        if self._poller is not None:
            await asyncio.wait({self._poller}, timeout=5.0)
        if self.handle.alive():
            self.after = await self.monitor.sample_metrics()
            await self.monitor.sample_health()

    async def aclose(self) -> None:
        self._stop.set()
        await self.monitor.aclose()

    def result(self, observations: Sequence[RequestObservation], **extra: Any) -> ServeRun:
        """The run: ``observations`` and what was watched; ``extra`` fields as given."""
        return ServeRun(
            target=self.handle.label,
            startup=self.handle.startup,
            observations=tuple(observations),
            facts=self.facts,
            health=tuple(self.monitor.health),
            metrics_before=self.before,
            metrics_after=self.after,
            limits=self.limits,
            elapsed_s=round(time.monotonic() - self.began, 3),
            server_alive_after=self.handle.alive(),
            **extra,
        )


def request_timeout(limits: ServeLimits) -> httpx.Timeout:
    """A request's transport bounds: 10 s to connect, its own limit (plus slack) per read."""
    return httpx.Timeout(10.0, read=limits.request_timeout_s + 10.0)


async def send_all(
    handle: ServerHandle,
    requests: Sequence[ServeRequestSpec],
    limits: ServeLimits,
    monitor: TargetMonitor,
    facts: TargetFacts,
    *,
    client: httpx.AsyncClient | None = None,
) -> list[RequestObservation]:
    """Every copy of ``requests`` on ``handle``'s server, each at its ``at_ms`` and within its
    spec's concurrency, on ``client`` (default: a fresh one), the whole run bounded."""
    if client is not None:
        return await _send_on(client, handle, requests, limits, monitor, facts)
    pool_limits = httpx.Limits(max_connections=None, max_keepalive_connections=32)
    async with httpx.AsyncClient(timeout=request_timeout(limits), limits=pool_limits) as own:
        return await _send_on(own, handle, requests, limits, monitor, facts)


async def _send_on(
    client: httpx.AsyncClient,
    handle: ServerHandle,
    requests: Sequence[ServeRequestSpec],
    limits: ServeLimits,
    monitor: TargetMonitor,
    facts: TargetFacts,
) -> list[RequestObservation]:
    model = handle.model_name  # the --served-model-name we passed, unless the server ignored it
    if facts.models is not None and model not in _served_names(facts.models) and facts.model_id:
        model = facts.model_id
    overall = max((r.at_ms for r in requests), default=0.0) / 1000.0
    overall += limits.request_timeout_s * max((_waves(r) for r in requests), default=1)
    overall += RUN_SLACK_S
    phase_t0 = time.monotonic()  # at_ms counts from here
    tasks = [
        asyncio.create_task(
            _copy(client, handle, spec, copy_id, gate, model, monitor, limits, phase_t0)
        )
        for spec in requests
        for gate in [asyncio.Semaphore(spec.concurrency or spec.repeat)]
        for copy_id in spec.copy_ids()
    ]
    try:
        done, pending = await asyncio.wait(tasks, timeout=overall)
    except BaseException:  # cancelled (a Ctrl-C cancels the run): no copy outlives it, so none
        for task in tasks:  # sends on the client once it is closed
            task.cancel()
        raise
    for task in pending:  # a backstop: each copy bounds itself well before this
        task.cancel()
    await asyncio.wait(pending, timeout=CANCEL_S) if pending else None
    results: list[RequestObservation] = []
    copies = [(spec, copy_id) for spec in requests for copy_id in spec.copy_ids()]
    for task, (spec, copy_id) in zip(tasks, copies, strict=True):
        if task in done and not task.cancelled():
            results.append(task.result())  # a harness bug raises here, after the cleanup
        else:
            results.append(_lost(spec, copy_id))
    return results


async def _copy(
    client: httpx.AsyncClient,
    handle: ServerHandle,
    spec: ServeRequestSpec,
    copy_id: str,
    gate: asyncio.Semaphore,
    model: str,
    monitor: TargetMonitor,
    limits: ServeLimits,
    phase_t0: float,
) -> RequestObservation:
    delay = spec.at_ms / 1000.0 - (time.monotonic() - phase_t0)
    if delay > 0:
        await asyncio.sleep(delay)
    async with gate:
        return await observe_request(
            client,
            handle.url,
            spec,
            copy_id,
            model=model,
            monitor=monitor,
            limits=limits,
            accepts=lambda key: handle.capabilities.get(key, True),
        )


async def fetch_facts(url: str) -> TargetFacts:
    """What ``/v1/models`` says about the served model (errors become ``TargetFacts.error``)."""
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            resp = await client.get(f"{url}/v1/models")
        data = resp.json()
    except (httpx.HTTPError, ValueError) as exc:
        return TargetFacts(error=f"{type(exc).__name__}: {exc}")
    entries = data.get("data") if isinstance(data, dict) else None
    first = entries[0] if entries else {}
    max_len = first.get("max_model_len")
    return TargetFacts(
        model_id=first.get("id"),
        max_model_len=int(max_len) if isinstance(max_len, int) else None,
        models=data if isinstance(data, dict) else None,
        error=None if resp.status_code == 200 else f"/v1/models answered {resp.status_code}",
    )


def _served_names(models: dict[str, Any]) -> set[str]:
    return {str(m.get("id")) for m in models.get("data") or [] if isinstance(m, dict)}


def _waves(spec: ServeRequestSpec) -> int:
    width = spec.concurrency or spec.repeat
    return -(-spec.repeat // width)


def not_started(
    handle: ServerHandle, requests: Sequence[ServeRequestSpec], limits: ServeLimits
) -> ServeRun:
    """The run of a server that did not start: each copy ends as its startup did."""
    outcome = handle.startup.outcome
    observations = tuple(
        RequestObservation(
            request_id=copy_id,
            spec_id=spec.id,
            endpoint=spec.endpoint,
            stream=spec.stream,
            outcome=outcome,
            detail=handle.startup.error or outcome,
        )
        for spec in requests
        for copy_id in spec.copy_ids()
    )
    return ServeRun(
        target=handle.label,
        startup=handle.startup,
        observations=observations,
        limits=limits,
        log_tail=handle.log_tail(LOG_TAIL_BYTES),
    )


def _lost(spec: ServeRequestSpec, copy_id: str) -> RequestObservation:
    return RequestObservation(
        request_id=copy_id,
        spec_id=spec.id,
        endpoint=spec.endpoint,
        stream=spec.stream,
        outcome="timeout",
        detail="the run's overall bound ran out before this copy ended",
    )
