"""Per-target observer: its readiness path and ``/metrics`` polled while requests are outstanding.

The readiness path is the one the target declares (``health`` in its table, ``/health`` by
default), and ``/metrics`` is read only from a target that has it (capability ``metrics``): a
request to an endpoint the target says it lacks would only record the harness's own 404s.

The monitor keeps the server-side half of progress detection: the time the token counter
(``vllm:generation_tokens_total``) last changed. A request is stalled only when neither its own
bytes nor this counter moved for ``stall_s`` (observe.py). It also answers the evidence samples
taken at a stall, while the stalled stream is still open: closing it first would abort the
request upstream (``with_cancellation`` in ``vllm/entrypoints/serve/utils/api_utils.py:51``)
and erase the wedge from the metrics.

``/health`` at the pin returns 200 unless the engine is dead (spec B6.6), so a green sample
during a stall is the finding, not a contradiction.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx

from parity.serve.observe import HealthSample, MetricsSnapshot, parse_metrics

SAMPLE_TIMEOUT_S = 2.0


class TargetMonitor:
    """Polls one server; ``t0`` is the run's start (monotonic seconds)."""

    def __init__(
        self,
        base_url: str,
        *,
        alive: Callable[[], bool],
        t0: float,
        poll_s: float = 0.25,
        health_path: str = "/health",
        metrics: bool = True,
    ) -> None:
        self.base_url = base_url
        self.health_path = health_path
        self.reads_metrics = metrics
        self.alive = alive
        self.t0 = t0
        self.poll_s = poll_s
        self.health: list[HealthSample] = []
        self.last_metrics: MetricsSnapshot | None = None
        self.counter: float | None = None
        self.last_progress = t0  # monotonic time the counter last changed (or the start)
        self.metrics_available = False
        self._last_metrics_at: float | None = None
        self._client = httpx.AsyncClient(timeout=SAMPLE_TIMEOUT_S)

    def ms(self, when: float) -> float:
        return round((when - self.t0) * 1000.0, 3)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def sample_health(self) -> HealthSample:
        began = time.monotonic()
        try:
            resp = await self._client.get(f"{self.base_url}{self.health_path}")
        except httpx.HTTPError as exc:
            sample = HealthSample(self.ms(began), None, error=_one_line(exc))
        else:
            latency = round((time.monotonic() - began) * 1000.0, 3)
            sample = HealthSample(self.ms(began), resp.status_code, latency_ms=latency)
        self.health.append(sample)
        return sample

    async def sample_metrics(self) -> MetricsSnapshot:
        began = time.monotonic()
        if not self.reads_metrics:
            return MetricsSnapshot(self.ms(began), error="no /metrics (capability metrics = false)")
        try:
            resp = await self._client.get(f"{self.base_url}/metrics")
        except httpx.HTTPError as exc:
            return MetricsSnapshot(self.ms(began), error=_one_line(exc))
        if resp.status_code != 200:
            return MetricsSnapshot(self.ms(began), error=f"/metrics answered {resp.status_code}")
        snapshot = parse_metrics(resp.text, self.ms(began))
        self._account(snapshot, time.monotonic())
        return snapshot

    def _account(self, snapshot: MetricsSnapshot, now: float) -> None:
        value = snapshot.generation_tokens
        if value is None:
            return
        self.metrics_available = True
        if self.counter is not None and value != self.counter:
            self.last_progress = now
        self.counter = value
        self.last_metrics = snapshot
        self._last_metrics_at = now

    async def poll(self, stop: asyncio.Event) -> None:
        """Sample /metrics every ``poll_s`` and the readiness path every other poll until
        ``stop``."""
        tick = 0
        while not stop.is_set():
            if self.alive():
                await self.sample_metrics()
                if tick % 2 == 0:
                    await self.sample_health()
            tick += 1
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.poll_s)
            except TimeoutError:
                pass

    def scheduler_view(self, since: float) -> str:
        """What the server's own counters say about a quiet request, from the latest
        ``/metrics`` sample taken after ``since`` (monotonic): ``wedged`` (requests waiting and
        none running: nothing can progress), ``working`` (something runs), or ``unknown`` (no
        fresh sample: no /metrics, or the server too busy to answer)."""
        sample = self.last_metrics
        taken = self._last_metrics_at
        if sample is None or taken is None or taken < since:
            return "unknown"
        running, waiting = sample.running, sample.waiting
        if running is None or waiting is None:
            return "unknown"
        if running == 0 and waiting > 0:
            return "wedged"
        return "working" if running > 0 else "unknown"

    async def evidence(self) -> tuple[HealthSample, MetricsSnapshot]:
        """A fresh readiness and /metrics pair (taken concurrently)."""
        health, metrics = await asyncio.gather(self.sample_health(), self.sample_metrics())
        return health, metrics


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
